"""The optimizers: AdamW with warmup and cosine decay, clipping and a weight-decay mask; or Muon
on the transformer blocks' projection matrices with that AdamW on every other parameter."""
import math
import re

import jax
import jax.numpy as jnp
import optax
from optax.contrib import MuonDimensionNumbers

from transformer_jax.settings import OptimizerSettings
from transformer_jax.layers.block import LAYERS
from transformer_jax.models.registry import EMBEDDING_NAMES

__all__ = ['decay_mask', 'learning_rate_schedule', 'make_optimizer', 'muon_dimension_numbers']


def learning_rate_schedule(opt: OptimizerSettings, total_steps: int, peak=None) -> optax.Schedule:
  """Linear warmup, peak * (step + 1) / warmup_steps at steps 0 .. warmup_steps - 1, so that the
  first update is a real one (a warmup from 0 would waste it), then cosine decay to
  min_lr_ratio * peak (or constant) from step warmup_steps. peak: default opt.learning_rate.

  Written with jnp rather than optax's join and cosine schedules, whose Python checks of the
  step counts reject the traced numbers of a vmapped sweep (train.vmapped): any of peak,
  warmup_steps and min_lr_ratio may be a traced scalar.
  """
  peak = opt.learning_rate if peak is None else peak
  warmup_steps, floor = opt.warmup_steps, opt.min_lr_ratio

  def schedule(step):
    if opt.schedule == 'constant':
      after = peak
    else:  # optax.cosine_decay_schedule(peak, decay_steps, floor) at step - warmup_steps
      decay_steps = jnp.maximum(total_steps - warmup_steps, 1)
      count = jnp.minimum(step - warmup_steps, decay_steps)
      after = peak * ((1 - floor) * (0.5 * (1 + jnp.cos(jnp.pi * count / decay_steps))) + floor)
    warmup = peak * (step + 1) / jnp.maximum(warmup_steps, 1)
    return jnp.where(step < warmup_steps, warmup, after)
  return schedule


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
    names = _names(path)
    if not _is_muon_matrix(names):
      return None
    first = 1 if LAYERS in names else 0  # a scanned stack's layer axis
    contracted = 2 if names[-2] == 'out' else 1  # the attention's output contracts (heads, hd)
    return MuonDimensionNumbers(tuple(range(first, first + contracted)),
                                tuple(range(first + contracted, leaf.ndim)))
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


def _is_set(number) -> bool:
  """Whether a config number turns its transformation on: a traced one does (a vmapped sweep
  groups the runs that have it off apart from those that have it on)."""
  return isinstance(number, jax.Array) or bool(number)


def make_optimizer(opt: OptimizerSettings, total_steps: int, frozen: tuple[str, ...] = ()
                   ) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """The optimizer of the settings `opt` (config.optimizer's, or the section itself) and its
  (AdamW's) learning-rate schedule; Muon's follows the same schedule from its own peak,
  muon_learning_rate. The top-level parameter subtrees `frozen` (a family's frozen) get no
  update and no optimizer state."""
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
  """make_optimizer's of every parameter."""
  opt = opt if isinstance(opt, OptimizerSettings) else OptimizerSettings.of(opt)
  schedule = learning_rate_schedule(opt, total_steps)
  tx = optax.adamw(schedule, b1=opt.b1, b2=opt.b2, eps=opt.eps,
                   weight_decay=opt.weight_decay, mask=lambda p: decay_mask(p, opt))
  if opt.name == 'muon':
    tx = _muon(opt, learning_rate_schedule(opt, total_steps, opt.muon_learning_rate), tx)
  if _is_set(opt.grad_clip_norm):
    return optax.chain(optax.clip_by_global_norm(opt.grad_clip_norm), tx), schedule
  return tx, schedule
