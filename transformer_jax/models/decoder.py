"""Decoder-only language model: GPT-2 style and LLaMA style are presets of this one module
(models/styles.py)."""
import dataclasses

import flax.linen as nn

from transformer_jax.model_config import ModelConfig
from transformer_jax.models import common, registry

__all__ = ['DecoderConfig', 'DecoderLM', 'FAMILY', 'forward_flops', 'param_counts']


@dataclasses.dataclass(frozen=True)
class DecoderConfig(common.TextConfig):
  """A decoder's settings: the text family's, nothing of its own."""
  family: str = 'decoder'


class DecoderLM(nn.Module):
  """tokens (B, T) -> float32 next-token logits (B, T, V), with causal self-attention.

  positions (B, T) default to 0..T-1. With `cache_index`, keys and values go into the 'cache'
  collection at that slot (the prefill and each decoding step of `transformer_jax.decode`).
  """
  cfg: DecoderConfig

  @nn.compact
  def __call__(self, tokens, positions=None, *, attention_mask=None, cache_index=None,
               deterministic=True):
    """tokens (B, T) int -> float32 logits (B, T, V).

    positions (B, T) int; attention_mask boolean (B, 1, T, T), AND-ed with the causal mask; with
    `cache_index` (the cache slot of the first token) the whole mask (B, 1, T, S) over the
    cache's S slots (see causal_mask).
    """
    cfg = self.cfg
    if positions is None:
      positions = common.default_positions(tokens, 0 if cache_index is None else cache_index)
    mask = common.decoder_mask(positions, attention_mask, cache_index)
    embed = common.text_embed(cfg, name='embed')
    x = nn.Dropout(cfg.dropout_rate)(embed(tokens, positions), deterministic=deterministic)
    x = common.stack(cfg, cfg.num_layers, name='decoder')(
        x, mask, positions, cache_index=cache_index, deterministic=deterministic)
    if cfg.final_norm:
      x = common.norm(cfg)(name='final_norm')(x)
    return common.lm_head(cfg, name='head')(x, embed)


def param_counts(cfg: ModelConfig) -> dict[str, int]:
  blocks = common.block_params(cfg, cfg.num_layers)
  return common.with_total({
      **blocks, 'embedding': common.text_embedding_params(cfg),
      'head': common.untied_head_params(cfg),
      'norms': blocks['norms'] + common.norm_params(cfg) * cfg.final_norm})


def forward_flops(cfg: ModelConfig, seq_len=None, target_len=None) -> dict[str, int]:
  del target_len
  return common.text_flops(cfg, seq_len or cfg.max_len, head=cfg.width * cfg.vocab_size)


FAMILY = registry.register(registry.Family(**common.text_family(
    name='decoder', module=DecoderLM,
    logits=lambda apply, batch: apply(batch['inputs'], **common.packed_arguments(batch)),
    task='next_token', config=DecoderConfig, decoding='decoder', chunked_logits=True,
    packed_shapes=registry.text_packed_shapes, param_counts=param_counts,
    forward_flops=forward_flops)))
