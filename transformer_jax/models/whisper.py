"""Whisper (Radford et al. 2022; openai/whisper model.py): the encoder-decoder of
models/encoder_decoder.py whose encoder reads log-Mel features instead of tokens.

The encoder: Whisper's log-Mel front end where it reads waveforms (layers.log_mel, with
SpecAugment's masks where given), the audio stem (layers.AudioStem: two 1-D convolutions, the
second of stride 2, at half the frame rate) plus fixed sinusoidal positions in Whisper's
[sin | cos] layout, then the blocks. The decoder is the encoder-decoder's own (learned positions,
cross-attention in every block, the tied unembedding): the module extends EncoderDecoder and
replaces `encode` (and `__call__`, to pass the masks), so it decodes by the same
'encoder_decoder' cache protocol, the cross-attention keys and values of an utterance computed
once, at the prefill. Whisper's blocks are the 'whisper' style (pre-LN, exact GELU, biases
everywhere but the key projections).
"""
import dataclasses
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax.errors import ConfigError
from transformer_jax.layers import AudioStem, axes, sinusoidal, stem_frames
from transformer_jax.layers.log_mel import HOP_LENGTH, log_mel, mask_bands
from transformer_jax.models import common, encoder_decoder, registry
from transformer_jax.models.encoder_decoder import EncoderDecoder, EncoderDecoderConfig
from transformer_jax.ranges import COUNT

__all__ = ['encoder_features', 'FAMILY', 'forward_flops', 'FRAMES_PER_SECOND', 'param_counts',
           'Whisper', 'WhisperConfig']

FRAMES_PER_SECOND = 100  # Whisper's 10 ms hop


@dataclasses.dataclass(frozen=True)
class WhisperConfig(EncoderDecoderConfig):
  """The encoder-decoder's settings, Whisper's blocks by default, and the audio the encoder
  reads: num_frames log-Mel frames of num_mels bins (3000 x 80: Whisper's 30 s window); max_len is
  the decoder's learned positions (448 in Whisper's checkpoints)."""
  family: str = 'whisper'
  num_mels: int = 80
  num_frames: int = 3000
  max_len: int = 448
  key_bias: bool = False
  mlp: str = 'gelu'
  norm_position: str = 'pre'

  RANGES: ClassVar = {**EncoderDecoderConfig.RANGES, 'num_mels': COUNT, 'num_frames': COUNT}

  def check(self) -> None:
    super().check()
    if self.width % 2 or self.width < 4:
      raise ConfigError(f'model.width={self.width}: Whisper\'s [sin | cos] encoder positions '
                        'need an even width of at least 4.')
    if self.positions == 'rope':
      raise ConfigError('model.positions="rope" would rotate the encoder\'s queries too, which '
                        'have sinusoidal positions: use "learned" (Whisper\'s decoder) or '
                        '"sinusoidal".')

  @property
  def source_positions(self) -> int:
    """The encoder's positions: the stem's outputs of num_frames frames (1500 for 30 s)."""
    return stem_frames(self.num_frames)


class Whisper(EncoderDecoder):
  """features (B, F, num_mels) float, or the 16 kHz waveforms (B, F * 160) they are made of,
  targets (B, T) int -> float32 logits (B, T, V) of the next target token; F at most
  model.num_frames (Whisper pads every clip to its window). Given waveforms, the encoder makes
  their log-Mel features itself (layers.log_mel), so that a jitted step computes them on the
  device (data.log_mel_on='device').

  `encode` (features -> encoded) and `decode` (the encoder-decoder's) are separate methods, so
  that decoding runs the encoder once. The encoder's position table 'pos_embed' is a parameter
  (as transformers stores and counts it), fixed at Whisper's sinusoids: no gradient reaches it.
  """
  cfg: WhisperConfig

  def setup(self):
    super().setup()
    cfg = self.cfg
    self.stem = AudioStem(cfg.width, dtype=cfg.compute_dtype, param_dtype=cfg.weight_dtype)
    table = lambda rng, shape, dtype: sinusoidal(
        np.arange(shape[0]), shape[1], layout='sin_cos').astype(dtype)
    self.pos_embed = self.param(
        'pos_embed', nn.with_logical_partitioning(table, ('positions', 'embed')),
        (cfg.source_positions, cfg.width), cfg.weight_dtype)

  def __call__(self, inputs, targets, input_valid=None, *, time_masks=None, freq_masks=None,
               deterministic=True):
    """inputs (encode's: features or waveforms), targets (B, T) int -> float32 logits (B, T, V);
    time_masks and freq_masks as encode's. Utterances are not packed: no positions or masks of
    packed rows, which the encoder-decoder's __call__ takes."""
    encoded = self.encode(inputs, input_valid, time_masks=time_masks, freq_masks=freq_masks,
                          deterministic=deterministic)
    return self.decode(targets, encoded, input_valid, deterministic=deterministic)

  def encode(self, inputs, input_valid=None, *, time_masks=None, freq_masks=None,
             positions=None, attention_mask=None, deterministic=True):
    """inputs: log-Mel features (B, F, num_mels), or 16 kHz waveforms (B, F * 160) padded or
    trimmed to their window, whose features the encoder computes first (layers.log_mel, in
    float32) -> encoded (B, ceil(F / 2), D).

    time_masks (B, count, 2) and freq_masks (B, count, 2): SpecAugment's bands (start, width) of
    frames and of Mel bins set to each example's mean (layers.log_mel.mask_bands; None: none).
    input_valid (B, ceil(F / 2)) bool marks real encoder positions (None: all, as Whisper, which
    pads with silence); positions and attention_mask as EncoderDecoder.encode's.
    """
    cfg = self.cfg
    features = encoder_features(cfg, inputs, time_masks, freq_masks)
    x = self.stem(features)
    fixed = jax.lax.stop_gradient(self.pos_embed[None, :x.shape[1]]).astype(jnp.float32)
    x = axes.constrain((x.astype(jnp.float32) + fixed).astype(cfg.compute_dtype), axes.EMBED)
    x = self.dropout(x, deterministic=deterministic)
    mask = common.both_masks(common.key_mask(input_valid), attention_mask)
    x = self.encoder(x, mask, positions, deterministic=deterministic)
    return self.encoder_output(x, deterministic)

  def encoder_input(self, batch_size: int, source_len: int) -> jax.ShapeDtypeStruct:
    """The features whose encoding has `source_len` positions (the cache protocol's optional
    method, for decode.init_cache)."""
    return jax.ShapeDtypeStruct((batch_size, 2 * source_len, self.cfg.num_mels), jnp.float32)


def encoder_features(cfg: WhisperConfig, inputs, time_masks=None, freq_masks=None) -> jax.Array:
  """The encoder's log-Mel features (B, F, num_mels) of features or waveforms (Whisper.encode's
  inputs), masked where masks are given; a ValueError naming the fix for any other shape."""
  if inputs.ndim == 2:
    inputs = log_mel(jnp.asarray(inputs, jnp.float32), num_mels=cfg.num_mels)
  if inputs.ndim != 3 or inputs.shape[-1] != cfg.num_mels:
    raise ValueError(f'Whisper reads log-Mel features (batch, frames, {cfg.num_mels}) or 16 kHz '
                     f'waveforms (batch, samples), not {inputs.shape}: compute the features with '
                     'data.audio.log_mel_spectrogram.')
  if inputs.shape[1] > cfg.num_frames:
    raise ValueError(f'{inputs.shape[1]} frames exceed model.num_frames={cfg.num_frames}: '
                     'trim the audio to the window (data.audio.pad_or_trim).')
  if time_masks is None and freq_masks is None:
    return inputs
  no_bands = jnp.zeros((inputs.shape[0], 0, 2), jnp.int32)
  return mask_bands(jnp.asarray(inputs), no_bands if time_masks is None else time_masks,
                    no_bands if freq_masks is None else freq_masks)


def _stem_params(cfg: WhisperConfig) -> int:
  return 3 * cfg.num_mels * cfg.width + cfg.width + 3 * cfg.width * cfg.width + cfg.width


def param_counts(cfg: WhisperConfig) -> dict[str, int]:
  """The encoder-decoder's, plus the stem ('other') and the encoder's position table."""
  counts = encoder_decoder.param_counts(cfg)
  counts['embedding'] += cfg.source_positions * cfg.width
  counts['other'] += _stem_params(cfg)
  return common.with_total({part: counts[part] for part in registry.PARTS})


def forward_flops(cfg: WhisperConfig, seq_len=None, target_len=None) -> dict[str, int]:
  """seq_len frames of audio (default model.num_frames) and a transcript of target_len tokens
  (default model.max_len): the stem, then the encoder-decoder's; per second of audio."""
  frames = seq_len or cfg.num_frames
  source = stem_frames(frames)
  flops = encoder_decoder.forward_flops(cfg, source, target_len or cfg.max_len)
  stem = 2 * 3 * cfg.width * (frames * cfg.num_mels + source * cfg.width)
  return {**flops, 'dense': flops['dense'] + stem, 'tokens': frames / FRAMES_PER_SECOND}


def _audio(batch: dict):
  """A batch's encoder inputs: its waveforms (data.log_mel_on='device') or its features."""
  return batch['waveforms'] if 'waveforms' in batch else batch['features']


def _logits(apply, batch: dict):
  return apply(_audio(batch), batch['decoder_inputs'], time_masks=batch.get('time_masks'),
               freq_masks=batch.get('freq_masks'))


def _frames(batch: dict) -> int:
  audio = _audio(batch)
  return audio.shape[1] // HOP_LENGTH if audio.ndim == 2 else audio.shape[1]


def _stacks(cfg: WhisperConfig, seq_len: int) -> list[registry.Stack]:
  """The encoder over the window's positions; the decoder over seq_len transcript tokens."""
  source = cfg.source_positions
  return [registry.Stack('encoder', cfg.num_layers, source, (source,)),
          registry.Stack('decoder', cfg.decoder_layers, seq_len, (seq_len, source))]


def _batch_shapes(cfg: WhisperConfig, batch_size: int, seq_len: int) -> dict:
  """An utterance's batch (data.speech) as data.log_mel_on='device' (the default) ships it: its
  waveform (the window's 16 kHz samples), the transcript's decoder inputs, targets and weights.
  With data.log_mel_on='host' the batch holds features, num_mels / 160 the waveform's bytes
  (half for Whisper's 80 bins): the memory plan counts the larger."""
  shapes = registry.text_batch_shapes(cfg, batch_size, seq_len)
  return {'waveforms': jax.ShapeDtypeStruct((batch_size, cfg.num_frames * HOP_LENGTH),
                                            jnp.float32),
          'decoder_inputs': shapes['inputs'], 'targets': shapes['targets'],
          'weights': shapes['weights']}


def _example_inputs(cfg: WhisperConfig, batch: int = 1, seq_len: int | None = None) -> tuple:
  features = jnp.zeros((batch, cfg.num_frames, cfg.num_mels), jnp.float32)
  return features, common.text_example_inputs(cfg, batch, seq_len)[0]


def _check_data(info: dict, cfg: WhisperConfig) -> None:
  for key in ('num_mels', 'num_frames'):
    if key in info and info[key] != getattr(cfg, key):
      raise ConfigError(f'The audio data has {key}={info[key]} but model.{key}='
                        f'{getattr(cfg, key)}: set them equal (data.n_mels and '
                        'data.window_seconds follow the model unless set).')


def _data_sizes(cfg: WhisperConfig) -> dict:
  return {**common.text_data_sizes(cfg), 'num_mels': cfg.num_mels, 'num_frames': cfg.num_frames,
          'max_len': cfg.max_len}


FAMILY = registry.register(registry.Family(**common.text_family(
    name='whisper', module=Whisper, example_inputs=_example_inputs, logits=_logits,
    task='audio', config=WhisperConfig, decoding='encoder_decoder', unit='second of audio',
    check_data=_check_data, chunked_logits=True,
    lengths=lambda batch: (_frames(batch), batch['decoder_inputs'].shape[1]),
    param_counts=param_counts, forward_flops=forward_flops, stacks=_stacks,
    batch_shapes=_batch_shapes, data_sizes=_data_sizes,
    describe=lambda cfg: (f'{cfg.num_frames / FRAMES_PER_SECOND:g} s of audio as '
                          f'{cfg.num_frames} frames of {cfg.num_mels} Mel bins'),
    depth_keys=('num_layers', 'num_decoder_layers'))))
