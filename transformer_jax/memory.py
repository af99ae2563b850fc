"""A per-device memory plan of a run, before anything is allocated: the state by its real
shardings, the train step's activations by a count of what the backward pass keeps, the KV cache.

State: parameters, optimizer state and gradients (gradients have the parameters' shapes and
shardings) from the abstract train state and its NamedShardings: exact on XLA:CPU and XLA:GPU,
and on XLA:TPU counted in the (8, 128) tiles it stores arrays in. Activations: for each block,
the tensors of each size that the backward pass reads (of the width, of the heads, of the MLP's
hidden units, of the attention matrices), times how many copies of that size XLA keeps live at
the step's peak (ACTIVATION_COPIES), split over the mesh axes the rules split them on (the batch
over 'data'; heads, MLP units and vocabulary over 'model' under tensor parallelism), plus the
float32 logits; on XLA:TPU each in its tiles, in the layout its kernel reads.

The copies are fitted to each compiler (XLA:CPU, XLA:TPU, XLA:GPU), which fuse differently, by
experiments/fit_memory.py on a fit set of compiled train steps, and judged on a test set chosen
before the fit (docs/memory_plan.md; figures in experiments/results/compile_targets/README.md).
memory_fit.json holds the copies and the test's plan / XLA by kind of model, which `accuracy`
reports. The parameters and optimizer state are exact; the rest is an estimate, which
--mode=describe prints beside XLA's own figure where the compiler is installed.
"""
import dataclasses
import functools
import json
import math
import os

import jax
import jax.numpy as jnp

from transformer_jax import accounting, decode, kernels, models
from transformer_jax.layers import axes
from transformer_jax.model_config import ModelConfig
from transformer_jax.train import run_settings, setup, sharding
from transformer_jax.train.step import LoraState

__all__ = ['kv_cache_bytes', 'activation_bytes', 'activation_terms', 'ACTIVATION_COPIES', 'Plan',
           'plan']

# Copies of each size that XLA keeps live at the step's peak, per block and token: of the width D
# (the residual stream, the norms' inputs and outputs, the projections' inputs and their
# gradients), of the heads' width ((H + KV) * head_dim / 2: queries, keys, values, attention
# output), of the MLP's hidden units F (pre-activations, activations, their product), per query
# and key of the attention matrices (scores, exponentials, probabilities, their gradient), and of
# them again in float32 where a sequence reaches LONG_ATTENTION queries x keys; of the float32
# logits; and of the state the step makes: the gradients, and FSDP's gathered weights.
ACTIVATION_TERMS = ('width', 'heads', 'mlp', 'attention', 'long_attention', 'logits',
                    'block_inputs')
LONG_ATTENTION = 1024 * 1024  # queries x keys from which XLA:TPU keeps the attention matrices
TERMS = ('gradients', 'gathered', *ACTIVATION_TERMS)
FIT_PATH = os.path.join(os.path.dirname(__file__), 'memory_fit.json')


def read_fit() -> dict:
  """memory_fit.json: the command that wrote it, the copies fitted to each compiler and the
  test set's plan / XLA by kind of model (docs/memory_plan.md)."""
  with open(FIT_PATH) as f:
    return json.load(f)


_FIT = read_fit()
ACTIVATION_COPIES = _FIT['copies']
# With model.remat_policy='full' a block keeps only its input, and recomputes the rest during its
# backward pass: one block's activations, at a time.


@dataclasses.dataclass(frozen=True)
class Plan:
  """Bytes per device."""
  params: int  # the trained parameters, with LoRA the frozen base, and their moving average
  optimizer: int
  gradients: int
  gathered: int  # FSDP: the weights split over the batch's axis, gathered whole for the step
  batch: int
  activations: int
  kv_cache: int | None  # decoding, per sequence of the context length; None: no causal mask
  devices: int
  terms: dict[str, float]  # the bytes of one copy of each term of ACTIVATION_COPIES

  @property
  def train_total(self) -> int:
    return (self.params + self.optimizer + self.gradients + self.gathered + self.batch
            + self.activations)


def _sharded_bytes(tree, shardings, platform: str) -> int:
  return sum(_array_bytes(s.shard_shape(x.shape), jnp.dtype(x.dtype).itemsize, platform)
             for x, s in zip(jax.tree.leaves(tree), jax.tree.leaves(shardings)))


def _array_bytes(shape: tuple[int, ...], itemsize: int, platform: str) -> int:
  """Bytes of an array of `shape` as `platform` stores it. XLA:TPU stores it in tiles over the
  two dimensions its layout makes minor (the pair that pads least, as XLA:TPU picks it; _tiled),
  a vector in tiles of 128 to 1,024 elements, everything in 512 bytes at least."""
  size = math.prod(shape) * itemsize
  if platform != 'tpu' or not shape:
    return max(size, 512) if platform == 'tpu' else size
  if len(shape) == 1:
    tile = min(1024, max(512 // itemsize, 1 << (shape[0] - 1).bit_length()))
    return -(-shape[0] // tile) * tile * itemsize
  return max(min(math.prod(shape) // (shape[m] * shape[s])
                 * _tiled('tpu', shape[m], shape[s], itemsize)
                 for m in range(len(shape)) for s in range(len(shape)) if m != s) * itemsize, 512)


def _gathered_bytes(params, shardings, batch_axes: set[str]) -> int:
  """What gathering the weights split over the batch's mesh axes adds: each such weight whole
  over those axes (still split over the others), less its own shard."""
  total = 0
  for x, s in zip(jax.tree.leaves(params), jax.tree.leaves(shardings)):
    spec = [(a,) if isinstance(a, str) else tuple(a or ()) for a in s.spec]
    if not any(set(axes) & batch_axes for axes in spec):
      continue
    kept = [math.prod(s.mesh.shape[a] for a in axes if a not in batch_axes) for axes in spec]
    whole = math.prod(d // k for d, k in zip(x.shape, kept + [1] * (x.ndim - len(kept))))
    total += (whole - math.prod(s.shard_shape(x.shape))) * jnp.dtype(x.dtype).itemsize
  return total


def activation_terms(settings, split, platform: str = 'cpu') -> dict[str, float]:
  """Bytes per device of one copy of each term of ACTIVATION_COPIES, over every block of the
  run's resolved settings (one block under remat 'full', besides every block's input);
  `split(name)` says how many ways a logical activation axis is split. On XLA:TPU each array is
  counted in its tiles, in the layout its kernel reads (_tiled). Each of the family's stacks is
  sized by its own config (a dual encoder's towers); a locked one (the family's frozen) counts
  nothing."""
  top, family, data = settings.model, settings.family, settings.data
  batch = data.batch_size // split(axes.BATCH)
  itemsize = top.compute_dtype.itemsize
  tiled = functools.partial(_tiled, platform)
  terms = dict.fromkeys(ACTIVATION_TERMS, 0.0)
  frozen = family.frozen(top)
  for stack in family.stacks(top, data.seq_len):
    if stack.name in frozen:  # no backward pass: its forward's are gone by the step's peak
      continue
    cfg, tokens = stack.config or top, stack.tokens
    heads = cfg.num_heads // split(axes.HEADS)
    kv = cfg.kv_heads // split(axes.KV_HEADS)
    kept = batch * itemsize * (1 if cfg.remat_policy == 'full' else stack.blocks)
    terms['width'] += kept * tiled(cfg.width, tokens)
    terms['mlp'] += kept * tiled(cfg.hidden_dim // split(axes.MLP), tokens) * cfg.use_mlp
    for keys in stack.keys:
      # Queries and the attention's output over the tokens, keys and values over the keys, a
      # quarter of the four: a fused kernel reads them with the head's features along the
      # lanes, XLA's with the positions.
      fused = not _keeps_weights(cfg, tokens, keys)
      terms['heads'] += kept * (heads * _per_head(tiled, cfg.head_dim, tokens, fused)
                                + kv * _per_head(tiled, cfg.head_dim, keys, fused)) / 2
      # The weights of the unfused kernels, in float32 on XLA:TPU (the softmax's dtype).
      weights = kept * heads * tiled(tokens, keys) * (cfg.use_attention and not fused)
      terms['attention'] += weights * (4 / itemsize if platform == 'tpu' else 1)
      if tokens * keys >= LONG_ATTENTION:  # float32: the softmax's dtype
        terms['long_attention'] += weights * 4 / itemsize
    if cfg.remat_policy == 'full':
      terms['block_inputs'] += stack.blocks * batch * tiled(cfg.width, tokens) * itemsize
  logits = family.logits_shape(top, data.seq_len)
  if logits is not None:  # float32, whatever the compute dtype
    positions, classes = logits
    if settings.training.logits_chunk:  # one chunk's at a time (resolve refused any other)
      positions = min(positions, settings.training.logits_chunk)
    terms['logits'] = 4 * batch * tiled(classes // split(axes.VOCAB), positions)
  return terms


def _per_head(tiled, head_dim: int, positions: int, fused: bool) -> int:
  return tiled(head_dim, positions) if fused else tiled(positions, head_dim)


def _tiled(platform: str, lanes: int, sublanes: int, itemsize: int = 4) -> int:
  """Elements of a (sublanes, lanes) array as `platform` lays it out: XLA:TPU pads the minor
  dimension to its 128 lanes and the next to its tile of 8 sublanes, or of 1, 2 or 4 for fewer
  (2 at least for 16-bit types, which pack two to a sublane); the others pad nothing we count."""
  if platform != 'tpu':
    return lanes * sublanes
  rows = 8 if sublanes > 4 else max(1 << (sublanes - 1).bit_length(), 4 // itemsize)
  return -(-lanes // 128) * 128 * -(-sublanes // rows) * rows


def _keeps_weights(cfg: ModelConfig, tokens: int, keys: int) -> bool:
  """Whether the attention kernel `cfg` runs (resolved for its platform) keeps the attention
  weights of `tokens` queries over `keys` keys; a fused kernel that takes the case does not."""
  q = jax.ShapeDtypeStruct((1, tokens, cfg.num_heads, cfg.head_dim), cfg.compute_dtype)
  k = jax.ShapeDtypeStruct((1, keys, cfg.kv_heads, cfg.head_dim), cfg.compute_dtype)
  return kernels.keeps_weights(cfg.attention_kernel, q, k, k)


def activation_bytes(terms: dict[str, float], platform: str) -> int:
  """The train step's activations per device as XLA on `platform` keeps them, of the terms of
  activation_terms (any others in `terms` are left out)."""
  copies = ACTIVATION_COPIES[platform]
  return int(sum(copies[name] * terms[name] for name in ACTIVATION_TERMS))


def encoder_positions(cfg: ModelConfig, seq_len: int) -> int | None:
  """The encoder outputs an encoder-decoder's cache holds beside `seq_len` decoded tokens: the
  keys of the cross-attention of the family's stacks (the source's tokens, an audio window's
  frames); None for a model without cross-attention."""
  stacks = models.registry.get(cfg.family).stacks(cfg, seq_len)
  return next((stack.keys[1] for stack in stacks if len(stack.keys) > 1), None)


def kv_cache_bytes(cfg: ModelConfig, seq_len: int, dtype: str) -> int:
  """Bytes of one sequence's KV cache of `seq_len` tokens (and, for an encoder-decoder, of its
  encoder_positions): by the accounting's formula, or, for a family that registers none, from
  the shapes of its cache (decode.init_cache, abstractly)."""
  family = models.registry.get(cfg.family)
  source = encoder_positions(cfg, seq_len)
  if family.param_counts is not None:
    return accounting.kv_cache_bytes(cfg, seq_len, dtype=dtype, source_len=source)
  model = models.build(dataclasses.replace(cfg, dtype=dtype))
  cache = jax.eval_shape(lambda: decode.init_cache(model, 1, seq_len, source))
  return sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(cache))


def plan(config, mesh: dict[str, int] | None = None, platform: str | None = None) -> Plan:
  """The per-device plan of a run (its RunSettings, or a config resolved here for `platform`:
  'cpu', 'tpu', 'gpu', default that of jax.devices()) on a mesh of `mesh` ({axis: size};
  default: the run's mesh with -1 resolved over this machine's devices), as XLA compiles for
  the platform: the run's own layout (setup.layout) on an abstract mesh. No device memory is
  touched."""
  settings = run_settings.resolve(config, platform)
  platform, cfg, family = settings.platform, settings.model, settings.family
  sizes = mesh or sharding.mesh_sizes(settings.mesh)
  abstract_mesh = jax.sharding.AbstractMesh(tuple(sizes.values()), tuple(sizes))
  laid_out = setup.layout(settings, abstract_mesh)
  state, shardings = laid_out.abstract_state, laid_out.state_sharding
  # With LoRA the state's params are the adapters, which alone have gradients and optimizer
  # state, beside the model's parameters: the frozen base. A locked part (the family's frozen:
  # a dual encoder's locked tower) has neither.
  params = _sharded_bytes(state.params, shardings.params, platform)
  locked = () if isinstance(state, LoraState) else family.frozen(cfg)
  trained = params - sum(_sharded_bytes(state.params[name], shardings.params[name], platform)
                         for name in locked)
  model_params, model_shardings = state.params, shardings.params
  if isinstance(state, LoraState):
    model_params, model_shardings = state.base, shardings.base
    params += _sharded_bytes(state.base, shardings.base, platform)
  if state.ema is not None:  # the moving average of the parameters, a copy of their own
    params += _sharded_bytes(state.ema, shardings.ema, platform)
  rules = settings.rules
  split = lambda name: math.prod(sizes[a] for a in sharding.mesh_axes_of(name, rules))
  batch = family.batch_shapes(cfg, settings.data.batch_size, settings.data.seq_len)
  batch_bytes = sum(_array_bytes((x.shape[0] // split(axes.BATCH), *x.shape[1:]),
                                 x.dtype.itemsize, platform) for x in batch.values())
  kv = None
  if family.decoding:
    kv = (kv_cache_bytes(cfg, settings.data.seq_len, cfg.compute_dtype.name)
          // split(axes.KV_HEADS))
  batch_axes = {a for name, a in rules if name == axes.BATCH and a}
  terms = {'gradients': trained,
           'gathered': _gathered_bytes(model_params, model_shardings, batch_axes),
           **activation_terms(settings, split, platform)}
  copies = ACTIVATION_COPIES[platform]
  optimizer = _sharded_bytes(state.opt_state, shardings.opt_state, platform)
  return Plan(params=params, optimizer=optimizer,
              gradients=int(copies['gradients'] * terms['gradients']),
              gathered=int(copies['gathered'] * terms['gathered']),
              batch=int(batch_bytes), activations=activation_bytes(terms, platform),
              kv_cache=kv, devices=math.prod(sizes.values()), terms=terms)


WITHIN = 0.15  # the plan / XLA the plan is held to: 1 +- WITHIN
SMALL_PLAN = 2**30  # below it XLA:TPU keeps part of a step in its on-chip memory


def kind(cfg: ModelConfig, platform: str, planned_bytes: float) -> str:
  """The kind of model that a plan of `planned_bytes` per device of `cfg` (resolved for
  `platform`) is judged with: on an accelerator a plan under SMALL_PLAN, else scanned blocks,
  else a remat policy, else the family."""
  if platform != 'cpu' and planned_bytes < SMALL_PLAN:
    return 'under 1 GiB'
  if cfg.scan_layers:
    return 'scanned'
  if cfg.remat_policy != 'none':
    return f'remat {cfg.remat_policy}'
  return cfg.family


def accuracy(cfg: ModelConfig, platform: str, plan: Plan) -> tuple[bool, str]:
  """How far plans of `cfg`'s kind of model (on `platform`, of `plan`'s size) held on the test
  set (docs/memory_plan.md): (whether within 1 +- WITHIN of what XLA needed, the sentence that
  says so: the range of plan / XLA over the test's models of that kind, or that it has none)."""
  cfg = cfg.on(platform)
  model_kind = kind(cfg, platform, plan.train_total)
  models_of = ('models under 1 GiB per device' if model_kind == 'under 1 GiB'
               else f'{model_kind} models')
  compiler = f'XLA:{platform.upper()}'
  measured = _FIT['test'].get(platform, {})
  if model_kind not in measured:
    return False, f"the plan's test set has no {models_of} on {compiler}"
  low, high, count = measured[model_kind]
  return (1 - WITHIN <= low and high <= 1 + WITHIN,
          f'for {models_of} the plan was {low:.2f}-{high:.2f}x what {compiler} needed over the '
          f'{count} of its test set')
