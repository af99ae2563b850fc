"""T5's relative position bias (Raffel et al. 2020, section 2.1; after Shaw et al. 2018): a learned
scalar per attention head and bucket of key-minus-query distance, added to the attention logits.

    bias = RelativePositionBias(num_heads=8, bidirectional=True)
    params = bias.init(rng, positions, positions)  # positions (B | 1, T): absolute positions
    logits_bias = bias.apply(params, positions, positions)  # float32 (B | 1, 8, T, T)

Half the buckets hold one distance each (0..max_exact - 1); the other half cover distances up to
`max_distance` in logarithmically wider bins, and all farther ones share the last. Bidirectional
buckets (T5's encoder) split them between keys before and after the query; causal ones (its
decoder) give every bucket to keys at or before it.
"""
import math
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax.errors import ConfigError

__all__ = ['RelativePositionBias', 'cached_key_positions', 'check_relative_buckets',
           'relative_position_bucket']


def check_relative_buckets(num_buckets: int, max_distance: int, bidirectional: bool,
                           prefix: str = '', names=('num_buckets', 'max_distance')) -> None:
  """Raises ConfigError unless the exact half of the buckets holds at least one distance and
  `max_distance` lies beyond it. `prefix` and `names` say where the settings live and what they
  are called there, for the message."""
  max_exact = (num_buckets // 2 if bidirectional else num_buckets) // 2
  if max_exact < 1 or max_distance <= max_exact:
    least = 4 if bidirectional else 2
    buckets, distance = (prefix + name for name in names)
    raise ConfigError(f'{buckets}={num_buckets} and {distance}={max_distance} '
                      f'leave no room for {"bidirectional" if bidirectional else "causal"} '
                      f'buckets: choose {buckets} >= {least} and {distance} > '
                      f'{max(max_exact, 1)} (T5: 32 and 128).')


def cached_key_positions(cache_index, num_queries: int, num_slots: int) -> jax.Array:
  """(1, num_slots) int32: the sequence slot of the token that each cache slot holds, for the
  num_queries queries at slots cache_index.. of a KV cache of num_slots slots (as
  `layers.causal_mask` holds them: a ring once the sequence outgrows it, one query per call).

  Key minus query slot is then the distance of the two tokens, so the relative bias of a cached
  step is that of an uncached pass; `cache_index` may be taken modulo num_slots. Slots not yet
  written get some position that the causal mask hides.
  """
  last = cache_index + num_queries - 1
  slots = jnp.arange(num_slots)
  return (last - (last - slots) % num_slots)[None]


def relative_position_bucket(relative_position: jax.Array, bidirectional: bool,
                             num_buckets: int = 32, max_distance: int = 128) -> jax.Array:
  """The int32 bucket in [0, num_buckets) of each key position minus query position.

  Bidirectional: keys after the query take the upper half of the buckets. Causal: keys after
  the query share bucket 0 with the query itself (a causal mask hides them). Of the buckets a
  direction has, the first max_exact = half hold distances 0..max_exact - 1; distance d beyond
  goes to max_exact + floor(log(d / max_exact) / log(max_distance / max_exact) * max_exact),
  capped at the direction's last bucket (computed in float32, as T5 does).
  """
  relative_position = jnp.asarray(relative_position, jnp.int32)
  if bidirectional:
    num_buckets //= 2
    offset = jnp.where(relative_position > 0, num_buckets, 0)
    distance = jnp.abs(relative_position)
  else:
    offset = 0
    distance = jnp.maximum(-relative_position, 0)
  max_exact = num_buckets // 2
  # The maximum keeps log away from 0 on the distances the exact buckets take.
  ratio = jnp.maximum(distance, max_exact).astype(jnp.float32) / np.float32(max_exact)
  scale = np.float32(math.log(max_distance / max_exact))
  far = max_exact + (jnp.log(ratio) / scale * np.float32(num_buckets - max_exact)).astype(jnp.int32)
  far = jnp.minimum(far, num_buckets - 1)
  return offset + jnp.where(distance < max_exact, distance, far)


class RelativePositionBias(nn.Module):
  """The (B | 1, num_heads, Q, K) float32 bias of queries at absolute positions (B | 1, Q) over
  keys at (B | 1, K): the learned scalar of each head for the bucket of key minus query position
  (`relative_position_bucket`). A cached decoding step passes its queries' absolute positions,
  so that its bias is that of the same tokens in an uncached pass. 1-D positions are a batch of 1.

  The table, 'relative_attention_bias' (num_buckets, num_heads) as T5 names it, is read in
  `dtype` (bfloat16 biases in a bfloat16 model, as flaxformer's) and the bias returned in
  float32, which the attention logits are. `embedding_init` defaults to flaxformer's
  variance scaling (fan_avg, uniform).
  """
  num_heads: int
  num_buckets: int = 32
  max_distance: int = 128
  bidirectional: bool = True
  embedding_init: Callable = nn.initializers.variance_scaling(1.0, 'fan_avg', 'uniform')
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  def __post_init__(self):
    if self.num_heads < 1:
      raise ConfigError(f'RelativePositionBias needs num_heads >= 1, not {self.num_heads}.')
    check_relative_buckets(self.num_buckets, self.max_distance, self.bidirectional)
    super().__post_init__()

  @nn.compact
  def __call__(self, query_positions: jax.Array, key_positions: jax.Array) -> jax.Array:
    """query_positions (B | 1, Q) or (Q,), key_positions (B | 1, K) or (K,) int ->
    float32 (B | 1, num_heads, Q, K)."""
    table = self.param(
        'relative_attention_bias',
        nn.with_logical_partitioning(self.embedding_init, ('relpos_buckets', 'heads')),
        (self.num_buckets, self.num_heads), self.param_dtype)
    query_positions, key_positions = jnp.atleast_2d(query_positions, key_positions)
    relative_BQK = key_positions[:, None, :] - query_positions[:, :, None]
    buckets_BQK = relative_position_bucket(relative_BQK, self.bidirectional, self.num_buckets,
                                           self.max_distance)
    bias_BQKH = jnp.take(table.astype(self.dtype), buckets_BQK, axis=0)
    return bias_BQKH.transpose(0, 3, 1, 2).astype(jnp.float32)
