"""The one dense layer every projection uses, with logical axis names on its parameters."""
import math
from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer_jax.kernels.contraction import contract, contract_int8

__all__ = ['INITS', 'kernel_init', 'Linear', 'xavier_uniform']

# How a kernel is drawn: 'normal', N(0, init_std) (LeCun normal where init_std is None);
# 'xavier_uniform' (Glorot & Bengio 2010), PyTorch's xavier_uniform_ of the (fan_in, fan_out)
# matrix, which DiT draws its blocks' kernels from.
INITS = ('normal', 'xavier_uniform')


def kernel_init(std: float | None, in_axes: int = 1, out_axes: int = 1, gain: float = 1.0):
  """N(0, std), or LeCun normal: variance 1 / fan-in, the fan-in being the product of the
  `in_axes` leading (contracted) dimensions; either times `gain` (standard deviations). Every
  trailing output dimension is named as one, so that none of them (such as the heads of a
  (D, heads, head_dim) kernel) counts as a receptive field, which would multiply the fan-in."""
  if std is not None:
    return nn.initializers.normal(std * gain)
  return nn.initializers.variance_scaling(
      gain ** 2, 'fan_in', 'truncated_normal', in_axis=tuple(range(in_axes)),
      out_axis=tuple(range(in_axes, in_axes + out_axes)))


def xavier_uniform(fan_in: int, fan_out: int, gain: float = 1.0):
  """U(-a, a) with a = gain * sqrt(6 / (fan_in + fan_out)) (standard deviation gain *
  sqrt(2 / (fan_in + fan_out))), as torch.nn.init.xavier_uniform_ of a (fan_out, fan_in)
  matrix. The fans are given, not read from the shape: a kernel with several input or output
  dimensions, or one part of a wider matrix of the original, has the fans of that matrix."""
  limit = gain * math.sqrt(6.0 / (fan_in + fan_out))
  return lambda key, shape, dtype=jnp.float32: jax.random.uniform(key, shape, dtype, -limit,
                                                                  limit)


class Linear(nn.Module):
  """y = x W + b: the trailing len(in_axes) dimensions of x contracted into `features`.

    Linear((heads, head_dim), in_axes=('embed',), out_axes=('heads', 'head_dim'))  # x (B, T, D)
    Linear((width,), in_axes=('heads', 'head_dim'), out_axes=('embed',))  # x (B, T, heads, hd)

  `in_axes` and `out_axes` are the logical names of the contracted and the output dimensions
  (what sharding rules refer to); their lengths say how many dimensions each side has. The
  kernel keeps the natural multi-dimensional shape, in_shape + features (see
  `kernels.contraction`, which picks the platform's form of the product). `initializer` (INITS)
  draws it N(0, init_std) or Xavier-uniform over fan-in prod(in_shape) and fan-out
  prod(features) (`init_fan_out` where the kernel is a part of a wider matrix, such as the
  queries of a fused query-key-value projection); biases start at zero. Parameters with an int8
  kernel and its 'kernel_scale' (`quantization.int8_params`) run the int8 product
  (`kernels.contraction.contract_int8`).
  """
  features: Sequence[int]
  in_axes: Sequence[str]
  out_axes: Sequence[str]
  use_bias: bool = True
  init_std: float | None = 0.02  # None: LeCun normal
  init_gain: float = 1.0  # times the initial standard deviation
  initializer: str = 'normal'  # one of INITS
  init_fan_out: int | None = None  # Xavier's fan-out; None: prod(features)
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  out_dtype: Any = None  # e.g. float32 logits from bfloat16 activations

  def __post_init__(self):
    if len(self.out_axes) != len(self.features) or not self.in_axes:
      raise ValueError(f'Linear{tuple(self.features)}: out_axes {tuple(self.out_axes)} must name '
                       f'each of the {len(self.features)} output dimensions, and in_axes '
                       f'{tuple(self.in_axes)} at least one contracted input dimension.')
    if any(f < 1 for f in self.features):
      raise ValueError(f'Linear features {tuple(self.features)} must be positive.')
    if self.initializer not in INITS:
      raise ValueError(f'Unknown Linear initializer {self.initializer!r}: use one of '
                       f'{list(INITS)}.')
    super().__post_init__()

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    """x (..., *in_shape) -> (..., *features), in `out_dtype` (default: `dtype`); in_shape is
    x's last len(in_axes) dimensions."""
    features, num_in = tuple(self.features), len(self.in_axes)
    if x.ndim <= num_in:
      raise ValueError(f'Linear contracts the last {num_in} dimensions {tuple(self.in_axes)} of '
                       f'its input, which has shape {x.shape}: it needs at least one more '
                       '(leading) dimension.')
    in_shape = x.shape[x.ndim - num_in:]
    if self.initializer == 'xavier_uniform':
      draw = xavier_uniform(math.prod(in_shape), self.init_fan_out or math.prod(features),
                            self.init_gain)
    else:
      draw = kernel_init(self.init_std, num_in, len(features), self.init_gain)
    kernel = self.param(
        'kernel', nn.with_logical_partitioning(draw, (*self.in_axes, *self.out_axes)),
        in_shape + features, self.param_dtype)
    if self.has_variable('params', 'kernel_scale'):
      y = contract_int8(x, kernel, self.get_variable('params', 'kernel_scale'), num_in,
                        self.out_dtype or self.dtype)
    else:
      y = contract(x.astype(self.dtype), kernel.astype(self.dtype), num_in, self.out_dtype)
    if self.use_bias:
      bias = self.param('bias', nn.with_logical_partitioning(nn.initializers.zeros,
                                                              tuple(self.out_axes)),
                        features, self.param_dtype)
      y = y + bias.astype(y.dtype).reshape((1,) * (y.ndim - len(features)) + features)
    return y
