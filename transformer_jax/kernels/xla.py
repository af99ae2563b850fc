"""XLA's attention: `jax.nn.dot_product_attention(implementation='xla')`, on every platform."""
import jax

__all__ = ['attention']


def attention(q, k, v, mask=None, *, scale, bias=None):
  """The kernel signature of `transformer_jax.kernels`: (B, T, heads, head_dim) out."""
  return jax.nn.dot_product_attention(q, k, v, bias=bias, mask=mask, scale=scale,
                                      implementation='xla')
