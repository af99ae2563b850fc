"""The plain einsum attention: the definition every other kernel is tested against."""
import jax
import jax.numpy as jnp

from transformer_jax.kernels import masks

__all__ = ['attention', 'weights']


def weights(q, k, mask, scale, bias=None):
  """softmax(Q K^T * scale + bias) in float32 (B, heads, T, S), hidden keys at zero weight.

  q (B, T, heads, head_dim); k (B, S, kv_heads, head_dim); mask boolean, broadcastable to
  (B, heads, T, S), or None; bias float, broadcastable to (B, heads, T, S), or None. A query
  that sees no key weighs all keys alike, as jax.nn does.
  """
  b, t, h, d = q.shape
  kv_heads = k.shape[2]
  q = q.reshape(b, t, kv_heads, h // kv_heads, d)
  logits = jnp.einsum('btkgd,bskd->bkgts', q, k, preferred_element_type=jnp.float32) * scale
  if bias is not None:
    logits = logits + masks.grouped(bias, kv_heads).astype(jnp.float32)
  if mask is not None:
    logits = jnp.where(masks.grouped(mask, kv_heads), logits, jnp.finfo(jnp.float32).min)
  return jax.nn.softmax(logits, axis=-1).reshape(b, h, t, -1)


def attention(q, k, v, mask=None, *, scale, bias=None):
  """The kernel signature of `transformer_jax.kernels`: (B, T, heads, head_dim) out."""
  b, t, h, d = q.shape
  kv_heads = k.shape[2]
  probs = weights(q, k, mask, scale, bias).reshape(b, kv_heads, h // kv_heads, t, -1)
  out = jnp.einsum('bkgts,bskd->btkgd', probs.astype(v.dtype), v)
  return out.reshape(b, t, h, d)
