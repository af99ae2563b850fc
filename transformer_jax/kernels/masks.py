"""The boolean masks every kernel takes, and their grouped form."""
import jax

__all__ = ['check', 'grouped']


def check(mask) -> None:
  """Refuses what a kernel would misread: masks are boolean (B | 1, heads | 1, T, S), True where
  a query sees a key."""
  if mask is None:
    return
  if mask.dtype != bool:
    raise TypeError(f'Attention masks are boolean, True where a query sees a key; got a '
                    f'{mask.dtype} mask. An additive mask (0 visible, -inf or -1e9 hidden) '
                    'converts with `mask = additive_mask == 0`.')
  if mask.ndim != 4:
    raise ValueError(f'Attention masks are (B | 1, heads | 1, T, S); got shape {mask.shape}.')


def grouped(mask: jax.Array, kv_heads: int) -> jax.Array:
  """(B, 1 | heads | kv_heads, T, S) -> (B, 1 | kv_heads, 1 | group, T, S): the heads axis split
  as the query heads are, each group of heads // kv_heads sharing one key-value head."""
  split = min(mask.shape[1], kv_heads)
  return mask.reshape(mask.shape[0], split, mask.shape[1] // split, *mask.shape[2:])
