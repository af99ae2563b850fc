"""Attention laid out for XLA:CPU: heads before positions, with its backward pass written out.

Each group of query heads sharing a key-value head is folded into the query axis, so that every
product is a batched matmul over (B, kv_heads) on operands laid out as it reads them, and the
backward pass takes dQ, dK and dV from the saved probabilities with dS = P (dP - rowsum(dO O)),
as flash attention does, rather than through the softmax's autodiff. In jax.nn's layout XLA:CPU
copies the operands around each product and fuses the softmax's backward into a slow batched
product (measured in experiments/results/bench_train). An additive bias takes dS summed over
the axes it is broadcast along.

Where a head's scores are many (long sequences: Whisper's 1,500 frames), each (batch, key-value
head) runs on its own in a loop, so that its scores stay in the cache rather than make a
(B, heads, T, S) array in memory, and the backward pass recomputes the probabilities from each
row's maximum and log-sum instead of saving them, as flash attention does (Dao et al., 2022).
The loop runs on one device, or on each device's own share inside shard_map; a jit step that
spreads the batch over several devices takes the batched products.
"""
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax.kernels import masks
from transformer_jax.kernels.contraction import summed

__all__ = ['attention']

_HIDDEN = -0.7 * float(np.finfo(np.float32).max)  # the logit jax.nn.dot_product_attention masks to
# The per-head loop runs where each (batch, key-value head)'s scores are at least this many
# query rows (a group's queries together) by as many keys. Measured on 2 cores
# (experiments/results/bench_attention), forward and backward against the batched products:
# 1.0-1.6x as fast at 448 x 448, 1.1-1.7x at 1,500 x 1,500 (the lower figures with the freed
# memory kept mapped, as launch.py runs); at 320 x 320 0.8-1.3x, at 256 x 256 (DiT-S/2) 0.6x.
_PER_HEAD_FROM = 384


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
  if bias is None and _loops_over_heads(q.shape[2], k.shape[2]) and not _spread_by_jit():
    out = _per_head_attention(q, k, v, mask, scale)
  else:
    out = _grouped_attention(q, k, v, mask, bias, scale)
  return out.reshape(b, kv_heads, group, t, d).transpose(0, 3, 1, 2, 4).reshape(b, t, h, d)


def _loops_over_heads(query_rows: int, keys: int) -> bool:
  """Whether scores of query_rows x keys per (batch, key-value head) are long enough for the
  per-head loop (a bias and a spread batch aside)."""
  return min(query_rows, keys) >= _PER_HEAD_FROM


def _spread_by_jit() -> bool:
  """Whether the step lays its arrays over several devices by GSPMD (a jit step on a mesh of
  more than one device), where the loop's index into the batch would gather the whole batch
  onto every device (XLA's all-gather, measured on 8 simulated devices). Inside shard_map the
  arrays are each device's own, and a loop is local."""
  mesh = jax.sharding.get_abstract_mesh()
  return math.prod(size for name, size in mesh.shape.items() if name not in mesh.manual_axes) > 1


def _grouped(x, like):
  """x (..., group * T, S) as (..., group, T, S), `like`'s last two axes."""
  return x.reshape(*x.shape[:-2], -1, *like.shape[-2:])


def _where_visible(x, mask, hidden):
  """x (..., group * T, S) where mask (..., group | 1, T, S) holds, else `hidden`."""
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
  return summed(x, axes, keepdims=True)


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
  d_biased, d_q, d_k, d_v = _from_probabilities(probs, mask, scaled_q, k, v, out, d_out)
  d_bias = None if bias is None else _summed_to(_grouped(d_biased, bias),
                                                bias.shape).astype(bias.dtype)
  return d_q * jnp.asarray(scale, scaled_q.dtype), d_k, d_v, None, d_bias


def _from_probabilities(probs, mask, scaled_q, k, v, out, d_out):
  """The gradients of the biased logits (float32), of the scaled queries, the keys and the
  values from the probabilities, both paths' (any leading axes): dS = P (dP - rowsum(dO O))."""
  d_v = jnp.einsum('...qs,...qd->...sd', probs.astype(d_out.dtype), d_out)
  d_probs = jnp.einsum('...qd,...sd->...qs', d_out, v, preferred_element_type=jnp.float32)
  rowsum = jnp.sum(d_out.astype(jnp.float32) * out.astype(jnp.float32), -1, keepdims=True)
  # Hidden logits get no gradient, as through jnp.where (a fully masked row has P uniform).
  d_biased = _where_visible(probs * (d_probs - rowsum), mask, 0.0)
  d_logits = d_biased.astype(scaled_q.dtype)  # of the scaled logits
  d_q = jnp.einsum('...qs,...sd->...qd', d_logits, k)
  d_k = jnp.einsum('...qs,...qd->...sd', d_logits, scaled_q)
  return d_biased, d_q, d_k.astype(k.dtype), d_v.astype(v.dtype)


_grouped_attention.defvjp(_grouped_attention_fwd, _grouped_attention_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _per_head_attention(q, k, v, mask, scale):
  return _per_head_attention_fwd(q, k, v, mask, scale)[0]


def _each_head(fn, mask, *arrays):
  """fn(mask, *arrays) of each (batch, key-value head) in turn: arrays (B, kv_heads, ...) and the
  mask (B | 1, kv_heads | 1, group | 1, T, S) indexed by both; the results stacked back."""
  b, kv_heads = arrays[0].shape[:2]

  def one(index):
    i, j = index // kv_heads, index % kv_heads
    head_mask = None if mask is None else mask[i % mask.shape[0], j % mask.shape[1]]
    return fn(head_mask, *(x[i, j] for x in arrays))

  results = jax.lax.map(one, jnp.arange(b * kv_heads))
  return jax.tree.map(lambda x: x.reshape(b, kv_heads, *x.shape[1:]), results)


def _head_logits(mask, scaled_q, k):
  """One head's masked logits (group * T, S) in float32."""
  logits = jnp.einsum('qd,sd->qs', scaled_q, k, preferred_element_type=jnp.float32)
  return _where_visible(logits, mask, _HIDDEN)


def _head_forward(mask, scaled_q, k, v):
  logits = _head_logits(mask, scaled_q, k)
  top = jnp.max(logits, axis=-1, keepdims=True)
  unnormalized = jnp.exp(logits - top)
  total = jnp.sum(unnormalized, axis=-1, keepdims=True)
  out = jnp.einsum('qs,sd->qd', (unnormalized / total).astype(v.dtype), v)
  # The maximum and the log-sum apart: a row that sees no key has every logit at _HIDDEN, beside
  # which the log of the keys' number vanishes in float32.
  return out, (top, jnp.log(total))


def _head_backward(mask, scaled_q, k, v, out, top, log_total, d_out):
  probs = jnp.exp(_head_logits(mask, scaled_q, k) - top - log_total)
  return _from_probabilities(probs, mask, scaled_q, k, v, out, d_out)[1:]


def _per_head_attention_fwd(q, k, v, mask, scale):
  scaled_q = q * jnp.asarray(scale, q.dtype)
  out, (top, log_total) = _each_head(_head_forward, mask, scaled_q, k, v)
  return out, (scaled_q, k, v, mask, out, top, log_total)


def _per_head_attention_bwd(scale, residuals, d_out):
  scaled_q, k, v, mask, out, top, log_total = residuals
  d_q, d_k, d_v = _each_head(_head_backward, mask, scaled_q, k, v, out, top, log_total, d_out)
  return d_q * jnp.asarray(scale, scaled_q.dtype), d_k, d_v, None


_per_head_attention.defvjp(_per_head_attention_fwd, _per_head_attention_bwd)
