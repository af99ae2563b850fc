"""The fused platform kernels on this CPU: splash attention in Pallas's interpreter against the
reference, forward and gradients; cuDNN's choice of case, and the arguments it runs with as
XLA runs them, against the reference; and the structured masks they read."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_jax import kernels, layers
# Imported, not skipped where it fails: Pallas's splash_attention ships inside jax itself, and
# 'auto' picks this kernel on TPUs, so an import that fails here is a broken kernel.
from transformer_jax.kernels import cudnn, masks, reference, splash
from transformer_jax.layers import axes

T = 128  # splash's smallest block
# Packed rows: two documents and padding, positions restarting at each document.
SEGMENTS = np.array([[1] * 50 + [2] * 50 + [0] * 28, [1] * 90 + [2] * 38])
POSITIONS = np.array([[*range(50), *range(50), *[0] * 28], [*range(90), *range(38)]])
REAL = SEGMENTS > 0  # the queries whose outputs a loss reads


def _inputs(kv_heads=2, t=T, s=T, h=4, d=32, dtype=jnp.float32):
  q = jax.random.normal(jax.random.key(0), (2, t, h, d), dtype)
  k, v = jax.random.normal(jax.random.key(1), (2, 2, s, kv_heads, d), dtype)
  return q, k, v


def _packed():
  return masks.Mask(causal=True, positions=jnp.asarray(POSITIONS),
                    segments=(jnp.asarray(SEGMENTS),) * 2)


def _loss(kernel, mask):
  """A weighted sum of the outputs of the real queries, so that gradients reach every input."""
  weights = jnp.cos(jnp.arange(32.0))[None, None, None] * REAL[:, :, None, None]
  return lambda q, k, v: jnp.sum(kernel(q, k, v, mask, scale=32 ** -0.5) * weights)


def _reference(q, k, v, mask, *, scale):
  return reference.attention(q, k, v, masks.dense(mask, q.shape[1], k.shape[1]), scale=scale)


_SLOW = pytest.mark.slow  # Pallas's interpreter takes tens of seconds a case


@pytest.mark.parametrize('mask,kv_heads', [
    pytest.param(None, 4, marks=_SLOW), (masks.Mask(causal=True, window=40), 1), (_packed(), 2),
    pytest.param(masks.Mask(causal=True), 2, marks=_SLOW),
    pytest.param(masks.Mask(valid=jnp.asarray(REAL)), 4, marks=_SLOW)])
def test_splash_in_the_interpreter_equals_the_reference_with_gradients(mask, kv_heads):
  """Causal, a sliding window, packed rows (on their real tokens: a padding query may see more
  of the padding), valid keys; MHA, GQA and MQA."""
  q, k, v = _inputs(kv_heads)
  kernel = splash.make(interpret=True)
  out, want = (kernel(q, k, v, mask, scale=32 ** -0.5), _reference(q, k, v, mask, scale=32 ** -0.5))
  np.testing.assert_allclose(out[REAL], want[REAL], atol=2e-5)
  grads = jax.grad(_loss(kernel, mask), argnums=(0, 1, 2))(q, k, v)
  wanted = jax.grad(_loss(_reference, mask), argnums=(0, 1, 2))(q, k, v)
  for got, expected in zip(grads, wanted):
    np.testing.assert_allclose(got, expected, atol=5e-5)


@pytest.mark.parametrize('t,mask,why', [
    (100, masks.Mask(causal=True), 'must divide the 100 queries'),
    (T, jnp.ones((1, 1, T, T), bool), 'cannot read a dense mask'),
    (T, masks.Mask(causal=True, positions=jnp.asarray(POSITIONS)), 'positions that start'),
    (T, masks.Mask(causal=True, other=jnp.ones((1, 1, T, T), bool)), 'cannot read a dense mask')])
def test_splash_falls_back_to_xla_with_the_reason(t, mask, why):
  q, k, _ = _inputs(t=t, s=t)
  plan, reason = splash.decide(q, k, mask)
  assert plan is None and why in reason
  q, k, v = _inputs(t=t, s=t)
  np.testing.assert_allclose(splash.make(interpret=True)(q, k, v, mask, scale=0.2),
                             _reference(q, k, v, mask, scale=0.2), atol=2e-6)


def test_splash_takes_no_bias_and_runs_xla_with_it():
  q, k, v = _inputs()
  bias = jax.random.normal(jax.random.key(5), (1, 4, T, T))
  assert splash.decide(q, k, masks.Mask(causal=True), bias) == (
      None, 'splash takes no additive bias')
  np.testing.assert_allclose(
      splash.make(interpret=True)(q, k, v, masks.Mask(causal=True), scale=0.2, bias=bias),
      reference.attention(q, k, v, masks.Mask(causal=True).dense(T, T), scale=0.2, bias=bias),
      atol=2e-6)


@pytest.mark.parametrize('t,takes', [(T, True), (127, False)])
def test_cudnn_takes_a_bias_as_a_dense_mask_at_even_lengths(t, takes):
  """A bias goes to cuDNN in the queries' dtype; like a dense mask, only at even lengths."""
  q, k, v = _inputs(t=t, s=t, dtype=jnp.bfloat16)
  bias = jnp.ones((1, 4, t, t), jnp.float32)
  kwargs, reason = cudnn.decide(q, k, v, masks.Mask(causal=True), bias=bias)
  if takes:
    assert kwargs['bias'].dtype == jnp.bfloat16 and kwargs['is_causal']
    assert 'an additive bias' in reason
  else:
    assert kwargs is None and 'even sequence lengths' in reason


def test_splash_blocks_divide_the_sequences_and_it_reads_the_activation_axes():
  q, k, _ = _inputs(t=384, s=1024)
  plan, _ = splash.decide(q, k, masks.Mask(valid=jnp.ones((2, 1024), bool)))
  assert (plan['block_q'], plan['block_kv']) == (128, 512)
  assert (splash.BATCH, splash.LENGTH, splash.HEADS, splash.KV_HEADS) == (
      axes.BATCH, axes.LENGTH, axes.HEADS, axes.KV_HEADS)


@pytest.mark.parametrize('dtype,mask,t,wanted', [
    (jnp.bfloat16, masks.Mask(causal=True), T, {'is_causal': True, 'mask': None}),
    (jnp.float16, masks.Mask(causal=True, window=16), T,
     {'is_causal': True, 'local_window_size': (15, 0), 'mask': None}),
    (jnp.bfloat16, _packed(), T, {'is_causal': True, 'mask': 'dense'}),
    (jnp.bfloat16, masks.Mask(causal=True, positions=jnp.asarray(POSITIONS)), T,
     {'mask': 'dense'}),
    (jnp.bfloat16, None, 9, {'mask': None}),
    (jnp.bfloat16, jnp.ones((2, 1, T, T), bool), T, {'mask': 'dense'})])
def test_cudnn_runs_the_cases_it_takes_with_the_mask_by_its_structure(dtype, mask, t, wanted):
  q, k, v = _inputs(t=t, s=t, dtype=dtype)
  kwargs, _ = cudnn.decide(q, k, v, mask)
  assert {key: 'dense' if key == 'mask' and value is not None else value
          for key, value in kwargs.items()} == wanted


@pytest.mark.parametrize('dtype,mask,t,why', [
    (jnp.float32, masks.Mask(causal=True), T, 'bfloat16 or float16, not float32'),
    (jnp.bfloat16, _packed(), 127, 'even sequence lengths')])
def test_cudnn_falls_back_to_xla_with_the_reason(dtype, mask, t, why, caplog):
  q, k, v = _inputs(t=t, s=t, dtype=dtype)
  if isinstance(mask, masks.Mask) and mask.segments is not None:
    mask = masks.Mask(causal=True, segments=(jnp.ones((2, t), jnp.int32),) * 2)
  kwargs, reason = cudnn.decide(q, k, v, mask)
  assert kwargs is None and why in reason
  with caplog.at_level('INFO'):
    out = cudnn.attention(q, k, v, mask, scale=0.2)
  assert why in caplog.text
  np.testing.assert_allclose(np.asarray(out, np.float32),
                             np.asarray(_reference(q, k, v, mask, scale=0.2), np.float32),
                             atol=2e-2 if dtype == jnp.bfloat16 else 2e-6)


@pytest.mark.parametrize('mask', [masks.Mask(causal=True), masks.Mask(causal=True, window=16),
                                  _packed(), masks.Mask(valid=jnp.asarray(REAL))])
def test_the_arguments_cudnn_runs_with_mean_the_mask_as_xla_runs_them(mask):
  """XLA's implementation of the same call (is_causal, local_window_size, the dense rest)."""
  q, k, v = _inputs()
  kwargs = cudnn.arguments(mask, T, T)
  out = jax.nn.dot_product_attention(q, k, v, scale=0.2, implementation='xla', **kwargs)
  np.testing.assert_allclose(out[REAL], _reference(q, k, v, mask, scale=0.2)[REAL], atol=2e-6)


def test_auto_picks_cudnn_on_gpus_and_splash_on_tpus():
  assert kernels.resolve('auto', 'gpu').name == 'cudnn'
  assert kernels.resolve('auto', 'tpu').name == 'splash'
  assert kernels.resolve('auto', 'cpu').name == 'cpu'


def test_a_mask_turns_dense_as_the_layers_build_masks():
  positions = jnp.asarray(POSITIONS)
  segments = jnp.asarray(SEGMENTS)
  causal = layers.causal_mask(jnp.arange(T), positions, T, window=20)
  np.testing.assert_array_equal(
      masks.Mask(causal=True, window=20, positions=positions).dense(T, T), causal)
  np.testing.assert_array_equal(
      masks.conjunction(masks.Mask(causal=True, positions=positions),
                        masks.Mask(segments=(segments, segments), valid=segments > 0)).dense(T, T),
      layers.causal_mask(jnp.arange(T), positions, T)
      & layers.segment_mask(segments, segments) & layers.padding_mask(segments > 0, T))
  extra = jax.random.bernoulli(jax.random.key(3), 0.5, (2, 4, T, T))
  np.testing.assert_array_equal(
      masks.conjunction(extra, masks.Mask(causal=True)).dense(T, T),
      extra & layers.causal_mask(jnp.arange(T), jnp.arange(T)[None], T))
  assert masks.Mask(causal=True, positions=np.arange(T)[None]).plain_positions
  assert not masks.Mask(causal=True, positions=positions).plain_positions


def test_kernels_not_marked_for_structure_get_the_dense_mask():
  seen = []
  def kernel(q, k, v, mask=None, *, scale):
    seen.append(mask)
    return reference.attention(q, k, v, mask, scale=scale)
  q, k, v = _inputs()
  kernel(q, k, v, masks.for_kernel(kernel, masks.Mask(causal=True), T, T), scale=1.0)
  assert seen[0].dtype == bool and seen[0].shape == (1, 1, T, T)
  assert masks.for_kernel(cudnn.attention, _packed(), T, T).segments is not None
