"""The dense layers' contraction, (..., *in) x (*in, *out) -> (..., *out), in the form each
platform runs fastest: what `layers.Linear` computes, chosen where the step is lowered.

Compiled for XLA:CPU, the product runs as one 2-D matmul over all leading positions, (B*T, in) x
(in, out): XLA:CPU computes the weight gradient of that form much faster than that of the
batched one. Elsewhere it is the plain contraction, which XLA:TPU runs moving fewer bytes
(experiments/results/bench_train has both measurements).
"""
import functools
import math

import jax
import jax.numpy as jnp

__all__ = ['as_contraction', 'as_one_matmul', 'contract']


def as_one_matmul(x, kernel, num_in: int, out_dtype=None):
  in_size = math.prod(kernel.shape[:num_in])
  y = jnp.dot(x.reshape(-1, in_size), kernel.reshape(in_size, -1), preferred_element_type=out_dtype)
  return y.reshape(x.shape[:x.ndim - num_in] + kernel.shape[num_in:])


def as_contraction(x, kernel, num_in: int, out_dtype=None):
  dims = ((tuple(range(x.ndim - num_in, x.ndim)), tuple(range(num_in))), ((), ()))
  return jax.lax.dot_general(x, kernel, dims, preferred_element_type=out_dtype)


def contract(x: jax.Array, kernel: jax.Array, num_in: int, out_dtype=None) -> jax.Array:
  """x's last `num_in` dimensions contracted with the kernel's first `num_in`, in the form of
  the platform the computation is lowered for."""
  forms = [functools.partial(form, num_in=num_in, out_dtype=out_dtype)
           for form in (as_one_matmul, as_contraction)]
  return jax.lax.platform_dependent(x, kernel, cpu=forms[0], default=forms[1])
