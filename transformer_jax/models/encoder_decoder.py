"""Encoder-decoder (original transformer / T5 layout): one shared embedding, cross-attention in
every decoder block. T5 (Raffel et al. 2020) is a style of it (models/styles.py): with
positions='relative', each stack computes its relative position bias once, before its first
block, and every self-attention of that stack adds it (bidirectional buckets in the encoder,
causal ones in the decoder; cross-attention takes none), and in training drops at
model.dropout_rate everywhere T5 does: the embeddings, the attention probabilities, the MLP's
hidden activation, each sublayer's output and each stack's final-norm output
(model.final_dropout)."""
import dataclasses
import functools
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax.errors import ConfigError
from transformer_jax.kernels import masks
from transformer_jax.layers.relative_position import (RelativePositionBias, cached_key_positions,
                                                      check_relative_buckets)
from transformer_jax.models import common, registry
from transformer_jax.ranges import OPTIONAL_FRACTION, Range

__all__ = ['EncoderDecoder', 'EncoderDecoderConfig', 'FAMILY', 'forward_flops', 'param_counts',
           'relative_bias_params']


_RELATIVE_SETTINGS = ('relative_buckets', 'relative_max_distance')


@dataclasses.dataclass(frozen=True)
class EncoderDecoderConfig(common.TextConfig):
  """An encoder-decoder's settings: the text family's; num_layers is the encoder's depth."""
  family: str = 'encoder_decoder'
  num_decoder_layers: int | None = None  # None: num_layers
  # positions='relative' (T5): buckets of key-minus-query distance, half of them one distance
  # each, half logarithmically wider up to relative_max_distance (layers.relative_position).
  relative_buckets: int = 32
  relative_max_distance: int = 128
  # The decoder's output times width^-0.5 before the tied unembedding (T5 1.0).
  scale_tied_head: bool = False
  # Dropout of each stack's output after its final norm, in training (T5's); None: dropout_rate.
  final_dropout: float | None = 0.0

  RANGES: ClassVar = {**common.TextConfig.RANGES, 'final_dropout': OPTIONAL_FRACTION,
                      'num_decoder_layers': Range(1, integer=True, optional=True),
                      'relative_buckets': Range(1, integer=True),
                      'relative_max_distance': Range(1, integer=True)}
  RELATIVE_POSITIONS: ClassVar = True

  def check(self) -> None:
    super().check()
    if self.positions == 'relative':
      for bidirectional in (True, False):  # the encoder's buckets, the decoder's
        check_relative_buckets(self.relative_buckets, self.relative_max_distance, bidirectional,
                               'model.', _RELATIVE_SETTINGS)
    else:
      changed = [name for name in _RELATIVE_SETTINGS
                 if getattr(self, name) != EncoderDecoderConfig.__dataclass_fields__[name].default]
      if changed:
        raise ConfigError(f'model.{changed[0]} sets the relative position bias, which model.'
                          f"positions={self.positions!r} does not have: set model.positions="
                          "'relative' or leave it unset.")
    if self.scale_tied_head and not self.tie_embeddings:
      raise ConfigError('model.scale_tied_head scales the input of the tied unembedding (T5 1.0) '
                        'and the head is untied: set model.tie_embeddings=True or '
                        'model.scale_tied_head=False.')

  @property
  def decoder_layers(self) -> int:
    return self.num_decoder_layers or self.num_layers

  @property
  def final_dropout_rate(self) -> float:
    return self.dropout_rate if self.final_dropout is None else self.final_dropout

  @property
  def dropout_rates(self) -> dict[str, float]:
    return {**super().dropout_rates, 'final_dropout': self.final_dropout_rate}


class EncoderDecoder(nn.Module):
  """inputs (B, S), targets (B, T) -> float32 logits (B, T, V) of the next target token.

  `input_valid` (B, S) marks real input tokens. Packed rows (several documents each) pass their
  positions and masks (see `__call__`). `encode` and `decode` are separate methods so
  that decoding runs the encoder once; with `cache_index`, `decode` caches its self-attention keys
  and values and, at the prefill, the cross-attention ones (pass `encoded=None` afterwards).
  """
  cfg: EncoderDecoderConfig

  def setup(self):
    cfg = self.cfg
    self.embed = common.text_embed(cfg)
    self.dropout = nn.Dropout(cfg.dropout_rate)
    self.final_dropout = nn.Dropout(cfg.final_dropout_rate)
    self.encoder = common.stack(cfg, cfg.num_layers)
    self.encoder_norm = common.norm(cfg)() if cfg.final_norm else None
    self.decoder = common.stack(cfg, cfg.decoder_layers, cross_attention=True)
    self.decoder_norm = common.norm(cfg)() if cfg.final_norm else None
    self.head = common.lm_head(cfg, input_scale=cfg.width ** -0.5 if cfg.scale_tied_head else 1.0)
    if cfg.positions == 'relative':
      bias = functools.partial(RelativePositionBias, cfg.num_heads, cfg.relative_buckets,
                               cfg.relative_max_distance, dtype=cfg.compute_dtype,
                               param_dtype=cfg.weight_dtype)
      self.encoder_position_bias = bias(bidirectional=True)
      self.decoder_position_bias = bias(bidirectional=False)

  def encode(self, inputs, input_valid=None, *, positions=None, attention_mask=None,
             deterministic=True):
    """inputs (B, S) int, input_valid (B, S) bool -> encoded (B, S, D).

    positions (B, S) int (None: 0..S-1); attention_mask boolean (B, 1, S, S), AND-ed with the
    padding mask of `input_valid`.
    """
    if positions is None:
      positions = common.default_positions(inputs)
    mask = common.both_masks(common.key_mask(input_valid), attention_mask)
    x = self.dropout(self.embed(inputs, positions), deterministic=deterministic)
    bias = None
    if self.cfg.positions == 'relative':  # by slot: within a packed document, the same distances
      slots = np.arange(inputs.shape[1])
      bias = self.encoder_position_bias(slots, slots)
    x = self.encoder(x, mask, positions, bias=bias, deterministic=deterministic)
    return self.encoder_output(x, deterministic)

  def encoder_output(self, x, deterministic=True):
    """The encoder stack's output x (B, S, D) through its final norm and final dropout."""
    if self.encoder_norm is not None:
      x = self.encoder_norm(x)
    return self.final_dropout(x, deterministic=deterministic)

  def decode(self, targets, encoded, input_valid=None, positions=None, *, attention_mask=None,
             cross_mask=None, cache_index=None, deterministic=True):
    """targets (B, T) int, encoded (B, S, D) (None once a cached prefill holds it) -> float32
    logits (B, T, V).

    input_valid (B, S) bool; positions (B, T) int; attention_mask and cache_index as the
    decoder's (see DecoderLM.__call__); cross_mask boolean (B, 1, T, S) over the inputs, AND-ed
    with the padding mask of `input_valid`.
    """
    if positions is None:
      positions = common.default_positions(targets, 0 if cache_index is None else cache_index)
    mask = common.decoder_mask(positions, attention_mask, cache_index)
    cross_mask = common.both_masks(common.key_mask(input_valid), cross_mask)
    x = self.dropout(self.embed(targets, positions), deterministic=deterministic)
    bias = None
    if self.cfg.positions == 'relative':
      bias = self._decoder_bias(targets.shape[1], mask, cache_index)
    x = self.decoder(x, mask, positions, encoded, cross_mask, cache_index, bias,
                     deterministic=deterministic)
    if self.decoder_norm is not None:
      x = self.decoder_norm(x)
    return self.head(self.final_dropout(x, deterministic=deterministic), self.embed)

  def _decoder_bias(self, num_queries: int, mask, cache_index):
    """The decoder's relative bias (1, heads, T, S) over its own T tokens, or with a cache over
    its S slots (the mask's last axis), by the tokens' distances in the sequence."""
    if cache_index is None:
      slots = np.arange(num_queries)
      return self.decoder_position_bias(slots, slots)
    query_slots = cache_index + jnp.arange(num_queries)
    return self.decoder_position_bias(
        query_slots, cached_key_positions(cache_index, num_queries, mask.shape[-1]))

  def __call__(self, inputs, targets, input_valid=None, *, input_positions=None,
               input_mask=None, target_positions=None, target_mask=None, cross_mask=None,
               deterministic=True):
    """inputs (B, S) int, targets (B, T) int, input_valid (B, S) bool -> float32 logits
    (B, T, V).

    The positions and masks of packed rows (None: 0.. and no mask): input_positions (B, S) and
    input_mask (B, 1, S, S) are encode's positions and attention_mask, target_positions (B, T),
    target_mask (B, 1, T, T) and cross_mask (B, 1, T, S) decode's.
    """
    encoded = self.encode(inputs, input_valid, positions=input_positions,
                          attention_mask=input_mask, deterministic=deterministic)
    return self.decode(targets, encoded, input_valid, target_positions,
                       attention_mask=target_mask, cross_mask=cross_mask,
                       deterministic=deterministic)


def relative_bias_params(cfg: EncoderDecoderConfig) -> int:
  """The tables of the encoder's and the decoder's relative position bias: one scalar per
  bucket and head each."""
  return 2 * cfg.relative_buckets * cfg.num_heads * (cfg.positions == 'relative')


def param_counts(cfg: EncoderDecoderConfig) -> dict[str, int]:
  encoder = common.block_params(cfg, cfg.num_layers)
  decoder = common.block_params(cfg, cfg.decoder_layers, cross=True)
  counts = {part: encoder[part] + decoder[part] for part in encoder}
  counts['norms'] += 2 * common.norm_params(cfg) * cfg.final_norm
  counts['attention'] += relative_bias_params(cfg)
  return common.with_total({**counts, 'embedding': common.text_embedding_params(cfg),
                            'head': common.untied_head_params(cfg)})


def forward_flops(cfg: EncoderDecoderConfig, seq_len=None, target_len=None) -> dict[str, int]:
  """A source of seq_len tokens (default model.max_len), a target of target_len (default
  seq_len): the encoder on the source, the decoder on the target with cross-attention."""
  s = seq_len or cfg.max_len
  t = target_len or s
  d, block = cfg.width, common.block_weights(cfg)
  q_and_out = 2 * d * common.attention_width(cfg)
  kv = common.attention_weights(cfg) * cfg.use_attention - q_and_out
  dense = 2 * (s * cfg.num_layers * block + s * cfg.decoder_layers * kv
               + t * (cfg.decoder_layers * (block + q_and_out) + d * cfg.vocab_size))
  self_logits = cfg.num_layers * s * s + cfg.decoder_layers * t * t
  attention = 4 * common.attention_width(cfg) * (self_logits + cfg.decoder_layers * t * s)
  # The relative bias: one addition per head and self-attention logit.
  bias = cfg.num_heads * cfg.use_attention * self_logits * (cfg.positions == 'relative')
  return {'dense': dense, 'attention': attention + bias, 'tokens': t}


def _logits(apply, batch: dict):
  """Packed (as Flax's wmt example packs), segment k of a row's targets is the translation of
  segment k of its inputs: each attends to its own."""
  packed = {}
  if 'input_segment_ids' in batch:
    inputs = common.packed_arguments(batch, 'input_')
    targets = common.packed_arguments(batch, 'target_')
    packed = dict(input_positions=inputs['positions'], input_mask=inputs['attention_mask'],
                  target_positions=targets['positions'], target_mask=targets['attention_mask'],
                  cross_mask=masks.Mask(segments=(batch['target_segment_ids'],
                                                  batch['input_segment_ids'])))
  return apply(batch['inputs'], batch['decoder_inputs'], batch.get('input_valid'), **packed)


def _stacks(cfg: EncoderDecoderConfig, seq_len: int) -> list[registry.Stack]:
  """The decoder's blocks attend to their own tokens, then to the seq_len sources."""
  return [registry.Stack('encoder', cfg.num_layers, seq_len, (seq_len,)),
          registry.Stack('decoder', cfg.decoder_layers, seq_len, (seq_len, seq_len))]


def _batch_shapes(cfg: EncoderDecoderConfig, batch_size: int, seq_len: int) -> dict:
  """A pair's batch (data.seq2seq.Seq2SeqTask): the source and its valid positions, the decoder's
  inputs, the targets and their weights."""
  shapes = registry.text_batch_shapes(cfg, batch_size, seq_len)
  return {**shapes, 'decoder_inputs': shapes['inputs'],
          'input_valid': jax.ShapeDtypeStruct((batch_size, seq_len), jnp.bool_)}


def _packed_shapes(shapes: dict) -> dict:
  """A packed pair's batch (data.translation): each side has segment ids and positions of its
  own, which stand for the sources' valid positions."""
  ids = lambda key: jax.ShapeDtypeStruct(shapes[key].shape[:2], jnp.int32)
  unpacked = {key: value for key, value in shapes.items() if key != 'input_valid'}
  return {**unpacked, 'input_segment_ids': ids('inputs'), 'input_positions': ids('inputs'),
          'target_segment_ids': ids('targets'), 'target_positions': ids('targets')}


FAMILY = registry.register(registry.Family(**common.text_family(
    name='encoder_decoder', module=EncoderDecoder,
    example_inputs=lambda cfg, batch=1, seq_len=None: common.text_example_inputs(
        cfg, batch, seq_len, streams=2),
    logits=_logits,
    task='seq2seq', config=EncoderDecoderConfig, decoding='encoder_decoder', chunked_logits=True,
    lengths=lambda batch: (batch['inputs'].shape[1], batch['decoder_inputs'].shape[1]),
    param_counts=param_counts, forward_flops=forward_flops, stacks=_stacks,
    batch_shapes=_batch_shapes, packed_shapes=_packed_shapes,
    depth_keys=('num_layers', 'num_decoder_layers'))))
