"""A family's forward pass on a batch, and the summed (not averaged) loss terms.

Sums, not means, so that microbatches, devices and processes combine exactly: the training
objective is the sum of per-position losses over the whole global batch divided by its total
weight, or by a fixed factor (training.loss_normalizing_factor; train.step).
"""
import functools

import flax.traverse_util
import jax
import jax.numpy as jnp

from transformer_jax.models import common
from transformer_jax.models.registry import Family
from transformer_jax.train import chunked_loss

__all__ = ['batch_sums', 'cross_entropy', 'cross_entropy_and_log_z', 'logits_targets_weights',
           'loss_sums', 'mixed_targets', 'objective']


def _applying(model, params, deterministic: bool, rngs):
  """model.apply with the parameters, the mode and the rngs bound: the `apply` a family's
  logits and loss call."""
  return lambda *args, **kw: model.apply({'params': params}, *args, deterministic=deterministic,
                                         rngs=rngs, **kw)


def logits_targets_weights(model, family: Family, params, batch, *, deterministic=True,
                           rngs=None):
  """(float32 logits, integer targets, float32 weights) of a batch, for any family."""
  apply = _applying(model, params, deterministic, rngs)
  return family.logits(apply, batch), batch[family.targets], family.weights(batch)


def batch_sums(model, family: Family, params, batch, rng, *, deterministic=True,
               label_smoothing: float = 0.0, z_loss: float = 0.0, top5: bool = False,
               logits_chunk: int = 0) -> dict[str, jax.Array]:
  """The summed loss terms of a batch for any family: its own `loss` where it registers one
  (given fold_in(rng, 1) for its noise), else loss_sums of its logits (with the batch's mixing
  and the z-loss); rng also draws the dropout masks.

  With logits_chunk > 0, a family of chunked logits (Family.chunked_logits) has its logits and
  their loss computed that many positions of each sequence at a time (train.chunked_loss): the
  same sums, without the whole logits in memory; a batch of mixed targets, or with top5, as
  without.
  """
  apply = _applying(model, params, deterministic, {'dropout': rng})
  if family.loss is not None:
    return family.loss(apply, batch, jax.random.fold_in(rng, 1), label_smoothing)
  targets, weights, mix = batch[family.targets], family.weights(batch), mixed_targets(batch)
  if logits_chunk and family.chunked_logits and mix is None and not top5:
    return chunked_loss.head_loss_sums(*_head_inputs(apply, family, batch), targets, weights,
                                       chunk=logits_chunk, label_smoothing=label_smoothing,
                                       z_loss=z_loss)
  logits = family.logits(apply, batch)
  return loss_sums(logits, targets, weights, label_smoothing=label_smoothing, mix=mix,
                   top5=top5, z_loss=z_loss)


def _head_inputs(apply, family: Family, batch):
  """(features, unembedding) that the model's head (models.common.LmHead) records of `batch`;
  the logits it computes are left unused, and XLA leaves them out."""
  recorded = {}

  def recording(*args, **kw):
    out, state = apply(*args, mutable=[common.HEAD_INPUTS], **kw)
    recorded.update(flax.traverse_util.flatten_dict(state.get(common.HEAD_INPUTS, {})))
    return out

  family.logits(recording, batch)
  if len(recorded) != 1:
    raise ValueError(f"A {family.name!r} model's logits are chunked (Family.chunked_logits), but "
                     f'it recorded {len(recorded)} heads ({list(recorded)}), not one '
                     'models.common.LmHead.')
  return next(iter(recorded.values()))


def objective(sums: dict[str, jax.Array]) -> jax.Array:
  """The summed training objective of a batch's loss terms: the loss, plus the z-loss where
  there is one."""
  return sums['loss'] + sums['z_loss'] if 'z_loss' in sums else sums['loss']


def mixed_targets(batch: dict):
  """(partner targets, weight of the own targets) of a batch mixed by mixup or CutMix
  (data.mixing); None for a batch without."""
  if 'label_mix' not in batch:
    return None
  return batch['label_mix'], batch['mix_weight'].astype(jnp.float32)


def loss_sums(logits, targets, weights, label_smoothing: float = 0.0, mix=None,
              top5: bool = False, z_loss: float = 0.0) -> dict[str, jax.Array]:
  """Weighted sums of the cross-entropy (float32, `cross_entropy`) and of correct argmax
  predictions ('correct'; with top5 also 'correct_top5', the targets among the five highest
  logits); with `z_loss` > 0, of z_loss * log(Z)^2 ('z_loss', T5X's and PaLM's, Z the
  softmax's normalizer). 'correct' counts `targets`, also in mixed rows."""
  nll, log_z = cross_entropy_and_log_z(logits, targets, label_smoothing, mix)
  sums = {'loss': jnp.sum(nll * weights), 'weight': jnp.sum(weights),
          'correct': jnp.sum((jnp.argmax(logits, axis=-1) == targets) * weights)}
  if z_loss:
    sums['z_loss'] = jnp.sum(z_loss * jnp.square(log_z) * weights)
  if top5:
    _, best = jax.lax.top_k(logits, min(5, logits.shape[-1]))
    sums['correct_top5'] = jnp.sum((best == targets[..., None]).any(axis=-1) * weights)
  return sums


def cross_entropy(logits, targets, label_smoothing: float = 0.0, mix=None) -> jax.Array:
  """Per position, the float32 cross-entropy of `logits` (..., V) against a target distribution:
  one-hot `targets`; with `mix` = (partner targets, lam) of mixed rows (mixed_targets), lam on
  `targets` and 1 - lam on the partner's; smoothed by label_smoothing (that much spread evenly).
  """
  return cross_entropy_and_log_z(logits, targets, label_smoothing, mix)[0]


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def cross_entropy_and_log_z(logits, targets, label_smoothing: float = 0.0, mix=None):
  """(cross_entropy, log Z) per position, log Z = logsumexp(logits) in float32 (what a z-loss
  penalises).

  Their gradients, softmax(logits) - the target distribution and softmax(logits), are computed
  from the logits and their logsumexp alone: the backward pass keeps nothing else of size V,
  where autodiff of log_softmax left XLA:TPU and XLA:GPU a second float32 copy of the logits at
  the step's peak.
  """
  return _cross_entropy_forward(logits, targets, label_smoothing, mix)[0]


def _cross_entropy_forward(logits, targets, label_smoothing, mix):
  full = logits.astype(jnp.float32)
  logsumexp = jax.nn.logsumexp(full, axis=-1)
  pick = lambda t: logsumexp - jnp.take_along_axis(full, t[..., None], axis=-1)[..., 0]
  nll = pick(targets)
  if mix is not None:
    partner, lam = mix
    nll = lam * nll + (1.0 - lam) * pick(partner)
  if label_smoothing:
    nll = (1.0 - label_smoothing) * nll + label_smoothing * (logsumexp - full.mean(axis=-1))
  return (nll, logsumexp), (logits, logsumexp, targets, mix)


def _cross_entropy_backward(label_smoothing, residuals, grads):
  grad_nll, grad_log_z = grads
  logits, logsumexp, targets, mix = residuals
  ids = jnp.arange(logits.shape[-1]).reshape((1,) * targets.ndim + (-1,))
  own = (1.0 - label_smoothing) * grad_nll  # the weight of the one-hot targets
  if mix is None:
    target = own[..., None] * (ids == targets[..., None])
  else:
    partner, lam = mix
    target = ((own * lam)[..., None] * (ids == targets[..., None])
              + (own * (1.0 - lam))[..., None] * (ids == partner[..., None]))
  softmax = jnp.exp(logits.astype(jnp.float32) - logsumexp[..., None])
  spread = label_smoothing / logits.shape[-1]  # the smoothing's share of every class
  # d nll / d logits = softmax - the target distribution; d log Z / d logits = softmax.
  grad = softmax * (grad_nll + grad_log_z)[..., None] - spread * grad_nll[..., None] - target
  return grad.astype(logits.dtype), None, None


cross_entropy_and_log_z.defvjp(_cross_entropy_forward, _cross_entropy_backward)
