"""Whisper (Radford et al. 2022): its audio stem and encoder positions against torch and
openai/whisper's formulas, the model, its cached decoding, its configs and its data."""
import flax.linen as nn
import numpy as np
import jax
import jax.numpy as jnp
import pytest
import torch

from transformer_jax import layers


def whisper_sinusoids(length, channels, max_timescale=10000):
  """openai/whisper model.py's `sinusoids`, in NumPy float64."""
  increment = np.log(max_timescale) / (channels // 2 - 1)
  inv_timescales = np.exp(-increment * np.arange(channels // 2))
  scaled = np.arange(length)[:, None] * inv_timescales[None, :]
  return np.concatenate([np.sin(scaled), np.cos(scaled)], axis=1)


def test_sin_cos_positions_are_whispers_table():
  table = layers.sinusoidal(jnp.arange(1500)[None], 384, layout='sin_cos')[0]
  np.testing.assert_allclose(table, whisper_sinusoids(1500, 384), atol=2e-4)
  # The first sine and cosine run at one radian per position, the last at 1/10000.
  np.testing.assert_allclose(table[:3, 0], np.sin([0, 1, 2]), atol=1e-6)
  np.testing.assert_allclose(table[1, 191], np.sin(1e-4), rtol=1e-5)


def test_an_unknown_sinusoidal_layout_fails_naming_the_layouts():
  with pytest.raises(ValueError, match="'interleaved', 'sin_cos'"):
    layers.sinusoidal(jnp.arange(4), 8, layout='split')


@pytest.mark.parametrize('num_frames', [10, 11])
def test_the_audio_stem_is_two_torch_conv1d_with_gelu(num_frames):
  mels, width = 6, 8
  features = np.random.default_rng(0).standard_normal((2, num_frames, mels)).astype(np.float32)
  stem = layers.AudioStem(features=width)
  params = nn.meta.unbox(stem.init(jax.random.key(1), features)['params'])
  ours = stem.apply({'params': params}, features)
  assert ours.shape == (2, layers.stem_frames(num_frames), width)
  conv = lambda x, name, stride: torch.nn.functional.conv1d(
      x, torch.tensor(np.asarray(params[name]['kernel']).transpose(2, 1, 0)),
      torch.tensor(np.asarray(params[name]['bias'])), stride=stride, padding=1)
  x = torch.tensor(features).transpose(1, 2)  # torch's (B, mels, frames)
  x = torch.nn.functional.gelu(conv(torch.nn.functional.gelu(conv(x, 'conv1', 1)), 'conv2', 2))
  np.testing.assert_allclose(ours, x.transpose(1, 2).numpy(), atol=1e-5)


def test_attention_without_a_key_bias_has_none_and_the_same_outputs():
  """Whisper's key projection has no bias; a key bias would be cancelled by the softmax."""
  x = np.random.default_rng(0).standard_normal((1, 5, 16)).astype(np.float32)
  attention = layers.Attention(num_heads=2, head_dim=8, key_bias=False)
  params = nn.meta.unbox(attention.init(jax.random.key(0), x)['params'])
  assert 'bias' not in params['key'] and 'bias' in params['query'] and 'bias' in params['value']
  with_bias = layers.Attention(num_heads=2, head_dim=8)
  biased = dict(params, key=dict(params['key'], bias=jnp.ones((2, 8))))
  np.testing.assert_allclose(with_bias.apply({'params': biased}, x),
                             attention.apply({'params': params}, x), atol=1e-5)
