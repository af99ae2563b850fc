"""Encoder-decoder (original transformer / T5 layout): one shared embedding, cross-attention in
every decoder block."""
import flax.linen as nn
import jax.numpy as jnp

from transformer_jax.layers import BlockStack, TextEmbed, make_norm, padding_mask
from transformer_jax.models.common import LmHead, decoder_mask, default_positions


class EncoderDecoder(nn.Module):
  """inputs (B, S), targets (B, T) -> float32 logits (B, T, V) of the next target token.

  `input_valid` (B, S) marks real input tokens. `encode` and `decode` are separate methods so
  that decoding runs the encoder once; with `cache_index`, `decode` caches its self-attention keys
  and values and, at the prefill, the cross-attention ones (pass `encoded=None` afterwards).
  """
  cfg: 'ModelConfig'

  def setup(self):
    cfg = self.cfg
    self.embed = TextEmbed(cfg)
    self.dropout = nn.Dropout(cfg.dropout_rate)
    self.encoder = BlockStack(cfg, cfg.num_layers)
    self.encoder_norm = make_norm(cfg, 'encoder_norm') if cfg.final_norm else None
    self.decoder = BlockStack(cfg, cfg.decoder_layers, has_cross_attention=True)
    self.decoder_norm = make_norm(cfg, 'decoder_norm') if cfg.final_norm else None
    self.head = LmHead(cfg)

  def encode(self, inputs, input_valid=None, *, deterministic=True):
    positions = default_positions(inputs)
    mask = None if input_valid is None else padding_mask(input_valid, inputs.shape[1])
    x = self.dropout(self.embed(inputs, positions), deterministic=deterministic)
    x = self.encoder(x, mask, positions, deterministic=deterministic)
    return x if self.encoder_norm is None else self.encoder_norm(x)

  def decode(self, targets, encoded, input_valid=None, positions=None, *, attention_mask=None,
             cache_index=None, deterministic=True):
    if positions is None:
      positions = default_positions(targets, 0 if cache_index is None else cache_index)
    mask = decoder_mask(positions, attention_mask, cache_index)
    cross_mask = None if input_valid is None else padding_mask(input_valid, targets.shape[1])
    x = self.dropout(self.embed(targets, positions), deterministic=deterministic)
    x = self.decoder(x, mask, positions, encoded, cross_mask, cache_index,
                     deterministic=deterministic)
    if self.decoder_norm is not None:
      x = self.decoder_norm(x)
    return self.head(x, self.embed)

  def __call__(self, inputs, targets, input_valid=None, *, deterministic=True):
    encoded = self.encode(inputs, input_valid, deterministic=deterministic)
    return self.decode(targets, encoded, input_valid, deterministic=deterministic)
