"""Conditioning layers of a diffusion transformer (Peebles & Xie 2023, DiT): adaLN-Zero, the
timestep embedder and the class table with a null class for classifier-free guidance."""
import math
from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax.layers.linear import Linear

__all__ = ['AdaLNZero', 'LabelEmbed', 'TimestepEmbed', 'timestep_frequencies']


class AdaLNZero(nn.Module):
  """Adaptive layer norm, zero-initialised (adaLN-Zero): a LayerNorm without parameters of its
  own whose shift and scale, and the gate of the sublayer it feeds, are a linear map of
  silu(condition); the map starts at zero, so a gated sublayer starts by adding nothing.

    norm = AdaLNZero()
    h, gate = norm.apply(params, x, condition)  # x (B, T, D), condition (B, C)
    x = x + gate * f(h)

  A conditioned norm (`conditioned`): layers.Block calls it as norm(x, encoded), `encoded` being
  the conditioning vector, and adds gate * f(h). gated=False: DiT's final layer, which returns
  h alone. The map's kernel is (C, 3 or 2, D) (shift, scale[, gate]): DiT's adaLN_modulation of
  a block, (C, 6D), is the two sublayers' side by side.
  """
  conditioned: ClassVar[bool] = True
  gated: bool = True
  eps: float = 1e-6
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array, condition: jax.Array):
    """x (B, T, D), condition (B, C) -> h (B, T, D) in `dtype`, and with `gated` the gate
    (B, 1, D)."""
    if condition is None or condition.ndim != 2 or condition.shape[0] != x.shape[0]:
      raise ValueError(f'AdaLNZero needs a conditioning vector (B, C) for x {x.shape}, got '
                       f'{getattr(condition, "shape", None)}: pass it as the block\'s `encoded`.')
    parts = 3 if self.gated else 2
    modulation = Linear((parts, x.shape[-1]), ('embed',), (None, 'modulation'), init_std=0.0,
                        dtype=self.dtype, param_dtype=self.param_dtype, out_dtype=jnp.float32,
                        name='modulation')(jax.nn.silu(condition.astype(jnp.float32)))
    shift, scale = modulation[:, None, 0], modulation[:, None, 1]
    x32 = x.astype(jnp.float32)
    mean = x32.mean(-1, keepdims=True)
    var = jnp.square(x32 - mean).mean(-1, keepdims=True)
    h = ((x32 - mean) * jax.lax.rsqrt(var + self.eps) * (1 + scale) + shift).astype(self.dtype)
    return (h, modulation[:, None, 2].astype(self.dtype)) if self.gated else h


def timestep_frequencies(timesteps: jax.Array, dim: int, max_period: float = 10000.0):
  """DiT's (and ADM's) sinusoidal embedding of (B,) timesteps: [cos(t f), sin(t f)] with
  f_i = max_period^(-i / half) for i < half = dim // 2 (a zero column after them for odd dim),
  float32 (B, dim)."""
  half = dim // 2
  freqs = np.exp(-math.log(max_period) * np.arange(half, dtype=np.float32) / half)
  args = timesteps.astype(jnp.float32)[:, None] * freqs[None]
  embedding = jnp.concatenate([jnp.cos(args), jnp.sin(args)], axis=-1)
  if dim % 2:
    embedding = jnp.concatenate([embedding, jnp.zeros_like(embedding[:, :1])], axis=-1)
  return embedding


class TimestepEmbed(nn.Module):
  """Timesteps (B,) -> (B, features): `frequency_dim` sinusoidal frequencies
  (timestep_frequencies), then Linear, SiLU, Linear, as DiT's TimestepEmbedder (kernels drawn
  N(0, init_std), as DiT's)."""
  features: int
  frequency_dim: int = 256
  init_std: float | None = 0.02
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, timesteps: jax.Array) -> jax.Array:
    dense = lambda in_axis, out_axis, name: Linear(
        (self.features,), (in_axis,), (out_axis,), init_std=self.init_std, dtype=self.dtype,
        param_dtype=self.param_dtype, name=name)
    frequencies = timestep_frequencies(timesteps, self.frequency_dim)
    h = dense('frequencies', 'mlp', 'dense_in')(frequencies)
    return dense('mlp', 'embed', 'dense_out')(jax.nn.silu(h))


class LabelEmbed(nn.Module):
  """Class labels (B,) -> rows (B, features) of a table of num_classes + 1 rows, the last the
  "null" class (`null_class`), which classifier-free guidance conditions on for the
  unconditional prediction (Ho & Salimans 2022; DiT's LabelEmbedder with dropout)."""
  num_classes: int
  features: int
  init_std: float = 0.02
  param_dtype: Any = jnp.float32

  @property
  def null_class(self) -> int:
    return self.num_classes

  @nn.compact
  def __call__(self, labels: jax.Array) -> jax.Array:
    table = self.param('table', nn.with_logical_partitioning(
        nn.initializers.normal(self.init_std), ('classes', 'embed')),
                       (self.num_classes + 1, self.features), self.param_dtype)
    return jnp.take(table, labels, axis=0)
