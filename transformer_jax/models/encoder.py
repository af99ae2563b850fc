"""Encoder-only masked language model (BERT style): bidirectional blocks and an MLM head."""
import dataclasses
from typing import Any, ClassVar

import flax.linen as nn
import jax.numpy as jnp

from transformer_jax.layers import Linear
from transformer_jax.layers.mlp import ACTIVATIONS
from transformer_jax.models import common, registry
from transformer_jax.ranges import Range

__all__ = ['encode', 'EncoderConfig', 'encoder_params', 'EncoderMLM', 'FAMILY', 'forward_flops',
           'MlmHead', 'param_counts']


@dataclasses.dataclass(frozen=True)
class EncoderConfig(common.TextConfig):
  """An encoder's settings: the text family's, and BERT's ends."""
  family: str = 'encoder'
  embed_norm: bool = False  # a norm right after the embeddings (BERT)
  type_vocab_size: int = 0  # token-type (segment) embeddings (BERT); 0: none

  RANGES: ClassVar = {**common.TextConfig.RANGES, 'type_vocab_size': Range(0, integer=True)}


def encode(cfg: EncoderConfig, tokens, positions, mask, token_types=None, *, deterministic):
  """(hidden states (B, T, width), the TextEmbed, which a tied head reads) of tokens (B, T) at
  positions (B, T) under `mask` (None: every token sees every token), built in the scope of the
  calling module (its compact method): the token, position and type embeddings, BERT's norm of
  them, dropout, the blocks and a pre-LN stack's final norm."""
  embed = common.text_embed(cfg, cfg.type_vocab_size, name='embed')
  x = embed(tokens, positions, token_types)
  if cfg.embed_norm and cfg.use_norm:
    x = common.norm(cfg)(name='embed_norm')(x)
  x = nn.Dropout(cfg.dropout_rate)(x, deterministic=deterministic)
  x = common.stack(cfg, cfg.num_layers, name='encoder')(x, mask, positions,
                                                        deterministic=deterministic)
  if cfg.final_norm:
    x = common.norm(cfg)(name='final_norm')(x)
  return x, embed


def encoder_params(cfg: EncoderConfig) -> dict[str, int]:
  """The parameters of `encode` by part: 'embedding', 'attention', 'mlp', 'norms'."""
  blocks, norm = common.block_params(cfg, cfg.num_layers), common.norm_params(cfg)
  norms = norm * (cfg.final_norm + (cfg.embed_norm and cfg.use_norm))
  return {**blocks, 'embedding': common.text_embedding_params(cfg, cfg.type_vocab_size),
          'norms': blocks['norms'] + norms}


class MlmHead(nn.Module):
  """BERT's head: dense + activation + norm, then the tied unembedding (or an untied matrix)
  plus an output bias: float32 logits over `vocab_size`."""
  vocab_size: int
  norm: Any  # a norm class with its arguments bound, called with a name
  activation: str = 'gelu'
  tied: bool = True
  init_std: float | None = 0.02
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, embed):
    """x (B, T, D) -> float32 logits (B, T, vocab_size); `embed` is the model's TextEmbed."""
    dense = lambda features, out_axis, name, **kw: Linear(
        (features,), ('embed',), (out_axis,), init_std=self.init_std, dtype=self.dtype,
        param_dtype=self.param_dtype, name=name, **kw)
    h = dense(x.shape[-1], 'mlp', 'transform')(x)
    h = self.norm(name='norm')(ACTIVATIONS.get(self.activation, ACTIVATIONS['gelu'])(h))
    if self.tied:
      logits = embed.attend(h)
    else:
      logits = dense(self.vocab_size, 'vocab', 'decoder', use_bias=False,
                     out_dtype=jnp.float32)(h)
    bias = self.param('bias', nn.with_logical_partitioning(nn.initializers.zeros, ('vocab',)),
                      (self.vocab_size,), self.param_dtype)
    return logits + bias.astype(jnp.float32).reshape((1,) * (logits.ndim - 1) + (-1,))


class EncoderMLM(nn.Module):
  """tokens (B, T) -> float32 logits (B, T, V) for every position; every token sees every valid
  token. `valid` (B, T) marks real tokens (padding is never attended to)."""
  cfg: EncoderConfig

  @nn.compact
  def __call__(self, tokens, positions=None, *, valid=None, token_types=None,
               attention_mask=None, deterministic=True):
    """tokens (B, T) int -> float32 logits (B, T, V).

    positions, valid (bool), token_types: (B, T) each; attention_mask boolean (B, 1, T, T),
    AND-ed with the padding mask of `valid`.
    """
    cfg = self.cfg
    if positions is None:
      positions = common.default_positions(tokens)
    mask = common.both_masks(common.key_mask(valid), attention_mask)
    x, embed = encode(cfg, tokens, positions, mask, token_types, deterministic=deterministic)
    # The head's norm stays whatever the ablations remove: it belongs to the head.
    return MlmHead(cfg.vocab_size, common.norm(cfg), cfg.mlp, cfg.tie_embeddings, cfg.init_std,
                   cfg.compute_dtype, cfg.weight_dtype, name='head')(x, embed)


def param_counts(cfg: EncoderConfig) -> dict[str, int]:
  d = cfg.width
  return common.with_total({
      **encoder_params(cfg),
      'head': d * d + d + common.norm_params(cfg) + common.untied_head_params(cfg)
              + cfg.vocab_size})


def forward_flops(cfg: EncoderConfig, seq_len=None, target_len=None) -> dict[str, int]:
  del target_len
  return common.text_flops(cfg, seq_len or cfg.max_len,
                           head=cfg.width * cfg.vocab_size + cfg.width * cfg.width)


FAMILY = registry.register(registry.Family(**common.text_family(
    name='encoder', module=EncoderMLM,
    # Packed, the segment mask also hides the padding (segment 0) from every real token.
    logits=lambda apply, batch: apply(batch['inputs'], valid=batch.get('valid'),
                                      **common.packed_arguments(batch)),
    task='masked', packed_shapes=registry.text_packed_shapes,
    config=EncoderConfig, param_counts=param_counts, forward_flops=forward_flops)))
