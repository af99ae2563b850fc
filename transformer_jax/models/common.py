"""Pieces the token families share: default positions, the decoder's mask, the LM head."""
import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer_jax.layers import Linear, causal_mask


def default_positions(tokens: jax.Array, offset=0) -> jax.Array:
  b, t = tokens.shape
  return jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32) + offset, (b, t))


def decoder_mask(positions, attention_mask=None, cache_index=None):
  """Causal self-attention mask (B, 1, T, T), AND-ed with an optional extra mask.

  With a cache, the keys live in cache slots only the caller knows the extent of, so the caller
  passes the complete mask over them (see `causal_mask` and `transformer_jax.decode`).
  """
  if cache_index is not None:
    if attention_mask is None:
      raise ValueError('Decoding with a cache needs attention_mask over the cache slots: build it '
                       'with transformer_jax.layers.causal_mask(slots, positions, cache_len).')
    return attention_mask
  t = positions.shape[1]
  mask = causal_mask(jnp.arange(t), positions, t)
  return mask if attention_mask is None else mask & attention_mask


class LmHead(nn.Module):
  """Float32 next-token logits: the tied unembedding E^T, or an untied (D, V) matrix without bias."""
  cfg: 'ModelConfig'

  @nn.compact
  def __call__(self, x, embed):
    cfg = self.cfg
    if cfg.tie_embeddings:
      return embed.attend(x)
    return Linear((cfg.vocab_size,), ('embed', 'vocab'), use_bias=False, dtype=cfg.compute_dtype,
                  param_dtype=cfg.weight_dtype, init_std=cfg.init_std, out_dtype=jnp.float32,
                  name='unembed')(x)
