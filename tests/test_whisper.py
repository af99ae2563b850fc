"""Whisper (Radford et al. 2022): its audio stem and encoder positions against torch and
openai/whisper's formulas, the model, its cached decoding, its configs and its data."""
import dataclasses
import functools
import shutil

import flax.linen as nn
import numpy as np
import jax
import jax.numpy as jnp
import pytest
import soundfile
import torch
import tokenizers
import transformers

import train_helpers
from helpers import ROOT, load_config, tiny
from test_decode import NEW_TOKENS, TARGET_LENGTHS, TARGET_PROMPTS, uncached_greedy
from transformer_jax import (accounting, aot, convert, data, decode, describe, layers, models,
                             quantization, run, train)
from transformer_jax.data import audio, speech
from transformer_jax.errors import ConfigError, UserError
from transformer_jax.models import whisper
from transformer_jax.train import losses, metrics, setup, sharding


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


@pytest.mark.parametrize('num_frames', [10, 11])
def test_the_audio_stems_gradients_are_torchs_taken_by_products(num_frames):
  """Its gradients come from products over the frames' windows, not from convolutions, which
  XLA:CPU runs 100x as slowly inside a loop (a scan of microbatches): every gradient against
  torch's autograd, and only the two forward convolutions in the program."""
  mels, width = 6, 8
  features = np.random.default_rng(0).standard_normal((2, num_frames, mels)).astype(np.float32)
  stem = layers.AudioStem(features=width)
  params = nn.meta.unbox(stem.init(jax.random.key(1), features)['params'])
  weights = np.cos(np.arange(2 * layers.stem_frames(num_frames) * width)).reshape(
      2, -1, width).astype(np.float32)
  loss = lambda params, x: jnp.sum(weights * stem.apply({'params': params}, x))
  gradients = jax.jit(jax.grad(loss, argnums=(0, 1)))
  d_params, d_features = gradients(params, features)
  assert gradients.lower(params, features).as_text().count('stablehlo.convolution') == 2
  torch_params = {name: {key: torch.tensor(np.asarray(value), requires_grad=True)
                         for key, value in layer.items()} for name, layer in params.items()}
  conv = lambda x, name, stride: torch.nn.functional.conv1d(
      x, torch_params[name]['kernel'].permute(2, 1, 0), torch_params[name]['bias'],
      stride=stride, padding=1)
  x = torch.tensor(features, requires_grad=True)
  out = torch.nn.functional.gelu(conv(torch.nn.functional.gelu(
      conv(x.transpose(1, 2), 'conv1', 1)), 'conv2', 2))
  (torch.tensor(weights) * out.transpose(1, 2)).sum().backward()
  np.testing.assert_allclose(d_features, x.grad.numpy(), atol=1e-5)
  for name, layer in d_params.items():
    for key, value in layer.items():
      np.testing.assert_allclose(value, torch_params[name][key].grad.numpy(), atol=1e-5,
                                 err_msg=f'{name}/{key}')


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
  in the shapes of its init (traced, not run): norm scales 1 + N(0, 0.1^2), the rest
  N(0, 0.1^2), so that no term is trivially zero; the encoder's position table is Whisper's
  sinusoids, as init makes it."""
  cfg = tiny('whisper', num_mels=6, num_frames=12, dtype='float32', **overrides)
  shapes = jax.eval_shape(lambda: models.init_params(cfg, jax.random.key(seed)))
  noise = np.random.default_rng(seed)
  table = layers.sinusoidal(np.arange(cfg.source_positions), cfg.width, layout='sin_cos')
  draw = lambda path, leaf: jnp.asarray(table if path[-1].key == 'pos_embed' else (
      (path[-1].key == 'scale') + 0.1 * noise.standard_normal(leaf.shape)), leaf.dtype)
  return models.build(cfg), jax.tree_util.tree_map_with_path(draw, shapes)


FEATURES = jnp.asarray(np.random.default_rng(7).standard_normal((3, 12, 6)), jnp.float32)


def assert_cached_greedy_is_uncached(model, params):
  """Cached greedy decoding of FEATURES from TARGET_PROMPTS gives each row the tokens and logits
  of re-running the whole model at every step."""
  out = decode.generate(model, params, TARGET_PROMPTS, prompt_lengths=TARGET_LENGTHS,
                        max_new_tokens=NEW_TOKENS, return_logits=True, inputs=FEATURES)
  for row in range(len(FEATURES)):
    tokens, logits = uncached_greedy(model, params, TARGET_PROMPTS[row:row + 1],
                                     TARGET_LENGTHS[row], NEW_TOKENS,
                                     inputs=FEATURES[row:row + 1])
    np.testing.assert_array_equal(out.tokens[row], tokens, err_msg=f'row {row}')
    np.testing.assert_allclose(out.logits[row], logits, atol=1e-5, rtol=0)


@pytest.mark.parametrize('scan', [False, pytest.param(True, marks=pytest.mark.slow)])
def test_cached_greedy_decoding_equals_the_uncached_rollout(scan):
  """The encoder runs once and the cross-attention keys and values are cached at the prefill:
  the same tokens and logits as re-running the whole model at every step."""
  assert_cached_greedy_is_uncached(*tiny_whisper(scan_layers=scan))


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


# The configs, the data and training.

def test_the_configs_describe_the_parameter_counts_of_transformers_whisper():
  """37,760,640 and 72,593,920: WhisperForConditionalGeneration's counts for whisper-tiny and
  whisper-base (its encoder position table included), checked against transformers by
  test_transformers_counts_whisper_tiny_as_describe_does."""
  for arg, count in [(None, 37_760_640), ('size=base', 72_593_920)]:
    config = load_config(ROOT / 'configs' / 'whisper_tiny.py', arg)
    config.compile.xla_memory = False  # the counts: no compile
    text = describe.describe(config)
    assert f'{count:,} parameters (analytic count = initialized tree)' in text
    assert 'FLOPs per second of audio' in text


def test_transformers_counts_whisper_tiny_as_describe_does():
  config = transformers.WhisperConfig(
      vocab_size=51865, num_mel_bins=80, d_model=384, encoder_layers=4, decoder_layers=4,
      encoder_attention_heads=6, decoder_attention_heads=6, encoder_ffn_dim=1536,
      decoder_ffn_dim=1536, max_source_positions=1500, max_target_positions=448)
  with torch.device('meta'):
    model = transformers.WhisperForConditionalGeneration(config)
  assert sum(p.numel() for p in model.parameters()) == 37_760_640


def test_forward_flops_per_second_of_audio_by_hand():
  cfg = tiny('whisper', num_mels=6, num_frames=12, max_len=8)  # 0.12 s, 6 encoder positions
  d, v, s, t = 32, 40, 6, 8
  block = 4 * d * d + 2 * d * 4 * d
  dense = (2 * 3 * d * (12 * 6 + s * d) + 2 * s * 2 * block  # stem, encoder
           + 2 * s * 2 * 2 * d * d  # the decoder's cross-attention keys and values
           + 2 * t * 2 * (block + 2 * d * d) + 2 * t * d * v)  # decoder blocks, head
  attention = 4 * d * (2 * s * s + 2 * (t * t + t * s))
  flops = accounting.forward_flops(cfg)
  assert (flops['dense'], flops['attention'], flops['tokens']) == (dense, attention, 0.12)


def audio_data(tmp_path=None, name='synthetic', num_mels=8, num_frames=20, **overrides):
  settings = data.DataSettings.of({'name': name, 'seq_len': 6, 'eval_examples': 8,
                                   'log_mel_on': 'host', **overrides})
  return speech.AudioTask(settings, seed=0, num_mels=num_mels, num_frames=num_frames, max_len=8)


def test_generated_tones_are_batches_of_features_and_their_digit():
  task = audio_data()
  batch = task.train_batch(3, 4, slice(None))
  assert batch['features'].shape == (4, 20, 8) and batch['features'].dtype == np.float32
  vocab = task.vocab
  for row in range(4):
    digit = vocab.decode(batch['targets'][row])
    assert digit in '0123456789' and len(digit) == 1
    np.testing.assert_array_equal(batch['targets'][row, :2], vocab.encode(digit) + [vocab.eos_id])
    np.testing.assert_array_equal(batch['decoder_inputs'][row, :2],
                                  [vocab.bos_id] + vocab.encode(digit))
    np.testing.assert_array_equal(batch['weights'][row], [1, 1, 0, 0, 0, 0])
  again = task.train_batch(3, 4, slice(2, 4))  # a pure function of (seed, step), by rows
  np.testing.assert_array_equal(again['features'], batch['features'][2:])
  assert not np.array_equal(task.train_batch(4, 4, slice(None))['features'], batch['features'])


SPEC_AUGMENT = dict(spec_augment=True, num_time_masks=2, max_time_width=5, num_freq_masks=1,
                    max_freq_width=3)


def test_waveforms_and_their_masks_make_the_hosts_features_and_logits_in_the_model():
  """data.log_mel_on='device' ships the tones padded to the window and SpecAugment's bands,
  drawn as the host draws them (a pure function of (seed, step)); the model's front end makes
  the host's masked features of them, and the same logits."""
  model, params = tiny_whisper()
  device, host = (audio_data(num_frames=12, num_mels=6, log_mel_on=where, **SPEC_AUGMENT)
                  for where in ('device', 'host'))
  on_device, on_host = (task.train_batch(3, 4, slice(None)) for task in (device, host))
  assert set(on_device) == {'waveforms', 'time_masks', 'freq_masks', 'decoder_inputs', 'targets',
                            'weights'}
  waveforms = on_device['waveforms']
  assert waveforms.shape == (4, 12 * 160) and waveforms.dtype == np.float32
  for key in ('decoder_inputs', 'targets', 'weights'):
    np.testing.assert_array_equal(on_device[key], on_host[key])
  for key, count, length, max_width in (('time_masks', 2, 12, 5), ('freq_masks', 1, 6, 3)):
    starts, widths = on_device[key][..., 0], on_device[key][..., 1]
    assert on_device[key].shape == (4, count, 2) and widths.any()
    assert (widths <= max_width).all() and (starts >= 0).all() and (starts + widths <= length).all()
  again = audio_data(num_frames=12, num_mels=6, log_mel_on='device', **SPEC_AUGMENT)
  for key, value in again.train_batch(3, 4, slice(None)).items():  # a rerun: the same masks
    np.testing.assert_array_equal(value, on_device[key])
  assert not np.array_equal(device.train_batch(4, 4, slice(None))['time_masks'],
                            on_device['time_masks'])
  unmasked = audio_data(num_frames=12, num_mels=6, log_mel_on='host').train_batch(3, 4, slice(None))
  assert not np.allclose(unmasked['features'], on_host['features'])  # the masks change them
  features = jax.jit(functools.partial(whisper.encoder_features, model.cfg))(
      waveforms, on_device['time_masks'], on_device['freq_masks'])
  np.testing.assert_allclose(features, on_host['features'], atol=1e-4, rtol=0)
  apply = lambda *args, **keywords: model.apply({'params': params}, *args, **keywords)
  logits = whisper.FAMILY.logits(apply, on_device)
  np.testing.assert_allclose(logits, whisper.FAMILY.logits(apply, on_host), atol=1e-4, rtol=0)
  assert np.abs(logits).max() > 1  # logits of order one: a wrong feature would show


def write_folder(directory, clips, header='file_name,transcription'):
  """WAV files at 8 kHz (resampled to 16 kHz on reading) and their metadata.csv."""
  lines = [header]
  for name, seconds, text in clips:
    soundfile.write(directory / name, 0.1 * np.ones(int(8000 * seconds), np.float32), 8000)
    lines.append(f'{name},{text}')
  (directory / 'metadata.csv').write_text('\n'.join(lines) + '\n')


def test_an_audiofolder_holds_out_its_last_tenth_and_encodes_the_transcripts(tmp_path):
  write_folder(tmp_path, [(f'{i}.wav', 0.1, 'ab' if i % 2 else 'ba') for i in range(10)])
  task = audio_data(name='audiofolder', audio_dir=str(tmp_path))
  assert task.num_eval_examples == 1 and task.vocab.size == 5  # PAD, BOS, EOS, a, b
  held_out = task.eval_examples(np.array([0]))
  assert task.vocab.decode(held_out['targets'][0]) == 'ab'  # 9.wav
  expected = audio.log_mel_spectrogram(audio.load_audio(tmp_path / '9.wav'), num_mels=8,
                                       num_samples=20 * audio.HOP_LENGTH)
  np.testing.assert_allclose(held_out['features'][0], expected, atol=1e-6)


def test_a_corrupt_file_is_named_and_a_metadata_without_the_columns_is_refused(tmp_path):
  write_folder(tmp_path, [('0.wav', 0.1, 'a'), ('1.wav', 0.1, 'b')])
  (tmp_path / '1.wav').write_bytes(b'not audio')
  with pytest.raises(UserError, match=f'cannot read the audio file {tmp_path / "1.wav"} '
                     f'\\(named by {tmp_path / "metadata.csv"}:3\\)'):
    audio_data(name='audiofolder', audio_dir=str(tmp_path))  # the header, checked at opening
  write_folder(tmp_path, [('0.wav', 0.1, 'a'), ('1.wav', 0.1, 'b')], header='path,text')
  with pytest.raises(UserError, match='no column file_name or transcription'):
    audio_data(name='audiofolder', audio_dir=str(tmp_path))


def test_transcripts_longer_than_the_decoders_positions_are_refused_naming_the_fix():
  with pytest.raises(ConfigError, match=r"data.seq_len=9 transcript tokens exceed the decoder's "
                     r'model.max_len=8 positions: lower data.seq_len or raise model.max_len'):
    audio_data(seq_len=9)


def test_a_transcript_longer_than_seq_len_fails_naming_the_fix(tmp_path):
  """A folder's transcripts are all checked when it is opened; a generated (or TFDS) one when a
  batch holds it: [BOS] 3 [EOS] is 2 decoder inputs, over data.seq_len=1."""
  write_folder(tmp_path, [('0.wav', 0.1, 'abcdefg'), ('1.wav', 0.1, 'b')])
  with pytest.raises(UserError, match=f'the longest, of {tmp_path / "0.wav"} '
                     f'\\({tmp_path / "metadata.csv"}:2\\), is 8 tokens with its EOS: set '
                     'data.seq_len=8.'):
    audio_data(name='audiofolder', audio_dir=str(tmp_path))
  with pytest.raises(UserError, match='is 2 tokens with its EOS, over data.seq_len=1: raise '
                     'data.seq_len'):
    audio_data(seq_len=1).train_batch(0, 4, slice(None))


def test_the_reference_configs_step_makes_the_features_with_the_loss_of_the_hosts():
  """--mode=compile's stand-in data (aot.stand_in) of configs/whisper_reference.py ships the
  waveforms batch_shapes plans; the train step makes their features and applies SpecAugment's
  bands, with the loss of the host's features."""
  config = load_config(ROOT / 'configs' / 'whisper_reference.py')
  reference = train.resolve(config, 'cpu').model
  planned = whisper.FAMILY.batch_shapes(reference, 16, 8)
  assert planned['waveforms'].shape == (16, 100 * 160) and 'features' not in planned
  config.model.update(width=16, num_layers=1, num_decoder_layers=1, num_frames=20, num_mels=8)
  config.data.update(batch_size=4, **SPEC_AUGMENT)
  run_ = train.build_run(aot.stand_in(train.resolve(config, 'cpu')), devices=jax.devices()[:1])
  batch = run_.data.train_batch(0)
  planned = run_.family.batch_shapes(run_.model_config, 4, 8)
  assert {key: (value.shape, value.dtype) for key, value in planned.items()} == {
      key: (batch[key].shape, batch[key].dtype) for key in planned}
  assert run_.family.lengths(batch) == (20, 8)  # the frames the FLOPs count
  masks = list(zip(batch['time_masks'], batch['freq_masks']))
  on_host = {**{key: batch[key] for key in ('decoder_inputs', 'targets', 'weights')},
             **speech.encoder_inputs(list(batch['waveforms']), masks, 'host', 8)}
  noise = np.random.default_rng(0)  # drawn as tiny_whisper's, by numpy: no init to compile
  state = setup.state_of(run_.tx, jax.tree_util.tree_map_with_path(
      lambda path, leaf: jnp.asarray((path[-1].key == 'scale')
                                     + 0.1 * noise.standard_normal(leaf.shape), leaf.dtype),
      run_.abstract_params))
  sums = jax.jit(lambda params, inputs: losses.batch_sums(
      run_.model, run_.family, params, inputs, jax.random.key(0)))
  expected = sums(state.params, on_host)
  unmasked = sums(state.params, {**on_host, **speech.encoder_inputs(
      list(batch['waveforms']), None, 'host', 8)})
  _, on_device = run_.train_step(state, sharding.global_batch(batch, run_.mesh))
  for key in ('loss', 'weight'):
    np.testing.assert_allclose(on_device[key], expected[key], rtol=1e-5, err_msg=key)
  # Without the masks the loss moves by far more than that tolerance (6e-4 of it).
  assert abs(unmasked['loss'] / expected['loss'] - 1) > 1e-4


@pytest.mark.slow
def test_the_reference_config_trains_end_to_end_on_generated_tones(tmp_path):
  config = load_config(ROOT / 'configs' / 'whisper_reference.py', 'steps=3')
  config.model.update(width=32, num_frames=40, num_mels=16)
  config.data.update(batch_size=8, eval_batch_size=8, eval_examples=8, wer_examples=8)
  config.training.update(log_every=1)
  run.run(config, str(tmp_path), 'train')
  losses = train_helpers.losses(str(tmp_path))
  assert sorted(losses) == [1, 2, 3] and all(np.isfinite(list(losses.values())))
  assert losses[1] > np.log(13) * 0.5  # near the uniform loss over 13 ids at the start
  (evaluation,) = [row for row in metrics.read_metrics(str(tmp_path)) if 'eval_wer' in row]
  assert evaluation['step'] == 3 and evaluation['eval_wer'] >= 0


def snapshot(directory):
  """{path: (size, mtime)} of every file under directory."""
  return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in directory.rglob('*')
          if p.is_file()}


@pytest.mark.slow
def test_sample_mode_transcribes_an_audio_file_greedily_and_writes_nothing(tmp_path, capsys):
  config = load_config(ROOT / 'configs' / 'whisper_reference.py', 'steps=2')
  config.model.update(width=32, num_frames=40, num_mels=16)
  config.data.update(batch_size=8, eval_batch_size=8, eval_examples=8, wer_examples=0)
  workdir = tmp_path / 'run'
  run.run(config, str(workdir), 'train')
  clip = tmp_path / 'clip.wav'
  soundfile.write(clip, 0.5 * np.sin(2 * np.pi * 700 * np.arange(4000) / 8000), 8000)
  config.sample.update(audio=str(clip), temperature=0.0, max_new_tokens=6)
  before = snapshot(workdir)
  (text,) = run.run(config, str(workdir), 'sample')
  assert snapshot(workdir) == before  # read-only
  assert capsys.readouterr().out.endswith(f'--- transcript 0 of {clip} (step 2) ---\n{text}\n')
  # The same transcript by hand: the file's features, greedy from BOS, cut at EOS.
  trained, params, _ = train.restore_trained(config, str(workdir))
  features = audio.log_mel_spectrogram(audio.load_audio(clip), num_mels=16,
                                       num_samples=40 * audio.HOP_LENGTH)
  vocab = trained.data.vocab
  tokens = decode.generate(trained.model, params, np.array([[vocab.bos_id]]), max_new_tokens=6,
                           inputs=features[None], eos_id=vocab.eos_id).tokens[0].tolist()
  assert text == vocab.decode(tokens)
  config.sample.update(beam_size=2)
  (beamed,) = run.run(config, str(workdir), 'sample')
  beams = decode.beam_search(trained.model, params, np.array([[vocab.bos_id]]), beam_size=2,
                             max_new_tokens=6, inputs=features[None], eos_id=vocab.eos_id,
                             length_penalty=0.6)
  assert beamed == vocab.decode(beams.tokens[0, 0, :int(beams.lengths[0, 0])].tolist())
  config.sample.update(beam_size=0, int8=True)
  (quantized,) = run.run(config, str(workdir), 'sample')
  int8 = quantization.int8_params(trained.model.cfg, params)
  tokens = decode.generate(trained.model, int8, np.array([[vocab.bos_id]]), max_new_tokens=6,
                           inputs=features[None], eos_id=vocab.eos_id).tokens[0].tolist()
  assert quantized == vocab.decode(tokens)
  config.sample.int8 = False
  (tmp_path / 'bad.wav').write_bytes(b'RIFF, but not audio')
  for path, message in ((tmp_path / 'bad.wav', 'cannot read the audio file'),
                        (tmp_path / 'absent.wav', 'no audio file at')):
    config.sample.audio = str(path)
    with pytest.raises(UserError, match=f'{message} {path}'):
      run.run(config, str(workdir), 'sample')
  config.sample.audio = None
  with pytest.raises(ConfigError, match='set --config.sample.audio=FILE'):
    run.run(config, str(workdir), 'sample')
  assert snapshot(workdir) == before


# Hugging Face's WhisperForConditionalGeneration.

@pytest.fixture(scope='module')
def hf_whisper(tmp_path_factory):
  """A small WhisperForConditionalGeneration of random weights (12 Mel bins, 16 frames, 2 encoder
  blocks and 1 decoder block), saved: biases and norms drawn too, so that each tensor matters;
  the encoder positions stay HF's sinusoids."""
  config = transformers.WhisperConfig(
      vocab_size=50, num_mel_bins=12, d_model=32, encoder_layers=2, decoder_layers=1,
      encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
      decoder_ffn_dim=64, max_source_positions=8, max_target_positions=10, pad_token_id=0,
      bos_token_id=1, eos_token_id=2, decoder_start_token_id=1, suppress_tokens=[],
      begin_suppress_tokens=[], attn_implementation='eager')
  torch.manual_seed(0)
  model = transformers.WhisperForConditionalGeneration(config).eval()
  with torch.no_grad():
    for name, param in model.named_parameters():
      if 'embed_positions' not in name or 'decoder' in name:
        param.copy_(torch.randn_like(param) * 0.2 + ('layer_norm.weight' in name))
  path = tmp_path_factory.mktemp('whisper')
  model.save_pretrained(path, safe_serialization=True)
  return model, path


def hf_example(seed=0):
  rng = np.random.default_rng(seed)
  features = rng.standard_normal((2, 16, 12)).astype(np.float32)  # ours: (frames, mels)
  tokens = rng.integers(0, 50, (2, 7))
  return features, tokens


def hf_logits(model, features, tokens):
  with torch.no_grad():
    return model(input_features=torch.from_numpy(features.transpose(0, 2, 1)),
                 decoder_input_ids=torch.from_numpy(tokens)).logits.numpy()


def test_imported_whisper_computes_transformers_logits_and_counts(hf_whisper):
  model, path = hf_whisper
  fields, params = convert.load(path)
  assert fields['num_frames'] == 16 and fields['num_mels'] == 12
  features, tokens = hf_example()
  expected = hf_logits(model, features, tokens)
  assert np.abs(expected).max() > 1  # logits of order one: a wrong tensor would show
  ours = models.build(fields).apply({'params': params}, features, tokens)
  np.testing.assert_allclose(ours, expected, atol=1e-4, rtol=0)
  hf_count = sum(p.numel() for p in model.parameters())
  assert accounting.param_counts(fields)['total'] == hf_count
  assert sum(np.size(a) for a in jax.tree.leaves(params)) == hf_count


def test_exported_whisper_loads_in_transformers_with_the_same_logits(hf_whisper, tmp_path):
  model, path = hf_whisper
  fields, params = convert.load(path)
  convert.save(tmp_path, fields, params)
  exported = transformers.WhisperForConditionalGeneration.from_pretrained(
      tmp_path, attn_implementation='eager').eval()
  features, tokens = hf_example(seed=1)
  np.testing.assert_allclose(hf_logits(exported, features, tokens),
                             hf_logits(model, features, tokens), atol=1e-5, rtol=0)


def test_word_error_rate_counts_edits_over_reference_words_after_normalising():
  # 'The cat, sat!' -> 'the cat sat'; against 'the bat sat down': 1 substitution, 1 deletion.
  assert speech.word_error_rate(['The cat, sat!'], ['the bat sat down']) == 2 / 4
  assert speech.word_error_rate(['a b', 'x'], ['A B.', '']) == 1 / 2  # 'x': an insertion
  assert speech.normalized("It's  OK?") == 'it s ok'


def test_eval_wer_transcribes_held_out_utterances_with_the_decoder():
  """A 'model' that always writes the digit 3 then EOS: WER is the share of held-out tones that
  are not 3, each one substitution of a one-word transcript."""
  task = audio_data(wer_examples=8)
  vocab = task.vocab

  def generate(prompt_tokens, inputs, max_new_tokens, eos_id, **unused):
    assert inputs.shape == (4, 20, 8) and prompt_tokens[0, 0] == vocab.bos_id
    return np.tile([vocab.encode('3')[0], eos_id] + [0] * (max_new_tokens - 2), (len(inputs), 1))

  digits = [vocab.decode(row) for row in task.eval_examples(np.arange(8))['targets']]
  expected = np.mean([digit != '3' for digit in digits])
  assert 0 < expected < 1
  assert task.generation_metrics(generate, batch_size=4) == {'eval_wer': expected}


def test_transcripts_take_a_tokenizer_json_starting_from_whispers_start_of_transcript(tmp_path):
  words = {'<|endoftext|>': 0, '<|startoftranscript|>': 1, '[UNK]': 2, 'three': 3, 'two': 4}
  made = tokenizers.Tokenizer(tokenizers.models.WordLevel(words, unk_token='[UNK]'))
  made.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
  made.add_special_tokens(['<|endoftext|>', '<|startoftranscript|>'])
  made.save(str(tmp_path / 'tokenizer.json'))
  write_folder(tmp_path, [('0.wav', 0.1, 'two three'), ('1.wav', 0.1, 'three')])
  task = audio_data(name='audiofolder', audio_dir=str(tmp_path), tokenizer=str(tmp_path))
  batch = task.eval_examples(np.array([0]))  # 1.wav
  np.testing.assert_array_equal(batch['decoder_inputs'][0, :2], [1, 3])
  np.testing.assert_array_equal(batch['targets'][0, :2], [3, 0])
  np.testing.assert_array_equal(batch['weights'][0], [1, 1, 0, 0, 0, 0])


WHISPER_SPECIALS = ['<|endoftext|>', '<|startoftranscript|>', '<|en|>', '<|fr|>',
                    '<|transcribe|>', '<|translate|>', '<|notimestamps|>']


def whisper_tokenizer(directory):
  """A word-level tokenizer.json with Whisper's special tokens at ids 0-6 and words after."""
  words = {token: i for i, token in enumerate(WHISPER_SPECIALS + ['[UNK]', 'three', 'two'])}
  made = tokenizers.Tokenizer(tokenizers.models.WordLevel(words, unk_token='[UNK]'))
  made.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
  made.add_special_tokens(WHISPER_SPECIALS)
  made.save(str(directory / 'tokenizer.json'))
  return str(directory)


@pytest.mark.parametrize('language,task,prompt', [
    ('en', 'transcribe', [1, 2, 4, 6]), ('fr', 'translate', [1, 3, 5, 6])])
def test_whispers_special_tokens_prompt_the_decoder_and_the_loss_skips_them(
    tmp_path, language, task, prompt):
  write_folder(tmp_path, [('0.wav', 0.1, 'two three'), ('1.wav', 0.1, 'two three two')])
  made = audio_data(name='audiofolder', audio_dir=str(tmp_path), seq_len=8, language=language,
                    whisper_task=task, tokenizer=whisper_tokenizer(tmp_path))
  assert made.prompt == prompt
  batch = made.eval_examples(np.array([0]))  # 1.wav: 'two three two' = 9 8 9, <|endoftext|> 0
  np.testing.assert_array_equal(batch['decoder_inputs'][0], prompt + [9, 8, 9, 0])
  np.testing.assert_array_equal(batch['targets'][0], prompt[1:] + [9, 8, 9, 0, 0])
  np.testing.assert_array_equal(batch['weights'][0], [0, 0, 0, 1, 1, 1, 1, 0])

  def generate(prompt_tokens, max_new_tokens, eos_id, **unused):  # writes 'two three', then EOS
    np.testing.assert_array_equal(prompt_tokens, [prompt])
    assert max_new_tokens == 8 + 1 - 4  # what fits the decoder's seq_len after the prompt
    return np.array([[9, 8, eos_id] + [0] * (max_new_tokens - 3)])

  assert made.generation_metrics(generate, batch_size=1) == {}  # data.wer_examples=0
  made.part = dataclasses.replace(made.part, wer_examples=1)
  assert made.generation_metrics(generate, batch_size=1) == {'eval_wer': 1 / 3}  # one deletion


def test_whispers_tokens_without_the_language_fail_naming_the_setting(tmp_path):
  write_folder(tmp_path, [('0.wav', 0.1, 'two'), ('1.wav', 0.1, 'three')])
  with pytest.raises(ConfigError, match=r'not <\|de\|>: set data.language'):
    audio_data(name='audiofolder', audio_dir=str(tmp_path), language='de',
               tokenizer=whisper_tokenizer(tmp_path))
  with pytest.raises(ConfigError, match='whisper_task'):
    audio_data(name='audiofolder', audio_dir=str(tmp_path), whisper_task='align',
               tokenizer=whisper_tokenizer(tmp_path))


def test_a_transcript_over_seq_len_after_the_prompt_fails_naming_the_fix(tmp_path):
  write_folder(tmp_path, [('0.wav', 0.1, 'two three two'), ('1.wav', 0.1, 'two')])
  with pytest.raises(UserError, match='is 4 tokens with its EOS after a prompt of 4: set '
                     'data.seq_len=7.'):
    audio_data(name='audiofolder', audio_dir=str(tmp_path), seq_len=6,
               tokenizer=whisper_tokenizer(tmp_path))


def test_sample_mode_transcribes_with_an_imported_whisper_from_its_prompt(hf_whisper, tmp_path,
                                                                          capsys):
  """init_from_hf's weights and a tokenizer.json with Whisper's tokens (its <|endoftext|> the
  checkpoint's EOS, 2): the transcript starts from <|startoftranscript|> <|en|> <|transcribe|>
  <|notimestamps|> = 1 3 4 5; its first token is the argmax of transformers' logits there."""
  model, path = hf_whisper
  checkpoint = tmp_path / 'checkpoint'
  shutil.copytree(path, checkpoint)
  words = ['[UNK]', '<|startoftranscript|>', '<|endoftext|>', '<|en|>', '<|transcribe|>',
           '<|notimestamps|>', 'two', 'three']
  made = tokenizers.Tokenizer(tokenizers.models.WordLevel(
      {word: i for i, word in enumerate(words)}, unk_token='[UNK]'))
  made.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
  made.add_special_tokens(words[1:6])
  made.save(str(checkpoint / 'tokenizer.json'))
  clip = tmp_path / 'clip.wav'
  soundfile.write(clip, 0.3 * np.sin(2 * np.pi * 500 * np.arange(2400) / 16000), 16000)
  config = load_config(ROOT / 'configs' / 'from_hf.py', f'path={checkpoint}')
  config.sample.update(audio=str(clip), temperature=0.0)
  (text,) = run.run(config, None, 'sample')
  assert f'--- transcript 0 of {clip} ({checkpoint}) ---' in capsys.readouterr().out
  features = audio.log_mel_spectrogram(audio.load_audio(clip), num_mels=12,
                                       num_samples=16 * audio.HOP_LENGTH)[None]
  prompt = np.array([[1, 3, 4, 5]])
  logits = hf_logits(model, features, prompt)
  settings = train.resolve(config, 'cpu')
  ours = models.build(settings.model)
  params = convert.load_params(str(checkpoint), settings.model)
  tokens = decode.generate(ours, params, prompt, max_new_tokens=10 + 1 - 4, inputs=features,
                           eos_id=2, token_limit=len(words)).tokens[0].tolist()
  assert tokens[0] == logits[0, -1, :len(words)].argmax()  # the tokenizer's ids only
  vocab = data.tokenizer.HFTokenizer.from_file(str(checkpoint), eos_id=2)
  assert text == vocab.decode(tokens)


def test_from_hf_describes_a_whisper_checkpoint_with_transformers_count(hf_whisper):
  model, path = hf_whisper
  config = load_config(ROOT / 'configs' / 'from_hf.py', f'path={path}')
  assert config.data.name == 'audiofolder' and config.data.tokenizer == str(path)
  count = sum(p.numel() for p in model.parameters())
  config.compile.xla_memory = False
  assert f'{count:,} parameters' in describe.describe(config)
