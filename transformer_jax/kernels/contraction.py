"""The dense layers' contraction, (..., *in) x (*in, *out) -> (..., *out), in the form each
platform runs fastest: what `layers.Linear` computes, chosen where the step is lowered.

Compiled for XLA:CPU, the product runs as one 2-D matmul over all leading positions, (B*T, in) x
(in, out): XLA:CPU computes the weight gradient of that form much faster than that of the
batched one. Elsewhere it is the plain contraction, which XLA:TPU runs moving fewer bytes
(experiments/results/bench_train has both measurements).

With int8 weights (`quantization.int8_params`), `contract_int8` quantizes the activations too, one
scale per position, and multiplies int8 by int8 into int32, as CTranslate2's int8 inference does:
on XLA:CPU with AVX-512 VNNI or AMX that product runs 1.7x (8 rows) to 8x (40 rows and more) as
fast as the float32 one (experiments/results/bench_systems).

`summed` is jnp.sum, as a product with ones where XLA:CPU's own reduction over outer axes is slow.
"""
import functools
import math

import jax
import jax.numpy as jnp

__all__ = ['as_contraction', 'as_one_matmul', 'contract', 'contract_int8', 'int8_product',
           'int8_rows', 'summed']


def as_one_matmul(x, kernel, num_in: int, out_dtype=None):
  in_size = math.prod(kernel.shape[:num_in])
  y = jnp.dot(x.reshape(-1, in_size), kernel.reshape(in_size, -1), preferred_element_type=out_dtype)
  return y.reshape(x.shape[:x.ndim - num_in] + kernel.shape[num_in:])


def as_contraction(x, kernel, num_in: int, out_dtype=None):
  dims = ((tuple(range(x.ndim - num_in, x.ndim)), tuple(range(num_in))), ((), ()))
  return jax.lax.dot_general(x, kernel, dims, preferred_element_type=out_dtype)


def summed(x: jax.Array, axes: tuple[int, ...], keepdims: bool = False) -> jax.Array:
  """jnp.sum(x, axes); compiled for XLA:CPU, where the last axis is not summed, a product with
  ones. YNNPACK's reduction, XLA:CPU's default, over the outer axes of wide rows runs at a
  small fraction of the memory's speed: on an AMD EPYC with 2 cores, (512, 32,128) summed over
  its rows in 97 ms against 2.3 ms as the product, (8, 6, 512, 512) over its first axis in 94
  against 2 ms (experiments/results/bench_systems). The product adds each column in order
  rather than pairwise: for the hundreds of rows summed here, float32 rounding either way."""
  axes = tuple(sorted(a % x.ndim for a in axes))
  if not axes or x.ndim - 1 in axes:
    return jnp.sum(x, axes, keepdims=keepdims)

  def as_product(x):
    kept = [a for a in range(x.ndim) if a not in axes]
    ones = jnp.ones([x.shape[a] for a in axes], x.dtype)
    out = jnp.einsum(x, list(range(x.ndim)), ones, list(axes), kept)
    return jnp.expand_dims(out, axes) if keepdims else out
  return jax.lax.platform_dependent(
      x, cpu=as_product, default=lambda x: jnp.sum(x, axes, keepdims=keepdims))


def contract(x: jax.Array, kernel: jax.Array, num_in: int, out_dtype=None) -> jax.Array:
  """x's last `num_in` dimensions contracted with the kernel's first `num_in`, in the form of
  the platform the computation is lowered for."""
  forms = [functools.partial(form, num_in=num_in, out_dtype=out_dtype)
           for form in (as_one_matmul, as_contraction)]
  return jax.lax.platform_dependent(x, kernel, cpu=forms[0], default=forms[1])


def int8_rows(x: jax.Array, axes=(-1,)):
  """x as int8 and the float32 scale of each slice along `axes` (kept as size-1 dimensions):
  x ~ q * scale, each slice's largest |x| at 127 (absmax quantization, symmetric)."""
  x = x.astype(jnp.float32)
  scale = jnp.max(jnp.abs(x), axis=axes, keepdims=True) / 127.0
  scale = jnp.where(scale > 0, scale, 1.0)  # an all-zero slice stays zero
  return jnp.round(x / scale).astype(jnp.int8), scale


def int8_product(x: jax.Array, weight: jax.Array, weight_scale: jax.Array,
                 weight_axis: int) -> jax.Array:
  """x (..., K) times a 2-D int8 weight contracted along its axis `weight_axis` (of size K), with
  the float32 scale of each of its N outputs, weight_scale (N,) -> float32 (..., N). x is
  quantized to int8 at each position (LLM.int8's and CTranslate2's dynamic per-row scale,
  Dettmers et al., 2022), the product accumulated in int32, then scaled by both scales. The
  weight is read in the layout it is stored in: a token table (N, K) contracts its axis 1."""
  rows, row_scale = int8_rows(x.reshape(-1, x.shape[-1]))
  # A single row is multiplied as two (the second zero): XLA:CPU compiles a vector's int8
  # product as an int32 one, the weight widened to 4 bytes an entry at every call, 4-7x slower.
  padded = jnp.pad(rows, ((0, 1), (0, 0))) if rows.shape[0] == 1 else rows
  y = jax.lax.dot_general(padded, weight, (((1,), (weight_axis,)), ((), ())),
                          preferred_element_type=jnp.int32)[:rows.shape[0]]
  y = y.astype(jnp.float32) * row_scale * weight_scale.reshape(1, -1).astype(jnp.float32)
  return y.reshape(*x.shape[:-1], -1)


def contract_int8(x: jax.Array, kernel: jax.Array, kernel_scale: jax.Array, num_in: int,
                  out_dtype=None) -> jax.Array:
  """contract(x, kernel * kernel_scale) for an int8 kernel (*in, *out) and the float32 scale of
  each output, kernel_scale (*out), by int8_product; float32 unless out_dtype."""
  in_size = math.prod(kernel.shape[:num_in])
  y = int8_product(x.reshape(*x.shape[:x.ndim - num_in], in_size), kernel.reshape(in_size, -1),
                   kernel_scale, 0)
  return y.reshape(x.shape[:x.ndim - num_in] + kernel.shape[num_in:]).astype(out_dtype or
                                                                              jnp.float32)
