"""T5's relative position bias against transformers' T5Attention (random weights, settings other
than T5's 32 buckets and distance 128) and buckets worked out by hand."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_jax import layers
from transformer_jax.errors import ConfigError
from transformer_jax.layers.relative_position import relative_position_bucket

torch = pytest.importorskip('torch')
modeling_t5 = pytest.importorskip('transformers.models.t5.modeling_t5')
T5Config = pytest.importorskip('transformers').T5Config

SETTINGS = [(32, 128), (10, 23), (7, 50), (4, 9), (64, 300)]


def torch_attention(num_buckets, max_distance, is_decoder, num_heads=3):
  """transformers' T5 attention with a relative bias of random weights."""
  torch.manual_seed(num_buckets * 1000 + max_distance)
  config = T5Config(d_model=13, d_kv=5, num_heads=num_heads, is_decoder=is_decoder,
                    relative_attention_num_buckets=num_buckets,
                    relative_attention_max_distance=max_distance)
  attention = modeling_t5.T5Attention(config, has_relative_attention_bias=True)
  torch.nn.init.normal_(attention.relative_attention_bias.weight)
  return attention


@pytest.mark.parametrize('bidirectional', [True, False])
@pytest.mark.parametrize('num_buckets,max_distance', SETTINGS)
def test_buckets_equal_transformers_t5(num_buckets, max_distance, bidirectional):
  relative = np.arange(-700, 701)
  expected = modeling_t5.T5Attention._relative_position_bucket(
      torch.tensor(relative), bidirectional=bidirectional, num_buckets=num_buckets,
      max_distance=max_distance).numpy()
  buckets = relative_position_bucket(jnp.asarray(relative), bidirectional, num_buckets,
                                     max_distance)
  np.testing.assert_array_equal(buckets, expected)
  assert buckets.dtype == jnp.int32


def test_t5_buckets_worked_out_by_hand():
  """32 buckets, distance 128. Bidirectional: 16 a side, 0..7 exact, then 8 + floor(log(d / 8) /
  log(16) * 8): d = 16 -> 10, d = 127 -> 15. Keys after the query take 16 more. Causal: 32
  buckets before the query, 0..15 exact, 16 + floor(log(d / 16) / log(8) * 16): d = 32 -> 21."""
  relative = jnp.array([0, -1, -7, -8, -16, -127, -128, -5000, 1, 7, 8, 5000])
  np.testing.assert_array_equal(relative_position_bucket(relative, True),
                                [0, 1, 7, 8, 10, 15, 15, 15, 17, 23, 24, 31])
  relative = jnp.array([0, 3, 5000, -1, -15, -16, -32, -127, -128, -5000])
  np.testing.assert_array_equal(relative_position_bucket(relative, False),
                                [0, 0, 0, 1, 15, 16, 21, 31, 31, 31])


def flax_bias(attention, bidirectional):
  """The layer with the torch attention's table, and its parameters."""
  table = attention.relative_attention_bias.weight.detach().numpy()
  layer = layers.RelativePositionBias(
      num_heads=table.shape[1], num_buckets=attention.relative_attention_num_buckets,
      max_distance=attention.relative_attention_max_distance, bidirectional=bidirectional)
  return layer, {'params': {'relative_attention_bias': jnp.asarray(table)}}


@pytest.mark.parametrize('bidirectional', [True, False])
@pytest.mark.parametrize('num_buckets,max_distance', [(10, 23), (7, 50), (32, 128)])
def test_bias_equals_transformers_compute_bias(num_buckets, max_distance, bidirectional):
  attention = torch_attention(num_buckets, max_distance, is_decoder=not bidirectional)
  layer, params = flax_bias(attention, bidirectional)
  for queries, keys in [(9, 9), (5, 31), (1, 1), (160, 160)]:
    expected = attention.compute_bias(queries, keys).detach().numpy()
    bias = layer.apply(params, jnp.arange(queries)[None], jnp.arange(keys)[None])
    assert bias.shape == (1, 3, queries, keys) and bias.dtype == jnp.float32
    np.testing.assert_allclose(bias, expected, rtol=0, atol=1e-6)


def test_a_cached_step_takes_the_bias_of_its_absolute_position():
  attention = torch_attention(10, 23, is_decoder=True)
  layer, params = flax_bias(attention, bidirectional=False)
  full = layer.apply(params, jnp.arange(40), jnp.arange(40))  # 1-D positions: a batch of 1
  for step in (0, 7, 39):
    expected = attention.compute_bias(1, 40, past_seen_tokens=step).detach().numpy()
    bias = layer.apply(params, jnp.array([[step]]), jnp.arange(40)[None])
    np.testing.assert_allclose(bias, expected, rtol=0, atol=1e-6)
    np.testing.assert_array_equal(bias[0, :, 0], full[0, :, step])


def test_rows_of_their_own_positions_and_the_parameter_axes(rng):
  layer = layers.RelativePositionBias(num_heads=2, num_buckets=6, max_distance=11)
  positions = jnp.array([[0, 1, 2, 3], [-2, -1, 0, 1]])  # a left-padded row: only differences
  variables = layer.init(rng, positions, positions)
  boxed = variables['params']['relative_attention_bias']
  assert boxed.names == ('relpos_buckets', 'heads') and boxed.value.shape == (6, 2)
  bias = layer.apply(variables, positions, positions)
  assert bias.shape == (2, 2, 4, 4)
  np.testing.assert_array_equal(bias[0], bias[1])
  shared = layer.apply(variables, positions[:1], positions)
  assert shared.shape == (2, 2, 4, 4)


def test_the_table_is_read_in_dtype_and_the_bias_is_float32(rng):
  layer = layers.RelativePositionBias(num_heads=2, num_buckets=8, max_distance=20,
                                      dtype=jnp.bfloat16)
  positions = jnp.arange(6)
  variables = layer.init(rng, positions, positions)
  bias = layer.apply(variables, positions, positions)
  assert bias.dtype == jnp.float32
  table = variables['params']['relative_attention_bias'].value
  rounded = table.astype(jnp.bfloat16).astype(jnp.float32)
  np.testing.assert_array_equal(bias[0, :, 0, 0], rounded[0])
  assert jax.jit(layer.apply)(variables, positions, positions).shape == (1, 2, 6, 6)


@pytest.mark.parametrize('kwargs,message', [
    ({'num_buckets': 3, 'bidirectional': True}, 'num_buckets >= 4'),
    ({'num_buckets': 1, 'bidirectional': False}, 'num_buckets >= 2'),
    ({'num_buckets': 32, 'max_distance': 8}, 'max_distance > 8'),
    ({'num_heads': 0}, 'num_heads >= 1'),
])
def test_bad_settings_name_the_fix(kwargs, message):
  with pytest.raises(ConfigError, match=message):
    layers.RelativePositionBias(**{'num_heads': 2, **kwargs})
