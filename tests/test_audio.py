"""Audio: the log-Mel front end, on the host and jitted as a step runs it, against transformers'
WhisperFeatureExtractor (built from its constructor arguments, nothing downloaded), SpecAugment's
masks, and files written by soundfile read back, resampled, against the signal they hold and
scipy's resampler."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import soundfile
from scipy import signal
from transformers import WhisperFeatureExtractor
from transformers.audio_utils import mel_filter_bank

from transformer_jax.data import audio
from transformer_jax.errors import ConfigError, UserError
from transformer_jax.layers import log_mel

RATE = 16000


def tone(seconds, hz, amplitude=0.5, rate=RATE, phase=0.0):
  return amplitude * np.sin(2 * np.pi * hz * np.arange(round(seconds * rate)) / rate + phase)


def waveform(kind, seconds):
  generator = np.random.default_rng(0)
  if kind == 'sine':
    return tone(seconds, 440) + tone(seconds, 3100, 0.1)
  if kind == 'noise':
    return 0.2 * generator.standard_normal(round(seconds * RATE))
  if kind == 'silence_then_tone':
    half = round(seconds * RATE / 2)
    return np.concatenate([np.zeros(half), tone(seconds - half / RATE, 1000)])
  return np.zeros(round(seconds * RATE))  # silence: every bin at the floor


@pytest.mark.parametrize('num_mels', [80, 128])
def test_the_mel_filters_are_slaneys(num_mels):
  expected = mel_filter_bank(num_frequency_bins=201, num_mel_filters=num_mels,
                             min_frequency=0.0, max_frequency=8000.0, sampling_rate=RATE,
                             norm='slaney', mel_scale='slaney')
  filters = audio.mel_filters(num_mels)
  assert filters.shape == (num_mels, 201)
  np.testing.assert_allclose(filters, expected.T, atol=1e-12)
  # The Slaney scale: 3 mels per 200 Hz up to 1 kHz (15 mels), then 27 mels per factor 6.4.
  hz = np.array([0, 200, 1000, 6400, 8000])
  mels = np.array([0, 3, 15, 42, 15 + 27 * np.log(8) / np.log(6.4)])
  np.testing.assert_allclose(log_mel._hz_to_mel(hz), mels, rtol=1e-12)
  np.testing.assert_allclose(log_mel._mel_to_hz(mels), hz, rtol=1e-12)


@pytest.mark.parametrize('kind,seconds,num_mels,chunk_seconds', [
    ('sine', 7.0, 80, 30),  # Whisper's window: 3,000 frames
    ('noise', 0.7, 80, 2),  # shorter than the window: padded with silence
    ('silence_then_tone', 3.3, 128, 2),  # longer: trimmed
    ('sine', 1.0, 128, 1),  # exactly the window
    ('silence', 1.5, 80, 1),
])
def test_log_mel_features_equal_whispers_feature_extractor(kind, seconds, num_mels,
                                                           chunk_seconds):
  x = waveform(kind, seconds).astype(np.float32)
  extractor = WhisperFeatureExtractor(feature_size=num_mels, sampling_rate=RATE, hop_length=160,
                                      chunk_length=chunk_seconds, n_fft=400)
  expected = extractor(x, sampling_rate=RATE, return_tensors='np')['input_features'][0]
  features = audio.log_mel_spectrogram(x, num_mels=num_mels, num_samples=chunk_seconds * RATE)
  assert features.dtype == np.float32
  assert features.shape == (chunk_seconds * 100, num_mels)  # 10 ms frames, time-major
  np.testing.assert_allclose(features, expected.T, atol=1e-4)
  # The step's front end (data.log_mel_on='device'): the waveform padded or trimmed to the window
  # by the pipeline, then layers.log_mel jitted in float32, gives the same features.
  window = audio.pad_or_trim(x, chunk_seconds * RATE)
  on_device = jax.jit(functools.partial(log_mel.log_mel, num_mels=num_mels))(window)
  assert on_device.dtype == jnp.float32
  np.testing.assert_allclose(on_device, expected.T, atol=1e-4)


def test_the_front_end_refuses_what_it_cannot_frame():
  with pytest.raises(ValueError, match='mono waveform is 1-D'):
    audio.log_mel_spectrogram(np.zeros((2, 1600)))
  with pytest.raises(ConfigError, match='more than 200 samples'):
    audio.log_mel_spectrogram(np.zeros(100), num_samples=150)


MASKS = dict(num_time_masks=3, max_time_width=20, num_freq_masks=2, max_freq_width=10)


def test_spec_augment_draws_the_given_counts_of_masks_within_their_widths():
  widths = {'time': set(), 'freq': set()}
  for seed in range(300):
    time_masks, freq_masks = audio.spec_augment_masks(100, 80, np.random.default_rng(seed),
                                                      **MASKS)
    assert len(time_masks) == 3 and len(freq_masks) == 2
    for axis, masks, length, max_width in (('time', time_masks, 100, 20),
                                           ('freq', freq_masks, 80, 10)):
      for start, width in masks:
        assert 0 <= width <= max_width and 0 <= start and start + width <= length
        widths[axis].add(width)
  assert widths == {'time': set(range(21)), 'freq': set(range(11))}  # uniform over [0, max]
  # A width above the axis's length is capped at it.
  (wide,), _ = audio.spec_augment_masks(5, 80, np.random.default_rng(0), num_time_masks=1,
                                        max_time_width=50, num_freq_masks=0, max_freq_width=0)
  assert wide[0] + wide[1] <= 5


def test_spec_augment_sets_the_masked_bands_and_is_a_function_of_the_generator():
  features = np.random.default_rng(0).standard_normal((100, 80)).astype(np.float32)
  masked = audio.spec_augment(features, np.random.default_rng(7), mask_value=-5.0, **MASKS)
  time_masks, freq_masks = audio.spec_augment_masks(100, 80, np.random.default_rng(7), **MASKS)
  hidden = np.zeros((100, 80), bool)
  for start, width in time_masks:
    hidden[start:start + width] = True
  for start, width in freq_masks:
    hidden[:, start:start + width] = True
  assert hidden.any()
  np.testing.assert_array_equal(masked[hidden], -5.0)
  np.testing.assert_array_equal(masked[~hidden], features[~hidden])
  again = audio.spec_augment(features, np.random.default_rng(7), mask_value=-5.0, **MASKS)
  np.testing.assert_array_equal(again, masked)
  other = audio.spec_augment(features, np.random.default_rng(8), mask_value=-5.0, **MASKS)
  assert not np.array_equal(other, masked)
  by_mean = audio.spec_augment(features, np.random.default_rng(7), **MASKS)
  np.testing.assert_allclose(by_mean[hidden], features.mean())
  with pytest.raises(ConfigError, match='num_time_masks must be an int >= 0'):
    audio.spec_augment(features, np.random.default_rng(0), num_time_masks=-1)


def test_a_stereo_8khz_wav_is_read_as_16khz_mono(tmp_path):
  left, right = tone(1.0, 300, 0.5, rate=8000), tone(1.0, 1250, 0.1, rate=8000, phase=0.3)
  soundfile.write(tmp_path / 'clip.wav', np.stack([left, right], axis=1), 8000, subtype='FLOAT')
  loaded = audio.load_audio(tmp_path / 'clip.wav')
  assert loaded.dtype == np.float32 and loaded.shape == (16000,)
  # Away from the ends (where a resampler sees the signal stop): the mean of the two tones
  # sampled at 16 kHz, and scipy's polyphase resampler's result (within its own 4e-4).
  middle = slice(400, -400)
  expected = (tone(1.0, 300, 0.5) + tone(1.0, 1250, 0.1, phase=0.3)) / 2
  np.testing.assert_allclose(loaded[middle], expected[middle], atol=1e-5)
  np.testing.assert_allclose(loaded[middle], signal.resample_poly((left + right) / 2, 2, 1)[middle],
                             atol=1e-3)


def test_a_44khz_flac_is_resampled_and_a_16khz_file_read_as_is(tmp_path):
  x = tone(1.0, 523, 0.4, rate=44100)
  soundfile.write(tmp_path / 'clip.flac', x, 44100)  # 16-bit PCM
  loaded = audio.load_audio(str(tmp_path / 'clip.flac'))
  assert loaded.shape == (16000,)
  middle = slice(400, -400)
  np.testing.assert_allclose(loaded[middle], tone(1.0, 523, 0.4)[middle], atol=1e-4)
  np.testing.assert_allclose(loaded[middle], signal.resample_poly(x, 160, 441)[middle], atol=1e-3)
  native = tone(0.5, 200, 0.25)
  soundfile.write(tmp_path / 'native.wav', native, RATE, subtype='FLOAT')
  np.testing.assert_array_equal(audio.load_audio(tmp_path / 'native.wav'),
                                native.astype(np.float32))


def test_unreadable_files_are_named_in_the_error(tmp_path):
  broken = tmp_path / 'broken.wav'
  broken.write_bytes(b'RIFF but not audio')
  with pytest.raises(UserError, match=f'cannot read the audio file {broken}'):
    audio.load_audio(broken)
  with pytest.raises(UserError, match=f'no audio file at {tmp_path / "missing.flac"}'):
    audio.load_audio(tmp_path / 'missing.flac')
  with pytest.raises(ConfigError, match='sample rate must be a positive int'):
    audio.load_audio(broken, sample_rate=0)
