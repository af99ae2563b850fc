"""The attention kernels: each equals the einsum reference, and the one a model runs is chosen by
the platform it is compiled for, by name, or as a function."""
import dataclasses
import re
import subprocess
import sys

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import ROOT, tiny
from transformer_jax import kernels, layers, models
from transformer_jax.layers import segment_mask


def _inputs(kv_heads, b=2, t=5, s=7, h=4, d=8):
  q = jax.random.normal(jax.random.key(0), (b, t, h, d))
  k, v = jax.random.normal(jax.random.key(1), (2, b, s, kv_heads, d))
  return q, k, v


@pytest.mark.parametrize('name', ['xla', 'cpu'])
@pytest.mark.parametrize('kv_heads,mask_shape', [(4, (2, 1, 5, 7)), (2, (2, 4, 5, 7)),
                                                 (1, (1, 1, 5, 7)), (2, None)])
def test_each_kernel_equals_the_reference_with_gradients(name, kv_heads, mask_shape):
  """Outputs and the gradients of q, k and v, for each grouping and mask broadcast (a per-head
  mask included)."""
  q, k, v = _inputs(kv_heads)
  mask = None if mask_shape is None else (
      jax.random.bernoulli(jax.random.key(2), 0.6, mask_shape).at[..., 0].set(True))
  _assert_equals_reference(name, q, k, v, mask)


@pytest.mark.parametrize('name', ['xla', 'cpu', 'auto'])
def test_each_kernel_equals_the_reference_on_a_segment_mask(name):
  """Under the per-row mask of packed rows, with grouped heads and a target padding query whose
  row of inputs has no padding, which sees no key at all (as the cross mask of a packed
  encoder-decoder can leave it)."""
  q = jax.random.normal(jax.random.key(0), (2, 6, 4, 8))
  k, v = jax.random.normal(jax.random.key(1), (2, 2, 5, 2, 8))
  mask = segment_mask(jnp.array([[1, 1, 2, 2, 0, 0], [1, 2, 2, 3, 3, 0]]),
                      jnp.array([[1, 1, 2, 2, 2], [1, 2, 3, 3, 0]]))
  _assert_equals_reference(name, q, k, v, mask)


@pytest.mark.parametrize('kv_heads,mask_shape', [(4, (2, 1, 5, 7)), (2, (2, 4, 5, 7)),
                                                 (1, (1, 1, 5, 7)), (2, None), (2, 'segments')])
def test_the_cpu_kernels_per_head_loop_equals_the_reference_with_gradients(monkeypatch, kv_heads,
                                                                         mask_shape):
  """The loop over (batch, key-value head) that long sequences take, forced on short ones: each
  grouping and mask broadcast, and packed rows with a query that sees no key."""
  monkeypatch.setattr(kernels.cpu, '_PER_HEAD_FROM', 0)
  q, k, v = _inputs(kv_heads)
  if mask_shape == 'segments':
    mask = segment_mask(jnp.array([[1, 1, 2, 2, 0], [1, 2, 2, 3, 3]]),
                        jnp.array([[1, 1, 2, 2, 2, 2, 2], [1, 2, 3, 3, 3, 3, 0]]))
  else:
    mask = None if mask_shape is None else (
        jax.random.bernoulli(jax.random.key(2), 0.6, mask_shape).at[..., 0].set(True))
  _assert_equals_reference('cpu', q, k, v, mask)


def test_the_cpu_kernel_loops_over_heads_where_their_scores_are_long_both_ways():
  """Per (batch, key-value head), a group's query rows by the keys: 384 x 384 and 384 x 1,500
  loop; 320 x 320 runs batched, and so do 1,024 rows (4 heads a key) by 256 keys, one decoded
  query by 1,500 keys, and any length with an additive bias (the loop takes none)."""
  def loops(t, s=None, kv_heads=4, bias=None):
    q = jnp.zeros((2, t, 4, 8))
    kv = jnp.zeros((2, s or t, kv_heads, 8))
    jaxpr = jax.make_jaxpr(lambda q, k, v: kernels.cpu.attention(q, k, v, scale=1.0, bias=bias))
    return 'scan' in str(jaxpr(q, kv, kv))

  assert loops(384) and loops(384, 1500)
  assert not loops(320) and not loops(256, kv_heads=1) and not loops(1, 1500)
  assert not loops(384, bias=jnp.zeros((1, 4, 384, 384)))


def test_the_cpu_kernel_loops_on_one_device_or_its_own_share_never_over_a_spread_batch():
  """On a mesh of 8 devices a jit step's arrays are spread by GSPMD, where the loop's index into
  the batch would gather it onto every device: batched there. One device, or each device's own
  share inside shard_map: the loop."""
  q = jnp.zeros((8, 384, 2, 8))
  attend = lambda q: kernels.cpu.attention(q, q, q, scale=1.0)
  loops = lambda fn: 'scan' in str(jax.make_jaxpr(fn)(q))
  for devices, spread in ((1, False), (8, True)):
    mesh = jax.make_mesh((devices,), ('data',), axis_types=(jax.sharding.AxisType.Auto,),
                         devices=jax.devices()[:devices])
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
      assert loops(attend) is not spread
    per_device = jax.shard_map(attend, mesh=mesh, in_specs=jax.P('data'),
                               out_specs=jax.P('data'))
    assert loops(per_device)


def test_the_cpu_kernels_per_head_loop_in_bfloat16_is_the_batched_products_to_rounding(
    monkeypatch):
  """In bfloat16 (float32 logits and softmax) the loop's output and gradients are the batched
  path's to bfloat16's rounding."""
  q, k, v = (x.astype(jnp.bfloat16) for x in _inputs(kv_heads=2, t=24, s=24))
  mask = jnp.tril(jnp.ones((24, 24), bool))[None, None]
  cotangent = jax.random.normal(jax.random.key(3), q.shape, jnp.bfloat16)

  def out_and_grads():
    attend = lambda q, k, v: kernels.cpu.attention(q, k, v, mask, scale=8 ** -0.5)
    out, pullback = jax.vjp(attend, q, k, v)
    return [x.astype(jnp.float32) for x in (out, *pullback(cotangent))]

  batched = out_and_grads()
  monkeypatch.setattr(kernels.cpu, '_PER_HEAD_FROM', 0)
  for got, expected in zip(out_and_grads(), batched):
    assert got.dtype == jnp.float32
    np.testing.assert_allclose(got, expected, atol=0.05, rtol=0.02)


def _assert_equals_reference(name, q, k, v, mask):
  """Kernel `name`'s outputs and gradients of q, k and v equal the reference kernel's."""
  cotangent = jax.random.normal(jax.random.key(3), q.shape)

  def out_and_grads(kernel):
    attend = lambda q, k, v: kernel(q, k, v, mask, scale=8 ** -0.5)
    loss = lambda q, k, v: jnp.sum(attend(q, k, v) * cotangent)
    return attend(q, k, v), jax.grad(loss, argnums=(0, 1, 2))(q, k, v)

  got, got_grads = out_and_grads(kernels.resolve(name).fn)
  expected, grads = out_and_grads(kernels.reference.attention)
  np.testing.assert_allclose(got, expected, atol=1e-6)
  for got_grad, grad in zip(got_grads, grads):
    np.testing.assert_allclose(got_grad, grad, atol=1e-5)


def test_the_reference_adds_the_bias_to_the_scaled_logits_before_the_mask():
  """Against NumPy: softmax(q k^T * scale + bias) over the visible keys, heads grouped."""
  q, k, v = (np.asarray(x, np.float64) for x in _inputs(kv_heads=2))
  bias = np.random.default_rng(0).standard_normal((1, 4, 5, 7))
  mask = np.random.default_rng(1).random((2, 1, 5, 7)) < 0.6
  mask[..., 0] = True
  k_per_head, v_per_head = np.repeat(k, 2, axis=2), np.repeat(v, 2, axis=2)
  logits = np.einsum('bthd,bshd->bhts', q, k_per_head) * 0.3 + bias
  logits = np.where(mask, logits, -np.inf)
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  expected = np.einsum('bhts,bshd->bthd', probs, v_per_head)
  got = kernels.reference.attention(*(jnp.asarray(x, jnp.float32) for x in (q, k, v)),
                                    jnp.asarray(mask), scale=0.3,
                                    bias=jnp.asarray(bias, jnp.float32))
  np.testing.assert_allclose(got, expected, atol=1e-5)


@pytest.mark.parametrize('name', ['xla', 'cpu', 'auto'])
@pytest.mark.parametrize('kv_heads,bias_shape,mask_shape', [
    (4, (1, 4, 5, 7), (2, 1, 5, 7)), (2, (2, 4, 5, 7), None), (1, (2, 1, 5, 7), (1, 1, 5, 7)),
    (2, (1, 1, 5, 7), (2, 4, 5, 7))])
def test_each_kernel_adds_a_bias_as_the_reference_with_its_gradient(name, kv_heads, bias_shape,
                                                                      mask_shape):
  """Outputs and the gradients of q, k, v and the bias, for each broadcast of the bias (T5's
  relative bias is (1, heads, T, S)) under a mask."""
  q, k, v = _inputs(kv_heads)
  bias = jax.random.normal(jax.random.key(4), bias_shape)
  mask = None if mask_shape is None else (
      jax.random.bernoulli(jax.random.key(2), 0.6, mask_shape).at[..., 0].set(True))
  cotangent = jax.random.normal(jax.random.key(3), q.shape)

  def out_and_grads(kernel):
    attend = lambda q, k, v, bias: kernel(q, k, v, mask, scale=8 ** -0.5, bias=bias)
    loss = lambda *args: jnp.sum(attend(*args) * cotangent)
    return attend(q, k, v, bias), jax.grad(loss, argnums=(0, 1, 2, 3))(q, k, v, bias)

  got, got_grads = out_and_grads(kernels.resolve(name).fn)
  expected, grads = out_and_grads(kernels.reference.attention)
  np.testing.assert_allclose(got, expected, atol=1e-6)
  for got_grad, grad in zip(got_grads, grads):
    np.testing.assert_allclose(got_grad, grad, atol=1e-5)
  assert got_grads[3].shape == bias_shape and np.abs(grads[3]).max() > 1e-3


def test_a_layer_without_logit_scaling_and_with_a_bias_runs_unscaled_logits_plus_the_bias(rng):
  """Attention(scale_logits=False) with a bias equals the reference kernel at scale 1 on the
  layer's own projections."""
  layer = layers.Attention(num_heads=2, head_dim=4, use_bias=False, scale_logits=False,
                           kernel='cpu')
  x = jax.random.normal(rng, (2, 5, 8))
  bias = jax.random.normal(jax.random.key(7), (1, 2, 5, 5))
  params = flax.linen.meta.unbox(layer.init(rng, x)['params'])
  project = lambda name: jnp.einsum('btd,dhk->bthk', x, params[name]['kernel'])
  heads = kernels.reference.attention(project('query'), project('key'), project('value'),
                                      scale=1.0, bias=bias)
  expected = jnp.einsum('bthk,hkd->btd', heads, params['out']['kernel'])
  np.testing.assert_allclose(layer.apply({'params': params}, x, bias=bias), expected, atol=1e-5)


def test_auto_picks_by_the_platform_it_is_given():
  assert kernels.resolve('auto', 'cpu').name == 'cpu'
  for platform, name in (('gpu', 'cudnn'), ('tpu', 'splash')):
    choice = kernels.resolve('auto', platform)
    assert (choice.name, choice.fn) == (name, kernels._KERNELS[name])  # pylint: disable=protected-access
    assert choice.reason.startswith(f'auto on {platform}: ')
  assert kernels.resolve('auto', 'rocm_or_other').name == 'xla'
  assert kernels.resolve('auto').reason == (
      'picked when compiled: cpu on cpu, cudnn on gpu, splash on tpu, xla elsewhere')


def test_auto_left_to_the_compiler_runs_the_kernel_of_the_platform_lowered_for(rng):
  """Attention(kernel='auto') with no platform given: lowered for the CPU it runs the CPU kernel
  (its grouped (B, kv_heads, group * T, head_dim) queries appear), for a TPU XLA's; on the CPU its
  outputs and gradients are the CPU kernel's."""
  x = jax.random.normal(rng, (2, 8, 32))
  auto = layers.Attention(num_heads=4, num_kv_heads=2, head_dim=8)
  params = auto.init(rng, x)
  grouped_queries = 'tensor<2x2x16x8xf32>'
  assert grouped_queries in _lowered(auto.apply, 'cpu', params, x)
  assert grouped_queries not in _lowered(auto.apply, 'tpu', params, x)
  cpu = layers.Attention(num_heads=4, num_kv_heads=2, head_dim=8, kernel='cpu')
  loss = lambda module: jax.grad(lambda p: jnp.sum(module.apply(p, x) ** 2))(params)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), loss(auto), loss(cpu))


def test_former_kernel_names_resolve_to_their_kernels():
  """Configs saved before the kernels had names of their own still build the same model."""
  assert kernels.resolve('dot_product_attention', 'cpu').name == 'cpu'
  assert kernels.resolve('dot_product_attention', 'tpu').name == 'splash'
  assert kernels.resolve('heads_first').fn is kernels.cpu.attention
  assert kernels.resolve('einsum').fn is kernels.reference.attention
  cfg = tiny('decoder', attention_kernel='dot_product_attention')
  assert cfg.attention_kernel == 'auto'
  assert models.attention_kernel(cfg, 'cpu').name == 'cpu'


def _forward_jaxpr(model, params, tokens) -> str:
  return str(jax.make_jaxpr(lambda p: model.apply({'params': p}, tokens))(params))


def test_the_model_runs_the_kernel_of_the_platform_it_is_built_for(rng):
  """models.build(cfg, platform) picks for that platform, not for the machine compiling: built
  for a TPU on this CPU, the model runs XLA's attention (no custom_vjp of the CPU kernel)."""
  cfg = tiny('decoder')
  tokens = jnp.zeros((2, 8), jnp.int32)
  params = models.build(cfg, 'cpu').init(rng, tokens)['params']
  assert 'custom_vjp_call' in _forward_jaxpr(models.build(cfg, 'cpu'), params, tokens)
  assert 'custom_vjp_call' not in _forward_jaxpr(models.build(cfg, 'tpu'), params, tokens)


def test_a_function_or_a_registered_name_is_the_kernel_the_layer_runs(rng, monkeypatch):
  calls = []

  def spy(q, k, v, mask=None, *, scale):
    calls.append(q.shape)
    return kernels.reference.attention(q, k, v, mask, scale=scale)

  x = jax.random.normal(rng, (2, 6, 32))
  attention = layers.Attention(num_heads=4, head_dim=8, kernel=spy)
  params = attention.init(rng, x)
  expected = layers.Attention(num_heads=4, head_dim=8, kernel='xla').apply(params, x)
  np.testing.assert_allclose(attention.apply(params, x), expected, atol=1e-6)
  assert calls and calls[-1] == (2, 6, 4, 8)
  monkeypatch.setitem(kernels._KERNELS, 'spy', spy)  # as kernels.register('spy', spy) adds it
  cfg = tiny('decoder', attention_kernel='spy')
  calls.clear()
  tokens = jnp.zeros((2, 8), jnp.int32)
  models.build(cfg).init(rng, tokens)
  assert len(calls) == cfg.num_layers
  assert models.attention_kernel(cfg, 'tpu').reason == 'chosen by name'


def test_a_float_mask_is_refused_with_how_to_convert_it(rng):
  """An additive mask (0 visible, -1e9 hidden) would read as 'all visible' if taken as a
  boolean one."""
  x = jax.random.normal(rng, (1, 4, 16))
  attention = layers.Attention(num_heads=2, head_dim=8)
  params = attention.init(rng, x)
  additive = jnp.where(jnp.tril(jnp.ones((4, 4), bool)), 0.0, -1e9)[None, None]
  with pytest.raises(TypeError, match=r'boolean.*additive_mask == 0'):
    attention.apply(params, x, mask=additive)
  causal = attention.apply(params, x, mask=additive == 0)
  np.testing.assert_allclose(causal, attention.apply(params, x, mask=layers.causal_mask(
      jnp.arange(4), jnp.arange(4)[None], 4)), atol=1e-6)


def test_describe_names_the_kernel_and_why():
  from transformer_jax import config_lib, describe
  config = config_lib.from_file('configs/llama_shakespeare.py')
  config.model.vocab_size = 65
  config.compile.xla_memory = False
  text = describe.describe(config)
  assert ('Attention kernel: cpu (auto on cpu: heads before positions and the backward written '
          'out run fastest there)') in text
  config.model.attention_kernel = 'reference'
  assert 'Attention kernel: reference (chosen by name)' in describe.describe(config)


def test_describe_on_a_cpu_says_what_runs_once_and_no_other_platforms_fallback(monkeypatch,
                                                                                caplog):
  """In bfloat16 at 8 tokens, a cuDNN or splash trace would log why it runs XLA's attention
  (no cuDNN here; blocks of 128): neither runs on this CPU, so neither may be traced."""
  from transformer_jax import config_lib, describe
  from transformer_jax.kernels import cudnn, splash
  for module in (cudnn, splash):
    monkeypatch.setattr(module, '_logged', set())  # what earlier tests logged logs again
  config = config_lib.from_file('configs/gpt2_small.py')
  config.compile.xla_memory = False
  with caplog.at_level('INFO', logger='transformer_jax'):
    text = describe.describe(config)
  assert 'runs XLA' not in caplog.text and 'cuDNN' not in text and 'splash' not in text
  assert text.count('Attention kernel: cpu (auto on cpu: ') == 1


def test_an_unknown_kernel_name_fails_in_the_config_check():
  from transformer_jax.errors import ConfigError
  with pytest.raises(ConfigError, match=r"Unknown attention_kernel 'flash'.*'auto'"):
    models.model_config(dataclasses.asdict(tiny('decoder')) | {'attention_kernel': 'flash'})


def _lowered(fn, platform, *args) -> str:
  """The StableHLO of `fn` lowered for `platform`, which this machine need not have."""
  return jax.export.export(jax.jit(fn), platforms=[platform])(*args).mlir_module()


def test_linear_runs_as_one_matmul_only_when_compiled_for_the_cpu():
  """Both forms equal NumPy's contraction; XLA:CPU gets the (B*T, in) matmul, a TPU the plain
  contraction of (B, T, heads, head_dim)."""
  from transformer_jax.kernels import contraction
  x = np.random.default_rng(0).standard_normal((2, 3, 4, 5), np.float32)
  kernel = np.random.default_rng(1).standard_normal((4, 5, 6), np.float32)
  expected = np.einsum('bthd,hdf->btf', x, kernel)
  for form in (contraction.as_one_matmul, contraction.as_contraction):
    np.testing.assert_allclose(form(x, kernel, 2, None), expected, rtol=1e-5)
  np.testing.assert_allclose(contraction.contract(x, kernel, 2), expected, rtol=1e-5)
  contract = lambda x, kernel: contraction.contract(x, kernel, 2)
  assert 'tensor<6x20xf32>' in _lowered(contract, 'cpu', x, kernel)
  assert 'tensor<6x20xf32>' not in _lowered(contract, 'tpu', x, kernel)


@pytest.mark.parametrize('axes', [(0,), (0, 2), (1,), (3,), (0, 3), ()])
@pytest.mark.parametrize('keepdims', [False, True])
def test_summed_is_the_sum_and_a_product_with_ones_only_on_the_cpu_over_outer_axes(axes,
                                                                                  keepdims):
  from transformer_jax.kernels.contraction import summed
  x = np.random.default_rng(0).standard_normal((4, 3, 5, 6), np.float32)
  expected = np.sum(x.astype(np.float64), axis=axes, keepdims=keepdims)
  result = jax.jit(lambda x: summed(x, axes, keepdims))(x)
  assert result.shape == expected.shape
  np.testing.assert_allclose(result, expected, rtol=1e-5, atol=1e-5)
  by_product = bool(axes) and 3 not in axes
  assert ('dot_general' in _lowered(lambda x: summed(x, axes, keepdims), 'cpu', x)) == by_product
  assert 'dot_general' not in _lowered(lambda x: summed(x, axes, keepdims), 'tpu', x)


def test_a_registered_kernel_is_selectable_and_auto_picks_it_for_its_platform(monkeypatch):
  monkeypatch.setattr(kernels, '_KERNELS', dict(kernels._KERNELS))  # undone after the test
  monkeypatch.setattr(kernels, '_AUTO', dict(kernels._AUTO))
  kernels.register('mine', kernels.reference.attention, platform='tpu')
  assert 'mine' in kernels.names()
  assert kernels.resolve('mine').fn is kernels.reference.attention
  assert kernels.resolve('auto', 'tpu').name == 'mine'
  assert kernels.resolve('auto', 'cpu').name == 'cpu'
  assert kernels.resolve('auto').reason == ('picked when compiled: cpu on cpu, cudnn on gpu, '
                                            'mine on tpu, xla elsewhere')
  for reserved in ('auto', 'einsum'):
    with pytest.raises(ValueError, match='reserved'):
      kernels.register(reserved, kernels.xla.attention)


def _dropped_weights(kernel, rng=None, b=2, t=64, h=4, s=32, **dropout):
  """(the kernel's probabilities after `dropout` (its keyword arguments), before) of random
  queries over s keys: values that are the identity (head_dim = s, value j the unit vector e_j)
  make the output the probabilities themselves."""
  q = jax.random.normal(jax.random.key(0), (b, t, h, s))
  k = jax.random.normal(jax.random.key(1), (b, s, 2, s))
  v = jnp.broadcast_to(jnp.eye(s)[None, :, None, :], (b, s, 2, s))
  out = kernels.function(kernel)(q, k, v, scale=0.5, **dropout)
  weights = kernels.reference.weights(q, k, None, 0.5)
  return np.asarray(jnp.swapaxes(out, 1, 2)), np.asarray(weights)


@pytest.mark.parametrize('kernel', ['reference', 'auto'])
def test_attention_dropout_zeroes_a_share_p_and_scales_the_kept_by_one_over_one_minus_p(kernel):
  """T5's dropout of the attention probabilities: of 2 * 4 * 64 * 32 = 16384 entries a share p
  is zeroed (within 4 standard errors), each kept one is its probability / (1 - p); the same
  key gives the same output, another key another one; rate 0 is the plain kernel exactly."""
  rate = 0.3
  dropping = lambda seed: _dropped_weights(
      kernel, **kernels.dropout_argument(rate, jax.random.key(seed)))[0]
  dropped, weights = _dropped_weights(kernel, dropout_rate=rate, dropout_rng=jax.random.key(5))
  zeroed = dropped == 0
  assert abs(zeroed.mean() - rate) < 4 * np.sqrt(rate * (1 - rate) / zeroed.size)
  np.testing.assert_allclose(dropped[~zeroed], weights[~zeroed] / (1 - rate), rtol=1e-5)
  np.testing.assert_array_equal(dropping(5), dropped)
  assert not np.array_equal(dropping(6), dropped)
  plain = _dropped_weights(kernel)[0]
  np.testing.assert_array_equal(
      _dropped_weights(kernel, dropout_rate=0.0, dropout_rng=jax.random.key(5))[0], plain)
  np.testing.assert_allclose(plain, weights, atol=1e-6)


def test_auto_resolves_to_the_reference_kernel_where_attention_probabilities_are_dropped():
  for platform in ('cpu', 'gpu', 'tpu', None):
    choice = kernels.resolve('auto', platform, dropout_rate=0.1)
    assert (choice.name, choice.fn) == ('reference', kernels.reference.attention)
  assert kernels.resolve('auto', 'gpu').name == 'cudnn'  # no dropout: the platform's own
  cfg = tiny('encoder_decoder', dropout_rate=0.1, attention_dropout=None)
  assert models.resolved(cfg, 'tpu')[0].attention_kernel == 'reference'
  assert kernels.takes_dropout('reference') and kernels.takes_dropout('auto')
  assert not any(kernels.takes_dropout(name) for name in ('xla', 'cpu', 'cudnn', 'splash'))


@pytest.mark.slow
def test_the_attention_benchmark_runs_both_cpu_paths_to_the_same_numbers():
  """experiments/bench_attention.py --quick: both paths of the CPU kernel compiled and timed at a
  tiny shape, their outputs and gradients equal to float32 rounding."""
  done = subprocess.run([sys.executable, 'experiments/bench_attention.py', '--quick'], cwd=ROOT,
                        capture_output=True, text=True, check=True)
  assert 'scores of 48 x 24 per (batch, key-value head), the kernel picks batched' in done.stdout
  assert done.stdout.count('as fast') == 2  # forward, and forward+backward
  difference = re.search(r'outputs and gradients: (\S+)', done.stdout).group(1)
  assert float(difference) < 1e-5
