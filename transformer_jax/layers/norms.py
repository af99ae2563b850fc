"""LayerNorm and RMSNorm, computed in float32 whatever the compute dtype."""
import flax.linen as nn
import jax
import jax.numpy as jnp


class LayerNorm(nn.Module):
  """(x - mean) / sqrt(var + eps) * scale (+ shift), over the last axis."""
  eps: float = 1e-5
  use_bias: bool = True
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32

  def __post_init__(self):
    _check_eps(self)
    super().__post_init__()

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    """x (..., D) -> (..., D), normalized over D in float32, returned in `dtype`."""
    x32 = x.astype(jnp.float32)
    mean = x32.mean(-1, keepdims=True)
    var = jnp.square(x32 - mean).mean(-1, keepdims=True)
    y = (x32 - mean) * jax.lax.rsqrt(var + self.eps)
    y = y * _param(self, 'scale', nn.initializers.ones, x)
    if self.use_bias:
      y = y + _param(self, 'bias', nn.initializers.zeros, x)
    return y.astype(self.dtype)


class RMSNorm(nn.Module):
  """x / sqrt(mean(x^2) + eps) * scale, over the last axis."""
  eps: float = 1e-6
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32

  def __post_init__(self):
    _check_eps(self)
    super().__post_init__()

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    """x (..., D) -> (..., D), normalized over D in float32, returned in `dtype`."""
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.square(x32).mean(-1, keepdims=True) + self.eps)
    y = y * _param(self, 'scale', nn.initializers.ones, x)
    return y.astype(self.dtype)


def _param(module: nn.Module, name: str, init, x: jax.Array) -> jax.Array:
  """A (D,) float32 parameter, shaped to broadcast against x."""
  value = module.param(name, nn.with_logical_partitioning(init, ('norm',)), (x.shape[-1],),
                       module.param_dtype)
  return value.astype(jnp.float32).reshape((1,) * (x.ndim - 1) + (-1,))


def _check_eps(norm: nn.Module) -> None:
  if not norm.eps > 0:  # NaN fails too
    raise ValueError(f'{type(norm).__name__} eps={norm.eps} must be positive and finite.')
