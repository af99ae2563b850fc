"""int8 inference: the quantized product against NumPy's integer arithmetic, which weights
int8_params quantizes (and which it leaves), and int8 models decoding as their own uncached
forward pass, close to float32."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

from helpers import init, tiny
from test_whisper import assert_cached_greedy_is_uncached, tiny_whisper
from transformer_jax import models, quantization
from transformer_jax.kernels.contraction import contract_int8, int8_product, int8_rows

RNG = np.random.default_rng(0)


def numpy_int8_product(x, weight, weight_axis):
  """x (M, K) quantized per row, times the int8 weight's integers (K along weight_axis) in int64,
  times both scales, in float64: the arithmetic int8_product stands for."""
  x_scale = np.abs(x).max(axis=1, keepdims=True) / 127
  rows = np.round(x / x_scale).astype(np.int64)
  w = weight.astype(np.float64)
  scale = np.abs(w).max(axis=weight_axis, keepdims=True) / 127
  integers = np.round(w / scale).astype(np.int64)
  if weight_axis == 1:
    integers, scale = integers.T, scale.T
  return (rows @ integers) * x_scale * scale


def test_int8_rows_put_each_rows_largest_magnitude_at_127():
  x = np.array([[0.5, -2.0, 1.0], [0.0, 0.0, 0.0], [3.0, 0.03, -0.02]], np.float32)
  q, scale = int8_rows(jnp.asarray(x))
  assert q.dtype == jnp.int8 and scale.shape == (3, 1)
  np.testing.assert_array_equal(q, [[32, -127, 64], [0, 0, 0], [127, 1, -1]])
  np.testing.assert_allclose(scale[:, 0], [2 / 127, 1.0, 3 / 127], rtol=1e-7)
  # Each value is recovered to within half its row's step.
  assert np.all(np.abs(np.asarray(q) * np.asarray(scale) - x) <= np.asarray(scale) / 2 + 1e-7)


@pytest.mark.parametrize('rows', [1, 5])  # a single row is multiplied as two
@pytest.mark.parametrize('weight_axis', [0, 1])
def test_int8_product_is_the_integer_product_times_both_scales(weight_axis, rows):
  x = RNG.standard_normal((rows, 24)).astype(np.float32)
  weight = RNG.standard_normal((24, 7) if weight_axis == 0 else (7, 24)).astype(np.float32)
  q, scale = int8_rows(jnp.asarray(weight), (weight_axis,))
  got = int8_product(jnp.asarray(x), q, scale, weight_axis)
  np.testing.assert_allclose(got, numpy_int8_product(x, weight, weight_axis), rtol=1e-6)
  # int8 by int8: within a few percent of the float product, not equal to it.
  exact = x @ (weight if weight_axis == 0 else weight.T)
  error = np.abs(np.asarray(got) - exact).max() / np.abs(exact).max()
  assert 1e-4 < error < 0.03


@pytest.mark.parametrize('kernel_shape,num_in', [((8, 3, 4), 1), ((3, 4, 8), 2)])
def test_contract_int8_folds_a_kernels_input_and_output_axes(kernel_shape, num_in):
  """A (width, heads, head_dim) kernel and a (heads, head_dim, width) one, x (2, 5, *in)."""
  kernel = RNG.standard_normal(kernel_shape).astype(np.float32)
  in_shape, out_shape = kernel_shape[:num_in], kernel_shape[num_in:]
  x = RNG.standard_normal((2, 5, *in_shape)).astype(np.float32)
  in_axes = tuple(range(num_in))
  q, scale = int8_rows(jnp.asarray(kernel), in_axes)
  got = contract_int8(jnp.asarray(x), q, jnp.squeeze(scale, in_axes), num_in)
  assert got.shape == (2, 5, *out_shape) and got.dtype == jnp.float32
  flat = numpy_int8_product(x.reshape(10, -1), kernel.reshape(-1, int(np.prod(out_shape))), 0)
  np.testing.assert_allclose(got, flat.reshape(2, 5, *out_shape), rtol=1e-6)


def flat(params):
  return {'/'.join(path): value for path, value in traverse_util.flatten_dict(params).items()}


def test_int8_params_quantize_the_dense_kernels_and_token_tables_alone():
  """Whisper holds every kind: dense kernels of 1 and 2 input axes, a token table, convolutions,
  position tables, norms and biases."""
  model, params = tiny_whisper()
  before, after = flat(params), flat(quantization.int8_params(model.cfg, params))
  int8 = {name for name, value in after.items() if value.dtype == jnp.int8}
  assert int8 == {name for name in before
                  if name.endswith('/kernel') and '/conv' not in name or name.endswith('tokens')}
  assert {name for name in after if name not in before} == {f'{name}_scale' for name in int8}
  assert any(name.endswith('attn/out/kernel') for name in int8)  # 2 input axes
  for name, value in before.items():
    if name not in int8:
      assert after[name] is value, name  # left as it was
      continue
    scale = np.asarray(after[f'{name}_scale'])
    axes = (-1,) if name.endswith('tokens') else tuple(range(value.ndim - scale.ndim))
    expanded = np.expand_dims(scale, axes)
    assert np.abs(np.asarray(after[name]) * expanded - value).max() <= expanded.max() / 2 + 1e-7
    # Each output's (each row's) largest weight is at +-127.
    np.testing.assert_array_equal(np.abs(np.asarray(after[name])).max(axis=axes), 127)


def test_scanned_blocks_get_a_scale_per_block_and_int8_is_refused_twice():
  cfg = tiny('decoder', scan_layers=True)
  params = init(cfg, jax.random.key(0))
  quantized = flat(quantization.int8_params(cfg, params))
  assert quantized['decoder/layers/mlp/up/kernel_scale'].shape == (2, 128)
  assert quantized['decoder/layers/attn/query/kernel_scale'].shape == (2, 4, 8)
  assert quantization.is_int8(quantization.int8_params(cfg, params))
  with pytest.raises(ValueError, match='int8 already'):
    quantization.int8_params(cfg, quantization.int8_params(cfg, params))
  with pytest.raises(ValueError, match='do not match the model'):
    quantization.int8_params(tiny('decoder'), params)  # blocks not scanned there


@pytest.mark.parametrize('family', ['decoder', 'encoder_decoder', 'vit'])
def test_int8_models_stay_close_to_float32(family):
  cfg = tiny(family, dtype='float32')
  model, params = models.build(cfg), init(cfg, jax.random.key(1))
  noise = np.random.default_rng(1)  # no weight left at zero (ViT's head starts so)
  params = jax.tree.map(lambda p: p + 0.1 * noise.standard_normal(p.shape, np.float32), params)
  inputs = models.example_inputs(cfg, 2)
  float32 = np.asarray(model.apply({'params': params}, *inputs))
  int8 = np.asarray(model.apply({'params': quantization.int8_params(cfg, params)}, *inputs))
  error = np.abs(int8 - float32).max() / np.abs(float32).max()
  assert 1e-4 < error < 0.05, error


def test_int8_decoding_is_its_own_uncached_forward_pass():
  """Each position's activations get their own scale, so a cached step quantizes a token as
  the whole forward pass does: the same tokens and logits."""
  model, params = tiny_whisper()
  assert_cached_greedy_is_uncached(model, quantization.int8_params(model.cfg, params))
