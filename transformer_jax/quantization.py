"""int8 inference: the dense layers' and token tables' weights in int8, one float32 scale per
output, and the activations quantized at each position as they enter a product (dynamic absmax
quantization, as LLM.int8 (Dettmers et al., 2022) without its outlier columns, and as
CTranslate2's int8 models compute). The products run int8 by int8 into int32
(`kernels.contraction.contract_int8`): on a CPU with AVX-512 VNNI or AMX, 1.7-8x as fast as
float32, the more rows the more (experiments/results/bench_systems: Whisper's transcription
1.3-2.5x as fast as in float32).

    params8 = int8_params(model_config, params)  # then model.apply({'params': params8}, ...)

The model needs no change: a `layers.Linear` whose parameters hold a 'kernel_scale', and a
`layers.TextEmbed` whose hold a 'tokens_scale', run their int8 forms. For inference only: the
scales are not trained, and rounding has no gradient.
"""
from typing import Any, Mapping

import flax.linen as nn
import jax.numpy as jnp
from flax import traverse_util

from transformer_jax import models
from transformer_jax.kernels.contraction import int8_rows
from transformer_jax.layers.embeddings import TextEmbed
from transformer_jax.layers.linear import Linear
from transformer_jax.model_config import ModelConfig

__all__ = ['int8_params', 'is_int8']


def int8_params(model: ModelConfig | Mapping[str, Any], params):
  """`params` of the model `model` (a ModelConfig or its dict) with each dense layer's kernel
  (*in, *out) as int8 beside 'kernel_scale' (*out), the largest |w| of each output at 127, and
  each token table (vocab, width) as int8 beside 'tokens_scale' (vocab,), one per row (the
  tied unembedding's outputs). Every other parameter (norms, biases, positions, convolutions)
  is kept as it is; blocks stacked by scan_layers get a scale per block."""
  if is_int8(params):
    raise ValueError('These parameters are int8 already (they hold a kernel_scale or '
                     'tokens_scale): quantize the float parameters once.')
  scaled_axes = _quantized_leaves(model)
  flat = traverse_util.flatten_dict(params)
  missing = [path for path in scaled_axes if path not in flat]
  if missing:
    raise ValueError(f'The parameters do not match the model: no {"/".join(missing[0])} '
                     f'({len(missing)} dense or token-table weights missing).')
  quantized = {}
  for path, value in flat.items():
    axes = scaled_axes.get(path)
    if axes is None:
      quantized[path] = value
      continue
    quantized[path], scale = int8_rows(value, axes)
    quantized[(*path[:-1], f'{path[-1]}_scale')] = jnp.squeeze(scale, axes)
  return traverse_util.unflatten_dict(quantized)


def is_int8(params) -> bool:
  """Whether a parameter tree holds int8 weights (made by int8_params)."""
  return any(path[-1] in ('kernel_scale', 'tokens_scale')
             for path in traverse_util.flatten_dict(params))


def _quantized_leaves(model) -> dict[tuple[str, ...], tuple[int, ...]]:
  """{path of a weight to quantize: the axes each scale spans (negative, from the end, so that
  a stacked block's leading axis keeps a scale per block)}, found by tracing the model's init
  and noting the modules it calls: every Linear's kernel, every TextEmbed's token table."""
  found = {}

  def note(next_fun, args, kwargs, context):
    module = context.module
    if isinstance(module, Linear):
      outputs, inputs = len(module.features), len(module.in_axes)
      found[(*module.path, 'kernel')] = tuple(range(-outputs - inputs, -outputs))
    elif isinstance(module, TextEmbed):
      found[(*module.path, 'tokens')] = (-1,)
    return next_fun(*args, **kwargs)

  with nn.intercept_methods(note):
    models.abstract_variables(model)
  return found
