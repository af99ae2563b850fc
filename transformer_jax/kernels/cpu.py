"""Attention laid out for XLA:CPU: heads before positions, with its backward pass written out.

Each group of query heads sharing a key-value head is folded into the query axis, so that every
product is a batched matmul over (B, kv_heads) on operands laid out as it reads them, and the
backward pass takes dQ, dK and dV from the saved probabilities with dS = P (dP - rowsum(dO O)),
as flash attention does, rather than through the softmax's autodiff. In jax.nn's layout XLA:CPU
copies the operands around each product and fuses the softmax's backward into a slow batched
product (measured in experiments/results/bench_train). An additive bias takes dS summed over
the axes it is broadcast along.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax.kernels import masks

__all__ = ['attention']

_HIDDEN = -0.7 * float(np.finfo(np.float32).max)  # the logit jax.nn.dot_product_attention masks to


def attention(q, k, v, mask=None, *, scale, bias=None):
  """The kernel signature of `transformer_jax.kernels`: jax.nn.dot_product_attention's result
  (B, T, heads, head_dim), and its gradients (of the bias too), to float32 rounding."""
  b, t, h, d = q.shape
  kv_heads = k.shape[2]
  group = h // kv_heads
  q = q.reshape(b, t, kv_heads, group, d).transpose(0, 2, 3, 1, 4).reshape(b, kv_heads, -1, d)
  k, v = jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2)
  if mask is not None:
    mask = masks.grouped(mask, kv_heads)
  if bias is not None:
    bias = masks.grouped(bias, kv_heads)
  out = _grouped_attention(q, k, v, mask, bias, scale)
  return out.reshape(b, kv_heads, group, t, d).transpose(0, 3, 1, 2, 4).reshape(b, t, h, d)


def _grouped(x, like):
  """x (B, kv_heads, group * T, S) as (B, kv_heads, group, T, S), `like`'s last two axes."""
  return x.reshape(*x.shape[:2], -1, *like.shape[-2:])


def _where_visible(x, mask, hidden):
  """x (B, kv_heads, group * T, S) where mask (B, ., ., T, S) holds, else `hidden`."""
  if mask is None:
    return x
  return jnp.where(mask, _grouped(x, mask), hidden).reshape(x.shape)


def _plus_bias(logits, bias):
  """logits (B, kv_heads, group * T, S) + bias (B | 1, kv_heads | 1, group | 1, T, S)."""
  if bias is None:
    return logits
  return (_grouped(logits, bias) + bias.astype(jnp.float32)).reshape(logits.shape)


def _summed_to(x, shape):
  """x summed over the axes along which an array of `shape` was broadcast to x's shape."""
  axes = tuple(i for i, (n, m) in enumerate(zip(shape, x.shape)) if n == 1 and m != 1)
  return jnp.sum(x, axis=axes, keepdims=True)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _grouped_attention(q, k, v, mask, bias, scale):
  return _grouped_attention_fwd(q, k, v, mask, bias, scale)[0]


def _grouped_attention_fwd(q, k, v, mask, bias, scale):
  # The scale goes on the queries (T x head_dim), not on the logits (T x S): fused into a
  # library matmul, a scaled product reads the scale broadcast to the logits' full size.
  scaled_q = q * jnp.asarray(scale, q.dtype)
  logits = jnp.einsum('bkqd,bksd->bkqs', scaled_q, k, preferred_element_type=jnp.float32)
  probs = jax.nn.softmax(_where_visible(_plus_bias(logits, bias), mask, _HIDDEN), axis=-1)
  out = jnp.einsum('bkqs,bksd->bkqd', probs.astype(v.dtype), v)
  return out, (scaled_q, k, v, mask, bias, probs, out)


def _grouped_attention_bwd(scale, residuals, d_out):
  scaled_q, k, v, mask, bias, probs, out = residuals
  d_v = jnp.einsum('bkqs,bkqd->bksd', probs.astype(d_out.dtype), d_out)
  d_probs = jnp.einsum('bkqd,bksd->bkqs', d_out, v, preferred_element_type=jnp.float32)
  rowsum = jnp.sum(d_out.astype(jnp.float32) * out.astype(jnp.float32), -1, keepdims=True)
  # Hidden logits get no gradient, as through jnp.where (a fully masked row has P uniform).
  d_biased = _where_visible(probs * (d_probs - rowsum), mask, 0.0)
  d_bias = None if bias is None else _summed_to(_grouped(d_biased, bias),
                                                bias.shape).astype(bias.dtype)
  d_logits = d_biased.astype(scaled_q.dtype)  # of the scaled logits
  d_q = jnp.einsum('bkqs,bksd->bkqd', d_logits, k) * jnp.asarray(scale, scaled_q.dtype)
  d_k = jnp.einsum('bkqs,bkqd->bksd', d_logits, scaled_q)
  return d_q, d_k.astype(k.dtype), d_v.astype(v.dtype), None, d_bias


_grouped_attention.defvjp(_grouped_attention_fwd, _grouped_attention_bwd)
