"""Audio for speech models: reading files, Whisper's log-Mel front end and SpecAugment, in NumPy
(they run in the input pipeline's workers, per example).

    waveform = audio.load_audio('clip.flac')                  # float32 mono at 16 kHz
    features = audio.log_mel_spectrogram(waveform)            # (3000, 80): 30 s, 10 ms frames
    features = audio.spec_augment(features, np.random.default_rng(seed), **masks)

The front end is Whisper's (Radford et al. 2022; openai/whisper audio.py): the waveform padded
with zeros or trimmed to a fixed number of samples; 25 ms periodic-Hann windows every 10 ms,
centred (reflect padding), the last frame dropped; the power spectrum through Slaney-style Mel
filters (librosa's, computed here); log10, clipped to 8 below the maximum, then (x + 4) / 4.
Features are time-major, (frames, mels): the (width, channels) layout of Flax's 1-D
convolutions (Whisper's own arrays are the transpose).
"""
import pathlib

import numpy as np
import soundfile
import soxr

from transformer_jax.errors import ConfigError, UserError

__all__ = ['SAMPLE_RATE', 'load_audio', 'log_mel_spectrogram', 'mel_filters', 'pad_or_trim',
           'spec_augment', 'spec_augment_masks', 'waveform_of']

SAMPLE_RATE = 16000
N_FFT = 400  # 25 ms at 16 kHz
HOP_LENGTH = 160  # 10 ms at 16 kHz
CHUNK_SAMPLES = 30 * SAMPLE_RATE  # Whisper's checkpoints read 30 s windows

# The Slaney mel scale (Auditory Toolbox; librosa's default): linear below 1 kHz at 3 mels per
# 200 Hz, logarithmic above, 27 mels per factor 6.4.
_HZ_PER_MEL = 200.0 / 3
_LOG_START_HZ = 1000.0
_LOG_START_MEL = _LOG_START_HZ / _HZ_PER_MEL
_LOG_STEP = np.log(6.4) / 27.0


def _hz_to_mel(hz: np.ndarray) -> np.ndarray:
  hz = np.asarray(hz, np.float64)
  log_part = _LOG_START_MEL + np.log(np.maximum(hz, _LOG_START_HZ) / _LOG_START_HZ) / _LOG_STEP
  return np.where(hz >= _LOG_START_HZ, log_part, hz / _HZ_PER_MEL)


def _mel_to_hz(mel: np.ndarray) -> np.ndarray:
  mel = np.asarray(mel, np.float64)
  log_part = _LOG_START_HZ * np.exp(_LOG_STEP * (mel - _LOG_START_MEL))
  return np.where(mel >= _LOG_START_MEL, log_part, mel * _HZ_PER_MEL)


def mel_filters(num_mels: int = 80, n_fft: int = N_FFT,
                sample_rate: int = SAMPLE_RATE) -> np.ndarray:
  """Triangular filters (num_mels, n_fft // 2 + 1) from 0 Hz to the Nyquist frequency, their
  edges evenly spaced on the Slaney mel scale, each scaled to unit area per Hz (Slaney norm:
  2 / its width in Hz), as librosa.filters.mel(norm='slaney') computes them."""
  fft_hz = np.linspace(0, sample_rate / 2, n_fft // 2 + 1)
  edges_hz = _mel_to_hz(np.linspace(0, _hz_to_mel(sample_rate / 2), num_mels + 2))
  widths = np.diff(edges_hz)
  ramps = edges_hz[:, None] - fft_hz[None, :]
  rising = -ramps[:-2] / widths[:-1, None]
  falling = ramps[2:] / widths[1:, None]
  filters = np.maximum(0, np.minimum(rising, falling))
  return filters * (2.0 / (edges_hz[2:] - edges_hz[:-2]))[:, None]


def pad_or_trim(waveform: np.ndarray, num_samples: int) -> np.ndarray:
  """The waveform's first num_samples samples, padded with zeros (silence) at the end."""
  waveform = waveform[:num_samples]
  return np.pad(waveform, (0, num_samples - len(waveform)))


def log_mel_spectrogram(waveform: np.ndarray, *, num_mels: int = 80,
                        num_samples: int = CHUNK_SAMPLES, sample_rate: int = SAMPLE_RATE,
                        n_fft: int = N_FFT, hop_length: int = HOP_LENGTH) -> np.ndarray:
  """Whisper's log-Mel features of a mono waveform (float, at sample_rate) padded or trimmed
  to num_samples: float32 (num_samples // hop_length, num_mels), in about [-1, 1.5]."""
  if waveform.ndim != 1:
    raise ValueError(f'a mono waveform is 1-D, got shape {waveform.shape}: mix the channels down '
                     '(load_audio does)')
  if num_samples <= n_fft // 2:
    raise ConfigError(f'an audio window of {num_samples} samples is too short for {n_fft}-sample '
                      f'frames: use more than {n_fft // 2} samples')
  waveform = pad_or_trim(np.asarray(waveform, np.float64), num_samples)
  padded = np.pad(waveform, n_fft // 2, mode='reflect')
  frames = np.lib.stride_tricks.sliding_window_view(padded, n_fft)[::hop_length][:-1]
  window = np.hanning(n_fft + 1)[:-1]  # periodic: the window of an n_fft + 1 cycle
  power = np.abs(np.fft.rfft(frames * window, axis=-1)) ** 2
  log_mel = np.log10(np.maximum(power @ mel_filters(num_mels, n_fft, sample_rate).T, 1e-10))
  log_mel = np.maximum(log_mel, log_mel.max() - 8.0)
  return ((log_mel + 4.0) / 4.0).astype(np.float32)


def spec_augment_masks(num_frames: int, num_mels: int, generator: np.random.Generator, *,
                       num_time_masks: int, max_time_width: int, num_freq_masks: int,
                       max_freq_width: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
  """SpecAugment's masks (Park et al. 2019) as (start, width) pairs, time masks then frequency
  masks: each width uniform in [0, max width] (capped at the axis's length), its start uniform
  in [0, length - width]. Masks may overlap."""

  def draw(count, max_width, length):
    masks = []
    for _ in range(count):
      width = int(generator.integers(0, min(max_width, length) + 1))
      masks.append((int(generator.integers(0, length - width + 1)), width))
    return masks

  for name, value in (('num_time_masks', num_time_masks), ('max_time_width', max_time_width),
                      ('num_freq_masks', num_freq_masks), ('max_freq_width', max_freq_width)):
    if not isinstance(value, int) or value < 0:
      raise ConfigError(f'SpecAugment {name} must be an int >= 0, got {value!r}')
  return (draw(num_time_masks, max_time_width, num_frames),
          draw(num_freq_masks, max_freq_width, num_mels))


def spec_augment(features: np.ndarray, generator: np.random.Generator, *,
                 num_time_masks: int = 2, max_time_width: int = 100, num_freq_masks: int = 2,
                 max_freq_width: int = 27, mask_value: float | None = None) -> np.ndarray:
  """A copy of features (frames, mels) with spec_augment_masks' time and frequency bands set to
  mask_value (default: the features' mean, which is what Park et al.'s zero is after their
  mean normalisation). The defaults are the paper's LibriSpeech double policy (LD)."""
  time_masks, freq_masks = spec_augment_masks(
      *features.shape, generator, num_time_masks=num_time_masks, max_time_width=max_time_width,
      num_freq_masks=num_freq_masks, max_freq_width=max_freq_width)
  value = features.mean() if mask_value is None else mask_value
  masked = features.copy()
  for start, width in time_masks:
    masked[start:start + width, :] = value
  for start, width in freq_masks:
    masked[:, start:start + width] = value
  return masked


def load_audio(path: str | pathlib.Path, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
  """The file's audio (any format libsndfile reads: WAV, FLAC, OGG, ...) as float32 mono (the
  channels' mean) at sample_rate, resampled by soxr's high-quality resampler."""
  _check_rate(sample_rate)
  if not pathlib.Path(path).is_file():
    raise UserError(f'no audio file at {path}: check the path (or the metadata naming it)')
  try:
    samples, file_rate = soundfile.read(path, dtype='float32', always_2d=True)
  except (soundfile.LibsndfileError, RuntimeError, OSError) as error:
    raise UserError(f'cannot read the audio file {path} ({str(error).rstrip(".")}): convert it '
                    'to WAV or FLAC, or remove it from the data') from error
  return waveform_of(samples, file_rate, sample_rate, source=str(path))


def waveform_of(samples: np.ndarray, rate: int, sample_rate: int = SAMPLE_RATE, *,
                source: str = 'the audio') -> np.ndarray:
  """float32 mono at sample_rate of `samples` (length,) or (length, channels) at `rate` Hz: the
  channels' mean, resampled by soxr's high-quality resampler. Integer samples are scaled to
  [-1, 1) by their type's full scale (int16 / 32768; uint8 centred on 128), but int64, TFDS's
  default for audio, whose files are 16-bit: by 32768. `source` names them in errors."""
  _check_rate(sample_rate)
  samples = np.asarray(samples)
  if samples.dtype == np.uint8:
    samples = (samples.astype(np.float32) - 128) / 128
  elif samples.dtype == np.int64:
    samples = samples.astype(np.float32) / 2**15
  elif np.issubdtype(samples.dtype, np.integer):
    samples = samples.astype(np.float32) / (np.iinfo(samples.dtype).max + 1)
  mono = (samples.mean(axis=1) if samples.ndim == 2 else samples).astype(np.float32)
  if rate == sample_rate:
    return mono
  try:
    return soxr.resample(mono, rate, sample_rate, quality='HQ').astype(np.float32)
  except ValueError as error:
    raise UserError(f'soxr cannot resample {source} from {rate} Hz to {sample_rate} Hz ({error}): '
                    'give audio of a positive sample rate (re-encode the file, or set '
                    'data.source_sample_rate for a dataset that states none)') from error


def _check_rate(sample_rate) -> None:
  if not isinstance(sample_rate, int) or isinstance(sample_rate, bool) or sample_rate <= 0:
    raise ConfigError(f'the audio sample rate must be a positive int (Hz), got {sample_rate!r}')
