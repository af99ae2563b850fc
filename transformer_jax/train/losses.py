"""A family's forward pass on a batch, and the summed (not averaged) loss terms.

Sums, not means, so that microbatches, devices and processes combine exactly: the loss is the
sum of per-position losses over the whole global batch divided by its total weight.
"""
import jax
import jax.numpy as jnp

from transformer_jax.models.registry import Family

__all__ = ['logits_targets_weights', 'loss_sums']


def logits_targets_weights(model, family: Family, params, batch, *, deterministic=True,
                           rngs=None):
  """(float32 logits, integer targets, float32 weights) of a batch, for any family."""
  apply = lambda *args, **kw: model.apply({'params': params}, *args, deterministic=deterministic,
                                          rngs=rngs, **kw)
  return family.logits(apply, batch), batch[family.targets], family.weights(batch)


def loss_sums(logits, targets, weights, label_smoothing: float = 0.0) -> dict[str, jax.Array]:
  """Weighted sums of the cross-entropy (float32) and of correct argmax predictions."""
  log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  nll = -jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
  if label_smoothing:
    nll = (1.0 - label_smoothing) * nll - label_smoothing * log_probs.mean(axis=-1)
  correct = (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32)
  return {'loss': jnp.sum(nll * weights), 'correct': jnp.sum(correct * weights),
          'weight': jnp.sum(weights)}
