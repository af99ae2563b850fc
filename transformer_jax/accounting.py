"""Parameters, FLOPs and KV-cache bytes: by the textbook formulas for our families, and for any
model from its parameter tree and from XLA's cost analysis.

Parameters are counted two ways that must agree for our families: analytically from the config
(`param_counts`, by the formula each family's registry entry names, beside its module) and from
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
from transformer_jax.models.registry import EMBEDDING_NAMES, PARTS

__all__ = [
    'count_params', 'counted_params', 'flops_per_token', 'forward_flops', 'kv_cache_bytes',
    'param_counts', 'part_of', 'xla_flops']


# By config, through the family's registry entry: each family's formulas live in its module.

def _config_of(model, function: str) -> ModelConfig:
  """The validated config of `model`; a module, a tree or anything else that is not a model
  config gets the error naming the counts that work for any model."""
  if not (isinstance(model, (ModelConfig, Mapping)) or hasattr(model, 'to_dict')):
    raise TypeError(f'accounting.{function} reads a model config (a ConfigDict, dict or '
                    f'ModelConfig of a registered family), not {type(model).__name__}: for a model '
                    'of your own, count its parameters with accounting.count_params(params) and '
                    'its FLOPs with accounting.xla_flops(module, *inputs).')
  return models.require_sizes(models.model_config(model))


def param_counts(model: ModelConfig | Mapping[str, Any]) -> dict[str, int]:
  """Analytic parameter count by part, and 'total', by the family's formula; a family without
  one (a family of your own) is counted from its initialized tree."""
  cfg = _config_of(model, 'param_counts')
  formula = models.registry.get(cfg.family).param_counts
  return formula(cfg) if formula else counted_params(cfg)


def counted_params(model: ModelConfig | Mapping[str, Any]) -> dict[str, int]:
  """Parameter count by part from the initialized tree's shapes (nothing is allocated)."""
  cfg = _config_of(model, 'counted_params')
  return count_params(nn.meta.unbox(models.abstract_variables(cfg)['params']))


def forward_flops(model: ModelConfig | Mapping[str, Any], seq_len: int | None = None,
                  target_len: int | None = None) -> dict[str, int]:
  """FLOPs of one forward pass over one example, split into 'dense' (weights) and 'attention'
  (the QK^T and AV products), with 'total' and the number of 'tokens' it predicts or classifies.

  seq_len: tokens of a text example (default model.max_len), or the source length of an
  encoder-decoder whose target has target_len tokens (default seq_len). A ViT's length is its
  patch count (+1 for [CLS]). A family without formulas gets XLA's count as 'dense'.
  """
  cfg = _config_of(model, 'forward_flops')
  family = models.registry.get(cfg.family)
  if family.forward_flops:
    flops = family.forward_flops(cfg, seq_len, target_len)
  else:
    inputs = family.example_inputs(cfg, 1, seq_len)
    counted = xla_flops(models.build(cfg), *inputs)
    tokens = 1 if not family.per_token else (target_len or seq_len or inputs[-1].shape[1])
    flops = {'dense': counted, 'attention': 0, 'tokens': tokens}
  return {**flops, 'total': flops['dense'] + flops['attention']}


def flops_per_token(model, seq_len: int | None = None) -> dict[str, float]:
  """Forward and training FLOPs per predicted token (per image for a ViT): 2N + 4LTD and
  3 (2N + 4LTD) for a decoder with a context of T tokens."""
  flops = forward_flops(_config_of(model, 'flops_per_token'), seq_len)
  forward = flops['total'] / flops['tokens']
  return {'forward': forward, 'train': 3 * forward,
          'attention_share': flops['attention'] / flops['total']}


def kv_cache_bytes(model, seq_len: int, batch: int = 1, dtype: Any = None,
                   source_len: int | None = None, window: int | None = None) -> int:
  """Bytes of the KV cache of `batch` sequences of `seq_len` tokens: 2 * L * T * kv_heads *
  head_dim numbers each (plus the cross-attention keys and values of `source_len` encoder
  outputs for an encoder-decoder). dtype defaults to the model's compute dtype. With a sliding
  `window`, T is the ring's min(window, seq_len) slots, however long the sequence grows."""
  cfg = _config_of(model, 'kv_cache_bytes')
  family = models.registry.get(cfg.family)
  if family.param_counts is None:
    raise ValueError(f'kv_cache_bytes has the formula of the families that register theirs, '
                     f'and family {cfg.family!r} registers none: measure its cache, the nbytes of '
                     'the leaves of transformer_jax.decode.init_cache(model, batch, seq_len).')
  decoding = family.decoding
  if decoding is None:
    raise ValueError(f'A {cfg.family!r} model has no causal mask, so it has no KV cache: '
                     'a new token would change the keys and values of every earlier one.')
  encoder_decoder = decoding == 'encoder_decoder'
  layers = cfg.decoder_layers if encoder_decoder else cfg.num_layers
  slots = seq_len if window is None else min(window, seq_len)
  tokens = slots + (source_len or 0) * encoder_decoder
  itemsize = (jnp.dtype(dtype) if dtype else cfg.compute_dtype).itemsize
  return batch * 2 * layers * tokens * cfg.kv_heads * cfg.head_dim * itemsize


# Any model.

def part_of(path: tuple[str, ...]) -> str:
  """Which part a parameter belongs to, from the names on its path (so that our modules count
  the same inside a model of your own); 'other' for names none of our modules use."""
  if 'head' in path:
    return 'head'
  if 'attn' in path or 'cross_attn' in path or 'relative_attention_bias' in path:
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
  pass (`params` default: the shapes its init gives, so nothing is allocated) or any function.
  XLA counts the body of a loop once: scanned layers, and on the CPU the attention kernel's loop
  over long heads (`attention_kernel='xla'` computes attention without one)."""
  if isinstance(fn, nn.Module):
    module = fn
    if params is None:
      params = jax.eval_shape(module.init, jax.random.key(0), *args)['params']
    fn = lambda p, *a: module.apply({'params': p}, *a)
    args = (nn.meta.unbox(params), *args)
  analysis = jax.jit(fn).lower(*args).cost_analysis()
  return float((analysis[0] if isinstance(analysis, (list, tuple)) else analysis)['flops'])
