"""The one dense layer every projection uses, with logical axis names on its parameters."""
import math
from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp


def kernel_init(std: float | None, in_axes: int = 1, out_axes: int = 1):
  """N(0, std), or LeCun normal: variance 1 / fan-in, the fan-in being the product of the
  `in_axes` leading (contracted) dimensions. Every trailing output dimension is named as one, so
  that none of them (such as the heads of a (D, heads, head_dim) kernel) counts as a receptive
  field, which would multiply the fan-in."""
  if std is not None:
    return nn.initializers.normal(std)
  return nn.initializers.variance_scaling(
      1.0, 'fan_in', 'truncated_normal', in_axis=tuple(range(in_axes)),
      out_axis=tuple(range(in_axes, in_axes + out_axes)))


class Linear(nn.Module):
  """y = x W + b, contracting the last `len(in_axes)` input dimensions into `features`.

  The kernel keeps the natural multi-dimensional shape (for example (D, heads, head_dim)) so
  that its logical axes can be sharded, but the product runs as one 2-D matmul over all leading
  positions: on XLA's CPU backend the weight gradient of a (B*T, D) product is markedly cheaper
  than that of a (B, T, D) one, and it is no slower elsewhere.
  """
  features: Sequence[int]
  axes: Sequence[str]  # logical names: the contracted input dims, then the output dims
  use_bias: bool = True
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32
  init_std: float | None = 0.02
  out_dtype: jnp.dtype | None = None  # e.g. float32 logits from bfloat16 activations

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    features = tuple(self.features)
    num_in = len(self.axes) - len(features)
    in_shape = x.shape[x.ndim - num_in:]
    kernel = self.param(
        'kernel', nn.with_logical_partitioning(kernel_init(self.init_std, num_in, len(features)),
                                               tuple(self.axes)),
        in_shape + features, self.param_dtype)
    lead = x.shape[:x.ndim - num_in]
    y = jnp.dot(x.reshape(-1, math.prod(in_shape)).astype(self.dtype),
                kernel.reshape(math.prod(in_shape), -1).astype(self.dtype),
                preferred_element_type=self.out_dtype)
    y = y.reshape(lead + features)
    if self.use_bias:
      bias = self.param('bias', nn.with_logical_partitioning(nn.initializers.zeros,
                                                              tuple(self.axes[num_in:])),
                        features, self.param_dtype)
      y = y + bias.astype(y.dtype).reshape((1,) * len(lead) + features)
    return y
