"""Settings: a config section resolved once into a frozen dataclass, every key with its type,
default and valid values declared in one place, checked when it is made; the training and mesh
sections' here, the others' beside the code that reads them (data, decode, train.optim, lora)."""
import copy
import dataclasses
import types
import typing
from typing import Any, Mapping

from transformer_jax.errors import ConfigError
from transformer_jax.ranges import COUNT, FRACTION, Range

__all__ = ['check_templates', 'CompileSettings', 'MeshSettings', 'OptimizerSettings', 'Settings',
           'TrainingSettings']


class Settings:
  """A base of frozen dataclasses whose fields are the keys of one config section (SECTION).
  RANGES and CHOICES give the valid values of its numeric and string keys; `check` (run when the
  settings are made) fails on any other with a ConfigError naming the key and a value that works.
  A subclass with rules across keys extends `check`."""
  SECTION: typing.ClassVar[str] = ''
  RANGES: typing.ClassVar[dict[str, Range]] = {}
  CHOICES: typing.ClassVar[dict[str, tuple]] = {}

  def __post_init__(self):
    self.check()

  def check(self) -> None:
    defaults = self.defaults()
    for name, valid in self.RANGES.items():
      valid.check(f'{self.SECTION}.{name}', getattr(self, name), defaults.get(name))
    for name, allowed in self.CHOICES.items():
      if getattr(self, name) not in allowed:
        raise ConfigError(f'{self.SECTION}.{name}={getattr(self, name)!r} must be one of '
                          f'{list(allowed)}.')

  @classmethod
  def of(cls, section: 'Mapping[str, Any] | Settings'):
    """The settings of a config section (a ConfigDict or a dict); None or missing: the
    default; a key that is no field fails, naming the fields."""
    if isinstance(section, cls):
      return section
    values = {key: value for key, value in dict(section).items() if value is not None}
    unknown = sorted(set(values) - set(cls.defaults()))
    if unknown:
      raise ConfigError(f'Unknown {cls.SECTION} settings {unknown}: the keys of config.'
                        f'{cls.SECTION} are {sorted(cls.defaults())}.')
    return cls(**{key: tuple(value) if isinstance(value, list) else value
                  for key, value in values.items()})

  @classmethod
  def defaults(cls) -> dict[str, Any]:
    return {field.name: field.default for field in dataclasses.fields(cls)}

  @classmethod
  def placeholder_types(cls) -> dict[str, type]:
    """The type of each field whose default is None (a typed placeholder in the config)."""
    return {field.name: next(t for t in typing.get_args(field.type) if t is not type(None))
            for field in dataclasses.fields(cls) if isinstance(field.type, types.UnionType)}


def check_templates(templates: tuple[str, ...], key: str) -> None:
  """Refuses caption templates that are not each a string with one '{}' for a class name."""
  bad = [t for t in templates if not isinstance(t, str) or t.count('{}') != 1]
  if not templates or bad:
    raise ConfigError(f'{key}={tuple(templates)}: give captions with one {{}} each for the class '
                      "name, as ('a photo of a {}.', 'a blurry photo of the {}.').")


@dataclasses.dataclass(frozen=True)
class TrainingSettings(Settings):
  """The keys of config.training."""
  SECTION = 'training'
  steps: int = 1000
  grad_accum_steps: int = 1  # the global batch is split into this many sequential microbatches
  label_smoothing: float = 0.0  # of the training loss, every family (Szegedy et al. 2016)
  # T5X's auxiliary z-loss (PaLM, Chowdhery et al. 2022, section 5): z_loss * log(Z)^2 per
  # target position, Z the softmax's normalizer, weighted as the cross-entropy is and added to
  # the training objective (T5: 1e-4); logged as its own metric 'z_loss', left out of 'loss'.
  # Of a family whose loss is the cross-entropy of its logits (one with a loss of its own, as
  # DiT's or CLIP's, refuses it).
  z_loss: float = 0.0
  # The training loss (and evaluation) of a model whose logits come from its language-model
  # head (decoders, encoder-decoders, Whisper) computes them this many positions of each
  # sequence at a time, with their gradient, in one pass (train.chunked_loss): no (batch,
  # length, vocabulary) array in memory, and on XLA:CPU a faster step (Whisper's head and loss,
  # 2.9 -> 2.1 s). 0: all the logits at once, then the loss.
  logits_chunk: int = 0
  # What the summed loss of a global batch is divided by: None, its total weight (the mean over
  # its real target tokens, T5X's 'NUM_REAL_TARGET_TOKENS'); a number, that constant (T5X's
  # loss_normalizing_factor: Mesh TF's T5 divided by batch size x target length, 2048 x 114),
  # so that every token weighs the same in every batch. The logged loss stays the mean.
  loss_normalizing_factor: float | None = None
  log_every: int = 50
  eval_every: int = 500
  checkpoint_every: int = 500
  keep_checkpoints: int = 3
  peak_flops_per_device: float | None = None  # for MFU where the table has none
  # A jax.profiler trace of profile_steps steps from step profile_start (as the log numbers them;
  # unset: none), in WORKDIR/profile for TensorBoard/XProf and Perfetto. A run resumed past that
  # step traces nothing.
  profile_start: int | None = None
  profile_steps: int = 3
  # The memory of one device, for the plan of --mode=describe; unset: what JAX reports for the
  # device (GPUs and TPUs do; a CPU does not).
  device_memory_gb: float | None = None
  # An exponential moving average of the trained parameters, ema <- decay_t * ema + (1 -
  # decay_t) * params after update t (DiT: 0.9999), checkpointed with the state; evaluation and
  # --mode=sample run it. 0: none. With ema_warmup, decay_t = 0 at t = 0, then min(ema_decay,
  # (1 + t) / (10 + t)) (diffusers' EMAModel, TensorFlow's ExponentialMovingAverage with
  # num_updates), so that a run shorter than the average's horizon still averages its own
  # recent steps rather than its initialization; False keeps ema_decay from the start (DiT's
  # train.py, whose EMA starts at the initial weights; at 0.9999 the weights the two averages
  # give the steps differ by 2% in all after 100k steps, by 1e-6 after 200k).
  ema_decay: float = 0.0
  ema_warmup: bool = True

  RANGES = {
      'steps': COUNT, 'grad_accum_steps': COUNT, 'label_smoothing': FRACTION,
      'log_every': COUNT, 'eval_every': COUNT, 'checkpoint_every': COUNT,
      'keep_checkpoints': COUNT,
      'peak_flops_per_device': Range(0, open_low=True, optional=True, example=1e12),
      'device_memory_gb': Range(0, open_low=True, optional=True, example=16),
      'profile_start': Range(1, integer=True, optional=True, example=10),
      'profile_steps': COUNT, 'ema_decay': FRACTION, 'z_loss': Range(0),
      'logits_chunk': Range(0, integer=True),
      'loss_normalizing_factor': Range(0, open_low=True, optional=True, example=233472),
  }

  def check(self) -> None:
    super().check()
    if self.profile_start is not None and self.profile_start > self.steps:
      raise ConfigError(f'training.profile_start={self.profile_start} is past the last step '
                        f'(training.steps={self.steps}): for example '
                        f'--config.training.profile_start={min(10, self.steps)}.')


@dataclasses.dataclass(frozen=True)
class MeshSettings(Settings):
  """The device mesh: axis names and sizes; -1 takes all remaining devices of all processes.
  Tensor parallelism needs a 'model' axis: axes=('data', 'model'), shape=(-1, 2)."""
  SECTION = 'mesh'
  axes: tuple[str, ...] = ('data',)
  shape: tuple[int, ...] = (-1,)

  def check(self) -> None:
    axes, shape = tuple(self.axes), tuple(self.shape)
    if len(axes) != len(shape) or len(set(axes)) != len(axes):
      raise ConfigError(f'mesh.axes={axes} and mesh.shape={shape} must name distinct axes, one '
                        "size each: for example --config.mesh.axes=\"('data',)\" "
                        '--config.mesh.shape="(-1,)".')
    if any(not isinstance(s, int) or (s < 1 and s != -1) for s in shape) or shape.count(-1) > 1:
      raise ConfigError(f'mesh.shape={shape} must hold positive sizes and at most one -1 (all '
                        'the remaining devices).')


@dataclasses.dataclass(frozen=True)
class CompileSettings(Settings):
  """The keys of config.compile."""
  SECTION = 'compile'
  # The accelerator to compile the run's steps for, without it (transformer_jax.targets): a TPU
  # topology 'v5e:2x2', a Cloud TPU type 'v4-8', or GPUs 'h100x8'. --mode=compile needs one;
  # --mode=describe describes the run on it; unset: on this machine's devices.
  target: str = ''
  # --mode=describe compiles the train step (for the target, else for this machine where it
  # states a memory to fit in: a GPU or TPU, or training.device_memory_gb) and prints XLA's
  # bytes per device beside the plan's, and whether the step fits by XLA's figure; kept in the
  # user's cache (aot.train_step_memory), so that describing it again compiles nothing.
  # False: the plan alone, an instant estimate, as where the target's compiler is not installed.
  xla_memory: bool = True


@dataclasses.dataclass(frozen=True)
class OptimizerSettings(Settings):
  """The keys of config.optimizer (train.optim.make_optimizer). A key of one optimizer (b1, b2,
  eps: AdamW's and Muon's; muon_*, adafactor_*, sgd_*) or one schedule (min_lr_ratio,
  decay_fraction) set with another is refused: it would silently do nothing."""
  SECTION = 'optimizer'
  # 'adamw'; 'muon': Muon on the blocks' projection matrices (train.optim.muon_dimension_numbers),
  # this AdamW on the embeddings, norms, biases and heads; 'adafactor': T5X's Adafactor (the
  # adafactor_* keys; train.optim.scale_by_adafactor); 'sgd': SGD with momentum (sgd_*).
  name: str = 'adamw'
  # The peak rate; of schedule='rsqrt', the constant factor (T5: 1.0, a rate of 0.01 for the
  # first 10^4 steps).
  learning_rate: float = 1e-3
  # 'cosine', 'linear', 'wsd' and 'constant' rise linearly over these steps to learning_rate;
  # 'rsqrt' holds learning_rate / sqrt(warmup_steps) over them. Refused past training.steps.
  warmup_steps: int = 0
  # After the warmup: 'cosine' decays to min_lr_ratio * learning_rate at the last step,
  # 'linear' linearly (BERT, Whisper), 'wsd' holds it and decays to that floor over the last
  # decay_fraction of training.steps as 1 - sqrt (Hagele et al. 2024); 'constant' holds it;
  # 'rsqrt': learning_rate / sqrt(max(step, warmup_steps)) (T5, T5X's 'constant * rsqrt_decay').
  schedule: str = 'cosine'
  min_lr_ratio: float = 0.0
  decay_fraction: float = 0.2
  b1: float = 0.9
  b2: float = 0.95
  eps: float = 1e-8
  # Decoupled, times the learning rate (AdamW's, and so for SGD and Adafactor).
  weight_decay: float = 0.1
  # Decay only the matmul kernels by default: norms, biases and embeddings are not decayed.
  decay_norms_and_biases: bool = False
  decay_embeddings: bool = False
  grad_clip_norm: float = 1.0  # 0: no clipping (of all the gradients, Muon's too)
  # Muon's settings: its peak learning rate (larger than AdamW's; the warmup and schedule above
  # apply to it too), momentum (beta) and whether it is Nesterov's, the Newton-Schulz iterations
  # that orthogonalize the momentum, and decoupled weight decay (times its rate).
  muon_learning_rate: float = 0.02
  muon_momentum: float = 0.95
  muon_nesterov: bool = True
  muon_ns_steps: int = 5
  muon_weight_decay: float = 0.0
  # Adafactor's (Shazeer & Stern 2018) as T5X's defaults: the second moments' decay
  # 1 - (step + 1)^-decay_rate, factored into row and column means for a matrix whose sides both
  # reach min_dim_size_to_factor, epsilon added to the squared gradients, each matrix's update
  # clipped to an RMS of clipping_threshold (0: not clipped) and, with param_scale, scaled by
  # the parameter's RMS (at least min_param_scale). No momentum, as T5 trains.
  adafactor_decay_rate: float = 0.8
  adafactor_min_dim_size_to_factor: int = 128
  adafactor_eps: float = 1e-30
  adafactor_clipping_threshold: float = 1.0
  adafactor_param_scale: bool = True
  adafactor_min_param_scale: float = 1e-3
  # SGD's momentum (PyTorch's and optax.trace's: buffer = momentum * buffer + gradient) and
  # whether it is Nesterov's.
  sgd_momentum: float = 0.9
  sgd_nesterov: bool = False

  RANGES = {
      'learning_rate': Range(0, open_low=True), 'warmup_steps': Range(0, integer=True),
      'min_lr_ratio': Range(0, 1), 'decay_fraction': Range(0, 1), 'b1': FRACTION,
      'b2': FRACTION,
      'eps': Range(0, open_low=True),  # 0 divides 0 by 0 for a never-used embedding row
      'weight_decay': Range(0), 'grad_clip_norm': Range(0),
      'muon_learning_rate': Range(0, open_low=True), 'muon_momentum': FRACTION,
      'muon_ns_steps': COUNT, 'muon_weight_decay': Range(0),
      'adafactor_decay_rate': Range(0, open_low=True), 'adafactor_min_dim_size_to_factor': COUNT,
      'adafactor_eps': Range(0, open_low=True), 'adafactor_clipping_threshold': Range(0),
      'adafactor_min_param_scale': Range(0, open_low=True), 'sgd_momentum': FRACTION,
  }
  CHOICES = {'name': ('adamw', 'muon', 'adafactor', 'sgd'),
             'schedule': ('cosine', 'linear', 'wsd', 'constant', 'rsqrt')}
  # The optimizers and schedules that read a key of their own; every other key is shared.
  OPTIMIZER_KEYS: typing.ClassVar[dict[str, tuple[str, ...]]] = {
      'b1': ('adamw', 'muon'), 'b2': ('adamw', 'muon'), 'eps': ('adamw', 'muon'),
      'muon_': ('muon',), 'adafactor_': ('adafactor',), 'sgd_': ('sgd',)}
  SCHEDULE_KEYS: typing.ClassVar[dict[str, tuple[str, ...]]] = {
      'min_lr_ratio': ('cosine', 'linear', 'wsd'), 'decay_fraction': ('wsd',)}

  def check(self) -> None:
    super().check()
    defaults = self.defaults()
    for setting, readers, owners in (('name', self.OPTIMIZER_KEYS, self.name),
                                     ('schedule', self.SCHEDULE_KEYS, self.schedule)):
      for key, default in defaults.items():
        users = next((u for prefix, u in readers.items() if key.startswith(prefix)), None)
        if users and owners not in users and getattr(self, key) != default:
          raise ConfigError(f'optimizer.{key}={getattr(self, key)!r} is read by optimizer.'
                            f'{setting}={" or ".join(map(repr, users))}, not by {owners!r}: '
                            f'leave it at {default!r}, or set --config.optimizer.{setting}='
                            f'{users[0]}.')
    if self.schedule == 'rsqrt' and self.warmup_steps == 0:
      raise ConfigError("optimizer.schedule='rsqrt' is learning_rate / sqrt(max(step, "
                        'warmup_steps)), infinite at step 0 with optimizer.warmup_steps=0: for '
                        "example --config.optimizer.warmup_steps=10000 (T5's).")

  def check_steps(self, steps: int) -> None:
    """Refuses a schedule that does not fit in a run of `steps` (training.steps): a warmup past
    its end, or a warmup and a 'wsd' decay that overlap. Traced numbers (a vmapped sweep's) were
    checked in each run's own settings, and are passed over."""
    warmup = self.warmup_steps
    if not isinstance(warmup, int):
      return
    if warmup > steps:
      raise ConfigError(f'optimizer.warmup_steps={warmup} is past the end of the run '
                        f'(training.steps={steps}), whose schedule would never leave its warmup: '
                        f'for example --config.optimizer.warmup_steps={steps // 10}.')
    if self.schedule == 'wsd' and isinstance(self.decay_fraction, (int, float)):
      decay = self.decay_fraction * steps
      if warmup + decay > steps:
        raise ConfigError(f'optimizer.warmup_steps={warmup} and the decay over the last '
                          f'optimizer.decay_fraction={self.decay_fraction} of training.steps='
                          f'{steps} ({decay:g} steps) overlap: shorten one of them.')

  def with_traced(self, **numbers) -> 'OptimizerSettings':
    """A copy holding traced numbers in place of these (a vmapped sweep's runs'), unchecked:
    each run's numbers were checked when its own settings were made."""
    traced = copy.copy(self)
    for name, value in numbers.items():
      object.__setattr__(traced, name, value)
    return traced
