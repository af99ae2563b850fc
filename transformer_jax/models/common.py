"""What the families share: the one place that maps a ModelConfig onto the layers' arguments,
default positions, the decoder's mask, the arguments of packed rows, the LM head, the settings
of the text families, and the parameter and FLOP formulas of the blocks."""
import dataclasses
import functools
from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax.errors import ConfigError
from transformer_jax.kernels import cache as kv_cache, masks
from transformer_jax.layers import embeddings
from transformer_jax.layers.mlp import GATED
from transformer_jax.layers import (MLP, Attention, Block, BlockStack, LayerNorm, Linear, RMSNorm,
                                    TextEmbed, axes)
from transformer_jax.model_config import ModelConfig
from transformer_jax.models import registry
from transformer_jax.ranges import COUNT, Range

__all__ = [
    'attention', 'attention_params', 'attention_weights', 'attention_width', 'block',
    'block_params', 'block_weights', 'both_masks', 'decoder_mask', 'default_positions',
    'follow_text_data', 'HEAD_INPUTS', 'key_mask', 'lm_head', 'LmHead', 'mlp', 'mlp_params',
    'mlp_weights', 'norm', 'norm_params', 'packed_arguments', 'residual_init_gain', 'stack',
    'text_data_sizes', 'text_embed', 'text_embedding_params', 'text_example_inputs',
    'text_family', 'text_flops', 'text_lengths', 'text_logits_shape', 'TextConfig',
    'untied_head_params', 'with_total']


@dataclasses.dataclass(frozen=True)
class TextConfig(ModelConfig):
  """The blocks, and the ends of a family that reads and writes token ids."""
  vocab_size: int = 0  # 0: the data's (data.vocab_size, else its tokenizer's ids)
  max_len: int = 1024  # rows of a learned position table; longest sequence
  tie_embeddings: bool = True
  # Token rows times sqrt(width) before the positions are added (Vaswani et al. 2017, section
  # 3.4): small embedding rows would otherwise be swamped by sinusoidal positions of amplitude 1.
  scale_embeddings: bool = False

  RANGES: ClassVar = {**ModelConfig.RANGES, 'vocab_size': Range(0, integer=True, example=65),
                      'max_len': COUNT}


def norm(cfg: ModelConfig) -> functools.partial:
  """The configured norm class with its arguments bound (called with a name)."""
  if cfg.norm == 'rmsnorm':
    return functools.partial(RMSNorm, eps=cfg.norm_eps, dtype=cfg.compute_dtype,
                             param_dtype=cfg.weight_dtype)
  return functools.partial(LayerNorm, eps=cfg.norm_eps, use_bias=cfg.norm_bias,
                           dtype=cfg.compute_dtype, param_dtype=cfg.weight_dtype)


def residual_init_gain(cfg: ModelConfig, num_layers: int, cross_attention: bool = False) -> float:
  """What the kernels writing into the residual stream of a stack of `num_layers` blocks start
  times (model.scale_residual_init): 1 / sqrt(N), N = num_layers * (2, or 3 with
  cross-attention) residual branches; 1 without the scaling."""
  if not cfg.scale_residual_init:
    return 1.0
  return (num_layers * (3 if cross_attention else 2)) ** -0.5


def attention(cfg: ModelConfig, cross: bool = False, out_init_gain: float = 1.0
              ) -> functools.partial:
  return functools.partial(
      Attention, num_heads=cfg.num_heads, head_dim=cfg.head_dim, num_kv_heads=cfg.kv_heads,
      rope_base=cfg.rope_base if cfg.positions == 'rope' and not cross else None,
      use_bias=cfg.use_bias, key_bias=cfg.key_bias, is_cross=cross, kernel=cfg.attention_kernel,
      cache_layout=kv_cache.layout_for(cfg.attention_kernel), init_std=cfg.init_std,
      initializer=cfg.init, out_init_gain=out_init_gain,
      scale_logits=cfg.scale_attention, dropout_rate=cfg.attention_dropout_rate,
      dtype=cfg.compute_dtype,
      param_dtype=cfg.weight_dtype)


def mlp(cfg: ModelConfig, out_init_gain: float = 1.0) -> functools.partial:
  return functools.partial(MLP, hidden=cfg.hidden_dim, activation=cfg.mlp, use_bias=cfg.use_bias,
                           init_std=cfg.init_std, initializer=cfg.init,
                           out_init_gain=out_init_gain, dropout_rate=cfg.mlp_dropout_rate,
                           dtype=cfg.compute_dtype, param_dtype=cfg.weight_dtype)


def block(cfg: ModelConfig, cross_attention: bool = False, num_layers: int | None = None
          ) -> functools.partial:
  """The Block of every family, bound to the config's options; `num_layers`: the depth of its
  stack (default model.num_layers), which model.scale_residual_init scales by."""
  gain = residual_init_gain(cfg, num_layers or cfg.num_layers, cross_attention)
  return functools.partial(
      Block, attention=attention(cfg, out_init_gain=gain), mlp=mlp(cfg, gain),
      norm=norm(cfg) if cfg.use_norm else None,
      cross_attention=attention(cfg, cross=True, out_init_gain=gain) if cross_attention else None,
      norm_position=cfg.norm_position, use_attention=cfg.use_attention, use_mlp=cfg.use_mlp,
      use_residual=cfg.use_residual, dropout_rate=cfg.dropout_rate)


def stack(cfg: ModelConfig, num_layers: int, cross_attention: bool = False, **kwargs) -> BlockStack:
  return BlockStack(block(cfg, cross_attention, num_layers), num_layers, scan=cfg.scan_layers,
                    remat_policy=cfg.remat_policy, **kwargs)


def text_embed(cfg: TextConfig, type_vocab_size: int = 0, **kwargs) -> TextEmbed:
  return TextEmbed(
      cfg.vocab_size, cfg.width,
      positions=cfg.positions if cfg.positions not in ('rope', 'relative') else 'none',
      max_len=cfg.max_len, type_vocab_size=type_vocab_size, scale=cfg.scale_embeddings,
      init_std=cfg.embed_init_std, dtype=cfg.compute_dtype, param_dtype=cfg.weight_dtype,
      **kwargs)


def default_positions(tokens: jax.Array, offset=0) -> jax.Array | np.ndarray:
  """(B, T) positions of a batch of tokens (layers.embeddings.default_positions)."""
  return embeddings.default_positions(*tokens.shape, offset)


def decoder_mask(positions, attention_mask=None, cache_index=None):
  """Causal self-attention mask over T slots (a `kernels.masks.Mask`, which is (B, 1, T, T)
  dense), AND-ed with an optional extra mask.

  With a cache, the keys live in cache slots only the caller knows the extent of, so the caller
  passes the complete mask over them (see `causal_mask` and `transformer_jax.decode`).
  """
  if cache_index is not None:
    if attention_mask is None:
      raise ValueError('Decoding with a cache needs attention_mask over the cache slots: build it '
                       'with transformer_jax.layers.causal_mask(slots, positions, cache_len).')
    return attention_mask
  return both_masks(masks.Mask(causal=True, positions=positions), attention_mask)


def both_masks(mask, other):
  """The conjunction of two optional masks, boolean arrays or `kernels.masks.Mask`s (None:
  every key)."""
  return masks.conjunction(mask, other)


def key_mask(valid) -> masks.Mask | None:
  """Every query sees the valid keys (B, S) (None: every key): `layers.padding_mask`, kept as
  its structure for the fused kernels."""
  return None if valid is None else masks.Mask(valid=valid)


def packed_arguments(batch: dict, prefix: str = '') -> dict:
  """The keyword arguments `positions` and `attention_mask` (B, 1, T, T) of one stream of a
  packed batch, whose rows hold several documents: `{prefix}segment_ids` (B, T), 1, 2, ... by
  document and 0 on padding, and `{prefix}positions` (B, T), restarting at 0 at each document.
  The mask keeps attention within each document (`layers.segment_mask`, kept as its segment ids
  for the fused kernels); {} for a batch without segment ids."""
  if f'{prefix}segment_ids' not in batch:
    return {}
  segments = batch[f'{prefix}segment_ids']
  return {'positions': batch[f'{prefix}positions'],
          'attention_mask': masks.Mask(segments=(segments, segments))}


HEAD_INPUTS = 'head_inputs'


class LmHead(nn.Module):
  """Float32 next-token logits: the tied unembedding E^T (`embed.attend`), or an untied (D, V)
  matrix without bias, of the input times `input_scale` (T5 1.0's tied head: width^-0.5).

  Where the HEAD_INPUTS collection is mutable, it also records (features, unembedding (D, V)),
  both in the compute dtype, whose product the logits are: the training loss then computes the
  logits itself a chunk at a time (train.chunked_loss), and XLA drops the unused whole ones."""
  vocab_size: int
  tied: bool = True
  init_std: float | None = 0.02
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  input_scale: float = 1.0

  @nn.compact
  def __call__(self, x, embed: TextEmbed):
    """x (B, T, D) -> float32 logits (B, T, vocab_size); `embed` is the model's TextEmbed,
    whose table the tied head reads."""
    if self.input_scale != 1.0:
      x = x * jnp.asarray(self.input_scale, x.dtype)
    if self.tied:
      logits = embed.attend(x)
      matrix = embed.tokens.T
    else:
      unembed = Linear((self.vocab_size,), ('embed',), ('vocab',), use_bias=False,
                       init_std=self.init_std, dtype=self.dtype, param_dtype=self.param_dtype,
                       out_dtype=jnp.float32, name='unembed')
      logits = unembed(x)
      matrix = unembed.variables['params']['kernel']
    if self.is_mutable_collection(HEAD_INPUTS) and not self.is_initializing():
      self.sow(HEAD_INPUTS, 'unembedding', (x.astype(self.dtype), matrix.astype(self.dtype)),
               init_fn=lambda: None, reduce_fn=lambda _, value: value)
    return axes.constrain(logits, axes.VOCAB)


def lm_head(cfg: TextConfig, **kwargs) -> LmHead:
  return LmHead(cfg.vocab_size, cfg.tie_embeddings, cfg.init_std, cfg.compute_dtype,
                cfg.weight_dtype, **kwargs)


def text_example_inputs(cfg: TextConfig, batch: int = 1, seq_len: int | None = None,
                        streams: int = 1) -> tuple:
  """`streams` token arrays (B, T): the inputs of a text family's __call__."""
  tokens = jnp.zeros((batch, seq_len or min(cfg.max_len, 8)), jnp.int32)
  return (tokens,) * streams


def text_data_sizes(cfg: TextConfig) -> dict:
  return {'vocab_size': cfg.vocab_size or None}


def follow_text_data(cfg: TextConfig, sizes: dict, source: str) -> TextConfig:
  """model.vocab_size, unset (0), takes the data's; one set may exceed it (a vocabulary padded to
  a multiple of 64) but not fall short."""
  found = sizes.get('vocab_size')
  if not found:
    return cfg
  if not cfg.vocab_size:
    return dataclasses.replace(cfg, vocab_size=found)
  if found > cfg.vocab_size:
    raise ConfigError(f'{source} has {found} token ids but model.vocab_size={cfg.vocab_size}: '
                      'leave model.vocab_size unset (0) to follow the data, or set '
                      f'--config.model.vocab_size={found}.')
  return cfg


def text_logits_shape(cfg: TextConfig, seq_len: int) -> tuple[int, int]:
  return seq_len, cfg.vocab_size


def text_lengths(batch: dict) -> tuple[int, None]:
  return batch['inputs'].shape[1], None


# The parameter and FLOP formulas the families share (see transformer_jax.accounting).

def norm_params(cfg: ModelConfig) -> int:
  return cfg.width * (2 if cfg.norm == 'layernorm' and cfg.norm_bias else 1)


def attention_weights(cfg: ModelConfig) -> int:
  """Q and O are D x heads * head_dim; K and V are D x kv_heads * head_dim."""
  return 2 * cfg.width * (cfg.num_heads + cfg.kv_heads) * cfg.head_dim


def mlp_weights(cfg: ModelConfig) -> int:
  return (3 if cfg.mlp in GATED else 2) * cfg.width * cfg.hidden_dim


def attention_params(cfg: ModelConfig) -> int:
  """One attention's weights and biases (the key projection's where model.key_bias)."""
  kv = cfg.kv_heads * cfg.head_dim
  return attention_weights(cfg) + cfg.use_bias * (
      cfg.num_heads * cfg.head_dim + cfg.width + (1 + cfg.key_bias) * kv)


def mlp_params(cfg: ModelConfig) -> int:
  """One MLP's weights and biases."""
  return mlp_weights(cfg) + cfg.use_bias * (
      (2 if cfg.mlp in GATED else 1) * cfg.hidden_dim + cfg.width)


def block_params(cfg: ModelConfig, num: int, cross: bool = False) -> dict[str, int]:
  """Parameters of `num` blocks by part (with cross-attention: a decoder's of an
  encoder-decoder)."""
  attn, mlp = attention_params(cfg), mlp_params(cfg)
  sublayers = [cfg.use_attention] * (2 if cross else 1) + [cfg.use_mlp]
  # A pre-LN block only normalizes the input of a sublayer that exists; post-LN always normalizes.
  norms = sum(cfg.use_norm and (present or cfg.norm_position == 'post') for present in sublayers)
  return {'attention': num * attn * sum(sublayers[:-1]), 'mlp': num * mlp * cfg.use_mlp,
          'norms': num * norms * norm_params(cfg)}


def text_embedding_params(cfg: TextConfig, type_vocab_size: int = 0) -> int:
  return (cfg.vocab_size + cfg.max_len * (cfg.positions == 'learned')
          + type_vocab_size) * cfg.width


def untied_head_params(cfg: TextConfig) -> int:
  return 0 if cfg.tie_embeddings else cfg.width * cfg.vocab_size


def with_total(counts: dict[str, int]) -> dict[str, int]:
  """Every part of registry.PARTS (0 where absent) and their 'total'."""
  counts = {part: counts.get(part, 0) for part in registry.PARTS}
  return {**counts, 'total': sum(counts.values())}


def block_weights(cfg: ModelConfig) -> int:
  """The weights a token is multiplied by in one block."""
  return attention_weights(cfg) * cfg.use_attention + mlp_weights(cfg) * cfg.use_mlp


def text_flops(cfg: ModelConfig, t: int, head: int) -> dict[str, int]:
  """Forward FLOPs of `t` tokens through the blocks and a head of `head` weights."""
  return {'dense': 2 * t * (cfg.num_layers * block_weights(cfg) + head),
          'attention': 4 * attention_width(cfg) * cfg.num_layers * t * t, 'tokens': t}


def attention_width(cfg: ModelConfig) -> int:
  """The width of the heads' queries, which each query-key and weight-value product spans (0
  without attention)."""
  return cfg.num_heads * cfg.head_dim * cfg.use_attention


def text_family(**entry) -> dict:
  """The registry questions every text family answers alike, with `entry` on top."""
  return {'example_inputs': text_example_inputs, 'lengths': text_lengths,
          'data_sizes': text_data_sizes, 'follow_data': follow_text_data,
          'logits_shape': text_logits_shape, **entry}
