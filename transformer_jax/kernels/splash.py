"""Splash attention on TPU: the Pallas kernel of `jax.experimental.pallas.ops.tpu.splash_attention`
where it runs, else XLA's attention, with the reason logged once.

Splash computes the mask in the kernel from its structure and skips the blocks it hides: causal,
a local window, and segment ids (packed rows; valid keys join them as a segment no query has).
It cannot read a dense mask nor add a bias (T5's relative positions), and it works in blocks
that must divide both sequence lengths (multiples of 128), so short or odd lengths, dense masks
and biases run XLA's attention. A Mosaic kernel is not partitioned by XLA: inside a step traced
with a mesh it runs under `jax.shard_map`, each device on its share of the batch and of the
heads as the logical-axis rules lay them out.
"""
import functools
import logging

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu import splash_attention as splash
from jax.sharding import PartitionSpec as P

from transformer_jax.kernels import masks, xla

log = logging.getLogger(__name__)

__all__ = ['attention', 'decide', 'make']

_BLOCKS = (512, 256, 128)  # the largest that divides a sequence is used
# The logical axes of `layers.axes` that q and k, v are laid out by (the kernels import nothing
# of the layers; a test holds the names equal).
BATCH, LENGTH, HEADS, KV_HEADS = 'act_batch', 'act_length', 'act_heads', 'act_kv_heads'
_logged: set[str] = set()


def decide(q, k, mask=None, bias=None) -> tuple[dict | None, str]:
  """The static settings splash runs this call with (block sizes, causal, window), and why;
  (None, why not) where it cannot."""
  if bias is not None:
    return None, 'splash takes no additive bias'
  t, s = q.shape[1], k.shape[1]
  block_q = next((b for b in _BLOCKS if t % b == 0), None)
  block_kv = next((b for b in _BLOCKS if s % b == 0), None)
  if block_q is None or block_kv is None:
    return None, (f'splash works in blocks of {_BLOCKS[-1]} positions, which must divide the '
                  f'{t} queries and {s} keys')
  plan = {'block_q': block_q, 'block_kv': block_kv, 'causal': False, 'window': None}
  if mask is None:
    return plan, 'splash over every key'
  if not isinstance(mask, masks.Mask) or mask.other is not None:
    return None, 'splash computes its mask from its structure and cannot read a dense mask'
  if mask.causal and not (mask.plain_positions or mask.segments is not None):
    return None, ('splash is causal from slot 0 of every row (or of every segment): positions '
                  'that start elsewhere need a dense mask')
  plan.update(causal=mask.causal, window=mask.window)
  parts = [name for name, on in (('causal', mask.causal), ('window', mask.window is not None),
                                 ('segment ids', mask.segments is not None),
                                 ('valid keys', mask.valid is not None)) if on]
  return plan, 'splash with ' + (', '.join(parts) or 'every key')


def make(interpret: bool = False):
  """The splash kernel (kernel signature, taking a `masks.Mask`); `interpret` runs Pallas's
  interpreter, so that the kernel runs (slowly) on any platform."""

  @masks.takes_structure
  def attention(q, k, v, mask=None, *, scale, bias=None):
    """The kernel signature of `transformer_jax.kernels`, taking a `masks.Mask` as well."""
    plan, why = decide(q, k, mask, bias)
    mesh = jax.sharding.get_abstract_mesh()
    if plan is not None and mesh.manual_axes:
      plan, why = None, ("inside the shard_map step (parallelism='shard_map') the Pallas output "
                         'has no varying-axes type for its check: use parallelism=jit')
    if plan is None:
      _log_once(f'attention runs XLA, not splash: {why} (q {q.shape}, k {k.shape})')
      return xla.attention(q, k, v, masks.dense(mask, q.shape[1], k.shape[1]), scale=scale,
                           bias=bias)
    segments = _segment_ids(mask, q.shape, k.shape)
    local = functools.partial(_local, interpret=interpret, **plan)
    q = (q * scale).astype(q.dtype)
    if mesh.empty:
      return local(q, k, v, *segments)
    q_spec, kv_spec = _spec(HEADS), _spec(KV_HEADS)
    if q_spec[2] != kv_spec[2]:
      _log_once('splash runs under the heads sharding of its queries, but the key-value heads '
                f'are sharded as {kv_spec[2]} and the heads as {q_spec[2]}: XLA runs it')
      return xla.attention(q, k, v, masks.dense(mask, q.shape[1], k.shape[1]), scale=1.0)
    ids_spec = P(q_spec[0], None)
    return jax.shard_map(local, mesh=mesh, in_specs=(q_spec, kv_spec, kv_spec)
                         + (ids_spec,) * len(segments), out_specs=q_spec, check_vma=False)(
                             q, k, v, *segments)

  return attention


attention = make()


def _spec(heads_axis: str) -> P:
  """(B, T, heads, head_dim) laid out by the rules in context; the positions whole, as splash
  reads them."""
  batch, _, heads, _ = nn.logical_to_mesh_axes((BATCH, LENGTH, heads_axis, None))
  return P(batch, None, heads, None)


def _segment_ids(mask, q_shape, k_shape) -> tuple:
  """() or the (query, key) segment ids splash reads: the mask's segments, with invalid keys in
  a segment of their own (-1) that no query has."""
  if not isinstance(mask, masks.Mask) or (mask.segments is None and mask.valid is None):
    return ()
  b, t, s = q_shape[0], q_shape[1], k_shape[1]
  query, key = mask.segments if mask.segments is not None else (
      jnp.zeros((b, t), jnp.int32), jnp.zeros((b, s), jnp.int32))
  if mask.valid is not None:
    key = jnp.where(mask.valid, key, -1)
  return (jnp.broadcast_to(query, (b, t)).astype(jnp.int32),
          jnp.broadcast_to(key, (b, s)).astype(jnp.int32))


def _local(q, k, v, *segments, block_q, block_kv, causal, window, interpret):
  """Splash on one device's share: q (b, T, h, d) over k, v (b, S, kv, d), scaled already."""
  b, t, h, d = q.shape
  s, kv_heads = k.shape[1], k.shape[2]
  kernel = _kernel(t, s, h // kv_heads, block_q, block_kv, causal, window, interpret)
  q = q.reshape(b, t, kv_heads, h // kv_heads, d).transpose(0, 2, 3, 1, 4)  # (b, kv, g, T, d)
  k, v = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)  # (b, kv, S, d)
  if segments:
    ids = splash.SegmentIds(*segments)
    per_head = lambda q, k, v, ids: kernel(q, k, v, segment_ids=ids)
    out = jax.vmap(jax.vmap(per_head, (0, 0, 0, None)))(q, k, v, ids)
  else:
    out = jax.vmap(jax.vmap(kernel))(q, k, v)
  return out.transpose(0, 3, 1, 2, 4).reshape(b, t, h, d)


@functools.lru_cache(maxsize=64)
def _kernel(t, s, group, block_q, block_kv, causal, window, interpret):
  """The splash kernel of a group of `group` query heads sharing one key-value head."""
  if window is not None:
    one = splash.LocalMask((t, s), window_size=(window - 1, 0), offset=0)
  elif causal:
    one = splash.CausalMask((t, s))
  else:
    one = splash.FullMask((t, s))
  sizes = splash.BlockSizes(block_q=block_q, block_kv=block_kv, block_kv_compute=block_kv,
                            block_q_dkv=block_q, block_kv_dkv=block_kv,
                            block_kv_dkv_compute=block_kv, block_q_dq=block_q, block_kv_dq=block_kv)
  return splash.make_splash_mqa_single_device(splash.MultiHeadMask([one] * group),
                                              block_sizes=sizes, interpret=interpret)


def _log_once(message: str) -> None:
  if message not in _logged:
    _logged.add(message)
    log.info(message)
