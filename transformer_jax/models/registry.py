"""The registry of model families: everything the library knows of a family, in one entry.

Training, evaluation, decoding, the accounting, the memory plan, `--mode=compile` and
`--mode=describe` read a family only through its `Family`, so adding one is a module, the
dataclass of its settings and one `register(Family(...))`: see transformer_jax/models/decoder.py,
the family with a setting of its own in tests/conv_family.py, or one whose inputs are a 1-D
signal, with a data task of its own, in tests/signal_family.py.
"""
import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp

from transformer_jax.errors import ConfigError
from transformer_jax.model_config import ModelConfig

__all__ = ['Apply', 'EMBEDDING_NAMES', 'Family', 'get', 'names', 'of_module', 'PARTS', 'register',
           'Stack', 'text_batch_shapes', 'text_packed_shapes']

Apply = Callable[..., jax.Array]  # the module applied to its params (and rngs, deterministic)

# The parts a parameter count is split into (Family.param_counts, transformer_jax.accounting).
PARTS = ('embedding', 'attention', 'mlp', 'norms', 'head', 'other')
# Top-level parameters that embed the inputs, in every family (and read by the weight-decay mask).
EMBEDDING_NAMES = ('embed', 'patch_embed', 'pos_embed', 'cls_token')


def _no_checks(*args) -> None:
  del args


def _no_lengths(batch: dict) -> tuple[int | None, int | None]:
  del batch
  return None, None


@dataclasses.dataclass(frozen=True)
class Stack:
  """A stack of blocks as the memory plan counts it: `blocks` blocks over `tokens` positions per
  example, each block's attentions over `keys` keys each (self-attention, then cross-attention),
  sized by `config` (None: the family's config; a dual encoder's tower: its own). A stack named
  as a parameter subtree the family's `frozen` names keeps nothing for a backward pass."""
  name: str
  blocks: int
  tokens: int
  keys: tuple[int, ...]
  config: ModelConfig | None = None


def _one_stack(cfg: ModelConfig, seq_len: int) -> list[Stack]:
  return [Stack('blocks', cfg.num_layers, seq_len, (seq_len,))]


def text_batch_shapes(cfg: ModelConfig, batch_size: int, seq_len: int) -> dict:
  """A next-token or masked batch: ids and targets (int32) and their weights (float32)."""
  del cfg
  shape = (batch_size, seq_len)
  return {'inputs': jax.ShapeDtypeStruct(shape, jnp.int32),
          'targets': jax.ShapeDtypeStruct(shape, jnp.int32),
          'weights': jax.ShapeDtypeStruct(shape, jnp.float32)}


def text_packed_shapes(shapes: dict) -> dict:
  """A packed next-token or masked batch (data.packing) from `shapes`, the {key:
  ShapeDtypeStruct} of the batch unpacked: each row's segment ids and positions, and weights of
  the targets (zero on the padding after a row's last document)."""
  rows = shapes['inputs'].shape[:2]
  return {**shapes, 'segment_ids': jax.ShapeDtypeStruct(rows, jnp.int32),
          'positions': jax.ShapeDtypeStruct(rows, jnp.int32),
          'weights': jax.ShapeDtypeStruct(shapes['targets'].shape, jnp.float32)}


def _no_sizes(cfg: ModelConfig) -> dict:
  del cfg
  return {}


def _follows_nothing(cfg: ModelConfig, sizes: dict, source: str) -> ModelConfig:
  del sizes, source
  return cfg


@dataclasses.dataclass(frozen=True)
class Family:
  """One model family.

  name: the value of config.model.family.
  module: the Flax module of a config (cfg -> nn.Module).
  config: the family's settings, a frozen dataclass extending model_config.ModelConfig (or a
    family's config such as models.common.TextConfig) that checks its own values; the keys of
    config.model are its fields.
  example_inputs: (cfg, batch, seq_len) -> the positional arguments of the module's __call__
    with the right shapes, for init and jax.eval_shape (seq_len None: a default).
  logits: (apply, batch) -> float32 logits of a batch of `task`'s data. A packed batch, whose
    rows hold several documents, has segment ids and positions that restart at each document
    ('segment_ids' and 'positions'; a seq2seq batch 'input_' and 'target_' ones of each): its
    attention stays within each document and its positions are those (models.common's
    packed_arguments).
  task: the data it trains on, a key of data.TASKS: 'image', 'next_token', 'masked', 'seq2seq'.
  targets: the batch key of the integer targets; each is weighted by batch['weights'] where the
    batch has them, else by 1.
  classification: evaluation reports top-5 accuracy.
  decoding: how decode.generate runs it: None (it cannot: no causal mask), 'decoder' or
    'encoder_decoder' (the two cache protocols documented in transformer_jax.decode).
  unit: what one example is counted in: 'token', a text position: an example is data.seq_len
    tokens (FLOPs per token at that length, tokens per second in the logs, the batch as
    B x seq_len in describe, data.seq_len checked against a learned position table); any other
    name ('image', 'second of audio') is one whole example, whatever data.seq_len says.
  check_data: (data.info, cfg) -> None, raising ConfigError where the data does not fit.
  lengths: batch -> (seq_len, target_len) of its examples, for the FLOPs of a step.
  param_counts: cfg -> {part: count} by the analytic formulas (PARTS); None: only
    the initialized tree is counted.
  forward_flops: (cfg, seq_len, target_len) -> {'dense', 'attention', 'tokens'} analytic FLOPs
    of one example's forward pass; None: XLA's cost analysis of the forward pass.

  loss: (apply, batch, rng, label_smoothing) -> the summed loss terms of a batch ({'loss',
    'weight', and any metrics, summed over the batch's examples as losses.loss_sums's are}) of a
    family whose objective is not the cross-entropy of `logits` (a diffusion model's noise
    regression, a contrastive loss); rng: a key of the step's own for the family's noise
    (fixed at evaluation); apply: the module applied as for `logits`. None: loss_sums of the
    logits against `targets`.
  chunked_logits: its logits are a models.common.LmHead's, which records its inputs so that
    the training loss can compute them a chunk of positions at a time (training.logits_chunk).
  loss_over_batch: the family's loss is one function of the whole global batch (a contrastive
    loss, whose negatives are the batch's other examples), not a sum over its examples: the
    per-device steps of parallelism='shard_map' and microbatches of training.grad_accum_steps
    would each see part of the batch, and are refused.

  What the rest of the library asks of a family instead of reading its settings:
  stacks: (cfg, seq_len) -> [Stack]: the blocks it runs and the positions they see (the memory
    plan, describe); seq_len is data.seq_len, which a family of fixed inputs ignores.
  batch_shapes: (cfg, batch_size, seq_len) -> {key: ShapeDtypeStruct} of a global training
    batch of its task, unpacked (the memory plan).
  packed_shapes: {key: ShapeDtypeStruct} of a batch of its task unpacked -> those of the same
    batch with data.packing (rows of several documents, with the segment ids and positions that
    `logits` reads; text_packed_shapes for next-token and masked text), for --mode=compile,
    whose generated stand-in is never packed. None: data.packing leaves its batches as they are.
  logits_shape: (cfg, seq_len) -> (positions, classes) of one example's float32 logits where
    they matter to the memory plan (a vocabulary at every position); None: they do not.
  data_sizes: cfg -> {size: value} of its settings that the data shares (image_size,
    num_classes, vocab_size...): passed to the task's maker; 0 or None: unset.
  follow_data: (cfg, sizes, source) -> cfg whose unset sizes take those the data states
    (`sizes`: the data settings' at the top, the data's info once read, named by `source`); a
    size set that the data cannot fit is refused, naming both.
  describe: cfg -> what else sizes the model, for describe ('32x32 images in patches of 4').
  depth_keys: the settings that count its blocks (config_lib.smoke shrinks each).
  frozen: cfg -> the top-level parameter subtrees that do not train (a locked tower): the
    optimizer keeps no state for them and leaves them as they are; the module stops their
    gradient.
  starts: cfg -> {subtree: source} of the parameter subtrees a run starts from another run's
    workdir (WORKDIR[:STEP]) or a Hugging Face directory (train.towers loads them).
  tower: (cfg, subtree) -> (the settings of the part a source fills, {a setting of them: the
    model.* key that sets it} where the names differ), which train.towers checks the source's
    against (a dual encoder's text tower: an encoder config, its width set by text_width).
  constrain: (cfg, params) -> the trained parameters after each optimizer update, where the
    family's recipe bounds some of them there rather than in the forward pass (CLIP's
    temperature, clamped as open_clip clamps it); given the tree the optimizer trains (a LoRA
    run's adapters, which hold none of them). Default: as they are.

  Sampling, for a family that does not decode text:
  sample_settings: the Settings class of config.sample (None: decode.SampleSettings), with
    check_for(cfg), its rules against the model's, which --mode=sample checks before reading.
  sample: (model, params, step, sample settings, workdir) -> what --mode=sample returns, from
    the parameters of the workdir's latest checkpoint (None: decode's text sampling).

  Evaluation beyond the held-out loss:
  eval_settings: the Settings class of config.eval (None: decode.EvalSettings), with
    check_for(cfg) checked when the run's settings are resolved.
  evaluate: (run, params) -> {'eval_NAME': value} added to every evaluation (None: nothing).
  """
  name: str
  module: Callable[[ModelConfig], Any]
  example_inputs: Callable[[ModelConfig, int, int | None], tuple]
  logits: Callable[[Apply, dict], jax.Array]
  task: str
  config: type[ModelConfig]
  targets: str = 'targets'
  classification: bool = False
  decoding: str | None = None
  unit: str = 'token'
  check_data: Callable[[dict, ModelConfig], None] = _no_checks
  lengths: Callable[[dict], tuple[int | None, int | None]] = _no_lengths
  param_counts: Callable[[ModelConfig], dict[str, int]] | None = None
  forward_flops: Callable[[ModelConfig, int | None, int | None], dict[str, int]] | None = None
  loss: Callable[[Apply, dict, jax.Array, float], dict] | None = None
  chunked_logits: bool = False
  loss_over_batch: bool = False
  stacks: Callable[[ModelConfig, int], list[Stack]] = _one_stack
  batch_shapes: Callable[[ModelConfig, int, int], dict] = text_batch_shapes
  packed_shapes: Callable[[dict], dict] | None = None
  logits_shape: Callable[[ModelConfig, int], tuple[int, int] | None] = lambda cfg, seq_len: None
  data_sizes: Callable[[ModelConfig], dict] = _no_sizes
  follow_data: Callable[[ModelConfig, dict, str], ModelConfig] = _follows_nothing
  describe: Callable[[ModelConfig], str] = lambda cfg: ''
  depth_keys: tuple[str, ...] = ('num_layers',)
  frozen: Callable[[ModelConfig], tuple[str, ...]] = lambda cfg: ()
  starts: Callable[[ModelConfig], dict[str, str]] = lambda cfg: {}
  tower: Callable[[ModelConfig, str], tuple[ModelConfig, dict[str, str]]] = (
      lambda cfg, part: (cfg, {}))
  constrain: Callable[[ModelConfig, dict], dict] = lambda cfg, params: params
  sample_settings: type | None = None
  sample: Callable[..., Any] | None = None
  eval_settings: type | None = None
  evaluate: Callable[..., dict] | None = None

  @property
  def per_token(self) -> bool:
    """Whether an example is counted in tokens, data.seq_len of them (`unit` 'token')."""
    return self.unit == 'token'

  def weights(self, batch: dict) -> jax.Array:
    """Float32 weight of each target: the batch's 'weights', else one per target."""
    if 'weights' in batch:
      return batch['weights'].astype(jnp.float32)
    return jnp.ones(batch[self.targets].shape, jnp.float32)


_FAMILIES: dict[str, Family] = {}


def register(family: Family) -> Family:
  """Adds (or replaces) a family; returns it, so a module can end with FAMILY = register(...)."""
  _FAMILIES[family.name] = family
  return family


def get(name: str) -> Family:
  if name not in _FAMILIES:
    raise ConfigError(f'Unknown family {name!r}: set model.family to one of {names()}, or '
                      'register a family of your own (transformer_jax.models.registry.register).')
  return _FAMILIES[name]


def of_module(module) -> Family | None:
  """The registered family whose config `module` carries (`module.cfg.family`); None for a
  module of one's own."""
  name = getattr(getattr(module, 'cfg', None), 'family', None)
  return _FAMILIES.get(name) if isinstance(name, str) else None


def names() -> list[str]:
  return sorted(_FAMILIES)
