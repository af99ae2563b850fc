"""Attention of new queries over a KV cache, in the layout `layers.Attention` keeps it in.

Layouts (`LAYOUTS`), of keys and values alike unless said:
  'folded'           (B * kv_heads, S, head_dim): one leading axis, so that the in-place update
                     of a decoding step and both products read the cache as it is stored.
  'heads_first'      (B, kv_heads, S, head_dim).
  'slots_first'      (B, S, kv_heads, head_dim): the keys' own layout as the projection makes
                     them.
  'keys_transposed'  'folded' with the keys transposed, (B * kv_heads, head_dim, S): the
                     queries' product with the keys then reads them as a plain matrix product
                     reads its right operand.
Each model keeps the layout of its attention kernel's platform (`layout_for`): 'keys_transposed'
with the 'cpu' kernel, 'folded' elsewhere. The decoding loop of GPT-2 small (bfloat16, 1024
slots, batch 8), compiled by experiments/decode_layout.py, copies or transposes no whole layer's
cache at any step on v5e:1x1 or h100x1 in the first three layouts, and 'folded' needs the least
memory: XLA's temporary bytes 789 MiB on v5e:1x1 against 1306 for both others (3621 against 3688
at batch 32), 456 MiB on h100x1 against 456 and 471 (1412 against 1423 and 1461). On XLA:CPU in
float32 (its 'auto' dtype) 'slots_first' copies and transposes each layer's keys and values at
every step, the others nothing; but XLA:CPU's product of a step's few queries with keys stored
(S, head_dim) rearranges the keys for its kernel at every step, where (head_dim, S) it reads
them as they are: Whisper's cross-attention of 8 windows' 5 beams over 1,500 frames (48 heads of
(5, 64) queries) took 3.09 ms a layer and step 'folded', 1.42 'keys_transposed' (torch's
scaled_dot_product_attention 1.21 ms), and whisper-tiny's beam search over 8 windows 7.25 ->
6.85 s. In bfloat16 on XLA:CPU 'folded' and 'keys_transposed' copy one of each layer's two
caches once a step (beside the float32 conversion every layout makes of it for XLA:CPU's
products; 'keys_transposed' its keys), 'heads_first' not.
"""
import jax
import jax.numpy as jnp

from transformer_jax.kernels import masks

__all__ = ['FOLDED', 'LAYOUTS', 'attention', 'check_layout', 'layout_for', 'slot_axis', 'stored',
           'write']

LAYOUTS = ('folded', 'heads_first', 'slots_first', 'keys_transposed')
FOLDED = ('folded', 'keys_transposed')  # the layouts with one leading axis of B * kv_heads
# The layout each attention kernel's platform reads fastest (above); 'folded' for the others.
_KERNEL_LAYOUTS = {'cpu': 'keys_transposed'}


def layout_for(kernel) -> str:
  """The cache layout of a model whose attention kernel is `kernel` (a name or a function)."""
  return _KERNEL_LAYOUTS.get(kernel, 'folded') if isinstance(kernel, str) else 'folded'


def check_layout(layout: str) -> None:
  if layout not in LAYOUTS:
    raise ValueError(f'cache_layout={layout!r} is not a KV-cache layout: choose one of {LAYOUTS}.')


def slot_axis(layout: str, keys: bool = False) -> int:
  """The axis of the cache slots of the keys (`keys`) or values, counted from the end (a
  scanned stack adds a leading one)."""
  if keys and layout == 'keys_transposed':
    return -1
  return -3 if layout == 'slots_first' else -2


def stored(x: jax.Array, layout: str, keys: bool = False) -> jax.Array:
  """New keys (`keys`) or values (B, T, kv_heads, head_dim) in `layout`."""
  if layout == 'slots_first':
    return x
  heads_first = jnp.swapaxes(x, 1, 2)
  if layout == 'heads_first':
    return heads_first
  folded = heads_first.reshape(-1, x.shape[1], x.shape[3])
  return jnp.swapaxes(folded, 1, 2) if keys and layout == 'keys_transposed' else folded


def write(cache: jax.Array, new: jax.Array, index, layout: str, keys: bool = False
          ) -> jax.Array:
  """`cache` with `new` (as `stored` makes it) written in at slots index.. ."""
  start = [0] * cache.ndim
  start[cache.ndim + slot_axis(layout, keys)] = index
  return jax.lax.dynamic_update_slice(cache, new.astype(cache.dtype), start)


def attention(q, k, v, mask=None, *, scale, bias=None, layout: str = 'folded'):
  """q (B, T, heads, head_dim) over cached keys and values in `layout`; mask boolean and bias
  float, each broadcastable to (B, heads, T, S), or None (the bias is added to the scaled
  logits). Softmax in float32; returns (B, T, heads, head_dim)."""
  if layout in FOLDED:
    return _folded(q, k, v, mask, scale, bias, layout == 'keys_transposed')
  b, t, h, d = q.shape
  kv_heads = k.shape[2 if layout == 'slots_first' else 1]
  kv = 'skd' if layout == 'slots_first' else 'ksd'
  grouped = q.reshape(b, t, kv_heads, h // kv_heads, d)
  logits = jnp.einsum(f'btkgd,b{kv}->bkgts', grouped, k,
                      preferred_element_type=jnp.float32) * scale
  logits = _masked(logits, mask, bias, kv_heads)
  probs = jax.nn.softmax(logits, axis=-1).astype(v.dtype)
  return jnp.einsum(f'bkgts,b{kv}->btkgd', probs, v).reshape(b, t, h, d)


def _masked(logits, mask, bias, kv_heads):
  """logits (B, kv_heads, group, T, S) plus the bias, hidden where the mask says."""
  if bias is not None:
    logits = logits + masks.grouped(bias, kv_heads).astype(jnp.float32)
  if mask is not None:
    logits = jnp.where(masks.grouped(mask, kv_heads), logits, jnp.finfo(jnp.float32).min)
  return logits


def _folded(q, k, v, mask, scale, bias, keys_transposed):
  b, t, h, d = q.shape
  kv_heads = k.shape[0] // b
  q = jnp.swapaxes(q, 1, 2).reshape(b * kv_heads, h // kv_heads * t, d)
  logits = jnp.einsum('nqd,nds->nqs' if keys_transposed else 'nqd,nsd->nqs', q, k,
                      preferred_element_type=jnp.float32) * scale
  if mask is not None or bias is not None:
    grouped = logits.reshape(b, kv_heads, h // kv_heads, t, -1)
    logits = _masked(grouped, mask, bias, kv_heads).reshape(logits.shape)
  probs = jax.nn.softmax(logits, axis=-1).astype(v.dtype)
  out = jnp.einsum('nqs,nsd->nqd', probs, v)
  return jnp.swapaxes(out.reshape(b, h, t, d), 1, 2)
