"""The optimizers: AdamW; Muon on the transformer blocks' projection matrices with that AdamW on
every other parameter; Adafactor as T5X trains T5; SGD with momentum. Each with clipping, a
weight-decay mask and a learning-rate schedule: a linear warmup, then cosine, linear,
warmup-stable-decay or constant, or T5's inverse square root."""
import math
import re
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from optax.contrib import MuonDimensionNumbers

from transformer_jax.kernels.contraction import summed
from transformer_jax.settings import OptimizerSettings
from transformer_jax.layers.block import LAYERS
from transformer_jax.models.registry import EMBEDDING_NAMES

__all__ = ['AdafactorState', 'adafactor_factoring', 'decay_mask', 'Factoring',
           'learning_rate_schedule', 'make_optimizer', 'muon_dimension_numbers',
           'scale_by_adafactor']


def learning_rate_schedule(opt: OptimizerSettings, total_steps: int, peak=None) -> optax.Schedule:
  """The rate at each step (0 for the first update) of opt.schedule, peak: default
  opt.learning_rate.

  'cosine', 'linear', 'wsd', 'constant': a linear warmup, peak * (step + 1) / warmup_steps at
  steps 0 .. warmup_steps - 1, so that the first update is a real one (a warmup from 0 would
  waste it); then from step warmup_steps
  - 'cosine': optax.cosine_decay_schedule's decay to min_lr_ratio * peak at total_steps;
  - 'linear': a linear decay to that floor at total_steps (BERT, Devlin et al. 2019, and
    Whisper, Radford et al. 2022, decay to 0; BERT's own decays from step 0 with the warmup
    overriding it, so its rate at the end of the warmup is peak * (1 - warmup / total); this
    one, as transformers' get_linear_schedule_with_warmup, decays from the peak there);
  - 'wsd' (warmup-stable-decay): the peak until the last decay_fraction of total_steps, then a
    decay to the floor as floor + (peak - floor) * (1 - sqrt(progress)), the "1-sqrt" cooldown
    that Hagele et al. 2024 (arXiv:2405.18392) found best, over 20% of the run by default, as
    theirs; MiniCPM's WSD (Hu et al. 2024, arXiv:2404.06395) decays exponentially instead, over
    about 10%;
  - 'constant': the peak.
  'rsqrt': peak / sqrt(max(step, warmup_steps)) from step 0, T5's inverse square root (Raffel
  et al. 2020, section 3.1.2: 1 / sqrt(max(n, k)), k = 10^4), as T5X's
  create_learning_rate_scheduler(factors='constant * rsqrt_decay') and Mesh TF's
  rsqrt_no_ramp_down compute it: its warmup is a plateau, no ramp, and peak the constant factor.

  Written with jnp rather than optax's join and cosine schedules, whose Python checks of the
  step counts reject the traced numbers of a vmapped sweep (train.vmapped): any of peak,
  warmup_steps, min_lr_ratio and decay_fraction may be a traced scalar.
  """
  peak = opt.learning_rate if peak is None else peak
  warmup_steps = opt.warmup_steps

  def schedule(step):
    if opt.schedule == 'rsqrt':
      return peak / jnp.sqrt(jnp.maximum(step, warmup_steps))
    if opt.schedule == 'constant':
      after = peak
    else:
      floor = opt.min_lr_ratio
      after = peak * (floor + (1 - floor) * _left_to_decay(opt, step, total_steps))
    warmup = peak * (step + 1) / jnp.maximum(warmup_steps, 1)
    return jnp.where(step < warmup_steps, warmup, after)
  return schedule


def _left_to_decay(opt, step, total_steps: int):
  """The share of the decay from the peak to the floor still ahead at `step` (past the warmup):
  1 where it starts, 0 at total_steps and after."""
  if opt.schedule == 'wsd':
    length = opt.decay_fraction * total_steps
    done = jnp.clip(step - (total_steps - length), 0, length) / jnp.maximum(length, 1e-9)
    return 1 - jnp.sqrt(done)
  length = jnp.maximum(total_steps - opt.warmup_steps, 1)
  done = jnp.minimum(step - opt.warmup_steps, length) / length
  return 0.5 * (1 + jnp.cos(jnp.pi * done)) if opt.schedule == 'cosine' else 1 - done


def _names(path) -> list[str]:
  """The dict keys of a parameter's path (a box's attribute in it left out)."""
  return [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]


def decay_mask(params, opt):
  """True for parameters that weight decay applies to: matmul kernels always; norms, biases,
  embeddings (at the top or inside a tower, as a dual encoder's) and any other parameter (a
  learned temperature) only where the config asks. The class token, one vector, goes with the
  norms' gains and the biases, as open_clip's rule has it (no decay of any parameter of fewer
  than 2 dimensions: its class_embedding), while the position and token tables are embeddings."""
  def decays(path, _):
    names = _names(path)
    if names[-1] == 'cls_token':
      return opt.decay_norms_and_biases
    if any(name in EMBEDDING_NAMES for name in names):
      return opt.decay_embeddings
    return names[-1] == 'kernel' or opt.decay_norms_and_biases
  return jax.tree_util.tree_map_with_path(decays, params)


def _is_muon_matrix(names: list[str]) -> bool:
  """A kernel inside a transformer block (unrolled block_<i>, or the nn.scan stack)."""
  return names[-1] == 'kernel' and any(n == LAYERS or re.fullmatch(r'block_\d+', n)
                                       for n in names)


def _block_matrix(names: list[str], ndim: int) -> tuple[tuple, tuple] | None:
  """(input axes, output axes) of the matrix a transformer block's projection kernel is (its
  head axes folded in; a scanned stack's leading layer axis in neither), or None for any other
  parameter."""
  if not _is_muon_matrix(names):
    return None
  first = 1 if LAYERS in names else 0  # a scanned stack's layer axis
  contracted = 2 if names[-2] == 'out' else 1  # the attention's output contracts (heads, hd)
  return tuple(range(first, first + contracted)), tuple(range(first + contracted, ndim))


def muon_dimension_numbers(params):
  """For each leaf of `params`, the matrix Muon sees in it (optax's MuonDimensionNumbers: its
  reduction and output axes; any other axis is a batch of matrices), or None where AdamW trains
  the leaf.

  Muon takes the kernels inside the transformer blocks: the attention's query, key, value and
  output projections (self- and cross-attention) and the MLP's. A projection's head axes fold
  into the matrix: a query (embed, heads, head_dim) is the (embed, heads * head_dim) matrix, the
  output (heads, head_dim, embed) the (heads * head_dim, embed) one; blocks stacked by nn.scan
  add a leading layer axis, one matrix per block. AdamW takes the rest, as Keller Jordan's recipe
  does: embeddings (tokens, positions, patches, the class token), norms, biases, and the heads
  (the unembedding, the classifier, the MLM head's transform), which lie outside the blocks.
  """
  def matrix(path, leaf):
    axes = _block_matrix(_names(path), leaf.ndim)
    return None if axes is None else MuonDimensionNumbers(*axes)
  return jax.tree_util.tree_map_with_path(matrix, params)


def _labels(params):
  """'muon' or 'adamw' for each parameter, taken whole (a box with its array too, as
  setup.boxed_abstract_state has them), so that the optimizer state of the other part holds an
  empty node in its place, not a box around one (which would get a sharding)."""
  return jax.tree_util.tree_map_with_path(
      lambda path, _: 'muon' if _is_muon_matrix(_names(path)) else 'adamw', params,
      is_leaf=lambda x: not isinstance(x, dict))


def _scale_by_width(dimension_numbers) -> optax.GradientTransformation:
  """Each matrix's update times sqrt(max(1, fan_out / fan_in)), fan_in and fan_out the sizes of
  its reduction and output axes by `dimension_numbers(updates)` (Keller Jordan's Muon scaling).
  optax.contrib.muon applies the same with scale_by_shape, which optax does not export; its
  muon() itself does not serve, its AdamW having no weight-decay mask."""
  def scale(update, numbers: MuonDimensionNumbers):
    fan_in, fan_out = (math.prod(update.shape[axis] for axis in axes)
                       for axes in (numbers.reduction_axis, numbers.output_axis))
    return update * math.sqrt(max(1.0, fan_out / fan_in))

  def update_fn(updates, state, params=None):
    del params
    return jax.tree.map(scale, updates, dimension_numbers(updates)), state
  return optax.GradientTransformation(optax.init_empty_state, update_fn)


def _muon(opt, schedule: optax.Schedule, adamw: optax.GradientTransformation):
  """Muon (momentum, orthogonalized by Newton-Schulz, scaled by sqrt(max(1, fan_out / fan_in))
  as Keller Jordan's is) on the leaves muon_dimension_numbers picks, `adamw` on the others."""
  muon = optax.chain(
      optax.contrib.scale_by_muon(ns_steps=opt.muon_ns_steps, beta=opt.muon_momentum,
                                  nesterov=opt.muon_nesterov,
                                  weight_dimension_numbers=muon_dimension_numbers),
      _scale_by_width(muon_dimension_numbers),
      optax.add_decayed_weights(opt.muon_weight_decay),
      optax.scale_by_learning_rate(schedule))
  return optax.partition({'muon': muon, 'adamw': adamw}, _labels)


class Factoring(NamedTuple):
  """How Adafactor keeps one parameter's second moments: the axes of independent blocks (a
  scanned stack's layers), and the row and column axes of a factored matrix (both empty: not
  factored, one moment per entry)."""
  batch: tuple[int, ...]
  rows: tuple[int, ...]
  cols: tuple[int, ...]


def _factoring(names: list[str], shape: tuple[int, ...], min_dim_size_to_factor: int) -> Factoring:
  """The Factoring of a parameter of these path names and shape (adafactor_factoring)."""
  batch = (0,) if LAYERS in names else ()
  matrix = _block_matrix(names, len(shape))
  if matrix is None:  # T5X's and optax's rule: the two largest axes
    free = sorted((a for a in range(len(shape)) if a not in batch), key=lambda a: shape[a])
    matrix = ((free[-2],), (free[-1],)) if len(free) >= 2 else None
  size = lambda axes: math.prod(shape[a] for a in axes)
  if matrix is None or min(map(size, matrix)) < min_dim_size_to_factor:
    return Factoring(batch, (), ())
  return Factoring(batch, *matrix)


def adafactor_factoring(params, min_dim_size_to_factor: int = 128):
  """The Factoring of each leaf of `params`.

  A transformer block's projection kernel is the matrix Muon sees too (muon_dimension_numbers):
  its input axes against its output axes, a query (embed, heads, head_dim) factored as the
  (embed, heads * head_dim) matrix, as T5X's standard_logical_factor_rules factor it (embed
  the rows; heads, head_dim, mlp the columns) and Mesh TF's 2-D variables were. Any other
  parameter factors its two largest axes, T5X's and optax's rule. Either only where both sides
  reach min_dim_size_to_factor. A scanned stack's layer axis is a batch axis: each block its own
  factors, clipping and parameter scale, as T5X's 'layers' rule has them.
  """
  return jax.tree_util.tree_map_with_path(
      lambda path, leaf: _factoring(_names(path), leaf.shape, min_dim_size_to_factor), params)


def _mean(x, axes: tuple[int, ...]):
  """x's mean over `axes`, summed as `kernels.contraction.summed` sums (the rows of a head's
  (512, 32,128) kernel: 164 ms a T5-small step with jnp.mean on an AMD EPYC)."""
  return summed(x, axes) / math.prod(x.shape[a] for a in axes)


class AdafactorState(NamedTuple):
  """Per parameter: the moving averages of the squared gradients' row and column means
  (factored parameters) or of the squared gradients themselves (the others); the unused ones
  (1,) placeholders, as optax.FactoredState has them."""
  count: jax.Array
  v_row: Any
  v_col: Any
  v: Any


def scale_by_adafactor(decay_rate: float = 0.8, eps: float = 1e-30,
                       clipping_threshold: float = 1.0, param_scale: bool = True,
                       min_param_scale: float = 1e-3,
                       min_dim_size_to_factor: int = 128) -> optax.GradientTransformation:
  """Adafactor's update before the learning rate (Shazeer & Stern 2018), as T5X's
  adafactor.Adafactor computes it with T5's settings (t5x/examples/t5/t5_1_1/base.gin).

  v <- d_t * v + (1 - d_t) * (g^2 + eps), d_t = 1 - (t + 1)^-decay_rate at update t = 0, 1, ...,
  v factored (adafactor_factoring) into its row means R and column means C, estimated as
  R C / mean(R); y = g / sqrt(v), divided by max(1, RMS(y) / clipping_threshold) (0: not
  clipped), then times max(RMS(param), min_param_scale) with param_scale; RMS over each block
  (a scanned stack's layers one by one). The learning rate multiplies this after (T5: the
  'rsqrt' schedule, no momentum).

  Where optax's adafactor differs: it factors the two largest axes of any array, so that a
  (embed, heads, head_dim) kernel is factored embed against head_dim, one pair of factors per
  head, and a scanned stack's layer axis can be one of the two; its clipping and parameter
  scale take one RMS over a whole array, all of a stack's layers together. Where T5X differs:
  it factors a kernel of more than two axes whatever its sizes, here only where both sides reach
  min_dim_size_to_factor (as for two axes there), so that a scanned stack factors as the
  unrolled one. transformers' Adafactor factors every parameter of two axes or more over its
  last two axes (a torch kernel is the (out, in) matrix), whatever their sizes
  (min_dim_size_to_factor=1 here), and otherwise computes the same with
  relative_step=False, scale_parameter=True, warmup_init=False, beta1=None, decay_rate=-0.8.
  """
  def moments(path, leaf):
    """The zero moments (v_row, v_col, v) of one parameter, boxed as the parameter less the
    axes each averages over where it is boxed (setup.boxed_abstract_state)."""
    box = leaf if isinstance(leaf, nn.Partitioned) else None
    shape = (box.value if box else leaf).shape
    factoring = _factoring(_names(path), shape, min_dim_size_to_factor)

    def zeros(reduced):
      kept = [a for a in range(len(shape)) if a not in reduced]
      value = jnp.zeros([shape[a] for a in kept], jnp.float32)
      return box.replace(value=value, names=tuple(box.names[a] for a in kept)) if box else value
    placeholder = jnp.zeros((1,), jnp.float32)
    if factoring.rows:
      return zeros(factoring.cols), zeros(factoring.rows), placeholder
    return placeholder, placeholder, zeros(())

  def scaled(factoring: Factoring, decay, g, v_row, v_col, v, param):
    """One parameter's update and new moments."""
    grad = g.astype(jnp.float32)
    squared = jnp.square(grad) + eps
    if factoring.rows:
      v_row = decay * v_row + (1 - decay) * _mean(squared, factoring.cols)
      v_col = decay * v_col + (1 - decay) * _mean(squared, factoring.rows)
      rows = jnp.expand_dims(v_row, factoring.cols)
      y = (grad * jax.lax.rsqrt(rows / rows.mean(axis=factoring.rows, keepdims=True))
           * jax.lax.rsqrt(jnp.expand_dims(v_col, factoring.rows)))
    else:
      v = decay * v + (1 - decay) * squared
      y = grad * jax.lax.rsqrt(v)
    block = tuple(a for a in range(grad.ndim) if a not in factoring.batch)
    rms = lambda x: jnp.sqrt(jnp.mean(jnp.square(x), axis=block, keepdims=True))
    if clipping_threshold:
      y = y / jnp.maximum(1.0, rms(y) / clipping_threshold)
    if param_scale:
      y = y * jnp.maximum(rms(param.astype(jnp.float32)), min_param_scale)
    return y.astype(g.dtype), v_row, v_col, v

  def init(params):
    boxed = lambda x: isinstance(x, nn.Partitioned)
    leaves, tree = jax.tree_util.tree_flatten_with_path(params, is_leaf=boxed)
    per_leaf = [moments(path, leaf) for path, leaf in leaves]
    return AdafactorState(jnp.zeros([], jnp.int32),
                          *(tree.unflatten([m[i] for m in per_leaf]) for i in range(3)))

  def update(updates, state, params=None):
    if params is None:
      raise ValueError('Adafactor scales its updates by the parameters: pass them to update.')
    decay = 1.0 - (state.count + 1.0) ** -decay_rate
    leaves, tree = jax.tree_util.tree_flatten_with_path(updates)
    out = [scaled(_factoring(_names(path), g.shape, min_dim_size_to_factor), decay, g, *rest)
           for (path, g), *rest in zip(leaves, *(tree.flatten_up_to(tree_) for tree_ in (
               state.v_row, state.v_col, state.v, params)))]
    new_updates, v_row, v_col, v = (tree.unflatten([o[i] for o in out]) for i in range(4))
    return new_updates, AdafactorState(optax.safe_increment(state.count), v_row, v_col, v)

  return optax.GradientTransformation(init, update)


def _is_set(number) -> bool:
  """Whether a config number turns its transformation on: a traced one does (a vmapped sweep
  groups the runs that have it off apart from those that have it on)."""
  return isinstance(number, jax.Array) or bool(number)


def make_optimizer(opt: OptimizerSettings, total_steps: int, frozen: tuple[str, ...] = ()
                   ) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """The optimizer of the settings `opt` (config.optimizer's, or the section itself) for a run
  of `total_steps` and its learning-rate schedule (Muon's follows the same schedule from its own
  peak, muon_learning_rate). The top-level parameter subtrees `frozen` (a family's frozen) get
  no update and no optimizer state."""
  opt = opt if isinstance(opt, OptimizerSettings) else OptimizerSettings.of(opt)
  opt.check_steps(total_steps)
  tx, schedule = _trained_optimizer(opt, total_steps)
  return (_leaving(frozen, tx) if frozen else tx), schedule


def _leaving(frozen: tuple[str, ...], tx: optax.GradientTransformation
             ) -> optax.GradientTransformation:
  """`tx` over the top-level subtrees of the parameters other than `frozen`, whose updates are
  zeros and which have no state (optax.partition's masked nodes would stand in the state)."""
  trained = lambda tree: {name: sub for name, sub in tree.items() if name not in frozen}

  def update(updates, state, params=None):
    new, state = tx.update(trained(updates), state, None if params is None else trained(params))
    return {name: jax.tree.map(jnp.zeros_like, sub) if name in frozen else new[name]
            for name, sub in updates.items()}, state
  return optax.GradientTransformation(lambda params: tx.init(trained(params)), update)


def _trained_optimizer(opt: OptimizerSettings, total_steps: int):
  """make_optimizer's of every parameter. Weight decay is decoupled and times the learning rate
  for each optimizer, as AdamW's (Loshchilov & Hutter 2019): T5X's Adafactor subtracts
  weight_decay_rate * param unscaled (times the rate with weight_decay_rate_lr_exponent=1),
  transformers' times its parameter-scaled rate, torch.optim.SGD adds it to the gradient before
  the momentum; T5 trains without."""
  schedule = learning_rate_schedule(opt, total_steps)
  mask = lambda params: decay_mask(params, opt)
  decay = optax.add_decayed_weights(opt.weight_decay, mask=mask)
  if opt.name == 'adafactor':
    tx = optax.chain(
        scale_by_adafactor(opt.adafactor_decay_rate, opt.adafactor_eps,
                           opt.adafactor_clipping_threshold, opt.adafactor_param_scale,
                           opt.adafactor_min_param_scale, opt.adafactor_min_dim_size_to_factor),
        decay, optax.scale_by_learning_rate(schedule))
  elif opt.name == 'sgd':
    # buffer = momentum * buffer + gradient, the update -rate * buffer: PyTorch's SGD and
    # big_vision's momentum_hp (whose buffer is bfloat16; float32 here).
    momentum = [optax.trace(opt.sgd_momentum, opt.sgd_nesterov)] if opt.sgd_momentum else []
    tx = optax.chain(*momentum, decay, optax.scale_by_learning_rate(schedule))
  else:
    tx = optax.adamw(schedule, b1=opt.b1, b2=opt.b2, eps=opt.eps,
                     weight_decay=opt.weight_decay, mask=mask)
    if opt.name == 'muon':
      tx = _muon(opt, learning_rate_schedule(opt, total_steps, opt.muon_learning_rate), tx)
  if _is_set(opt.grad_clip_norm):
    return optax.chain(optax.clip_by_global_norm(opt.grad_clip_norm), tx), schedule
  return tx, schedule
