"""Whisper's log-Mel front end and SpecAugment's masking, written once over the array namespace
of their inputs: NumPy arrays (the input pipeline's workers, in float64) or JAX arrays (inside a
jitted step, in float32).

    features = log_mel(waveforms, num_mels=80)            # (..., 480000) -> (..., 3000, 80)
    features = mask_bands(features, time_masks, freq_masks)

The front end is Whisper's (Radford et al. 2022; openai/whisper audio.py), of a waveform already
padded with zeros or trimmed to its window: 25 ms periodic-Hann windows every 10 ms, centred
(reflect padding), the last frame dropped; the power spectrum through Slaney-style Mel filters
(librosa's, computed here); log10, clipped to 8 below the example's maximum, then (x + 4) / 4.
Features are time-major, (frames, mels): the (width, channels) layout of Flax's 1-D
convolutions (Whisper's own arrays are the transpose).
"""
import numpy as np

from transformer_jax.errors import ConfigError

__all__ = ['HOP_LENGTH', 'log_mel', 'mask_bands', 'mel_filters', 'N_FFT', 'SAMPLE_RATE']

SAMPLE_RATE = 16000
N_FFT = 400  # 25 ms at 16 kHz
HOP_LENGTH = 160  # 10 ms at 16 kHz

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


def log_mel(waveforms, *, num_mels: int = 80, sample_rate: int = SAMPLE_RATE,
            n_fft: int = N_FFT, hop_length: int = HOP_LENGTH):
  """Whisper's log-Mel features of mono waveforms (..., samples) at sample_rate, each already
  its window's length: (..., samples // hop_length, num_mels) in the waveforms' float dtype and
  array namespace (NumPy or jax.numpy), in about [-1, 1.5]."""
  xp = waveforms.__array_namespace__()
  samples = waveforms.shape[-1]
  if samples <= n_fft // 2:
    raise ConfigError(f'an audio window of {samples} samples is too short for {n_fft}-sample '
                      f'frames: use more than {n_fft // 2} samples')
  dtype = waveforms.dtype
  edges = [(0, 0)] * (waveforms.ndim - 1) + [(n_fft // 2, n_fft // 2)]
  padded = xp.pad(waveforms, edges, mode='reflect')
  starts = hop_length * np.arange(samples // hop_length)
  frames = padded[..., starts[:, None] + np.arange(n_fft)[None, :]]
  window = np.hanning(n_fft + 1)[:-1]  # periodic: of n_fft + 1 points
  window = xp.asarray(window.reshape((1,) * (frames.ndim - 1) + (n_fft,)), dtype=dtype)
  spectrum = xp.fft.rfft(frames * window, axis=-1)
  power = spectrum.real ** 2 + spectrum.imag ** 2
  filters = xp.asarray(mel_filters(num_mels, n_fft, sample_rate).T, dtype=dtype)
  log_power = xp.log10(xp.maximum(power @ filters, 1e-10))
  log_power = xp.maximum(log_power, log_power.max(axis=(-2, -1), keepdims=True) - 8.0)
  return (log_power + 4.0) / 4.0


def _in_bands(masks, length: int, xp):
  """(..., length) bool: the positions inside any of masks (..., count, 2) of (start, width)."""
  positions = xp.arange(length).reshape((1,) * (masks.ndim - 1) + (length,))
  starts, widths = masks[..., 0, None], masks[..., 1, None]
  return ((positions >= starts) & (positions < starts + widths)).any(axis=-2)


def mask_bands(features, time_masks, freq_masks, value: float | None = None):
  """SpecAugment's masking (Park et al. 2019): features (..., frames, mels) with the frames of
  time_masks and the Mel bins of freq_masks, each (..., count, 2) ints (start, width), set to
  `value` (None: each example's mean, what Park et al.'s zero is after their mean
  normalisation). The masks may overlap; a width of 0 masks nothing. In the features' array
  namespace."""
  xp = features.__array_namespace__()
  frames, mels = features.shape[-2:]
  masked = (_in_bands(xp.asarray(time_masks), frames, xp)[..., :, None]
            | _in_bands(xp.asarray(freq_masks), mels, xp)[..., None, :])
  if value is None:
    value = features.mean(axis=(-2, -1), keepdims=True).astype(features.dtype)
  return xp.where(masked, value, features)
