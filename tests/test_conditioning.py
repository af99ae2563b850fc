"""DiT's conditioning layers: adaLN-Zero in the shared Block, the timestep embedder and the class
table, against DiT's formulas written out in PyTorch and NumPy."""
import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from transformer_jax import layers

D, C, B, T = 16, 12, 3, 5


def _block():
  return layers.Block(
      attention=functools.partial(layers.Attention, num_heads=2, head_dim=D // 2, use_bias=True),
      mlp=functools.partial(layers.MLP, hidden=2 * D, activation='gelu_tanh'),
      norm=layers.AdaLNZero)


def _init(module, *args):
  return nn.meta.unbox(module.init(*args))


def _random_like(tree, seed):
  leaves, treedef = jax.tree.flatten(tree)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  return treedef.unflatten([0.3 * jax.random.normal(k, x.shape) for k, x in zip(keys, leaves)])


def test_an_adaln_zero_block_starts_as_the_identity():
  x = jax.random.normal(jax.random.key(0), (B, T, D))
  condition = jax.random.normal(jax.random.key(1), (B, C))
  block = _block()
  params = _init(block, jax.random.key(2), x, None, None, condition)
  modulation = params['params']['attn_norm']['modulation']
  assert modulation['kernel'].shape == (C, 3, D) and not modulation['kernel'].any()
  np.testing.assert_array_equal(block.apply(params, x, None, None, condition), x)


def test_an_adaln_zero_block_computes_dits_block():
  """x + gate_msa * attn(modulate(norm(x), shift_msa, scale_msa)), then the same with the MLP,
  the six vectors a linear map of silu(c) (DiT's DiTBlock), from the block's own sublayers."""
  x = np.asarray(jax.random.normal(jax.random.key(0), (B, T, D)))
  condition = np.asarray(jax.random.normal(jax.random.key(1), (B, C)))
  block = _block()
  params = jax.tree.map(np.asarray, _random_like(
      _init(block, jax.random.key(2), x, None, None, condition), 3)['params'])
  got = block.apply({'params': params}, x, None, None, condition)

  silu = condition / (1 + np.exp(-condition))
  def modulated(h, norm):
    shift, scale, gate = np.moveaxis(
        np.einsum('bc,ckd->bkd', silu, norm['modulation']['kernel'])
        + norm['modulation']['bias'], 1, 0)[:, :, None]
    normed = (h - h.mean(-1, keepdims=True)) / np.sqrt(h.var(-1, keepdims=True) + 1e-6)
    return normed * (1 + scale) + shift, gate
  attention = functools.partial(layers.Attention, num_heads=2, head_dim=D // 2, use_bias=True)()
  mlp = layers.MLP(hidden=2 * D, activation='gelu_tanh')
  h, gate = modulated(x, params['attn_norm'])
  x = x + gate * np.asarray(attention.apply({'params': params['attn']}, h))
  h, gate = modulated(x, params['mlp_norm'])
  x = x + gate * np.asarray(mlp.apply({'params': params['mlp']}, h))
  np.testing.assert_allclose(got, x, rtol=1e-5, atol=1e-5)


def test_a_conditioned_norm_is_refused_post_ln_or_beside_cross_attention():
  with pytest.raises(ValueError, match='pre-LN, in a block without cross-attention'):
    layers.Block(attention=layers.Attention, mlp=layers.MLP, norm=layers.AdaLNZero,
                 norm_position='post')
  with pytest.raises(ValueError, match='conditioning vector'):
    layers.AdaLNZero().init(jax.random.key(0), jnp.zeros((B, T, D)), None)


def test_the_final_adaln_has_no_gate():
  x, condition = jnp.ones((B, T, D)), jnp.ones((B, C))
  norm = layers.AdaLNZero(gated=False)
  params = _init(norm, jax.random.key(0), x, condition)
  assert params['params']['modulation']['kernel'].shape == (C, 2, D)
  np.testing.assert_array_equal(norm.apply(params, x, condition), jnp.zeros_like(x))


def test_the_timestep_embedder_is_dits():
  """DiT's TimestepEmbedder.timestep_embedding and its Linear-SiLU-Linear, in PyTorch with the
  same weights."""
  timesteps = np.array([0, 1, 17, 999])
  embed = layers.TimestepEmbed(features=D, frequency_dim=256)
  params = _init(embed, jax.random.key(0), jnp.asarray(timesteps))['params']
  got = embed.apply({'params': params}, jnp.asarray(timesteps))

  t = torch.tensor(timesteps)
  freqs = torch.exp(-math.log(10000) * torch.arange(0, 128, dtype=torch.float32) / 128)
  args = t[:, None].float() * freqs[None]
  frequencies = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
  # The frequencies agree to one float32 ulp (NumPy's exp against PyTorch's), times t <= 999.
  np.testing.assert_allclose(layers.timestep_frequencies(jnp.asarray(timesteps), 256),
                             frequencies.numpy(), atol=1e-4)
  mlp = torch.nn.Sequential(torch.nn.Linear(256, D), torch.nn.SiLU(), torch.nn.Linear(D, D))
  with torch.no_grad():
    for index, name in ((0, 'dense_in'), (2, 'dense_out')):
      mlp[index].weight.copy_(torch.tensor(np.asarray(params[name]['kernel']).T))
      mlp[index].bias.copy_(torch.tensor(np.asarray(params[name]['bias'])))
    want = mlp(frequencies).numpy()
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
  assert np.asarray(params['dense_in']['kernel']).std() == pytest.approx(0.02, rel=0.1)


def test_an_odd_frequency_count_ends_in_a_zero_column():
  got = layers.timestep_frequencies(jnp.array([5]), 5)
  np.testing.assert_allclose(got[0], [np.cos(5), np.cos(5e-2), np.sin(5), np.sin(5e-2), 0],
                             rtol=1e-6)


def test_the_class_table_has_a_null_row():
  embed = layers.LabelEmbed(num_classes=10, features=D)
  params = _init(embed, jax.random.key(0), jnp.array([0]))['params']
  assert params['table'].shape == (11, D) and embed.null_class == 10
  np.testing.assert_array_equal(embed.apply({'params': params}, jnp.array([10, 3])),
                                params['table'][jnp.array([10, 3])])
