"""The image-text losses against NumPy in float64, and over the global batch: one device equals
eight in both forms (jit and shard_map), gradients included; no device holds all similarities."""
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from transformer_jax.errors import ConfigError
from transformer_jax.settings import MeshSettings
from transformer_jax import contrastive
from transformer_jax.train import sharding

CLIP_T = math.log(1 / 0.07)
SIGLIP_T, SIGLIP_B = math.log(10), -10.0


def _unit(x):
  return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _log_softmax(x, axis):
  shifted = x - x.max(axis=axis, keepdims=True)
  return shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))


def numpy_softmax_loss(image, text, log_temperature):
  logits = math.exp(log_temperature) * _unit(image) @ _unit(text).T
  image_to_text = -np.diag(_log_softmax(logits, axis=1)).mean()
  text_to_image = -np.diag(_log_softmax(logits, axis=0)).mean()
  return (image_to_text + text_to_image) / 2


def numpy_sigmoid_loss(image, text, log_temperature, bias):
  logits = math.exp(log_temperature) * _unit(image) @ _unit(text).T + bias
  z = 2 * np.eye(len(image)) - 1
  log_sigmoid = -np.logaddexp(0.0, -z * logits)
  return -log_sigmoid.sum() / len(image)


def pairs(batch, width=8, noise=0.5, seed=0):
  """float64 (image, text) embeddings of `batch` pairs, each text near its image, of varied
  norms (the losses normalise)."""
  rng = np.random.default_rng(seed)
  image = rng.normal(size=(batch, width)) * rng.uniform(0.5, 3.0, size=(batch, 1))
  text = (_unit(image) + noise * rng.normal(size=(batch, width))) * rng.uniform(0.5, 3.0,
                                                                                size=(batch, 1))
  return image, text


LOSSES = {'softmax': (contrastive.softmax_contrastive_loss,
                      contrastive.softmax_contrastive_loss_per_device, (CLIP_T,)),
          'sigmoid': (contrastive.sigmoid_loss, contrastive.sigmoid_loss_per_device,
                      (SIGLIP_T, SIGLIP_B))}


def on_devices(name, form, devices):
  """The loss `name` as a jitted fn(image, text, *scalars) on the first `devices` devices, its
  embeddings sharded P('data'): the whole-batch form under jit, or the per-device one under
  shard_map."""
  whole_batch, per_device, _ = LOSSES[name]
  mesh = sharding.make_mesh(MeshSettings(shape=(devices,)))
  rules = sharding.RULE_SETS['dp']

  def jit_form(*args):
    with sharding.activation_rules(mesh, rules):
      return whole_batch(*args)

  loss = jit_form if form == 'jit' else contrastive.on_mesh(per_device, mesh)
  batch = NamedSharding(mesh, P(sharding.DATA_AXIS))
  scalars = (NamedSharding(mesh, P()),) * len(LOSSES[name][2])
  return jax.jit(loss, in_shardings=(batch, batch) + scalars)


def _inputs(name, batch=32, **kw):
  image, text = pairs(batch, **kw)
  return image, text, LOSSES[name][2]


def _as_f32(image, text, scalars):
  return (jnp.asarray(image, jnp.float32), jnp.asarray(text, jnp.float32),
          *(jnp.float32(s) for s in scalars))


@pytest.mark.parametrize('scalars', [(CLIP_T,), (0.0,), (math.log(30.0),)])
def test_the_softmax_loss_is_clips_symmetric_cross_entropy(scalars):
  image, text = pairs(16, noise=1.0)
  loss, metrics = contrastive.softmax_contrastive_loss(*_as_f32(image, text, scalars))
  np.testing.assert_allclose(loss, numpy_softmax_loss(image, text, *scalars), rtol=1e-5)
  assert metrics['temperature'] == pytest.approx(math.exp(scalars[0]), rel=1e-6)


@pytest.mark.parametrize('scalars', [(SIGLIP_T, SIGLIP_B), (SIGLIP_T, -2.71), (0.5, 1.5)])
def test_the_sigmoid_loss_is_siglips_summed_over_texts_and_averaged_over_images(scalars):
  image, text = pairs(16, noise=1.0)
  loss, metrics = contrastive.sigmoid_loss(*_as_f32(image, text, scalars))
  np.testing.assert_allclose(loss, numpy_sigmoid_loss(image, text, *scalars), rtol=1e-5)
  assert metrics['bias'] == pytest.approx(scalars[1])


def test_past_100_the_softmax_scale_is_exp_t_and_t_still_learns():
  """CLIP's clip at 100 is open_clip's clamp of the parameter after each update (below), not a
  min in the loss, which would leave t no gradient to come back with."""
  image, text = pairs(16, noise=1.0)
  args = _as_f32(image, text, (math.log(500.0),))
  loss, metrics = contrastive.softmax_contrastive_loss(*args)
  assert metrics['temperature'] == pytest.approx(500.0, rel=1e-6)
  np.testing.assert_allclose(loss, numpy_softmax_loss(image, text, math.log(500.0)), rtol=1e-5)
  grad_t = jax.grad(lambda t: contrastive.softmax_contrastive_loss(args[0], args[1], t)[0])(
      args[2])
  assert abs(grad_t) > 1e-3


@pytest.mark.parametrize('t, clamped', [(math.log(500.0), math.log(100.0)), (-0.5, 0.0),
                                        (2.0, 2.0), (math.log(100.0), math.log(100.0))])
def test_the_softmax_temperature_is_clamped_to_1_100_and_the_sigmoids_left_free(t, clamped):
  """open_clip's train.py after every step: logit_scale.clamp_(0, math.log(100)); big_vision's
  SigLIP trainer clamps neither t nor b."""
  scalars = {'log_temperature': jnp.float32(t)}
  out = contrastive.ContrastiveSettings().constrained(scalars)['log_temperature']
  assert out == np.float32(clamped)
  sigmoid = contrastive.ContrastiveSettings(loss='sigmoid')
  free = {'log_temperature': jnp.float32(t), 'bias': jnp.float32(-20.0)}
  assert sigmoid.constrained(free) == free


@pytest.mark.parametrize('name', LOSSES)
@pytest.mark.parametrize('form', ['jit', 'shard_map'])
def test_one_device_gives_the_loss_and_metrics_of_eight(name, form):
  image, text, scalars = _inputs(name)
  args = _as_f32(image, text, scalars)
  one_loss, one_metrics = on_devices(name, form, 1)(*args)
  eight_loss, eight_metrics = on_devices(name, form, 8)(*args)
  reference = {'softmax': numpy_softmax_loss, 'sigmoid': numpy_sigmoid_loss}[name]
  np.testing.assert_allclose(one_loss, reference(image, text, *scalars), rtol=1e-5)
  np.testing.assert_allclose(eight_loss, one_loss, rtol=1e-5)
  for key, value in one_metrics.items():
    np.testing.assert_allclose(eight_metrics[key], value, rtol=1e-6, err_msg=key)
  # Texts near their images but noisy: some pairs are retrieved, not all.
  assert 0 < one_metrics['image_to_text_accuracy'] < 1


@pytest.mark.parametrize('name', LOSSES)
@pytest.mark.parametrize('form', ['jit', 'shard_map'])
def test_one_device_gives_the_gradients_of_eight(name, form):
  image, text, scalars = _inputs(name)
  args = _as_f32(image, text, scalars)
  positions = tuple(range(len(args)))
  grads = lambda devices: jax.grad(lambda *a: on_devices(name, form, devices)(*a)[0],
                                   argnums=positions)(*args)
  one, eight = grads(1), grads(8)
  for position, (g1, g8) in enumerate(zip(one, eight)):
    assert np.abs(g1).max() > 1e-4, position  # every input has a gradient to compare
    np.testing.assert_allclose(g8, g1, rtol=1e-5, atol=1e-7, err_msg=f'argument {position}')


@pytest.mark.parametrize('name', LOSSES)
def test_the_gradients_match_numpy_finite_differences(name):
  image, text = pairs(8, width=4)
  whole_batch, _, scalars = LOSSES[name]
  numpy_loss = {'softmax': numpy_softmax_loss, 'sigmoid': numpy_sigmoid_loss}[name]
  _, *rest = _as_f32(image, text, scalars)
  grad = jax.jit(jax.grad(lambda i: whole_batch(i, *rest)[0]))(jnp.asarray(image, jnp.float32))
  step = 1e-6
  numeric = np.zeros_like(image)
  for index in np.ndindex(*image.shape):
    up, down = image.copy(), image.copy()
    up[index] += step
    down[index] -= step
    numeric[index] = (numpy_loss(up, text, *scalars) - numpy_loss(down, text, *scalars)) / (
        2 * step)
  np.testing.assert_allclose(grad, numeric, rtol=1e-3, atol=1e-5)


def test_the_ring_exchange_equals_the_gathered_sigmoid_loss():
  image, text, scalars = _inputs('sigmoid', batch=48, noise=0.7, seed=3)
  args = _as_f32(image, text, scalars)
  gathered, ring = on_devices('sigmoid', 'jit', 8), on_devices('sigmoid', 'shard_map', 8)
  (gathered_loss, gathered_metrics), (ring_loss, ring_metrics) = gathered(*args), ring(*args)
  np.testing.assert_allclose(ring_loss, gathered_loss, rtol=1e-5)
  for key, value in gathered_metrics.items():
    np.testing.assert_allclose(ring_metrics[key], value, rtol=1e-6, err_msg=key)
  assert 0 < gathered_metrics['text_to_image_accuracy'] < 1
  value_and_grad = lambda f: jax.grad(lambda *a: f(*a)[0], argnums=(0, 1, 2, 3))(*args)
  for g_ring, g_gathered in zip(value_and_grad(ring), value_and_grad(gathered)):
    np.testing.assert_allclose(g_ring, g_gathered, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize('name', LOSSES)
@pytest.mark.parametrize('form', ['jit', 'shard_map'])
def test_the_accuracy_counts_the_pairs_whose_partner_is_nearest(name, form):
  batch = 32
  image = np.linalg.qr(np.random.default_rng(1).normal(size=(batch, batch)))[0]  # orthonormal
  text = image + 0.01 * np.random.default_rng(2).normal(size=image.shape)
  _, metrics = on_devices(name, form, 8)(*_as_f32(image, text, LOSSES[name][2]))
  assert metrics['image_to_text_accuracy'] == 1.0 and metrics['text_to_image_accuracy'] == 1.0
  # Texts 0 and 9 (on different devices) swapped: exactly those two images and two texts miss.
  swapped = text[[9, 1, 2, 3, 4, 5, 6, 7, 8, 0] + list(range(10, batch))]
  _, metrics = on_devices(name, form, 8)(*_as_f32(image, swapped, LOSSES[name][2]))
  assert metrics['image_to_text_accuracy'] == pytest.approx((batch - 2) / batch)
  assert metrics['text_to_image_accuracy'] == pytest.approx((batch - 2) / batch)


@pytest.mark.parametrize('name', LOSSES)
@pytest.mark.parametrize('form', ['jit', 'shard_map'])
def test_no_device_holds_the_whole_similarity_matrix(name, form):
  batch = 64
  image, text, scalars = _inputs(name, batch=batch)
  args = _as_f32(image, text, scalars)
  whole = f'f32[{batch},{batch}]'
  hlo = lambda devices: on_devices(name, form, devices).lower(*args).compile().as_text()
  assert whole in hlo(1)  # the check can see the matrix
  assert whole not in hlo(8)


def test_the_settings_give_the_papers_initial_scalars_and_their_loss():
  assert contrastive.ContrastiveSettings().initial_scalars() == {
      'log_temperature': pytest.approx(CLIP_T)}
  siglip = contrastive.ContrastiveSettings(loss='sigmoid')
  assert siglip.initial_scalars() == {'log_temperature': pytest.approx(SIGLIP_T), 'bias': -10.0}
  lit_coco = contrastive.ContrastiveSettings.of({'loss': 'sigmoid', 'temperature': 10.0,
                                                 'bias': -2.71})
  assert lit_coco.initial_scalars()['bias'] == -2.71
  image, text = pairs(16)
  scalars = siglip.initial_scalars()
  loss, _ = siglip.loss_fn()(*_as_f32(image, text, ()), **scalars)
  np.testing.assert_allclose(loss, numpy_sigmoid_loss(image, text, SIGLIP_T, SIGLIP_B),
                             rtol=1e-5)
  assert siglip.loss_fn(per_device=True) is contrastive.sigmoid_loss_per_device


@pytest.mark.parametrize('section,message', [
    ({'bias': -10.0}, 'contrastive.loss="sigmoid"'),
    ({'loss': 'infonce'}, "contrastive.loss='infonce' must be one of"),
    ({'loss': 'sigmoid', 'temperature': 0.0}, '--config.contrastive.temperature=10'),
])
def test_bad_settings_name_the_fix(section, message):
  with pytest.raises(ConfigError, match=re.escape(message)):
    contrastive.ContrastiveSettings.of(section)


def test_its_data_axis_is_the_meshs():
  assert contrastive.DATA_AXIS == sharding.DATA_AXIS
