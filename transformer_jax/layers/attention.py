"""Multi-head attention (MHA, GQA, MQA; self and cross) with its KV cache, and mask helpers."""
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax.layers import axes
from transformer_jax.layers.embeddings import apply_rope
from transformer_jax.layers.linear import Linear


def causal_mask(query_slots: jax.Array, positions: jax.Array, kv_len: int,
                window: int | None = None) -> jax.Array:
  """(B, 1, T, kv_len): a query sees the keys from its row's first token up to itself, and with
  `window` only the last `window` of them (itself included): a banded causal mask.

  `query_slots` (T,) are the slots of the queries in their row's sequence (0..T-1 without a
  cache; the cache index onwards with one); `positions` (B, T) their token positions. A row whose
  prompt is left-padded by k slots has positions starting at -k, so its first real token sits at
  slot k and the padding slots before it are never seen.

  The kv_len key slots are a ring: key slot j holds the latest token at or before the query
  whose slot is j modulo kv_len. While the slots stay below kv_len that is token j itself (or
  none, for j after the query); a sliding-window cache of kv_len = window slots that wrote
  token s at slot s % window holds exactly the query's last `window` tokens (one query per call
  once the ring wraps: several would overwrite keys that the earlier of them still see).
  """
  held = query_slots[:, None] - (query_slots[:, None] - jnp.arange(kv_len)[None, :]) % kv_len
  first_slot = query_slots[None, :] - positions  # (B, T)
  visible = (held[None] >= 0) & (held[None] >= first_slot[:, :, None])
  if window is not None:
    visible &= held[None] > query_slots[None, :, None] - window
  return visible[:, None]


def padding_mask(valid: jax.Array, num_queries: int) -> jax.Array:
  """(B, 1, T, S) from the keys' validity (B, S): every query sees every valid key."""
  return jnp.broadcast_to(valid[:, None, None, :], (valid.shape[0], 1, num_queries, valid.shape[1]))


def reference_attention(q, k, v, mask, scale):
  """Plain einsum attention with a float32 softmax, the check on `jax.nn.dot_product_attention`.

  Returns the output (B, T, heads, head_dim) and the attention weights (B, heads, T, S).
  """
  b, t, h, d = q.shape
  kv_heads = k.shape[2]
  q = q.reshape(b, t, kv_heads, h // kv_heads, d)
  logits = jnp.einsum('btkgd,bskd->bkgts', q, k, preferred_element_type=jnp.float32) * scale
  if mask is not None:
    logits = jnp.where(mask[:, :, None], logits, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(logits, axis=-1).astype(v.dtype)
  out = jnp.einsum('bkgts,bskd->btkgd', probs, v).reshape(b, t, h, d)
  return out, probs.reshape(b, h, t, -1)


def cached_attention(q, k, v, mask, scale):
  """Queries (B, T, heads, head_dim) over a cache of keys and values (B * kv_heads, S, head_dim),
  with a float32 softmax; returns (B, T, heads, head_dim).

  Each group's query heads are folded into the query axis, so that both products are batched
  matmuls over the cache's leading axis that read it in the order it is stored. The same
  products with the batch and the heads as two axes, as `heads_first_attention` computes them
  for training, decoded the reference LM 6 times slower at batch 32 (821 against 4,914 tokens/s
  over 1,024 tokens, whole context): XLA copied the cache at every step.
  """
  b, t, h, d = q.shape
  kv_heads = k.shape[0] // b
  q = jnp.swapaxes(q, 1, 2).reshape(b * kv_heads, h // kv_heads * t, d)
  logits = jnp.einsum('nqd,nsd->nqs', q, k, preferred_element_type=jnp.float32) * scale
  if mask is not None:
    grouped = logits.reshape(b, kv_heads, h // kv_heads, t, -1)
    logits = jnp.where(mask[:, :, None], grouped, jnp.finfo(jnp.float32).min).reshape(logits.shape)
  probs = jax.nn.softmax(logits, axis=-1).astype(v.dtype)
  out = jnp.einsum('nqs,nsd->nqd', probs, v)
  return jnp.swapaxes(out.reshape(b, h, t, d), 1, 2)


def heads_first_attention(q, k, v, mask, scale):
  """jax.nn.dot_product_attention's result (B, T, heads, head_dim), computed with the heads
  before the positions and with its backward pass written out: the attention XLA:CPU runs fast.

  q (B, T, heads, head_dim); k and v (B, S, kv_heads, head_dim); mask broadcastable to
  (B, heads, T, S), or None. Each group's query heads are folded into the query axis, so that
  every product is a batched matmul over (B, kv_heads) on operands laid out as it reads them.
  The backward pass takes dQ, dK and dV from the saved probabilities, with
  dS = P (dP - rowsum(dO O)) as flash attention does, rather than through the softmax's autodiff.

  Why, measured on the reference LM's train step (B=32, T=64, 4 heads of 32, 2-core CPU): in
  jax.nn.dot_product_attention's layout (B, T, heads, head_dim), XLA copies the operands around
  each product and fuses the softmax's backward into a batched matmul that took 2 ms per layer;
  this version took the step from 73 to 68 ms.
  """
  b, t, h, d = q.shape
  kv_heads = k.shape[2]
  group = h // kv_heads
  q = q.reshape(b, t, kv_heads, group, d).transpose(0, 2, 3, 1, 4).reshape(b, kv_heads, -1, d)
  k, v = jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2)
  if mask is not None:  # (B, 1 | kv_heads, 1 | group, T, S), as the grouped logits are
    split = min(mask.shape[1], kv_heads)
    mask = mask.reshape(mask.shape[0], split, mask.shape[1] // split, *mask.shape[2:])
  out = _grouped_attention(q, k, v, mask, scale)
  return out.reshape(b, kv_heads, group, t, d).transpose(0, 3, 1, 2, 4).reshape(b, t, h, d)


_HIDDEN = -0.7 * float(np.finfo(np.float32).max)  # the logit jax.nn.dot_product_attention masks to


def _where_visible(x, mask, hidden):
  """x (B, kv_heads, group * T, S) where mask (B, ., ., T, S) holds, else `hidden`."""
  if mask is None:
    return x
  grouped = x.reshape(*x.shape[:2], -1, *mask.shape[-2:])
  return jnp.where(mask, grouped, hidden).reshape(x.shape)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _grouped_attention(q, k, v, mask, scale):
  return _grouped_attention_fwd(q, k, v, mask, scale)[0]


def _grouped_attention_fwd(q, k, v, mask, scale):
  logits = jnp.einsum('bkqd,bksd->bkqs', q, k, preferred_element_type=jnp.float32) * scale
  probs = jax.nn.softmax(_where_visible(logits, mask, _HIDDEN), axis=-1)
  out = jnp.einsum('bkqs,bksd->bkqd', probs.astype(v.dtype), v)
  return out, (q, k, v, mask, probs, out)


def _grouped_attention_bwd(scale, residuals, d_out):
  q, k, v, mask, probs, out = residuals
  d_v = jnp.einsum('bkqs,bkqd->bksd', probs.astype(d_out.dtype), d_out)
  d_probs = jnp.einsum('bkqd,bksd->bkqs', d_out, v, preferred_element_type=jnp.float32)
  rowsum = jnp.sum(d_out.astype(jnp.float32) * out.astype(jnp.float32), -1, keepdims=True)
  # Hidden logits get no gradient, as through jnp.where (a fully masked row has P uniform).
  d_logits = _where_visible(probs * (d_probs - rowsum) * scale, mask, 0.0).astype(q.dtype)
  d_q = jnp.einsum('bkqs,bksd->bkqd', d_logits, k)
  d_k = jnp.einsum('bkqs,bkqd->bksd', d_logits, q)
  return d_q, d_k.astype(k.dtype), d_v.astype(v.dtype), None


_grouped_attention.defvjp(_grouped_attention_fwd, _grouped_attention_bwd)

KERNELS = ('dot_product_attention', 'heads_first', 'einsum')


def _on_cpu() -> bool:
  """Whether kernel='dot_product_attention' runs heads_first_attention: on XLA:CPU."""
  return jax.default_backend() == 'cpu'


class Attention(nn.Module):
  """softmax(Q K^T / sqrt(head_dim) + mask) V over `num_heads` query heads and `num_kv_heads`
  key-value heads (MHA; GQA; MQA with one), self- or cross-attention, with its KV cache.

    attention = Attention(num_heads=4, head_dim=32, rope_base=10000.0)
    params = attention.init(rng, x)  # x (B, T, D)
    y = attention.apply(params, x, mask=causal_mask(jnp.arange(T), positions, T))  # (B, T, D)

  The output has `out_features` (default: the input's width). Self-attention takes its keys
  from its input; cross-attention (`is_cross`) from `kv_inputs`. With `rope_base`, queries and
  keys of self-attention are rotated by their `positions` (B, T) (default 0..T-1, after the
  cache index when decoding). `kernel` is 'dot_product_attention' (jax.nn's, cuDNN's flash
  attention on a GPU; on XLA:CPU `heads_first_attention`, the same numbers faster there),
  'heads_first' (`heads_first_attention` on any backend) or 'einsum', the plain reference,
  which also sows the attention weights into 'intermediates'. `init_std` None draws the kernels
  LeCun-normal.

  With `cache_index` set, the 'cache' collection holds the keys and values (B * num_kv_heads,
  S, head_dim): self-attention writes its new ones at slots cache_index.. and attends over all S
  slots (the caller's mask hides slots not yet written; a sliding-window cache is a ring of S
  slots that the caller indexes modulo S, see `causal_mask`); cross-attention stores them when
  given `kv_inputs` and reads them back when called without. Attention over the cache is
  `cached_attention`, whatever `kernel` says.

  The cache layout is for XLA:CPU, where a decoding step is bound by reading the cache. With
  slots before heads (B, S, kv_heads, head_dim), each step copied and transposed the whole cache
  (6x slower at batch 32 and 1,030 slots, through jax.nn.dot_product_attention or an einsum);
  with heads before slots but batch and heads apart, XLA still copied the cache several times
  per step at batch 1 (its size-1 batch axis is reshaped away between the in-place update and
  the product). One leading axis lets the update and both products use the cache as stored.
  """
  num_heads: int
  head_dim: int
  num_kv_heads: int | None = None  # None: num_heads
  rope_base: float | None = None  # None: no rotary positions
  use_bias: bool = True
  out_features: int | None = None  # None: the input's width
  is_cross: bool = False
  kernel: str = 'dot_product_attention'
  init_std: float | None = 0.02
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  def __post_init__(self):
    if self.num_heads < 1 or self.head_dim < 1:
      raise ValueError(f'Attention needs num_heads >= 1 and head_dim >= 1, not {self.num_heads} '
                       f'and {self.head_dim}.')
    if self.kv_heads < 1 or self.num_heads % self.kv_heads:
      raise ValueError(f'num_kv_heads={self.num_kv_heads} must divide num_heads={self.num_heads}: '
                       'each group of query heads shares one key-value head.')
    if self.rope_base is not None and (self.head_dim % 2 or not self.rope_base > 1):
      raise ValueError(f'RoPE rotates pairs of channels with frequencies rope_base^(-i/h): it '
                       f'needs an even head_dim (not {self.head_dim}) and rope_base > 1 (not '
                       f'{self.rope_base}).')
    if self.kernel not in KERNELS:
      raise ValueError(f'Unknown attention kernel {self.kernel!r}: use one of {list(KERNELS)}.')
    super().__post_init__()

  @property
  def kv_heads(self) -> int:
    return self.num_kv_heads or self.num_heads

  @nn.compact
  def __call__(self, x, kv_inputs=None, *, mask=None, positions=None, cache_index=None):
    dense = lambda heads, axis, name: Linear(
        (heads, self.head_dim), ('embed',), (axis, 'head_dim'), use_bias=self.use_bias,
        init_std=self.init_std, dtype=self.dtype, param_dtype=self.param_dtype, name=name)
    q = axes.constrain(dense(self.num_heads, 'heads', 'query')(x), axes.HEADS, None)
    source = x if not self.is_cross else kv_inputs
    k = v = None
    if source is not None:
      k, v = (axes.constrain(dense(self.kv_heads, 'kv_heads', name)(source), axes.KV_HEADS, None)
              for name in ('key', 'value'))
    if self.rope_base is not None and not self.is_cross:
      if positions is None and cache_index is None:  # constant rotations (see apply_rope)
        positions = np.arange(x.shape[1])[None]
      elif positions is None:
        positions = jnp.broadcast_to(jnp.arange(x.shape[1]) + cache_index, x.shape[:2])
      q = apply_rope(q, positions, self.rope_base)
      k = apply_rope(k, positions, self.rope_base)
    scale = self.head_dim ** -0.5
    if cache_index is not None:
      out = cached_attention(q, *self._cached(k, v, cache_index), mask, scale)
    elif self.kernel == 'einsum':
      out, weights = reference_attention(q, k, v, mask, scale)
      self.sow('intermediates', 'attention_weights', weights)
    elif self.kernel == 'heads_first' or _on_cpu():
      out = heads_first_attention(q, k, v, mask, scale)
    else:
      out = jax.nn.dot_product_attention(q, k, v, mask=mask, scale=scale)
    out = axes.constrain(out, axes.HEADS, None)
    return Linear((self.out_features or x.shape[-1],), ('heads', 'head_dim'), ('embed',),
                  use_bias=self.use_bias, init_std=self.init_std, dtype=self.dtype,
                  param_dtype=self.param_dtype, name='out')(out)

  def _cached(self, k, v, cache_index):
    """The cached keys and values (B * kv_heads, S, head_dim), with the new ones written in."""
    if k is None:  # a cross-attention step: the keys and values stored at the prefill
      if not self.has_variable('cache', 'cached_key'):
        raise ValueError('Cross-attention has no encoder outputs and no cached keys: run the '
                         'prefill with the encoder outputs first.')
      return self.get_variable('cache', 'cached_key'), self.get_variable('cache', 'cached_value')
    heads_first = lambda x: jnp.swapaxes(x, 1, 2).reshape(-1, x.shape[1], x.shape[3])
    k, v = heads_first(k), heads_first(v)
    key = self.variable('cache', 'cached_key', jnp.zeros, k.shape, k.dtype)
    value = self.variable('cache', 'cached_value', jnp.zeros, v.shape, v.dtype)
    if self.is_cross:
      key.value, value.value = k, v
    else:
      start = (0, cache_index, 0)
      key.value = jax.lax.dynamic_update_slice(key.value, k.astype(key.value.dtype), start)
      value.value = jax.lax.dynamic_update_slice(value.value, v.astype(value.value.dtype), start)
    return key.value, value.value
