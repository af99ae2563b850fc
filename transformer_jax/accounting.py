"""Parameters, FLOPs and KV-cache bytes: by the textbook formulas for our families, and for any
model from its parameter tree and from XLA's cost analysis.

Parameters are counted two ways that must agree for our families: analytically from the config
(`param_counts`, one formula per family, each family's registry entry naming its own) and from
the shapes of an initialized tree (`counted_params`, via jax.eval_shape, so even GPT-2 small
allocates nothing). `count_params` counts any tree, a model of your own included. FLOPs follow
the standard accounting (Kaplan et al. 2020, section 2.1): a multiply-add is 2 FLOPs, a token
costs 2 FLOPs per weight it is multiplied by (the embedding lookup costs none), attention costs
4*T*D per token and layer over T keys, and a training step costs 3 times the forward pass.
`xla_flops` counts what XLA counts in any jitted function (the matmuls, and the element-wise
work the formulas leave out). The KV cache holds 2 * L * T * kv_heads * head_dim numbers per
sequence.
"""
import math
from typing import Any, Callable, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer_jax import models
from transformer_jax.model_config import ModelConfig

PARTS = ('embedding', 'attention', 'mlp', 'norms', 'head', 'other')
# Top-level parameters that embed the inputs, in every family (and read by the weight-decay mask).
EMBEDDING_NAMES = ('embed', 'patch_embed', 'pos_embed', 'cls_token')


# The formulas, by part.

def _norm(cfg: ModelConfig) -> int:
  return cfg.width * (2 if cfg.norm == 'layernorm' and cfg.norm_bias else 1)


def _attention_weights(cfg: ModelConfig) -> int:
  """Q and O are D x D; K and V are D x kv_heads * head_dim."""
  return 2 * cfg.width * cfg.width + 2 * cfg.width * cfg.kv_heads * cfg.head_dim


def _mlp_weights(cfg: ModelConfig) -> int:
  return (3 if cfg.mlp == 'swiglu' else 2) * cfg.width * cfg.hidden_dim


def _blocks(cfg: ModelConfig, num: int, cross: bool = False) -> dict[str, int]:
  kv = cfg.kv_heads * cfg.head_dim
  attn = _attention_weights(cfg) + cfg.use_bias * (2 * cfg.width + 2 * kv)
  mlp = _mlp_weights(cfg) + cfg.use_bias * (
      (2 if cfg.mlp == 'swiglu' else 1) * cfg.hidden_dim + cfg.width)
  sublayers = [cfg.use_attention] * (2 if cross else 1) + [cfg.use_mlp]
  # A pre-LN block only normalizes the input of a sublayer that exists; post-LN always normalizes.
  norms = sum(cfg.use_norm and (present or cfg.norm_position == 'post') for present in sublayers)
  return {'attention': num * attn * sum(sublayers[:-1]), 'mlp': num * mlp * cfg.use_mlp,
          'norms': num * norms * _norm(cfg)}


def _text_embedding(cfg: ModelConfig, type_vocab_size: int = 0) -> int:
  return (cfg.vocab_size + cfg.max_len * (cfg.positions == 'learned')
          + type_vocab_size) * cfg.width


def _total(counts: dict[str, int]) -> dict[str, int]:
  counts = {part: counts.get(part, 0) for part in PARTS}
  return {**counts, 'total': sum(counts.values())}


def _untied(cfg: ModelConfig) -> int:
  return 0 if cfg.tie_embeddings else cfg.width * cfg.vocab_size


def decoder_params(cfg: ModelConfig) -> dict[str, int]:
  blocks = _blocks(cfg, cfg.num_layers)
  return _total({**blocks, 'embedding': _text_embedding(cfg), 'head': _untied(cfg),
                 'norms': blocks['norms'] + _norm(cfg) * cfg.final_norm})


def encoder_params(cfg: ModelConfig) -> dict[str, int]:
  blocks, d = _blocks(cfg, cfg.num_layers), cfg.width
  norms = _norm(cfg) * (cfg.final_norm + (cfg.embed_norm and cfg.use_norm))
  return _total({**blocks, 'embedding': _text_embedding(cfg, cfg.type_vocab_size),
                 'norms': blocks['norms'] + norms,
                 'head': d * d + d + _norm(cfg) + _untied(cfg) + cfg.vocab_size})


def encoder_decoder_params(cfg: ModelConfig) -> dict[str, int]:
  encoder, decoder = _blocks(cfg, cfg.num_layers), _blocks(cfg, cfg.decoder_layers, cross=True)
  counts = {part: encoder[part] + decoder[part] for part in encoder}
  counts['norms'] += 2 * _norm(cfg) * cfg.final_norm
  return _total({**counts, 'embedding': _text_embedding(cfg), 'head': _untied(cfg)})


def vit_params(cfg: ModelConfig) -> dict[str, int]:
  d, cls = cfg.width, cfg.pool == 'cls'
  tokens = cfg.num_patches + cls
  blocks = _blocks(cfg, cfg.num_layers)
  return _total({**blocks, 'norms': blocks['norms'] + _norm(cfg) * cfg.final_norm,
                 'embedding': (cfg.num_channels * cfg.patch_size ** 2 * d + d + d * cls
                               + tokens * d * (cfg.positions == 'learned')),
                 'head': d * cfg.num_classes + cfg.num_classes})


def decoder_flops(cfg: ModelConfig, seq_len=None, target_len=None) -> dict[str, int]:
  del target_len
  return _text_flops(cfg, seq_len or cfg.max_len, head=cfg.width * cfg.vocab_size)


def encoder_flops(cfg: ModelConfig, seq_len=None, target_len=None) -> dict[str, int]:
  del target_len
  return _text_flops(cfg, seq_len or cfg.max_len,
                     head=cfg.width * cfg.vocab_size + cfg.width * cfg.width)


def _block_weights(cfg: ModelConfig) -> int:
  return _attention_weights(cfg) * cfg.use_attention + _mlp_weights(cfg) * cfg.use_mlp


def _text_flops(cfg: ModelConfig, t: int, head: int) -> dict[str, int]:
  return {'dense': 2 * t * (cfg.num_layers * _block_weights(cfg) + head),
          'attention': 4 * cfg.width * cfg.use_attention * cfg.num_layers * t * t, 'tokens': t}


def encoder_decoder_flops(cfg: ModelConfig, seq_len=None, target_len=None) -> dict[str, int]:
  """A source of seq_len tokens (default model.max_len), a target of target_len (default
  seq_len): the encoder on the source, the decoder on the target with cross-attention."""
  s = seq_len or cfg.max_len
  t = target_len or s
  d, block = cfg.width, _block_weights(cfg)
  q_and_out = 2 * d * d * cfg.use_attention
  kv = (_attention_weights(cfg) - 2 * d * d) * cfg.use_attention
  dense = 2 * (s * cfg.num_layers * block + s * cfg.decoder_layers * kv
               + t * (cfg.decoder_layers * (block + q_and_out) + d * cfg.vocab_size))
  attention = 4 * d * cfg.use_attention * (cfg.num_layers * s * s
                                           + cfg.decoder_layers * (t * t + t * s))
  return {'dense': dense, 'attention': attention, 'tokens': t}


def vit_flops(cfg: ModelConfig, seq_len=None, target_len=None) -> dict[str, int]:
  """Per image: seq_len is the patch count (+1 for [CLS]) whatever is passed."""
  del seq_len, target_len
  d, patches = cfg.width, cfg.num_patches
  t = patches + (cfg.pool == 'cls')
  dense = 2 * (patches * cfg.num_channels * cfg.patch_size ** 2 * d
               + t * cfg.num_layers * _block_weights(cfg) + d * cfg.num_classes)
  return {'dense': dense, 'attention': 4 * d * cfg.use_attention * cfg.num_layers * t * t,
          'tokens': 1}


# By config, through the family's registry entry.

def param_counts(model: ModelConfig | Mapping[str, Any]) -> dict[str, int]:
  """Analytic parameter count by part, and 'total', by the family's formula; a family without
  one (a family of your own) is counted from its initialized tree."""
  cfg = models.model_config(model)
  formula = models.registry.get(cfg.family).param_counts
  return formula(cfg) if formula else counted_params(cfg)


def counted_params(model: ModelConfig | Mapping[str, Any]) -> dict[str, int]:
  """Parameter count by part from the initialized tree's shapes (nothing is allocated)."""
  return count_params(nn.meta.unbox(models.abstract_variables(model)['params']))


def forward_flops(model: ModelConfig | Mapping[str, Any], seq_len: int | None = None,
                  target_len: int | None = None) -> dict[str, int]:
  """FLOPs of one forward pass over one example, split into 'dense' (weights) and 'attention'
  (the QK^T and AV products), with 'total' and the number of 'tokens' it predicts or classifies.

  seq_len: tokens of a text example (default model.max_len), or the source length of an
  encoder-decoder whose target has target_len tokens (default seq_len). A ViT's length is its
  patch count (+1 for [CLS]). A family without formulas gets XLA's count as 'dense'.
  """
  cfg = models.model_config(model)
  family = models.registry.get(cfg.family)
  if family.forward_flops:
    flops = family.forward_flops(cfg, seq_len, target_len)
  else:
    inputs = family.example_inputs(cfg, 1, seq_len)
    counted = xla_flops(models.build(cfg), *inputs)
    tokens = 1 if family.unit != 'token' else (target_len or seq_len or inputs[-1].shape[1])
    flops = {'dense': counted, 'attention': 0, 'tokens': tokens}
  return {**flops, 'total': flops['dense'] + flops['attention']}


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
  decoding = models.registry.get(cfg.family).decoding
  if decoding is None:
    raise ValueError(f'A {cfg.family!r} model has no causal mask, so it has no KV cache: '
                     'a new token would change the keys and values of every earlier one.')
  encoder_decoder = decoding == 'encoder_decoder'
  layers = cfg.decoder_layers if encoder_decoder else cfg.num_layers
  slots = seq_len if window is None else min(window, seq_len)
  tokens = slots + (source_len or 0) * encoder_decoder
  itemsize = jnp.dtype(dtype or cfg.dtype).itemsize
  return batch * 2 * layers * tokens * cfg.kv_heads * cfg.head_dim * itemsize


# Any model.

def part_of(path: tuple[str, ...]) -> str:
  """Which part a parameter belongs to, from the names on its path (so that our modules count
  the same inside a model of your own); 'other' for names none of our modules use."""
  if 'head' in path:
    return 'head'
  if 'attn' in path or 'cross_attn' in path:
    return 'attention'
  if 'mlp' in path:
    return 'mlp'
  if any(name.endswith('norm') for name in path):
    return 'norms'
  if any(name in EMBEDDING_NAMES for name in path):
    return 'embedding'
  return 'other'


def count_params(params) -> dict[str, int]:
  """Parameters by part (PARTS) and 'total' of any parameter tree (arrays or
  ShapeDtypeStructs): a model of your own built from our layers, or not."""
  counts = dict.fromkeys(PARTS, 0)
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    counts[part_of(tuple(getattr(k, 'key', getattr(k, 'name', str(k))) for k in path))] += (
        math.prod(leaf.shape))
  return {**counts, 'total': sum(counts.values())}


def xla_flops(fn: nn.Module | Callable, *args, params=None) -> float:
  """The FLOPs XLA's cost analysis counts in one call of `fn(*args)`: a Flax module's forward
  pass (`params` default: the shapes its init gives, so nothing is allocated) or any function."""
  if isinstance(fn, nn.Module):
    module = fn
    if params is None:
      params = jax.eval_shape(module.init, jax.random.key(0), *args)['params']
    fn = lambda p, *a: module.apply({'params': p}, *a)
    args = (nn.meta.unbox(params), *args)
  analysis = jax.jit(fn).lower(*args).cost_analysis()
  return float((analysis[0] if isinstance(analysis, (list, tuple)) else analysis)['flops'])
