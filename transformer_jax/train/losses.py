"""A family's forward pass on a batch, and the summed (not averaged) loss terms.

Sums, not means, so that microbatches, devices and processes combine exactly: the loss is the
sum of per-position losses over the whole global batch divided by its total weight.
"""
import jax
import jax.numpy as jnp

from transformer_jax.models.registry import Family

__all__ = ['logits_targets_weights', 'loss_sums', 'mixed_targets']


def logits_targets_weights(model, family: Family, params, batch, *, deterministic=True,
                           rngs=None):
  """(float32 logits, integer targets, float32 weights) of a batch, for any family."""
  apply = lambda *args, **kw: model.apply({'params': params}, *args, deterministic=deterministic,
                                          rngs=rngs, **kw)
  return family.logits(apply, batch), batch[family.targets], family.weights(batch)


def mixed_targets(batch: dict):
  """(partner targets, weight of the own targets) of a batch mixed by mixup or CutMix
  (data.mixing); None for a batch without."""
  if 'label_mix' not in batch:
    return None
  return batch['label_mix'], batch['mix_weight'].astype(jnp.float32)


def loss_sums(logits, targets, weights, label_smoothing: float = 0.0, mix=None,
              top5: bool = False) -> dict[str, jax.Array]:
  """Weighted sums of the cross-entropy (float32) and of correct argmax predictions ('correct';
  with top5 also 'correct_top5', the targets among the five highest logits).

  mix: (partner targets, lam) of mixed rows (mixed_targets): the target distribution is lam on
  `targets` and 1 - lam on the partner's, smoothed by label_smoothing; 'correct' counts `targets`.
  """
  log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  pick = lambda t: -jnp.take_along_axis(log_probs, t[..., None], axis=-1)[..., 0]
  nll = pick(targets)
  if mix is not None:
    partner, lam = mix
    nll = lam * nll + (1.0 - lam) * pick(partner)
  if label_smoothing:
    nll = (1.0 - label_smoothing) * nll - label_smoothing * log_probs.mean(axis=-1)
  sums = {'loss': jnp.sum(nll * weights), 'weight': jnp.sum(weights),
          'correct': jnp.sum((jnp.argmax(logits, axis=-1) == targets) * weights)}
  if top5:
    _, best = jax.lax.top_k(logits, min(5, logits.shape[-1]))
    sums['correct_top5'] = jnp.sum((best == targets[..., None]).any(axis=-1) * weights)
  return sums
