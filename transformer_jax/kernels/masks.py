"""The masks kernels take: boolean arrays, or a `Mask` that says how the mask is made.

A dense mask is boolean (B | 1, heads | 1, T, S), True where a query sees a key. A `Mask`
describes the same thing by its parts (causal, a sliding window, segment ids of packed rows,
the keys' validity, any other dense mask), so that a fused kernel (cuDNN, splash attention) can
compute it in the kernel instead of reading a (T, S) array per row; `dense` turns it into the
boolean array for every kernel that takes one. The attention layer passes a `Mask` only to a
kernel marked `takes_structure`; every other kernel gets the boolean array it always got.
"""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ['Mask', 'check', 'conjunction', 'dense', 'for_kernel', 'grouped', 'takes_structure']


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Mask:
  """A query sees a key where every part that is set allows it.

  causal: self-attention over the T query slots (S == T): a query sees the keys at its slot and
    before, from the first slot of its row's sequence on: the query at slot i with position p
    sees slots i - p .. i (with `positions` None, every row starts at slot 0). Packed rows,
    whose positions restart at each document, thus see their own document only.
  window: with causal, only the last `window` keys (the query's included).
  positions: (B, T) token positions of the queries (causal only), or None: 0..T-1.
  segments: (query ids (B, T), key ids (B, S)): a query sees the keys of its own segment.
  valid: (B, S) boolean: the keys that exist (padding False).
  other: a dense boolean mask (B | 1, heads | 1, T, S) of anything else.
  """
  causal: bool = dataclasses.field(default=False, metadata={'static': True})
  window: int | None = dataclasses.field(default=None, metadata={'static': True})
  positions: jax.Array | None = None
  segments: tuple[jax.Array, jax.Array] | None = None
  valid: jax.Array | None = None
  other: jax.Array | None = None

  def dense(self, num_queries: int, num_keys: int) -> jax.Array | None:
    """The boolean (B | 1, heads | 1, T, S) mask, or None where no part is set."""
    parts = []
    if self.causal:
      parts.append(_causal(num_queries, self.positions, self.window))
    if self.segments is not None:
      query, key = self.segments
      parts.append((query[:, :, None] == key[:, None, :])[:, None])
    if self.valid is not None:
      parts.append(self.valid[:, None, None, :])
    if self.other is not None:
      parts.append(self.other)
    if not parts:
      return None
    mask = parts[0]
    for part in parts[1:]:
      mask = mask & part
    batch = max(part.shape[0] for part in parts)
    return jnp.broadcast_to(mask, (batch, mask.shape[1], num_queries, num_keys))

  @property
  def plain_positions(self) -> bool:
    """Whether every row's sequence starts at slot 0 (positions None or a constant 0..T-1)."""
    if self.positions is None:
      return True
    if isinstance(self.positions, jax.core.Tracer):
      return False
    positions = np.asarray(self.positions)
    return bool((positions == np.arange(positions.shape[-1])).all())


def _causal(t: int, positions, window: int | None) -> jax.Array:
  """(B | 1, 1, T, T): what `layers.causal_mask(arange(T), positions, T, window)` gives."""
  query, key = np.arange(t)[:, None], np.arange(t)[None, :]
  visible = key <= query
  if window is not None:
    visible = visible & (key > query - window)
  if positions is None:
    return jnp.asarray(visible)[None, None]
  first = jnp.arange(t)[None, :] - positions  # (B, T): the first slot of each query's sequence
  return (visible[None] & (key[None] >= first[:, :, None]))[:, None]


def dense(mask, num_queries: int, num_keys: int):
  """A boolean mask from either kind (None stays None)."""
  return mask.dense(num_queries, num_keys) if isinstance(mask, Mask) else mask


def conjunction(mask, other):
  """Both masks (a `Mask`, a boolean array or None, None meaning every key). Two Masks merge
  part by part where they can; what does not fit a part is kept dense in `other`."""
  if mask is None or other is None:
    return other if mask is None else mask
  if not isinstance(mask, Mask) and not isinstance(other, Mask):
    return mask & other
  mask, other = (mask, other) if isinstance(mask, Mask) else (other, mask)
  if not isinstance(other, Mask):
    return dataclasses.replace(mask, other=_and(mask.other, other))
  if (mask.causal and other.causal) or (mask.segments is not None and other.segments is not None):
    raise ValueError('Two Masks that are both causal or both carry segment ids: combine their '
                     'dense forms (Mask.dense) instead.')
  first, second = (mask, other) if mask.causal else (other, mask)
  return Mask(causal=first.causal, window=first.window, positions=first.positions,
              segments=first.segments if first.segments is not None else second.segments,
              valid=_and(first.valid, second.valid), other=_and(first.other, second.other))


def _and(a, b):
  return b if a is None else a if b is None else a & b


def takes_structure(fn):
  """Marks a kernel that takes a `Mask` itself (and reads its parts); returns `fn`."""
  fn.takes_structure = True
  return fn


def for_kernel(fn, mask, num_queries: int, num_keys: int):
  """The mask as `fn` takes it: a `Mask` for a kernel marked `takes_structure`, else dense."""
  return mask if getattr(fn, 'takes_structure', False) else dense(mask, num_queries, num_keys)


def check(mask) -> None:
  """Refuses what a kernel would misread: masks are boolean (B | 1, heads | 1, T, S), True where
  a query sees a key (or a `Mask`)."""
  if mask is None or isinstance(mask, Mask):
    return
  if mask.dtype != bool:
    raise TypeError(f'Attention masks are boolean, True where a query sees a key; got a '
                    f'{mask.dtype} mask. An additive mask (0 visible, -inf or -1e9 hidden) '
                    'converts with `mask = additive_mask == 0`.')
  if mask.ndim != 4:
    raise ValueError(f'Attention masks are (B | 1, heads | 1, T, S); got shape {mask.shape}.')


def grouped(mask: jax.Array, kv_heads: int) -> jax.Array:
  """(B, 1 | heads | kv_heads, T, S) -> (B, 1 | kv_heads, 1 | group, T, S): the heads axis split
  as the query heads are, each group of heads // kv_heads sharing one key-value head. Masks and
  additive biases alike."""
  split = min(mask.shape[1], kv_heads)
  return mask.reshape(mask.shape[0], split, mask.shape[1] // split, *mask.shape[2:])
