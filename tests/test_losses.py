"""The cross-entropy and its hand-written gradient against an independent computation in float64:
-sum(q log softmax(logits)) over each position's target distribution q, and its gradient
softmax(logits) - q, for one-hot, mixed and smoothed targets, float32 and bfloat16 logits; with
T5X's z-loss z * log(Z)^2 added, whose gradient is 2 z log(Z) softmax(logits), still computed
from the logits alone."""
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


def reference(logits, targets, weights, smoothing, mix, z_loss=0.0):
  """(sum of weighted cross-entropies, of weighted z-losses, the gradient of their sum) in
  float64."""
  x = np.asarray(logits, np.float64)
  log_z = np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True)) + x.max(
      -1, keepdims=True)
  log_probs = x - log_z
  q = target_distribution(np.asarray(targets), x.shape[-1], smoothing, mix)
  w = np.asarray(weights, np.float64)[..., None]
  grad = (np.exp(log_probs) * (1 + 2 * z_loss * log_z) - q) * w
  return -(q * log_probs * w).sum(), (z_loss * log_z ** 2 * w).sum(), grad


def example(shape, mixed, seed=0):
  """(logits of order 3, targets, weights, the mixing or None) of `shape` (..., V)."""
  keys = jax.random.split(jax.random.key(seed), 5)
  mix = (jax.random.randint(keys[3], shape[:-1], 0, shape[-1]),
         jax.random.uniform(keys[4], shape[:-1])) if mixed else None
  return (3 * jax.random.normal(keys[0], shape), jax.random.randint(keys[1], shape[:-1], 0,
                                                                     shape[-1]),
          jax.random.uniform(keys[2], shape[:-1]), mix)


@pytest.mark.parametrize('shape', [(4, 7, 33), (6, 10)])  # tokens (B, T, V), images (B, classes)
@pytest.mark.parametrize('smoothing', [0.0, 0.1])
@pytest.mark.parametrize('mixed', [False, True])
@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize('z_loss', [0.0, 0.03])
def test_the_loss_and_its_gradient_are_those_of_the_target_distribution(shape, smoothing, mixed,
                                                                       dtype, z_loss):
  logits, targets, weights, mix = example(shape, mixed)
  logits = logits.astype(dtype)

  def objective(x):
    sums = losses.loss_sums(x, targets, weights, smoothing, mix, z_loss=z_loss)
    assert ('z_loss' in sums) == bool(z_loss)
    return losses.objective(sums), sums
  (_, sums), grad = jax.jit(jax.value_and_grad(objective, has_aux=True))(logits)
  expected_value, expected_z_loss, expected_grad = reference(
      logits.astype(jnp.float32), targets, weights, smoothing, mix, z_loss)
  assert grad.dtype == dtype
  np.testing.assert_allclose(float(sums['loss']), expected_value, rtol=1e-6)
  np.testing.assert_allclose(float(sums.get('z_loss', 0.0)), expected_z_loss, rtol=1e-6)
  tolerance = 1e-6 if dtype == jnp.float32 else 4e-3  # bfloat16 gradients: 8 bits of mantissa
  np.testing.assert_allclose(np.asarray(grad, np.float64), expected_grad, rtol=tolerance,
                             atol=tolerance * np.abs(expected_grad).max())


@pytest.mark.parametrize('smoothing', [0.0, 0.1])
@pytest.mark.parametrize('mixed', [False, True])
def test_the_z_loss_and_its_gradient_are_jax_grad_of_the_plain_formula(smoothing, mixed):
  """T5X's loss, written plainly with log_softmax and logsumexp and differentiated by jax.grad:
  the weighted sum of the cross-entropy plus 1e-2 * logsumexp(logits)^2."""
  logits, targets, weights, mix = example((4, 7, 33), mixed, seed=1)

  def plain(x):
    log_probs = jax.nn.log_softmax(x)
    q = jnp.asarray(target_distribution(np.asarray(targets), x.shape[-1], smoothing, mix))
    return jnp.sum(weights * (-(q * log_probs).sum(-1) + 1e-2 * jax.nn.logsumexp(x, -1) ** 2))
  ours = lambda x: losses.objective(losses.loss_sums(x, targets, weights, smoothing, mix,
                                                     z_loss=1e-2))
  np.testing.assert_allclose(ours(logits), plain(logits), rtol=1e-6)
  np.testing.assert_allclose(jax.grad(ours)(logits), jax.grad(plain)(logits), rtol=1e-5,
                             atol=1e-7)


def test_the_backward_pass_keeps_one_array_of_the_vocabulary_size_with_the_z_loss():
  """The residuals of the objective's VJP: of the shape of the logits, the logits alone, where
  autodiff of the plain formula keeps a second (its softmax)."""
  logits, targets, weights, _ = example((4, 7, 33), False)
  ours = lambda x: losses.objective(losses.loss_sums(x, targets, weights, z_loss=1e-2))
  plain = lambda x: jnp.sum(weights * (-jnp.take_along_axis(jax.nn.log_softmax(x),
                                                            targets[..., None], -1)[..., 0]
                                       + 1e-2 * jax.nn.logsumexp(x, -1) ** 2))
  full_size = lambda f: sum(leaf.shape == logits.shape for leaf in jax.tree.leaves(
      jax.vjp(jax.jit(f), logits)[1]))
  assert (full_size(ours), full_size(plain)) == (1, 2)


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
