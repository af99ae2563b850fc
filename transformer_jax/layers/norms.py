"""LayerNorm and RMSNorm, computed in float32 whatever the compute dtype."""
import flax.linen as nn
import jax
import jax.numpy as jnp

__all__ = ['LayerNorm', 'RMSNorm']


class _Norm(nn.Module):
  """What both norms take: eps, the output dtype and the dtype of their (D,) parameters."""
  eps: float = 1e-6
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32

  def __post_init__(self):
    if not self.eps > 0:  # NaN fails too
      raise ValueError(f'{type(self).__name__} eps={self.eps} must be positive and finite.')
    super().__post_init__()

  def _param(self, name: str, init, x: jax.Array) -> jax.Array:
    """A (D,) parameter in float32, shaped to broadcast against x."""
    value = self.param(name, nn.with_logical_partitioning(init, ('norm',)), (x.shape[-1],),
                       self.param_dtype)
    return value.astype(jnp.float32).reshape((1,) * (x.ndim - 1) + (-1,))


class LayerNorm(_Norm):
  """(x - mean) / sqrt(var + eps) * scale (+ shift), over the last axis."""
  eps: float = 1e-5
  use_bias: bool = True

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    """x (..., D) -> (..., D), normalized over D in float32, returned in `dtype`."""
    x32 = x.astype(jnp.float32)
    mean = x32.mean(-1, keepdims=True)
    var = jnp.square(x32 - mean).mean(-1, keepdims=True)
    y = (x32 - mean) * jax.lax.rsqrt(var + self.eps) * self._param('scale', nn.initializers.ones, x)
    if self.use_bias:
      y = y + self._param('bias', nn.initializers.zeros, x)
    return y.astype(self.dtype)


class RMSNorm(_Norm):
  """x / sqrt(mean(x^2) + eps) * scale, over the last axis."""

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    """x (..., D) -> (..., D), normalized over D in float32, returned in `dtype`."""
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.square(x32).mean(-1, keepdims=True) + self.eps)
    return (y * self._param('scale', nn.initializers.ones, x)).astype(self.dtype)
