"""Parameters, FLOPs and KV-cache bytes of a model config, by the seeds' formulas.

Parameters are counted two ways that must agree: analytically from the config
(`param_counts`) and from the shapes of an initialized tree (`counted_params`, via
jax.eval_shape, so even GPT-2 small allocates nothing). FLOPs follow seed 000, section 3.3: a
multiply-add is 2 FLOPs, a token costs 2 FLOPs per weight it is multiplied by (the embedding
lookup costs none), attention costs 4*T*D per token and layer over T keys, and a training step
costs 3 times the forward pass. The KV cache holds 2 * L * T * kv_heads * head_dim numbers per
sequence (section 3.5).
"""
import math
from typing import Any, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer_jax import models
from transformer_jax.model_config import ModelConfig

PARTS = ('embedding', 'attention', 'mlp', 'norms', 'head')


def _norm(cfg: ModelConfig) -> int:
  return cfg.width * (2 if cfg.norm == 'layernorm' and cfg.norm_bias else 1)


def _attention_weights(cfg: ModelConfig) -> int:
  """Q and O are D x D; K and V are D x kv_heads * head_dim."""
  return 2 * cfg.width * cfg.width + 2 * cfg.width * cfg.kv_heads * cfg.head_dim


def _mlp_weights(cfg: ModelConfig) -> int:
  return (3 if cfg.mlp == 'swiglu' else 2) * cfg.width * cfg.hidden_dim


def _block(cfg: ModelConfig, cross: bool) -> dict[str, int]:
  kv = cfg.kv_heads * cfg.head_dim
  attn = _attention_weights(cfg) + cfg.use_bias * (2 * cfg.width + 2 * kv)
  mlp = _mlp_weights(cfg) + cfg.use_bias * (
      (2 if cfg.mlp == 'swiglu' else 1) * cfg.hidden_dim + cfg.width)
  sublayers = [cfg.use_attention] * (2 if cross else 1) + [cfg.use_mlp]
  # A pre-LN block only normalizes the input of a sublayer that exists; post-LN always normalizes.
  norms = sum(cfg.use_norm and (present or cfg.norm_position == 'post') for present in sublayers)
  return {'attention': attn * sum(sublayers[:-1]), 'mlp': mlp * cfg.use_mlp,
          'norms': norms * _norm(cfg)}


def param_counts(model: ModelConfig | Mapping[str, Any]) -> dict[str, int]:
  """Analytic parameter count by part, and 'total'."""
  cfg = models.model_config(model)
  d = cfg.width
  counts = dict.fromkeys(PARTS, 0)

  def add_blocks(num, cross=False):
    for part, n in _block(cfg, cross).items():
      counts[part] += num * n

  final_norm = _norm(cfg) * cfg.final_norm
  if cfg.family == 'vit':
    tokens = cfg.num_patches + (cfg.pool == 'cls')
    counts['embedding'] = (cfg.num_channels * cfg.patch_size ** 2 * d + d + d * (cfg.pool == 'cls')
                           + tokens * d * (cfg.positions == 'learned'))
    add_blocks(cfg.num_layers)
    counts['norms'] += final_norm
    counts['head'] = d * cfg.num_classes + cfg.num_classes
  else:
    counts['embedding'] = (cfg.vocab_size + cfg.max_len * (cfg.positions == 'learned')
                           + cfg.type_vocab_size) * d
    untied = 0 if cfg.tie_embeddings else d * cfg.vocab_size
    if cfg.family == 'decoder':
      add_blocks(cfg.num_layers)
      counts['norms'] += final_norm
      counts['head'] = untied
    elif cfg.family == 'encoder':
      add_blocks(cfg.num_layers)
      counts['norms'] += final_norm + _norm(cfg) * (cfg.embed_norm and cfg.use_norm)
      counts['head'] = d * d + d + _norm(cfg) + untied + cfg.vocab_size
    else:
      add_blocks(cfg.num_layers)
      add_blocks(cfg.decoder_layers, cross=True)
      counts['norms'] += 2 * final_norm
      counts['head'] = untied
  counts['total'] = sum(counts[p] for p in PARTS)
  return counts


def part_of(path: tuple[str, ...]) -> str:
  """Which part a parameter belongs to, from its path in the tree."""
  if path[0] == 'head':
    return 'head'
  if 'attn' in path or 'cross_attn' in path:
    return 'attention'
  if 'mlp' in path:
    return 'mlp'
  if any(name.endswith('norm') for name in path):
    return 'norms'
  if path[0] in ('embed', 'patch_embed', 'pos_embed', 'cls_token'):
    return 'embedding'
  raise ValueError(f'No accounting part for parameter {"/".join(path)}.')


def counted_params(model: ModelConfig | Mapping[str, Any]) -> dict[str, int]:
  """Parameter count by part from the initialized tree's shapes (nothing is allocated)."""
  params = nn.meta.unbox(models.abstract_variables(model)['params'])
  counts = dict.fromkeys(PARTS, 0)
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    counts[part_of(tuple(k.key for k in path))] += math.prod(leaf.shape)
  counts['total'] = sum(counts[p] for p in PARTS)
  return counts


def forward_flops(model: ModelConfig | Mapping[str, Any], seq_len: int | None = None,
                  target_len: int | None = None) -> dict[str, int]:
  """FLOPs of one forward pass over one example, split into 'dense' (weights) and 'attention'
  (the QK^T and AV products), with 'total' and the number of 'tokens' it predicts or classifies.

  seq_len: tokens of a text example (default model.max_len), or the source length of an
  encoder-decoder whose target has target_len tokens (default seq_len). A ViT's length is its
  patch count (+1 for [CLS]).
  """
  cfg = models.model_config(model)
  d = cfg.width
  block = _attention_weights(cfg) * cfg.use_attention + _mlp_weights(cfg) * cfg.use_mlp
  attn = 4 * d * cfg.use_attention  # per query, per key, per layer
  if cfg.family == 'vit':
    patches = cfg.num_patches
    t = patches + (cfg.pool == 'cls')
    dense = 2 * (patches * cfg.num_channels * cfg.patch_size ** 2 * d + t * cfg.num_layers * block
                 + d * cfg.num_classes)
    flops = {'dense': dense, 'attention': attn * cfg.num_layers * t * t, 'tokens': 1}
  elif cfg.family in ('decoder', 'encoder'):
    t = seq_len or cfg.max_len
    head = d * cfg.vocab_size + (d * d if cfg.family == 'encoder' else 0)
    flops = {'dense': 2 * t * (cfg.num_layers * block + head),
             'attention': attn * cfg.num_layers * t * t, 'tokens': t}
  else:
    s = seq_len or cfg.max_len
    t = target_len or s
    q_and_out = 2 * d * d * cfg.use_attention
    kv = (_attention_weights(cfg) - 2 * d * d) * cfg.use_attention
    dense = 2 * (s * cfg.num_layers * block + s * cfg.decoder_layers * kv
                 + t * (cfg.decoder_layers * (block + q_and_out) + d * cfg.vocab_size))
    attention = attn * (cfg.num_layers * s * s + cfg.decoder_layers * (t * t + t * s))
    flops = {'dense': dense, 'attention': attention, 'tokens': t}
  flops['total'] = flops['dense'] + flops['attention']
  return flops


def flops_per_token(model, seq_len: int | None = None) -> dict[str, float]:
  """Forward and training FLOPs per predicted token (per image for a ViT): 2N + 4LTD and
  3 (2N + 4LTD) for a decoder with a context of T tokens."""
  flops = forward_flops(model, seq_len)
  forward = flops['total'] / flops['tokens']
  return {'forward': forward, 'train': 3 * forward,
          'attention_share': flops['attention'] / flops['total']}


def kv_cache_bytes(model, seq_len: int, batch: int = 1, dtype: Any = None,
                   source_len: int | None = None, window: int | None = None) -> int:
  """Bytes of the KV cache of `batch` sequences of `seq_len` tokens: 2 * L * T * kv_heads *
  head_dim numbers each (plus the cross-attention keys and values of `source_len` encoder
  outputs for an encoder-decoder). dtype defaults to the model's compute dtype. With a sliding
  `window`, T is the ring's min(window, seq_len) slots, however long the sequence grows."""
  cfg = models.model_config(model)
  if cfg.family in ('vit', 'encoder'):
    raise ValueError(f'A {cfg.family!r} model has no causal mask, so it has no KV cache: '
                     'a new token would change the keys and values of every earlier one.')
  layers = cfg.num_layers if cfg.family == 'decoder' else cfg.decoder_layers
  slots = seq_len if window is None else min(window, seq_len)
  tokens = slots + (source_len or 0) * (cfg.family == 'encoder_decoder')
  itemsize = jnp.dtype(dtype or cfg.dtype).itemsize
  return batch * 2 * layers * tokens * cfg.kv_heads * cfg.head_dim * itemsize
