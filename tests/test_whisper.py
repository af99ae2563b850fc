"""Whisper (Radford et al. 2022): its audio stem and encoder positions against torch and
openai/whisper's formulas, the model, its cached decoding, its configs and its data."""
import flax.linen as nn
import numpy as np
import jax
import jax.numpy as jnp
import pytest
import torch

from helpers import tiny
from test_decode import NEW_TOKENS, TARGET_LENGTHS, TARGET_PROMPTS, uncached_greedy
from transformer_jax import decode, layers, models


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


def tiny_whisper(seed=0, **overrides):
  """A small Whisper (6 Mel bins, 12 frames: 6 encoder positions) with parameters drawn by numpy
  in the shapes of its init: norm scales 1 + N(0, 0.1^2), the rest N(0, 0.1^2), so that no term
  is trivially zero (the encoder's position table is Whisper's sinusoids, as init makes it)."""
  cfg = tiny('whisper', num_mels=6, num_frames=12, dtype='float32', **overrides)
  params = models.init_params(cfg, jax.random.key(seed))
  noise = np.random.default_rng(seed)
  draw = lambda path, leaf: leaf if path[-1].key == 'pos_embed' else jnp.asarray(
      (path[-1].key == 'scale') + 0.1 * noise.standard_normal(leaf.shape), leaf.dtype)
  return models.build(cfg), jax.tree_util.tree_map_with_path(draw, params)


FEATURES = jnp.asarray(np.random.default_rng(7).standard_normal((3, 12, 6)), jnp.float32)


@pytest.mark.parametrize('scan', [False, pytest.param(True, marks=pytest.mark.slow)])
def test_cached_greedy_decoding_equals_the_uncached_rollout(scan):
  """The encoder runs once and the cross-attention keys and values are cached at the prefill:
  the same tokens and logits as re-running the whole model at every step."""
  model, params = tiny_whisper(scan_layers=scan)
  out = decode.generate(model, params, TARGET_PROMPTS, prompt_lengths=TARGET_LENGTHS,
                        max_new_tokens=NEW_TOKENS, return_logits=True, inputs=FEATURES)
  for row in range(len(FEATURES)):
    tokens, logits = uncached_greedy(model, params, TARGET_PROMPTS[row:row + 1],
                                     TARGET_LENGTHS[row], NEW_TOKENS,
                                     inputs=FEATURES[row:row + 1])
    np.testing.assert_array_equal(out.tokens[row], tokens, err_msg=f'row {row}')
    np.testing.assert_allclose(out.logits[row], logits, atol=1e-5, rtol=0)


@pytest.mark.slow
def test_beams_have_the_log_probabilities_of_the_uncached_forward_pass():
  """Each of 3 beams of each utterance (the cache rows reordered as beams are chosen, the
  cross-attention ones too) has the log-probability the full forward pass gives its tokens;
  beam 1 is greedy decoding."""
  model, params = tiny_whisper(seed=1)
  forward = jax.jit(lambda features, tokens: model.apply({'params': params}, features, tokens))
  beams = decode.beam_search(model, params, TARGET_PROMPTS, prompt_lengths=TARGET_LENGTHS,
                             beam_size=3, max_new_tokens=NEW_TOKENS, inputs=FEATURES)
  for row in range(len(FEATURES)):
    prompt = TARGET_PROMPTS[row, :TARGET_LENGTHS[row]]
    for k in range(3):
      tokens = jnp.concatenate([prompt, beams.tokens[row, k]])[None]
      logits = forward(FEATURES[row:row + 1], tokens)
      picked = jnp.take_along_axis(jax.nn.log_softmax(logits[0, :-1]), tokens[0, 1:, None], 1)
      np.testing.assert_allclose(beams.log_probs[row, k], picked[len(prompt) - 1:].sum(),
                                 atol=1e-5, rtol=0, err_msg=f'row {row} beam {k}')
  greedy = decode.beam_search(model, params, TARGET_PROMPTS, prompt_lengths=TARGET_LENGTHS,
                              beam_size=1, max_new_tokens=NEW_TOKENS, inputs=FEATURES)
  expected = decode.generate(model, params, TARGET_PROMPTS, prompt_lengths=TARGET_LENGTHS,
                             max_new_tokens=NEW_TOKENS, inputs=FEATURES)
  np.testing.assert_array_equal(greedy.tokens[:, 0], expected.tokens)


def test_no_gradient_reaches_the_fixed_encoder_positions():
  model, params = tiny_whisper()
  loss = lambda p: model.apply({'params': p}, FEATURES, TARGET_PROMPTS).sum()
  grads = jax.jit(jax.grad(loss))(params)
  assert not np.asarray(grads['pos_embed']).any()
  assert np.asarray(grads['stem']['conv1']['kernel']).any()
  np.testing.assert_allclose(params['pos_embed'], whisper_sinusoids(6, 32), atol=1e-6)


def test_features_longer_than_the_window_fail_naming_the_fix():
  model, params = tiny_whisper()
  with pytest.raises(ValueError, match='num_frames=12'):
    model.apply({'params': params}, jnp.zeros((1, 14, 6)), TARGET_PROMPTS[:1])
