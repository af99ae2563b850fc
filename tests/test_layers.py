"""The shared layers against examples worked out by hand and independent computations."""
import dataclasses
import functools
import os
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import init, tiny
from process_env import process_env
from transformer_jax import kernels, layers, models
from transformer_jax.errors import ConfigError
from transformer_jax.layers import PatchEmbed, causal_mask, resize_position_grid
from transformer_jax.models import common, styles

EYE = np.eye(2, dtype=np.float32)


def worked_example_block():
  """A pre-LN block small enough to work out by hand: T = D = 2, one head, LayerNorm, no biases,
  all weights I, d_ff = 2 with ReLU and W2 = I/2."""
  cfg = tiny('encoder', width=2, num_heads=1, d_ff=2, mlp='relu', use_bias=False,
             norm='layernorm', norm_bias=False, attention_kernel='reference')
  params = {
      'attn': {name: {'kernel': EYE.reshape(2, 1, 2)} for name in ('query', 'key', 'value')},
      'attn_norm': {'scale': np.ones(2, np.float32)},
      'mlp': {'up': {'kernel': EYE}, 'down': {'kernel': EYE / 2}},
      'mlp_norm': {'scale': np.ones(2, np.float32)},
  }
  params['attn']['out'] = {'kernel': EYE.reshape(1, 2, 2)}
  return common.block(cfg)(), params


def test_block_matches_its_values_worked_out_by_hand():
  block, params = worked_example_block()
  x = jnp.array([[[2.0, 0.0], [0.0, 1.0]]])
  positions = jnp.arange(2)[None]
  y = block.apply({'params': params}, x, None, positions)
  np.testing.assert_array_equal(np.round(np.float64(y[0]), 3), [[3.388, -0.888], [-0.888, 2.388]])
  causal = causal_mask(jnp.arange(2), positions, 2)
  y = block.apply({'params': params}, x, causal, positions)
  np.testing.assert_array_equal(np.round(np.float64(y[0]), 3), [[3.5, -1.0], [-0.888, 2.388]])


def test_shapes_through_one_block(rng):
  # B = 2, T = 5, D = 64, H = 4, d_ff = 4D. Queries are laid out (B, T, H, d_k), not the
  # head-major (B, H, T, d_k); the attention weights are (B, H, T, T).
  cfg = tiny('encoder', width=64, num_heads=4, attention_kernel='reference')
  x = jax.random.normal(rng, (2, 5, 64))
  block = common.block(cfg)()
  params = block.init(rng, x, None, jnp.zeros((2, 5), jnp.int32))
  y, state = block.apply(params, x, None, jnp.zeros((2, 5), jnp.int32),
                         capture_intermediates=True, mutable=['intermediates'])
  inter = state['intermediates']
  assert inter['attn_norm']['__call__'][0].shape == (2, 5, 64)
  assert inter['attn']['query']['__call__'][0].shape == (2, 5, 4, 16)
  assert inter['attn']['attention_weights'][0].shape == (2, 4, 5, 5)
  assert inter['attn']['__call__'][0].shape == (2, 5, 64)
  assert inter['mlp']['up']['__call__'][0].shape == (2, 5, 256)
  assert y.shape == (2, 5, 64)


def test_rope_dot_product_depends_only_on_distance(rng):
  kq, kk = jax.random.split(rng)
  q = jnp.broadcast_to(jax.random.normal(kq, (32,)), (1, 20, 1, 32))
  k = jnp.broadcast_to(jax.random.normal(kk, (32,)), (1, 20, 1, 32))
  positions = jnp.arange(20)[None]
  rq, rk = layers.apply_rope(q, positions)[0, :, 0], layers.apply_rope(k, positions)[0, :, 0]
  at_distance_2 = [rq[m] @ rk[m - 2] for m in (2, 9, 19)]
  np.testing.assert_allclose(at_distance_2, at_distance_2[0], rtol=1e-5)
  assert abs(rq[5] @ rk[0] - at_distance_2[0]) > 1e-3
  np.testing.assert_allclose(rq[0], q[0, 0, 0], rtol=1e-6)  # position 0 is not rotated
  np.testing.assert_allclose(jnp.linalg.norm(rq, axis=-1), jnp.linalg.norm(q[0, :, 0], axis=-1),
                             rtol=1e-5)


def test_rope_matches_half_split_formula(rng):
  # RoPE (Su et al. 2021) rotating channel i with channel i + half, as the PyTorch reference's
  # apply_rope does: freqs = base^(-i/half), angles = p * freqs.
  x = np.asarray(jax.random.normal(rng, (1, 7, 2, 8)))
  half, pos = 4, np.arange(7)
  angles = pos[:, None] * 10000.0 ** (-np.arange(half) / half)
  cos, sin = np.cos(angles)[:, None], np.sin(angles)[:, None]
  x1, x2 = x[0, ..., :half], x[0, ..., half:]
  expected = np.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1)
  np.testing.assert_allclose(layers.apply_rope(jnp.asarray(x), jnp.arange(7)[None])[0],
                             expected, rtol=1e-5, atol=1e-6)


def test_sinusoidal_matches_vaswani():
  pe = layers.sinusoidal(jnp.arange(50)[None], 16)[0]
  p, i = 37, 3
  np.testing.assert_allclose(pe[p, 2 * i], np.sin(p / 10000 ** (2 * i / 16)), rtol=1e-5)
  np.testing.assert_allclose(pe[p, 2 * i + 1], np.cos(p / 10000 ** (2 * i / 16)), rtol=1e-5)


def test_patch_embedding_is_reshape_and_matmul(rng):
  # A convolution with kernel = stride = P is a matmul on flattened patches; with images laid
  # out (B, H, W, C) a patch flattens in (row, column, channel) order, the order of the
  # convolution kernel (P, P, C, D).
  images = jax.random.normal(rng, (1, 224, 224, 3))
  embed = PatchEmbed(16, 768)
  params = embed.init(rng, images)
  params = jax.tree.map(lambda p: jax.random.normal(jax.random.key(1), p.shape) * 0.1,
                        nn.meta.unbox(params))
  tokens = embed.apply(params, images)
  patches = images.reshape(14, 16, 14, 16, 3).transpose(0, 2, 1, 3, 4).reshape(196, 768)
  conv = params['params']['conv']
  by_hand = patches @ conv['kernel'].reshape(768, 768) + conv['bias'][None]
  assert tokens.shape == (1, 196, 768)
  np.testing.assert_allclose(tokens[0], by_hand, atol=2e-4, rtol=1e-4)


def test_patch_embedding_is_a_convolutions_value_and_gradients_without_one(rng):
  """The patches' product computes a convolution of stride P and its gradients (flax's
  nn.Conv of the same parameters), and the program holds no convolution, which XLA:CPU runs
  100x as slowly inside a loop (a scan of microbatches)."""
  images = jax.random.normal(rng, (2, 12, 8, 3))
  embed = PatchEmbed(4, 5)
  params = nn.meta.unbox(embed.init(rng, images))
  conv = nn.Conv(5, (4, 4), strides=(4, 4), padding='VALID')
  by_convolution = lambda params, x: conv.apply({'params': params['params']['conv']}, x).reshape(
      2, 6, 5)
  weights = jnp.cos(jnp.arange(60.0)).reshape(2, 6, 5)
  value_and_grads = lambda forward: jax.value_and_grad(
      lambda params, x: jnp.sum(weights * forward(params, x)), argnums=(0, 1))(params, images)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5),
               value_and_grads(embed.apply), value_and_grads(by_convolution))
  gradients = jax.jit(jax.grad(lambda params, x: jnp.sum(embed.apply(params, x)), (0, 1)))
  assert 'convolution' not in gradients.lower(params, images).as_text()


def test_position_grid_resize_keeps_cls_row(rng):
  pos = jax.random.normal(rng, (197, 768))
  new = resize_position_grid(pos, 24)
  assert new.shape == (577, 768)
  np.testing.assert_array_equal(new[0], pos[0])
  np.testing.assert_allclose(resize_position_grid(pos, 14), pos, atol=1e-5)  # same grid
  constant = jnp.ones((1 + 14 * 14, 4))
  np.testing.assert_allclose(resize_position_grid(constant, 24), 1.0, atol=1e-5)
  # A grid that varies linearly stays linear away from the border, so the interpolation reads
  # the rows in the right order.
  rows = jnp.repeat(jnp.arange(14.0), 14)[:, None]
  resized = resize_position_grid(jnp.concatenate([jnp.zeros((1, 1)), rows]), 28)[1:].reshape(28, 28)
  np.testing.assert_allclose(np.diff(resized[4:24, 10]), 0.5, atol=1e-4)


def test_gqa_equals_mha_with_repeated_kv_heads(rng):
  gqa_cfg = tiny('decoder', num_kv_heads=2, use_bias=True, attention_kernel='xla')
  mha_cfg = tiny('decoder', num_kv_heads=4, use_bias=True, attention_kernel='xla')
  x = jax.random.normal(rng, (2, 6, 32))
  positions = jnp.broadcast_to(jnp.arange(6), (2, 6))
  mask = causal_mask(jnp.arange(6), positions, 6)
  gqa = common.attention(gqa_cfg)()
  params = nn.meta.unbox(gqa.init(rng, x, mask=mask, positions=positions))['params']
  params = jax.tree.map(lambda p: p + 0.1 * jax.random.normal(rng, p.shape), params)
  repeated = dict(params)
  for name in ('key', 'value'):
    repeated[name] = {'kernel': jnp.repeat(params[name]['kernel'], 2, axis=1),
                      'bias': jnp.repeat(params[name]['bias'], 2, axis=0)}
  out_gqa = gqa.apply({'params': params}, x, mask=mask, positions=positions)
  out_mha = common.attention(mha_cfg)().apply({'params': repeated}, x, mask=mask,
                                              positions=positions)
  np.testing.assert_allclose(out_gqa, out_mha, atol=1e-5)


@pytest.mark.parametrize('kv_heads', [4, 2, 1])
def test_kernel_matches_einsum_reference(rng, kv_heads):
  q = jax.random.normal(rng, (2, 5, 4, 8))
  k, v = jax.random.normal(jax.random.key(1), (2, 2, 7, kv_heads, 8))
  mask = jax.random.bernoulli(jax.random.key(2), 0.7, (2, 1, 5, 7)).at[..., 0].set(True)
  expected = kernels.reference.attention(q, k, v, mask, scale=8 ** -0.5)
  weights = kernels.reference.weights(q, k, mask, 8 ** -0.5)
  got = jax.nn.dot_product_attention(q, k, v, mask=mask, scale=8 ** -0.5)
  np.testing.assert_allclose(got, expected, atol=1e-5)
  np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-5)
  assert float(jnp.where(mask[:, 0], 0.0, weights[:, 0]).max()) == 0.0


def _attention_grads(attend, q, k, v, weights):
  """The output of `attend` and the gradients of a weighted sum of it by q, k and v."""
  loss = lambda q, k, v: jnp.sum(attend(q, k, v) * weights)
  return attend(q, k, v), jax.grad(loss, argnums=(0, 1, 2))(q, k, v)


@pytest.mark.parametrize('kv_heads,mask_kind', [(4, 'causal'), (2, 'causal'), (1, 'padding'),
                                                (4, 'per_head'), (2, 'none'), (4, 'empty_row')])
def test_cpu_kernel_equals_jax_nn_with_gradients(rng, kv_heads, mask_kind):
  """The CPU kernel against jax.nn's attention: outputs and the gradients
  of the queries, keys and values, for each GQA grouping and kind of mask (a fully masked query
  row included, whose softmax is uniform in both)."""
  b, t, s, h, d = 2, 5, 7, 4, 8
  q = jax.random.normal(rng, (b, t, h, d))
  k, v = jax.random.normal(jax.random.key(1), (2, b, s, kv_heads, d))
  weights = jax.random.normal(jax.random.key(2), (b, t, h, d))
  slots = jnp.arange(t) + s - t
  masks = {'causal': causal_mask(slots, jnp.broadcast_to(slots, (b, t)), s),
           'padding': layers.padding_mask(jnp.arange(s)[None] < jnp.array([[4], [7]]), t),
           'per_head': jax.random.bernoulli(jax.random.key(3), 0.6, (b, h, t, s)),
           'none': None,
           'empty_row': jnp.ones((b, 1, t, s), bool).at[1, 0, 2].set(False)}
  mask = masks[mask_kind]
  got, got_grads = _attention_grads(
      lambda q, k, v: kernels.cpu.attention(q, k, v, mask, scale=d ** -0.5), q, k, v, weights)
  expected, grads = _attention_grads(
      lambda q, k, v: jax.nn.dot_product_attention(q, k, v, mask=mask, scale=d ** -0.5), q, k, v,
      weights)
  np.testing.assert_allclose(got, expected, atol=1e-6)
  for got_grad, grad in zip(got_grads, grads):
    np.testing.assert_allclose(got_grad, grad, atol=1e-6)


def test_cpu_kernel_gives_a_decoders_loss_and_gradients(rng):
  """The reference LM's blocks (RoPE, GQA) train to the same loss and gradients through the CPU
  kernel, the one 'auto' picks on XLA:CPU, as through XLA's."""
  cfg = tiny('decoder', num_kv_heads=2, positions='rope', mlp='swiglu', norm='rmsnorm')
  tokens = jax.random.randint(rng, (2, 12), 0, cfg.vocab_size)
  params = init(cfg, rng, tokens)

  def loss_and_grads(kernel):
    model = models.build(dataclasses.replace(cfg, attention_kernel=kernel))
    loss = lambda p: jnp.mean(jax.nn.log_softmax(model.apply({'params': p}, tokens))[..., 3])
    return jax.value_and_grad(loss)(params)

  assert models.attention_kernel(cfg, 'cpu').name == 'cpu'
  cpu_loss, cpu_grads = loss_and_grads('cpu')
  loss, grads = loss_and_grads('xla')
  np.testing.assert_allclose(cpu_loss, loss, atol=1e-6)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), cpu_grads, grads)


@pytest.mark.slow
def test_rope_rotates_by_constant_positions_as_by_traced_ones(rng):
  """Positions known when tracing (NumPy, the default) and the same positions as a traced array
  rotate alike, and a decoder without positions gives the loss and gradients it gives with its
  default positions passed explicitly."""
  x = jax.random.normal(rng, (2, 9, 4, 16))
  positions = np.broadcast_to(np.arange(9), (2, 9))
  np.testing.assert_allclose(layers.apply_rope(x, positions),
                             jax.jit(layers.apply_rope)(x, jnp.asarray(positions)), atol=1e-6)
  cfg = tiny('decoder', positions='rope')
  tokens = jax.random.randint(rng, (2, 9), 0, cfg.vocab_size)
  params, model = init(cfg, rng, tokens), models.build(cfg)
  loss = lambda p, *pos: jnp.mean(model.apply({'params': p}, tokens, *pos) ** 2)
  constant = jax.jit(jax.value_and_grad(loss))(params)
  traced = jax.jit(jax.value_and_grad(loss))(params, common.default_positions(tokens))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), constant, traced)


def test_norms_match_their_formulas(rng):
  x = jax.random.normal(rng, (3, 10)) * 3 + 1
  ln = layers.LayerNorm(eps=1e-5)
  y = ln.apply(ln.init(rng, x), x)
  expected = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
  np.testing.assert_allclose(y, expected, atol=1e-5)
  rms = layers.RMSNorm(eps=1e-6)
  y = rms.apply(rms.init(rng, x), x)
  np.testing.assert_allclose(y, x / np.sqrt((x ** 2).mean(-1, keepdims=True) + 1e-6), atol=1e-5)


def test_bfloat16_compute_keeps_float32_norms_and_logits(rng):
  cfg = tiny('decoder', dtype='bfloat16')
  from transformer_jax import models
  model = models.build(cfg)
  tokens = jnp.zeros((2, 8), jnp.int32)
  params = model.init(rng, tokens)
  assert {p.dtype for p in jax.tree.leaves(nn.meta.unbox(params))} == {jnp.dtype('float32')}
  logits = model.apply(params, tokens)
  assert logits.dtype == jnp.float32
  x = jnp.linspace(-3, 3, 32, dtype=jnp.bfloat16)[None]
  ln = layers.LayerNorm(dtype=jnp.bfloat16)
  assert ln.apply(ln.init(rng, x), x).dtype == jnp.bfloat16


def intended_fan_in(path, shape):
  """The inputs each output of a kernel sums over, by what the kernel does: queries, keys and
  values (D, heads, head_dim) read D; the attention output (heads, head_dim, D) reads every head;
  a patch convolution (P, P, C, D) a patch; any other (in, out) matrix its rows."""
  if path[-2] in ('query', 'key', 'value'):
    return shape[0]
  if path[-2] == 'out':
    return shape[0] * shape[1]
  return int(np.prod(shape[:-1]))


@pytest.mark.parametrize('family', ['decoder', 'encoder', 'encoder_decoder', 'vit'])
def test_lecun_initialization_has_variance_one_over_the_fan_in(rng, family):
  """init_std=None draws every dense kernel with std 1 / sqrt(fan-in) (LeCun normal)."""
  cfg = tiny(family, width=128, num_heads=8, num_kv_heads=2, init_std=None,
             **(dict(image_size=16) if family == 'vit' else dict(vocab_size=256)))
  params = nn.meta.unbox(models.build(cfg).init(rng, *models.example_inputs(cfg, 2))['params'])
  checked = 0
  for path, kernel in jax.tree_util.tree_flatten_with_path(params)[0]:
    names = tuple(k.key for k in path)
    if names[-1] != 'kernel' or not np.any(kernel):  # the ViT head starts at zero on purpose
      continue
    expected = intended_fan_in(names, kernel.shape) ** -0.5
    assert np.std(kernel) == pytest.approx(expected, rel=0.1), '/'.join(names)
    checked += 1
  assert checked >= 6


def test_scaled_embeddings_follow_vaswani(rng):
  """Token rows times sqrt(d_model), plus the sinusoidal positions (section 3.4)."""
  cfg = tiny('decoder', positions='sinusoidal', scale_embeddings=True)
  embed = common.text_embed(cfg)
  ids = jnp.array([[3, 1, 4, 1, 5]])
  positions = jnp.arange(5)[None]
  params = embed.init(rng, ids, positions)
  out = embed.apply(params, ids, positions)
  table = nn.meta.unbox(params)['params']['tokens']
  expected = table[ids] * np.sqrt(cfg.width) + layers.sinusoidal(positions, cfg.width)
  np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-6)
  assert styles.STYLES['transformer']['scale_embeddings']


def test_layers_are_usable_alone_with_plain_arguments(rng):
  x = jax.random.normal(rng, (2, 6, 32))
  attention = layers.Attention(num_heads=4, head_dim=8, num_kv_heads=2, rope_base=10000.0,
                               out_features=48)
  params = attention.init(rng, x)
  assert attention.apply(params, x).shape == (2, 6, 48)
  # Without positions, RoPE rotates by 0..T-1 (as given, known when tracing: NumPy).
  positions = np.broadcast_to(np.arange(6), (2, 6))
  np.testing.assert_allclose(attention.apply(params, x),
                             attention.apply(params, x, positions=positions), rtol=1e-6)
  mlp = layers.MLP(hidden=64, activation='swiglu', out_features=16)
  assert mlp.apply(mlp.init(rng, x), x).shape == (2, 6, 16)
  norm = layers.LayerNorm(eps=1e-6)
  assert norm.apply(norm.init(rng, x), x).shape == x.shape


@pytest.mark.parametrize('make,message', [
    (lambda: layers.Attention(num_heads=3, head_dim=8, num_kv_heads=2), 'must divide'),
    (lambda: layers.Attention(num_heads=2, head_dim=7, rope_base=10000.0), 'even head_dim'),
    (lambda: layers.Attention(num_heads=2, head_dim=8, kernel='flash'), 'Unknown attention'),
    (lambda: layers.MLP(hidden=8, activation='tanh'), 'Unknown MLP activation'),
    (lambda: layers.Linear((4, 4), ('embed',), ('mlp',)), 'must name each'),
    (lambda: layers.Linear((4,), (), ('mlp',)), 'at least one contracted'),
    (lambda: layers.TextEmbed(10, 8, positions='learned'), 'need max_len'),
    (lambda: layers.RMSNorm(eps=0.0), 'eps=0.0 must be positive'),
    (lambda: layers.Block(attention=None, mlp=None, norm_position='middle'), 'norm_position'),
    (lambda: layers.BlockStack(layers.Block, num_layers=2), 'functools.partial'),
])
def test_layers_refuse_bad_arguments_with_a_message(make, message):
  with pytest.raises(ValueError, match=message):
    make()


def test_linear_refuses_an_input_without_the_dimensions_it_contracts(rng):
  linear = layers.Linear((4,), ('heads', 'head_dim'), ('embed',))
  with pytest.raises(ValueError, match=r'contracts the last 2 dimensions'):
    linear.init(rng, jnp.ones((2, 8)))


class ResidualTanh(nn.Module):
  """A block of one's own that meets BlockStack's contract: x + tanh(x W + b), W (D, D)."""
  deterministic: bool = True
  scanned: bool = False

  @nn.compact
  def __call__(self, x, mask, positions, encoded, cross_mask, cache_index):
    del mask, positions, encoded, cross_mask, cache_index
    x = x + jnp.tanh(layers.Linear((x.shape[-1],), ('embed',), ('embed',), init_std=1.0,
                                   name='dense')(x))
    return (x, None) if self.scanned else x


class WithoutScannedField(nn.Module):
  deterministic: bool = True

  def __call__(self, x, mask, positions, encoded, cross_mask, cache_index):
    return x


class TakingOnlyXAndMask(ResidualTanh):
  def __call__(self, x, mask):
    return x


class ReturningXWhenScanned(ResidualTanh):
  def __call__(self, x, *args):
    return x


class ReturningTheWrongWidth(ResidualTanh):
  def __call__(self, x, *args):
    return x[..., :1], None


def test_a_block_of_ones_own_stacks_scanned_and_unrolled_alike(rng):
  x = jax.random.normal(rng, (2, 3, 4))
  unrolled = layers.BlockStack(functools.partial(ResidualTanh), num_layers=3)
  params = nn.meta.unbox(unrolled.init(rng, x)['params'])
  expected = np.asarray(x, np.float64)
  for i in range(3):
    dense = jax.tree.map(np.asarray, params[f'block_{i}']['dense'])
    expected = expected + np.tanh(expected @ dense['kernel'] + dense['bias'])
  np.testing.assert_allclose(unrolled.apply({'params': params}, x), expected, rtol=1e-5)
  scanned = layers.BlockStack(functools.partial(ResidualTanh), num_layers=3, scan=True)
  got = scanned.apply({'params': models.stack_layers(params)}, x)
  np.testing.assert_allclose(got, unrolled.apply({'params': params}, x), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize('block,scan,problem', [
    (WithoutScannedField, False, 'has no field scanned'),
    (TakingOnlyXAndMask, False, r'cannot be called as BlockStack calls it'),
    (functools.partial(ResidualTanh, scanned=True), False, 'binds scanned'),
    (functools.partial(ResidualTanh, name='mine'), True, 'binds name'),
    (ReturningXWhenScanned, True, r'returned an array \(2, 3, 4\) with scanned=True, not \(x,'),
    (ReturningTheWrongWidth, True, r'turned x \(2, 3, 4\) float32 into \(2, 3, 1\) float32'),
    (functools.partial(ReturningTheWrongWidth), False, 'returned a tuple with scanned=False'),
])
def test_a_block_that_misses_the_contract_is_told_so(rng, block, scan, problem):
  block = block if isinstance(block, functools.partial) else functools.partial(block)
  with pytest.raises(ValueError, match=problem) as error:
    layers.BlockStack(block, num_layers=2, scan=scan).init(rng, jnp.ones((2, 3, 4)))
  assert 'a block stacked by BlockStack is a Flax module class' in str(error.value)


@pytest.mark.parametrize('scan', [False, True])
def test_a_stack_in_row_blocks_computes_the_whole_batchs_values(rng, scan):
  """Inference a block of rows at a time (layers.row_blocks) against the whole batch at once:
  the mask and cross-attention's encoded rows split with x, T5-style bias shared by every row."""
  attention = functools.partial(layers.Attention, num_heads=2, head_dim=4)
  stack = layers.BlockStack(functools.partial(
      layers.Block, attention=attention, cross_attention=attention,
      mlp=functools.partial(layers.MLP, hidden=16)), num_layers=2, scan=scan)
  keys = jax.random.split(rng, 5)
  x, encoded = jax.random.normal(keys[0], (6, 5, 8)), jax.random.normal(keys[1], (6, 3, 8))
  mask = jax.random.bernoulli(keys[2], 0.7, (6, 1, 5, 5)) | jnp.eye(5, dtype=bool)[None, None]
  bias = jax.random.normal(keys[3], (1, 2, 5, 5))
  call = lambda: stack.apply(params, x, mask, None, encoded, bias=bias)
  with layers.row_blocks(10):  # 2 rows of 5 tokens: 3 blocks
    params = stack.init(keys[4], x, mask, None, encoded, bias=bias)
    blocked = call()
    program = jax.make_jaxpr(call)()
  # (with scan=True, flax hoists the layer scan's work that no block's rows enter: length 2)
  assert [e.params['length'] for e in program.jaxpr.eqns if e.primitive.name == 'scan'] == (
      [2, 3] if scan else [3])
  np.testing.assert_allclose(blocked, call(), rtol=1e-5, atol=1e-6)


ROW_BLOCK_SCANS = """
import functools
import jax, jax.numpy as jnp
from transformer_jax import layers
attention = functools.partial(layers.Attention, num_heads=2, head_dim=4)
stack = layers.BlockStack(functools.partial(layers.Block, attention=attention,
                                            mlp=functools.partial(layers.MLP, hidden=16)), 2)
x, rng = jnp.ones((4, 1024, 8)), jax.random.key(0)
params = jax.eval_shape(lambda: stack.init(rng, x[:, :4]))
def scans(**kw):
  program = jax.make_jaxpr(lambda p: stack.apply(p, x, **kw))(params)
  return [e.params['length'] for e in program.jaxpr.eqns if e.primitive.name == 'scan']
with layers.row_blocks():
  print(jax.device_count(), scans(), scans(deterministic=False, rngs={'dropout': rng}))
print(scans())
"""


def test_row_blocks_by_default_block_inference_on_one_cpu_device_only():
  """4 rows of 1,024 tokens: blocks of 2 rows (CPU_BLOCK_TOKENS = 2,048) on one CPU device, in
  inference only; none on the tests' 8 devices, nor outside row_blocks."""
  run = lambda env: subprocess.run([sys.executable, '-c', ROW_BLOCK_SCANS], env=env, check=True,
                                   capture_output=True, text=True).stdout.split('\n')[:2]
  assert run(process_env()) == ['1 [2] []', '[]']
  assert run(dict(os.environ)) == ['8 [] []', '[]']


def test_blocks_take_the_most_rows_that_divide_the_batch_within_the_tokens():
  assert layers.block.block_rows(256, 77, 2048) == 16  # 26 rows fit; 16 divides 256
  assert layers.block.block_rows(100, 77, 2048) == 25
  assert layers.block.block_rows(8, 1500, 2048) == 1
  assert layers.block.block_rows(7, 300, 2048) == 1
  assert layers.block.block_rows(32, 50, 2048) == 32


def test_exact_gelu_and_its_written_derivative_match_the_normal_cdf_in_float64():
  from scipy import special
  gelu = layers.mlp.ACTIVATIONS['gelu']
  x = np.linspace(-12, 12, 4801, dtype=np.float32)
  x64 = x.astype(np.float64)
  pdf = np.exp(-0.5 * x64 ** 2) / np.sqrt(2 * np.pi)
  # 1 + erf(x / sqrt 2) cancels in the far negative tail (as in PyTorch's form): where GELU is
  # below 1e-6 in size, the error is absolute, not relative.
  close = functools.partial(np.testing.assert_allclose, rtol=2e-6, atol=1e-6)
  close(gelu(x), x64 * special.ndtr(x64))
  close(jax.vmap(jax.grad(gelu))(x), special.ndtr(x64) + x64 * pdf)
  # Forward mode, and the second derivative phi(x) (2 - x^2), go through the written rule too.
  close(jax.jvp(gelu, (x,), (np.ones_like(x),))[1], special.ndtr(x64) + x64 * pdf)
  close(jax.vmap(jax.grad(jax.grad(gelu)))(x), pdf * (2 - x64 ** 2))


def test_the_mlp_drops_its_hidden_activation_at_its_rate_in_training_only(rng):
  """T5's feed-forward dropout, between the activation and the down projection: with identity
  projections and positive inputs the output is the dropped activation itself, a share p of it
  zeroed (within 4 standard errors of 4096 entries) and the rest scaled by 1 / (1 - p)."""
  x = jax.random.uniform(rng, (4, 32, 32), minval=0.5, maxval=1.5)
  mlp = layers.MLP(hidden=32, activation='relu', use_bias=False, dropout_rate=0.25)
  params = {'params': {'up': {'kernel': jnp.eye(32)}, 'down': {'kernel': jnp.eye(32)}}}
  np.testing.assert_array_equal(mlp.apply(params, x), x)  # deterministic by default
  dropped = lambda key: np.asarray(mlp.apply(params, x, deterministic=False,
                                             rngs={'dropout': key}))
  out = dropped(jax.random.key(1))
  zeroed = out == 0
  assert abs(zeroed.mean() - 0.25) < 4 * np.sqrt(0.25 * 0.75 / zeroed.size)
  np.testing.assert_allclose(out[~zeroed], np.asarray(x)[~zeroed] / 0.75, rtol=1e-6)
  np.testing.assert_array_equal(dropped(jax.random.key(1)), out)
  assert not np.array_equal(dropped(jax.random.key(2)), out)


def test_attention_dropout_in_a_kernel_that_cannot_take_it_fails_naming_the_fix(rng):
  """A fused kernel never forms the probabilities: it serves deterministic calls, and a training
  call fails when traced, in one line naming the settings to change."""
  x = jax.random.normal(rng, (2, 6, 16))
  attention = layers.Attention(num_heads=2, head_dim=8, kernel='xla', dropout_rate=0.1)
  params = attention.init(rng, x)
  reference = dataclasses.replace(attention, kernel='reference')
  np.testing.assert_allclose(attention.apply(params, x), reference.apply(params, x), atol=1e-6)
  with pytest.raises(ConfigError, match="The attention kernel 'xla' cannot drop attention "
                     r"probabilities, which the model drops at rate 0.1 in training: choose "
                     r"'auto' or 'reference' \(model.attention_kernel\), or set "
                     'model.attention_dropout=0.') as error:
    attention.apply(params, x, deterministic=False, rngs={'dropout': rng})
  assert '\n' not in str(error.value)


@pytest.mark.parametrize('family,rate', [
    ('decoder', 'attention_dropout'), ('decoder', 'mlp_dropout'),
    ('encoder_decoder', 'attention_dropout'), ('encoder_decoder', 'mlp_dropout'),
    ('encoder_decoder', 'final_dropout')])
def test_each_dropout_is_off_when_deterministic_or_at_rate_zero(rng, family, rate):
  """The same parameters (dropout has none) give the outputs of the model without dropout
  exactly where the call is deterministic (evaluation, decoding) or the rate is 0; in training
  the rate alone changes them, the same 'dropout' key alike."""
  build = lambda value: models.build(tiny(family, attention_kernel='reference', **{rate: value}))
  plain, dropping = build(0.0), build(0.3)
  inputs = models.example_inputs(tiny(family), batch=2, seq_len=8)
  inputs = tuple(jax.random.randint(rng, x.shape, 0, 40) for x in inputs)
  params = plain.init(rng, *inputs)
  apply = lambda model, **kw: np.asarray(model.apply(params, *inputs, **kw))
  expected = apply(plain)
  np.testing.assert_array_equal(apply(dropping), expected)
  training = lambda model, key: apply(model, deterministic=False, rngs={'dropout': key})
  np.testing.assert_array_equal(training(plain, jax.random.key(1)), expected)
  first = training(dropping, jax.random.key(1))
  assert np.abs(first - expected).max() > 1e-3
  np.testing.assert_array_equal(training(dropping, jax.random.key(1)), first)


def test_a_sublayer_of_ones_own_need_not_take_deterministic(rng):
  """Block gives `deterministic` only to a sublayer whose __call__ takes it: one of your own
  without it trains under the block's dropout, beside an Attention that drops its own."""

  class Doubled(nn.Module):
    @nn.compact
    def __call__(self, x):
      return 2 * x

  block = layers.Block(
      attention=functools.partial(layers.Attention, num_heads=2, head_dim=4,
                                  kernel='reference', dropout_rate=0.5),
      mlp=Doubled, dropout_rate=0.1, deterministic=False)
  x = jax.random.normal(rng, (2, 5, 8))
  params = block.init({'params': rng, 'dropout': rng}, x)
  out = lambda key: block.apply(params, x, rngs={'dropout': jax.random.key(key)})
  np.testing.assert_array_equal(out(1), out(1))
  assert not np.allclose(out(1), out(2))


@pytest.mark.parametrize('layout', kernels.cache.LAYOUTS)
@pytest.mark.parametrize('mask_shape', [None, (1, 1, 2, 5), (6, 1, 2, 5), (6, 4, 1, 5)])
def test_cross_attention_over_cache_rows_shared_by_consecutive_rows_equals_a_repeated_cache(
    layout, mask_shape):
  """Beam search stores a source's cross-attention keys and values once for its beams: 6 query
  rows over a cache of 2 rows (3 rows each) give what the cache repeated for every row gives,
  under a mask per row, per head, one for all, or none."""
  layer = layers.Attention(num_heads=4, num_kv_heads=2, head_dim=8, is_cross=True,
                           cache_layout=layout)
  x = jax.random.normal(jax.random.key(0), (6, 2, 16))
  encoded = jax.random.normal(jax.random.key(1), (2, 5, 16))
  params = layer.init(jax.random.key(2), x[:2], encoded)['params']
  prefill = lambda queries, source: layer.apply({'params': params}, queries, source,
                                                cache_index=0, mutable=['cache'])[1]['cache']
  shared, repeated = prefill(x[::3], encoded), prefill(x, jnp.repeat(encoded, 3, axis=0))
  mask = None if mask_shape is None else (
      jax.random.bernoulli(jax.random.key(3), 0.6, mask_shape).at[..., 0].set(True))
  step = lambda cache: layer.apply({'params': params, 'cache': cache}, x, mask=mask,
                                   cache_index=1)
  np.testing.assert_allclose(step(shared), step(repeated), atol=1e-6)


def test_cross_attention_refuses_query_rows_that_do_not_share_the_cache_rows_evenly():
  layer = layers.Attention(num_heads=2, head_dim=4, is_cross=True)
  encoded = jnp.ones((2, 3, 8))
  params = layer.init(jax.random.key(0), jnp.ones((2, 1, 8)), encoded)['params']
  _, cache = layer.apply({'params': params}, jnp.ones((2, 1, 8)), encoded, cache_index=0,
                         mutable=['cache'])
  with pytest.raises(ValueError, match='5 query rows over a cache of 2 rows'):
    layer.apply({'params': params, **cache}, jnp.ones((5, 1, 8)), cache_index=1)
