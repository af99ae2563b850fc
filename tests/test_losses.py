"""The cross-entropy and its hand-written gradient against an independent computation in float64:
-sum(q log softmax(logits)) over each position's target distribution q, and its gradient
softmax(logits) - q, for one-hot, mixed and smoothed targets, float32 and bfloat16 logits."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_jax.train import losses


def target_distribution(targets, vocab, smoothing, mix):
  """q (..., V) in float64: one-hot targets, lam / 1 - lam on the partner's, smoothed."""
  q = np.eye(vocab)[targets]
  if mix is not None:
    partner, lam = (np.asarray(x) for x in mix)
    q = lam[..., None] * q + (1 - lam[..., None]) * np.eye(vocab)[partner]
  return (1 - smoothing) * q + smoothing / vocab


def reference(logits, targets, weights, smoothing, mix):
  """(sum of weighted cross-entropies, its gradient) in float64."""
  x = np.asarray(logits, np.float64)
  log_probs = x - np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True)) - x.max(
      -1, keepdims=True)
  q = target_distribution(np.asarray(targets), x.shape[-1], smoothing, mix)
  w = np.asarray(weights, np.float64)[..., None]
  return -(q * log_probs * w).sum(), (np.exp(log_probs) - q) * w


@pytest.mark.parametrize('shape', [(4, 7, 33), (6, 10)])  # tokens (B, T, V), images (B, classes)
@pytest.mark.parametrize('smoothing', [0.0, 0.1])
@pytest.mark.parametrize('mixed', [False, True])
@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16])
def test_the_loss_and_its_gradient_are_those_of_the_target_distribution(shape, smoothing, mixed,
                                                                       dtype):
  keys = jax.random.split(jax.random.key(0), 5)
  logits = (3 * jax.random.normal(keys[0], shape)).astype(dtype)
  targets = jax.random.randint(keys[1], shape[:-1], 0, shape[-1])
  weights = jax.random.uniform(keys[2], shape[:-1])
  mix = (jax.random.randint(keys[3], shape[:-1], 0, shape[-1]),
         jax.random.uniform(keys[4], shape[:-1])) if mixed else None
  loss = lambda x: losses.loss_sums(x, targets, weights, smoothing, mix)['loss']
  value, grad = jax.jit(jax.value_and_grad(loss))(logits)
  expected_value, expected_grad = reference(logits.astype(jnp.float32), targets, weights,
                                            smoothing, mix)
  assert grad.dtype == dtype
  np.testing.assert_allclose(float(value), expected_value, rtol=1e-6)
  tolerance = 1e-6 if dtype == jnp.float32 else 4e-3  # bfloat16 gradients: 8 bits of mantissa
  np.testing.assert_allclose(np.asarray(grad, np.float64), expected_grad, rtol=tolerance,
                             atol=tolerance * np.abs(expected_grad).max())


def test_each_position_gets_its_own_loss_and_a_zero_weight_no_gradient():
  logits = jax.random.normal(jax.random.key(1), (3, 5, 11))
  targets = jnp.arange(15).reshape(3, 5) % 11
  weights = jnp.ones((3, 5)).at[1].set(0.0)
  nll = losses.cross_entropy(logits, targets)
  expected = jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(logits, targets[..., None],
                                                                 -1)[..., 0]
  np.testing.assert_allclose(nll, expected, rtol=1e-6)
  grad = jax.grad(lambda x: losses.loss_sums(x, targets, weights)['loss'])(logits)
  assert not np.any(grad[1]) and np.all(np.abs(grad[0]).sum(-1) > 0)
