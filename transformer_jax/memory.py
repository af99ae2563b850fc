"""A per-device memory plan of a run, before anything is allocated: the state by its real
shardings, the train step's activations by a count of what the backward pass keeps, the KV cache.

State: parameters, optimizer state and gradients (gradients have the parameters' shapes and
shardings) from the abstract train state and its NamedShardings: exact. Activations: for each
block, the tensors of each size that the backward pass reads (of the width, of the heads, of the
MLP's hidden units, of the attention matrices), times how many copies of that size XLA keeps
live at the step's peak (ACTIVATION_COPIES), split over the mesh axes the rules split them on
(the batch over 'data'; heads, MLP units and vocabulary over 'model' under tensor parallelism),
plus the float32 logits. The copies are fitted to each compiler (XLA:CPU, XLA:TPU, XLA:GPU),
which fuse differently; tests/test_memory.py (XLA:CPU, 1 and 8 devices) and
tests/test_memory_targets.py (v5e:2x2, v4-8, h100x4) check the plan against
compiled.memory_analysis() of the real step on models the fits did not see, under data,
fully-sharded and tensor parallelism. The parameters and optimizer state are exact; the rest is
an estimate, and `caveats` names the cases measured to be off by more than 15%.
"""
import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from transformer_jax import accounting, decode, kernels, lora, models
from transformer_jax.layers import axes
from transformer_jax.model_config import ModelConfig
from transformer_jax.train import optim, setup, sharding
from transformer_jax.settings import MeshSettings, TrainingSettings
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
# XLA:CPU: fitted by least squares to compiled.memory_analysis() of 19 train steps: four
# families, widths 64 to 256, sequences 32 to 128, 1 and 8 devices under DP, FSDP and TP.
# XLA:TPU and XLA:GPU: fitted by experiments/fit_memory.py (least squares of the relative error,
# non-negative, at most one gradient tree and one set of gathered weights) to the train steps of
# its GRID compiled for v5e:2x2 and h100x4 (17 models: decoders, encoders, encoder-decoders and
# ViTs, widths 64 to 768, sequences 64 to 1024, vocabularies 64 to 16,384, float32 and bfloat16,
# DP, FSDP and TP on 4 devices), attention by each platform's kernel (splash, cuDNN: no
# attention weights where they take the case); the grid is within 0.73-1.15x on XLA:GPU but
# only 0.50-1.47x on XLA:TPU, whose use these terms do not capture (it pads small arrays to its
# tiles, and splash's backward keeps more than the terms say at long sequences under TP).
# The grid's models are all multi-head, whose heads' term equals the width's: the split between
# the two counts is the fit's, not a measurement.
_CPU = {'gradients': 1, 'gathered': 1, 'width': 9, 'heads': 4.5, 'mlp': 2.7, 'attention': 4.4,
        'long_attention': 0, 'logits': 2, 'block_inputs': 1}
ACTIVATION_TERMS = ('width', 'heads', 'mlp', 'attention', 'long_attention', 'logits',
                    'block_inputs')
LONG_ATTENTION = 1024 * 1024  # queries x keys from which XLA:TPU keeps the attention matrices
TERMS = ('gradients', 'gathered', *ACTIVATION_TERMS)
ACTIVATION_COPIES = {
    'cpu': _CPU,
    'tpu': {'gradients': 0, 'gathered': 0.3, 'width': 2.77, 'heads': 3.22, 'mlp': 0,
            'attention': 0, 'long_attention': 0, 'logits': 1.42, 'block_inputs': 1},
    'gpu': {'gradients': 1, 'gathered': 0.62, 'width': 5.92, 'heads': 7.79, 'mlp': 3.79,
            'attention': 2.0, 'long_attention': 0.13, 'logits': 2.41, 'block_inputs': 1},
}
# With model.remat_policy='full' a block keeps only its input, and recomputes the rest during its
# backward pass: one block's activations, at a time.


@dataclasses.dataclass(frozen=True)
class Plan:
  """Bytes per device."""
  params: int
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


def _sharded_bytes(tree, shardings) -> int:
  return sum(math.prod(s.shard_shape(x.shape)) * jnp.dtype(x.dtype).itemsize
             for x, s in zip(jax.tree.leaves(tree), jax.tree.leaves(shardings)))


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


def _block_tokens(cfg: ModelConfig, family, config) -> list[tuple[int, int, int]]:
  """(blocks, tokens per example, keys per query) of each stack the model runs."""
  if family.unit == 'image':
    tokens = cfg.num_patches + (cfg.pool == 'cls')
    return [(cfg.num_layers, tokens, tokens)]
  t = config.data.seq_len
  if family.decoding == 'encoder_decoder':  # the decoder's cross-attention reads t sources
    return [(cfg.num_layers, t, t), (cfg.decoder_layers, t, 2 * t)]
  return [(cfg.num_layers, t, t)]


def activation_terms(cfg: ModelConfig, family, config, split) -> dict[str, float]:
  """Bytes per device of one copy of each term of ACTIVATION_COPIES, over every block (one block
  under remat 'full', besides every block's input); `split(name)` says how many ways a logical
  activation axis is split."""
  batch = config.data.batch_size // split(axes.BATCH)
  heads = cfg.num_heads // split(axes.HEADS)
  kv = cfg.kv_heads // split(axes.KV_HEADS)
  itemsize = cfg.compute_dtype.itemsize
  terms = dict.fromkeys(ACTIVATION_TERMS, 0.0)
  for blocks, tokens, keys in _block_tokens(cfg, family, config):
    kept = batch * tokens * itemsize * (1 if cfg.remat_policy == 'full' else blocks)
    terms['width'] += kept * cfg.width
    terms['heads'] += kept * (heads + kv) * cfg.head_dim / 2
    terms['mlp'] += kept * cfg.hidden_dim // split(axes.MLP) * cfg.use_mlp
    attention = kept * heads * keys * (cfg.use_attention and _keeps_weights(cfg, tokens, keys))
    terms['attention'] += attention
    if tokens * keys >= LONG_ATTENTION:  # float32: the softmax's dtype
      terms['long_attention'] += attention * 4 / itemsize
    if cfg.remat_policy == 'full':
      terms['block_inputs'] += blocks * batch * tokens * cfg.width * itemsize
  if family.unit == 'token':  # float32, whatever the compute dtype
    terms['logits'] = 4 * batch * config.data.seq_len * cfg.vocab_size // split(axes.VOCAB)
  return terms


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


def kv_cache_bytes(cfg: ModelConfig, seq_len: int, dtype: str) -> int:
  """Bytes of one sequence's KV cache of `seq_len` tokens (and as many encoder outputs, for an
  encoder-decoder): by the accounting's formula, or, for a family that registers none, from
  the shapes of its cache (decode.init_cache, abstractly)."""
  family = models.registry.get(cfg.family)
  source = seq_len if family.decoding == 'encoder_decoder' else None
  if family.param_counts is not None:
    return accounting.kv_cache_bytes(cfg, seq_len, dtype=dtype, source_len=source)
  model = models.build(dataclasses.replace(cfg, dtype=dtype))
  cache = jax.eval_shape(lambda: decode.init_cache(model, 1, seq_len, source))
  return sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(cache))


def plan(config: ml_collections.ConfigDict, mesh: dict[str, int] | None = None,
         cfg: ModelConfig | None = None, platform: str | None = None) -> Plan:
  """The per-device plan of a run's config on a mesh of `mesh` ({axis: size}; default:
  config.mesh with -1 resolved over this machine's devices), of `cfg` (default: config.model's
  typed config), as XLA compiles for `platform` ('cpu', 'tpu', 'gpu'; default: that of
  jax.devices()). No device memory is touched."""
  platform = platform or jax.devices()[0].platform
  cfg = (cfg or models.model_config(config.model)).on(platform)
  cfg = dataclasses.replace(cfg, attention_kernel=models.attention_kernel(cfg, platform).name)
  family = models.registry.get(cfg.family)
  sizes = mesh or sharding.mesh_sizes(MeshSettings.of(config.mesh))
  abstract_mesh = jax.sharding.AbstractMesh(tuple(sizes.values()), tuple(sizes))
  sharding.check_rule_set(config)
  rules = sharding.rules_of(config)
  model = models.build(cfg)  # the kernel changes no shape of the state
  tx, _ = optim.make_optimizer(config.optimizer, TrainingSettings.of(config.training).steps)
  boxed = setup.boxed_abstract_state(model, tx, family.example_inputs(cfg),
                                     lora.LoraSettings.of(config.lora))
  shardings = sharding.state_shardings(boxed, abstract_mesh, rules)
  state = nn.meta.unbox(boxed)
  # With LoRA the state's params are the adapters, which alone have gradients and optimizer
  # state, beside the model's parameters: the frozen base.
  trained = params = _sharded_bytes(state.params, shardings.params)
  model_params, model_shardings = state.params, shardings.params
  if isinstance(state, LoraState):
    model_params, model_shardings = state.base, shardings.base
    params += _sharded_bytes(state.base, shardings.base)
  split = lambda name: math.prod(sizes[a] for a in sharding.mesh_axes_of(name, rules))
  batch_bytes = sum(np.prod(shape) * itemsize for shape, itemsize in
                    _batch_shapes(cfg, family, config)) // split(axes.BATCH)
  kv = None
  if family.decoding:
    kv = kv_cache_bytes(cfg, config.data.seq_len, cfg.compute_dtype.name) // split(axes.KV_HEADS)
  batch_axes = {a for name, a in rules if name == axes.BATCH and a}
  terms = {'gradients': trained,
           'gathered': _gathered_bytes(model_params, model_shardings, batch_axes),
           **activation_terms(cfg, family, config, split)}
  copies = ACTIVATION_COPIES[platform]
  return Plan(params=params, optimizer=_sharded_bytes(state.opt_state, shardings.opt_state),
              gradients=int(copies['gradients'] * terms['gradients']),
              gathered=int(copies['gathered'] * terms['gathered']),
              batch=int(batch_bytes), activations=activation_bytes(terms, platform),
              kv_cache=kv, devices=math.prod(sizes.values()), terms=terms)


def _batch_shapes(cfg, family, config):
  """(shape, itemsize) of each array of a global training batch."""
  b, t = config.data.batch_size, config.data.seq_len
  if family.unit == 'image':
    return [((b, cfg.image_size, cfg.image_size, cfg.num_channels), 4), ((b,), 4)]
  streams = 4 if family.decoding == 'encoder_decoder' else 3  # ids, targets, weights, valid...
  return [((b, t), 4)] * streams


# Plan / XLA where the plan is more than 15% off, measured by experiments/fit_memory.py --cases
# (a decoder of 4 blocks, width 192, batch 32 x 256, FSDP over 4 devices) on XLA:CPU, v5e:2x2
# and h100x4; a case absent here was within 15% on that platform.
OFF_BY = {('cpu', 'remat full'): 0.44, ('cpu', 'remat dots'): 1.44, ('cpu', 'bfloat16'): 0.69,
          ('gpu', 'remat dots'): 1.40, ('gpu', 'scanned'): 0.84,
          ('tpu', 'remat full'): 0.74, ('tpu', 'scanned'): 0.19, ('tpu', 'bfloat16'): 0.54}


# Plan / XLA:TPU over the measured models (GPT-2 small, ViT-B/16, the reference LM; the held-out
# tests' models): its terms do not capture what XLA:TPU keeps.
TPU_RANGE = (0.19, 1.01)


def caveats(cfg: ModelConfig, platform: str) -> list[str]:
  """Why the plan of `cfg` may be more than 15% off what XLA on `platform` needs: XLA:TPU, a case
  of OFF_BY, or a remat policy the plan does not model and nothing measured."""
  cases = [f'remat {cfg.remat_policy}'] if cfg.remat_policy != 'none' else []
  cases += ['scanned'] if cfg.scan_layers else []
  cases += ['bfloat16'] if cfg.compute_dtype == jnp.bfloat16 else []
  found = [f'with {case} the plan was {OFF_BY[platform, case]:.2f}x what XLA:{platform.upper()} '
           'needed in a measured case; --mode=compile gives the figure of this run'
           for case in cases if (platform, case) in OFF_BY]
  if cfg.remat_policy == 'dots_no_batch':
    found.append("remat 'dots_no_batch' is planned as no remat and was not measured")
  if platform == 'tpu':  # experiments/results/compile_targets
    found.append(f'on XLA:TPU the plan was {TPU_RANGE[0]}-{TPU_RANGE[1]}x what the compiler '
                 'needed for the models measured; --mode=compile gives the figure of this run')
  return found
