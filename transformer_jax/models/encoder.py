"""Encoder-only masked language model (BERT style): bidirectional blocks and an MLM head."""
import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer_jax.layers import BlockStack, Linear, TextEmbed, make_norm, padding_mask
from transformer_jax.layers.mlp import ACTIVATIONS
from transformer_jax.models.common import default_positions


class MlmHead(nn.Module):
  """BERT's head: dense + activation + norm, then the tied unembedding plus an output bias."""
  cfg: 'ModelConfig'

  @nn.compact
  def __call__(self, x, embed):
    cfg = self.cfg
    h = Linear((cfg.width,), ('embed', 'mlp'), use_bias=True, dtype=cfg.compute_dtype,
               param_dtype=cfg.weight_dtype, init_std=cfg.init_std, name='transform')(x)
    h = ACTIVATIONS.get(cfg.mlp, ACTIVATIONS['gelu'])(h)
    h = make_norm(cfg, 'norm', always=True)(h)
    if cfg.tie_embeddings:
      logits = embed.attend(h)
    else:
      logits = Linear((cfg.vocab_size,), ('embed', 'vocab'), use_bias=False,
                      dtype=cfg.compute_dtype, param_dtype=cfg.weight_dtype,
                      init_std=cfg.init_std, out_dtype=jnp.float32, name='decoder')(h)
    bias = self.param('bias', nn.with_logical_partitioning(nn.initializers.zeros, ('vocab',)),
                      (cfg.vocab_size,), cfg.weight_dtype)
    return logits + bias.astype(jnp.float32).reshape((1,) * (logits.ndim - 1) + (-1,))


class EncoderMLM(nn.Module):
  """tokens (B, T) -> float32 logits (B, T, V) for every position; every token sees every valid
  token. `valid` (B, T) marks real tokens (padding is never attended to)."""
  cfg: 'ModelConfig'

  @nn.compact
  def __call__(self, tokens, positions=None, *, valid=None, token_types=None,
               attention_mask=None, deterministic=True):
    cfg = self.cfg
    if positions is None:
      positions = default_positions(tokens)
    mask = None if valid is None else padding_mask(valid, tokens.shape[1])
    if attention_mask is not None:
      mask = attention_mask if mask is None else mask & attention_mask
    embed = TextEmbed(cfg, name='embed')
    x = embed(tokens, positions, token_types)
    if cfg.embed_norm:
      x = make_norm(cfg, 'embed_norm')(x)
    x = nn.Dropout(cfg.dropout_rate)(x, deterministic=deterministic)
    x = BlockStack(cfg, cfg.num_layers, name='encoder')(x, mask, positions,
                                                         deterministic=deterministic)
    if cfg.final_norm:
      x = make_norm(cfg, 'final_norm')(x)
    return MlmHead(cfg, name='head')(x, embed)
