"""A family of a researcher's own whose inputs are neither tokens nor images: a 1-D signal of
floats (as audio is), cut into frames that a linear map embeds, then our Block stack and a
classifier of the pooled frames. Its data is a task of its own (noisy sines whose frequency is
the class) with a setting of its own (data.signal_noise), and the file is also a config:

  python launch.py --config tests/signal_family.py --workdir W [--mode=describe|compile|train]

Nothing outside this file knows of it: the registry entry answers every question the library
asks of a family (its inputs, stacks, batch shapes, data sizes, describe line), and the data
task and its settings register beside it."""
import dataclasses
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax import config_lib, data, layers
from transformer_jax.data import rng
from transformer_jax.errors import ConfigError
from transformer_jax.model_config import ModelConfig
from transformer_jax.models import common, registry
from transformer_jax.ranges import COUNT, Range


@dataclasses.dataclass(frozen=True)
class SignalConfig(ModelConfig):
  family: str = 'signal'
  signal_length: int = 256  # samples per example
  frame: int = 16  # samples per token
  num_classes: int = 4

  RANGES: ClassVar = {**ModelConfig.RANGES, 'signal_length': COUNT, 'frame': COUNT,
                      'num_classes': COUNT}

  def check(self) -> None:
    super().check()
    if self.signal_length % self.frame:
      raise ConfigError(f'model.frame={self.frame} does not divide model.signal_length='
                        f'{self.signal_length}.')

  @property
  def num_frames(self) -> int:
    return self.signal_length // self.frame


class SignalClassifier(nn.Module):
  """signal (B, L) float -> float32 class logits (B, num_classes)."""
  cfg: SignalConfig

  @nn.compact
  def __call__(self, signal, *, deterministic=True):
    cfg = self.cfg
    frames = signal.reshape(signal.shape[0], cfg.num_frames, cfg.frame)
    x = layers.Linear((cfg.width,), ('frame',), ('embed',), dtype=cfg.compute_dtype,
                      param_dtype=cfg.weight_dtype, name='embed')(frames)
    x = x + self.param('pos_embed', nn.with_logical_partitioning(
        nn.initializers.normal(0.02), ('positions', 'embed')), (cfg.num_frames, cfg.width))[None]
    x = common.stack(cfg, cfg.num_layers, name='encoder')(x, deterministic=deterministic)
    x = common.norm(cfg)(name='final_norm')(x).mean(axis=1)
    return layers.Linear((cfg.num_classes,), ('embed',), ('classes',), dtype=cfg.compute_dtype,
                         param_dtype=cfg.weight_dtype, out_dtype=jnp.float32, name='head')(x)


@data.register_part
@dataclasses.dataclass(frozen=True)
class SignalSettings(data.DataPart):
  PART = 'signal'
  signal_noise: float = 0.1  # the standard deviation of the noise added to each sine

  RANGES = {'signal_noise': Range(0)}


class SineTask:
  """{'signal': float32 (b, L), 'label': int32 (b,)}: a sine of frequency (label + 1) cycles
  per frame at a random phase, plus noise; a batch is a pure function of (seed, step)."""

  def __init__(self, settings, seed: int, *, signal_length: int, frame: int, num_classes: int):
    self.seed, self.length, self.frame = seed, signal_length, frame
    self.num_classes = num_classes
    self.noise = settings.part(SignalSettings).signal_noise
    self.num_eval_examples = settings.eval_examples
    self.vocab = None
    self.info = {'num_classes': num_classes, 'signal_length': signal_length}

  def _examples(self, generator, count: int) -> dict:
    labels = generator.integers(0, self.num_classes, size=count)
    phase = generator.uniform(0, 2 * np.pi, size=(count, 1))
    t = np.arange(self.length) / self.frame
    signal = np.sin(2 * np.pi * (labels[:, None] + 1) * t / 4 + phase)
    signal += self.noise * generator.standard_normal(signal.shape)
    return {'signal': signal.astype(np.float32), 'label': labels.astype(np.int32)}

  def train_batch(self, step: int, batch_size: int, rows: slice) -> dict:
    batch = self._examples(rng.generator(rng.GENERATE, self.seed, step), batch_size)
    return {key: value[rows] for key, value in batch.items()}

  def eval_examples(self, indices: np.ndarray) -> dict:
    examples = [self._examples(rng.generator(rng.HELD_OUT, int(i)), 1) for i in indices]
    return {key: np.concatenate([e[key] for e in examples]) for key in examples[0]}


def make_sine_task(settings, seed, tokenizer_dir=None, *, signal_length, frame, num_classes,
                   **unused):
  del tokenizer_dir, unused
  return SineTask(settings, seed, signal_length=signal_length, frame=frame,
                  num_classes=num_classes)


data.register_task(data.Task('signal', make_sine_task, ('synthetic',)))

FAMILY = registry.register(registry.Family(
    name='signal', module=SignalClassifier,
    example_inputs=lambda cfg, batch=1, seq_len=None: (
        jnp.zeros((batch, cfg.signal_length), jnp.float32),),
    logits=lambda apply, batch: apply(batch['signal']), task='signal', targets='label',
    config=SignalConfig, classification=True, unit='signal',
    stacks=lambda cfg, seq_len=None: [
        registry.Stack('encoder', cfg.num_layers, cfg.num_frames, (cfg.num_frames,))],
    batch_shapes=lambda cfg, batch_size, seq_len=None: {
        'signal': jax.ShapeDtypeStruct((batch_size, cfg.signal_length), jnp.float32),
        'label': jax.ShapeDtypeStruct((batch_size,), jnp.int32)},
    data_sizes=lambda cfg: {'signal_length': cfg.signal_length, 'frame': cfg.frame,
                            'num_classes': cfg.num_classes},
    describe=lambda cfg: f'signals of {cfg.signal_length} samples in frames of {cfg.frame}'))


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, steps=20)
  config = config_lib.base_config('signal')
  config.model.update(width=32, num_layers=2, num_heads=4, dtype='float32')
  config.data.update(name='synthetic', batch_size=16, eval_batch_size=16, eval_examples=64)
  config.optimizer.update(learning_rate=3e-3, warmup_steps=2)
  config.training.update(steps=arg.steps, log_every=5, eval_every=arg.steps,
                         checkpoint_every=arg.steps)
  return config
