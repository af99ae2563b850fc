"""Audio for speech models: reading files, Whisper's log-Mel front end and SpecAugment on the
host, in NumPy (in the input pipeline's workers, per example, where data.log_mel_on='host').

    waveform = audio.load_audio('clip.flac')                  # float32 mono at 16 kHz
    features = audio.log_mel_spectrogram(waveform)            # (3000, 80): 30 s, 10 ms frames
    features = audio.spec_augment(features, np.random.default_rng(seed), **masks)

The front end is Whisper's (Radford et al. 2022; openai/whisper audio.py), layers.log_mel's
(the one implementation, which also runs inside a jitted step), of the waveform padded with
zeros or trimmed to a fixed number of samples (`pad_or_trim`): so the features of a padded
waveform made on the device are those of the raw waveform made here.
"""
import pathlib

import numpy as np
import soundfile
import soxr

from transformer_jax.errors import ConfigError, UserError
from transformer_jax.layers.log_mel import (HOP_LENGTH, mask_bands, mel_filters, N_FFT,
                                            SAMPLE_RATE, log_mel)

__all__ = ['as_bands', 'check_audio', 'CHUNK_SAMPLES', 'HOP_LENGTH', 'SAMPLE_RATE',
           'load_audio', 'log_mel_spectrogram', 'mel_filters', 'pad_or_trim', 'spec_augment',
           'spec_augment_masks', 'waveform_of']

CHUNK_SAMPLES = 30 * SAMPLE_RATE  # Whisper's checkpoints read 30 s windows


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
  waveform = pad_or_trim(np.asarray(waveform, np.float64), num_samples)
  features = log_mel(waveform, num_mels=num_mels, sample_rate=sample_rate, n_fft=n_fft,
                     hop_length=hop_length)
  return features.astype(np.float32)


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
  mask_value (default: the features' mean; layers.log_mel.mask_bands). The defaults are Park et
  al.'s LibriSpeech double policy (LD)."""
  time_masks, freq_masks = spec_augment_masks(
      *features.shape, generator, num_time_masks=num_time_masks, max_time_width=max_time_width,
      num_freq_masks=num_freq_masks, max_freq_width=max_freq_width)
  return mask_bands(features, as_bands(time_masks), as_bands(freq_masks), mask_value)


def as_bands(masks: list[tuple[int, int]]) -> np.ndarray:
  """int32 (count, 2) of (start, width) pairs: what mask_bands takes."""
  return np.asarray(masks, np.int32).reshape(len(masks), 2)


def load_audio(path: str | pathlib.Path, sample_rate: int = SAMPLE_RATE, *,
               origin: str | None = None) -> np.ndarray:
  """The file's audio (any format libsndfile reads: WAV, FLAC, OGG, MP3, ...) as float32 mono
  (the channels' mean) at sample_rate, resampled by soxr's high-quality resampler. A file that
  is not there or does not decode is a UserError naming it and `origin` (what names it: a
  metadata file's 'path:line')."""
  _check_rate(sample_rate)
  try:
    samples, file_rate = soundfile.read(path, dtype='float32', always_2d=True)
  except (soundfile.LibsndfileError, RuntimeError, OSError) as error:
    raise _unreadable(path, origin, error) from error
  return waveform_of(samples, file_rate, sample_rate, source=str(path))


def check_audio(path: str | pathlib.Path, origin: str | None = None) -> None:
  """Reads the file's header alone (libsndfile opens it without decoding the samples): a
  UserError as load_audio's where the file is not there or not audio libsndfile reads, or where
  its header states no samples."""
  try:
    with soundfile.SoundFile(path) as opened:
      frames = opened.frames
  except (soundfile.LibsndfileError, RuntimeError, OSError) as error:
    raise _unreadable(path, origin, error) from error
  if not frames:
    raise UserError(f'the audio file {path}{_named(origin)} holds no samples: replace it, or '
                    f'{_remove(origin)}')


def _unreadable(path, origin: str | None, error: Exception) -> UserError:
  """The one line for a file not there or not decoded; libsndfile's reason without its prefix
  (which names the file again)."""
  if not pathlib.Path(path).is_file():
    return UserError(f'no audio file at {path}{_named(origin)}: check the path (or the metadata '
                     'naming it)')
  reason = getattr(error, 'error_string', None) or str(error)
  return UserError(f'cannot read the audio file {path}{_named(origin)}: {reason.rstrip(".")}; '
                   f'convert it to WAV or FLAC, or {_remove(origin)}')


def _named(origin: str | None) -> str:
  return f' (named by {origin})' if origin else ''


def _remove(origin: str | None) -> str:
  return 'remove that line' if origin else 'remove it from the data'


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
