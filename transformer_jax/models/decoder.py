"""Decoder-only language model: GPT-2 style and LLaMA style are presets of this one module."""
import flax.linen as nn
import jax

from transformer_jax.layers import BlockStack, TextEmbed, make_norm
from transformer_jax.models.common import LmHead, decoder_mask, default_positions


class DecoderLM(nn.Module):
  """tokens (B, T) -> float32 next-token logits (B, T, V), with causal self-attention.

  positions (B, T) default to 0..T-1. With `cache_index`, keys and values go into the 'cache'
  collection at that slot (the prefill and each decoding step of `transformer_jax.decode`).
  """
  cfg: 'ModelConfig'

  @nn.compact
  def __call__(self, tokens, positions=None, *, attention_mask=None, cache_index=None,
               deterministic=True):
    cfg = self.cfg
    if positions is None:
      positions = default_positions(tokens, 0 if cache_index is None else cache_index)
    mask = decoder_mask(positions, attention_mask, cache_index)
    embed = TextEmbed(cfg, name='embed')
    x = nn.Dropout(cfg.dropout_rate)(embed(tokens, positions), deterministic=deterministic)
    x = BlockStack(cfg, cfg.num_layers, name='decoder')(
        x, mask, positions, cache_index=cache_index, deterministic=deterministic)
    if cfg.final_norm:
      x = make_norm(cfg, 'final_norm')(x)
    return LmHead(cfg, name='head')(x, embed)
