"""Attention of new queries over a KV cache stored (B * kv_heads, S, head_dim).

That is the layout `layers.Attention` keeps its cache in: one leading axis, so that the in-place
update of a decoding step and both products read the cache as it is stored (with slots before
heads, or with the batch and the heads as two axes, XLA copied the whole cache at every step).
"""
import jax
import jax.numpy as jnp

from transformer_jax.kernels import masks

__all__ = ['attention']


def attention(q, k, v, mask=None, *, scale):
  """q (B, T, heads, head_dim) over cached keys and values (B * kv_heads, S, head_dim); mask
  boolean, broadcastable to (B, heads, T, S), or None. Softmax in float32; returns
  (B, T, heads, head_dim)."""
  b, t, h, d = q.shape
  kv_heads = k.shape[0] // b
  q = jnp.swapaxes(q, 1, 2).reshape(b * kv_heads, h // kv_heads * t, d)
  logits = jnp.einsum('nqd,nsd->nqs', q, k, preferred_element_type=jnp.float32) * scale
  if mask is not None:
    grouped = logits.reshape(b, kv_heads, h // kv_heads, t, -1)
    logits = jnp.where(masks.grouped(mask, kv_heads), grouped,
                       jnp.finfo(jnp.float32).min).reshape(logits.shape)
  probs = jax.nn.softmax(logits, axis=-1).astype(v.dtype)
  out = jnp.einsum('nqs,nsd->nqd', probs, v)
  return jnp.swapaxes(out.reshape(b, h, t, d), 1, 2)
