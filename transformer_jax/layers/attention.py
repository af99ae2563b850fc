"""Multi-head attention (MHA, GQA, MQA; self and cross) with its KV cache, and mask helpers."""
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer_jax import kernels
from transformer_jax.errors import ConfigError
from transformer_jax.layers import axes
from transformer_jax.layers.embeddings import apply_rope, default_positions
from transformer_jax.layers.linear import Linear

__all__ = ['Attention', 'causal_mask', 'check_dropout', 'check_kv_heads', 'check_rope',
           'padding_mask', 'segment_mask']


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


def segment_mask(query_segments: jax.Array, key_segments: jax.Array) -> jax.Array:
  """(B, 1, T, S) from the segment ids (B, T) of the queries and (B, S) of the keys of packed
  rows: a query sees the keys of its own segment only, so attention never crosses documents.

  Equality, not equality of nonzero ids: padding (segment 0) sees padding, so that a padding
  query of a row that has padding keys keeps a key to attend to.
  """
  return (query_segments[:, :, None] == key_segments[:, None, :])[:, None]


def _side_by_side(queries, mask, bias, sharing: int):
  """Queries (B * n, T, heads, head_dim), the mask and the bias (B * n | 1, heads | 1, T | 1, S)
  as B rows of n * T: the n rows that read one cache row side by side along T, so that each
  cached key is read once for all of them (each query keeps its own row of the mask)."""
  if sharing == 1:
    return queries, mask, bias
  rows, t = queries.shape[0] // sharing, queries.shape[1]

  def logits_like(x):
    if x is None:
      return None
    x = jnp.broadcast_to(x, (x.shape[0], x.shape[1], t, x.shape[3]))
    if x.shape[0] == 1:
      return jnp.tile(x, (1, 1, sharing, 1))
    x = x.reshape(rows, sharing, *x.shape[1:]).swapaxes(1, 2)
    return x.reshape(rows, x.shape[1], sharing * t, x.shape[-1])

  return (queries.reshape(rows, sharing * t, *queries.shape[2:]), logits_like(mask),
          logits_like(bias))


def check_kv_heads(num_heads: int, num_kv_heads: int | None, prefix: str = '') -> None:
  """Each key-value head serves a whole group of query heads. `prefix` is where the settings
  live ('model.' in a run's config), for the message."""
  if num_kv_heads is not None and (num_kv_heads < 1 or num_heads % num_kv_heads):
    divisors = [d for d in range(1, num_heads + 1) if num_heads % d == 0]
    raise ConfigError(f'{prefix}num_kv_heads={num_kv_heads} does not divide {prefix}num_heads='
                      f'{num_heads}: the key-value heads must divide the query heads, each group '
                      f'of which shares one, so choose a divisor of {num_heads} ({divisors}).')


def check_rope(head_dim: int, rope_base: float, prefix: str = '') -> None:
  """RoPE rotates pairs of channels, at frequencies base^(-i/h) that fall with i."""
  if head_dim % 2 or not rope_base > 1:
    fix = (f' (choose {prefix}width / {prefix}num_heads even, or other {prefix}positions)'
           if prefix else '')
    raise ConfigError(f'RoPE rotates pairs of channels with frequencies rope_base^(-i/h): it needs '
                      f'an even head_dim (not {head_dim}){fix} and {prefix}rope_base > 1 (not '
                      f'{rope_base}).')


def check_dropout(kernel: str | kernels.Kernel, rate: float) -> None:
  """Attention probabilities dropped at `rate` > 0 need a kernel that forms them
  (`kernels.takes_dropout`); a fused one never does."""
  if rate > 0 and not kernels.takes_dropout(kernel):
    name = kernel if isinstance(kernel, str) else getattr(kernel, '__name__', repr(kernel))
    raise ConfigError(f'The attention kernel {name!r} cannot drop attention probabilities, which '
                      f"the model drops at rate {rate} in training: choose 'auto' or 'reference' "
                      '(model.attention_kernel), or set model.attention_dropout=0.')


class Attention(nn.Module):
  """softmax(Q K^T / sqrt(head_dim) + bias + mask) V over `num_heads` query heads and `num_kv_heads`
  key-value heads (MHA; GQA; MQA with one), self- or cross-attention, with its KV cache.

    attention = Attention(num_heads=4, head_dim=32, rope_base=10000.0)
    params = attention.init(rng, x)  # x (B, T, D)
    y = attention.apply(params, x, mask=causal_mask(jnp.arange(T), positions, T))  # (B, T, D)

  The layer projects queries, keys and values, rotates them (RoPE), keeps the cache and projects
  the heads back; the softmax(QK^T)V between is `kernel`: a name of `transformer_jax.kernels`
  ('auto', 'xla', 'cpu', 'reference', or one registered there) or a function of the kernels'
  signature. 'auto' runs the kernel of the platform the step is compiled for; a run decides
  the name once, at the top (train.resolve). The output has `out_features` (default: the input's
  width). Self-attention takes its keys from its input; cross-attention (`is_cross`)
  from `kv_inputs`. With `rope_base`, queries and keys of self-attention are rotated by their
  `positions` (B, T) (default 0..T-1, after the cache index when decoding). `initializer`
  (Linear's INITS) draws the kernels N(0, init_std) (LeCun normal where init_std is None) or
  Xavier-uniform, the queries, keys and values with the fans of one fused (D, (heads +
  2 kv_heads) head_dim) projection: timm's qkv Linear(D, 3D), which DiT initializes so.
  `out_init_gain` multiplies the output projection's initial draw (GPT-2's 1 / sqrt(N) for the
  N residual branches of a stack). `scale_logits` False leaves out the 1 / sqrt(head_dim) and
  folds it into the initialization of the queries, as T5 does. Where the 'intermediates'
  collection is mutable, the layer sows the attention weights (B, heads, T, S) there, computed
  by the reference kernel. `dropout_rate` > 0 drops attention probabilities where the call is
  not `deterministic` (T5's and BERT's attention dropout, with the 'dropout' rng): there the
  kernel must take it (`kernels.takes_dropout`: 'auto' and 'reference'; another fails when the
  call is traced, before anything compiles), while deterministic calls run any kernel.

  With `cache_index` set, the 'cache' collection holds the keys and values in `cache_layout`
  (`kernels.cache.LAYOUTS`; 'folded' is (B * num_kv_heads, S, head_dim); our models take their
  kernel's, `kernels.cache.layout_for`: on XLA:CPU 'keys_transposed', its keys (..., head_dim, S)):
  self-attention writes its new ones at slots cache_index.. and attends over all S slots (the
  caller's mask hides slots not yet written; a sliding-window cache is a ring of S slots that
  the caller indexes modulo S, see `causal_mask`); cross-attention stores them when given
  `kv_inputs` and reads them back when called without. Attention over the cache is
  `kernels.cache.attention`, which reads each layout as it is stored.
  """
  num_heads: int
  head_dim: int
  num_kv_heads: int | None = None  # None: num_heads
  rope_base: float | None = None  # None: no rotary positions
  use_bias: bool = True
  # Whisper's key projection has no bias, with use_bias: q . b_k is the same for every key of a
  # query, so the softmax cancels it.
  key_bias: bool = True
  out_features: int | None = None  # None: the input's width
  is_cross: bool = False
  kernel: str | kernels.Kernel = 'auto'
  cache_layout: str = 'folded'
  init_std: float | None = 0.02
  initializer: str = 'normal'
  out_init_gain: float = 1.0  # times the output projection's initial draw
  scale_logits: bool = True
  dropout_rate: float = 0.0  # of the attention probabilities, in training
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  def __post_init__(self):
    if self.num_heads < 1 or self.head_dim < 1:
      raise ValueError(f'Attention needs num_heads >= 1 and head_dim >= 1, not {self.num_heads} '
                       f'and {self.head_dim}.')
    check_kv_heads(self.num_heads, self.num_kv_heads)
    if self.rope_base is not None:
      check_rope(self.head_dim, self.rope_base)
    kernels.function(self.kernel)  # an unknown name fails here
    if not 0 <= self.dropout_rate < 1:
      raise ValueError(f'Attention dropout_rate={self.dropout_rate} must be in [0, 1).')
    kernels.cache.check_layout(self.cache_layout)
    super().__post_init__()

  @property
  def kv_heads(self) -> int:
    return self.num_kv_heads or self.num_heads

  @nn.compact
  def __call__(self, x, kv_inputs=None, *, mask=None, positions=None, cache_index=None,
               bias=None, deterministic=True):
    """x (B, T, D) -> (B, T, out_features).

    kv_inputs (B, S, D'): cross-attention's keys and values (None in a cached decoding step,
    which reads them from the cache). mask: boolean (B | 1, heads | 1, T, S), True where a query
    sees a key, or a `kernels.masks.Mask` that describes one; None: every key. bias: float
    (B | 1, heads | 1, T, S) added to the scaled logits (over the S cache slots when decoding),
    or None. positions
    (B, T): RoPE's token positions. cache_index: the cache slot of the first of the T queries
    (decoding), or None (no cache). deterministic: False drops attention probabilities at
    `dropout_rate` (never over the cache: decoding is deterministic).
    """
    kernels.masks.check(mask)
    dense = lambda heads, axis, name, gain=1.0: Linear(
        (heads, self.head_dim), ('embed',), (axis, 'head_dim'),
        use_bias=self.use_bias and (self.key_bias or name != 'key'),
        init_std=self.init_std, init_gain=gain, initializer=self.initializer,
        init_fan_out=(self.num_heads + 2 * self.kv_heads) * self.head_dim, dtype=self.dtype,
        param_dtype=self.param_dtype, name=name)
    # Unscaled logits start as the scaled ones would: the queries start 1 / sqrt(head_dim) as large.
    query_gain = 1.0 if self.scale_logits else self.head_dim ** -0.5
    q = axes.constrain(dense(self.num_heads, 'heads', 'query', query_gain)(x), axes.HEADS, None)
    source = x if not self.is_cross else kv_inputs
    k = v = None
    if source is not None:
      k, v = (axes.constrain(dense(self.kv_heads, 'kv_heads', name)(source), axes.KV_HEADS, None)
              for name in ('key', 'value'))
    if self.rope_base is not None and not self.is_cross:
      if positions is None:  # constant rotations where the offset is (see apply_rope)
        positions = default_positions(x.shape[0], x.shape[1],
                                      0 if cache_index is None else cache_index)
      q = apply_rope(q, positions, self.rope_base)
      k = apply_rope(k, positions, self.rope_base)
    scale = self.head_dim ** -0.5 if self.scale_logits else 1.0
    if cache_index is not None:
      k, v = self._cached(k, v, cache_index)
      slots = k.shape[kernels.cache.slot_axis(self.cache_layout, keys=True)]
      queries, visible, added = _side_by_side(q, kernels.masks.dense(mask, q.shape[1], slots),
                                              bias, self._rows_sharing_a_cache_row(q, k))
      out = kernels.cache.attention(queries, k, v, visible, scale=scale, bias=added,
                                    layout=self.cache_layout)
      out = out.reshape(q.shape[0], q.shape[1], *out.shape[2:])
    else:
      fn = kernels.function(self.kernel)
      rng = None
      if not deterministic and self.dropout_rate:  # when traced: a kernel that cannot fails
        check_dropout(self.kernel, self.dropout_rate)
        rng = self.make_rng('dropout')
      out = fn(q, k, v, kernels.masks.for_kernel(fn, mask, q.shape[1], k.shape[1]), scale=scale,
               **kernels.bias_argument(bias), **kernels.dropout_argument(self.dropout_rate, rng))
      if self.is_mutable_collection('intermediates'):
        dense_mask = kernels.masks.dense(mask, q.shape[1], k.shape[1])
        self.sow('intermediates', 'attention_weights',
                 kernels.reference.weights(q, k, dense_mask, scale, bias))
    out = axes.constrain(out, axes.HEADS, None)
    return Linear((self.out_features or x.shape[-1],), ('heads', 'head_dim'), ('embed',),
                  use_bias=self.use_bias, init_std=self.init_std, init_gain=self.out_init_gain,
                  initializer=self.initializer, dtype=self.dtype, param_dtype=self.param_dtype,
                  name='out')(out)

  def _rows_sharing_a_cache_row(self, q, k) -> int:
    """How many consecutive query rows read each row of the cache: 1, or beam search's beams
    of one source over its cross-attention keys and values, stored once."""
    rows = k.shape[0] // (self.kv_heads if self.cache_layout in kernels.cache.FOLDED else 1)
    if q.shape[0] % rows:
      raise ValueError(f'{q.shape[0]} query rows over a cache of {rows} rows: each cache row '
                       'serves the same number of consecutive query rows.')
    return q.shape[0] // rows

  def _cached(self, k, v, cache_index):
    """The cached keys and values in `cache_layout`, with the new ones written in."""
    if k is None:  # a cross-attention step: the keys and values stored at the prefill
      if not self.has_variable('cache', 'cached_key'):
        raise ValueError('Cross-attention has no encoder outputs and no cached keys: run the '
                         'prefill with the encoder outputs first.')
      return self.get_variable('cache', 'cached_key'), self.get_variable('cache', 'cached_value')
    k, v = (kernels.cache.stored(x, self.cache_layout, keys) for x, keys in ((k, True), (v, False)))
    key = self.variable('cache', 'cached_key', jnp.zeros, k.shape, k.dtype)
    value = self.variable('cache', 'cached_value', jnp.zeros, v.shape, v.dtype)
    if self.is_cross:
      key.value, value.value = k, v
    else:
      key.value = kernels.cache.write(key.value, k, cache_index, self.cache_layout, keys=True)
      value.value = kernels.cache.write(value.value, v, cache_index, self.cache_layout)
    return key.value, value.value
