"""cuDNN's fused attention: `jax.nn.dot_product_attention(implementation='cudnn')` where cuDNN
supports the case, else XLA's attention, with the reason logged once.

The mask goes to cuDNN by its structure where cuDNN has one for it: causal as `is_causal` (rows
that all start at slot 0, or packed rows, whose segment ids also say where documents start), a
sliding window as `local_window_size`; the other parts (segment ids, valid keys, any dense mask)
go dense, which cuDNN reads as a bias, as it reads an additive bias (in the queries' dtype).
cuDNN takes bfloat16 and float16 only, head widths that are multiples of 8 up to its limit, and
with a bias in training even sequence lengths: jax's own checks refuse the rest while the call
is traced, and those cases run XLA's attention.
"""
import logging

import jax
import jax.numpy as jnp

from transformer_jax.kernels import masks, xla

log = logging.getLogger(__name__)

__all__ = ['arguments', 'attention', 'decide']

_DTYPES = (jnp.bfloat16, jnp.float16)
_logged: set[str] = set()


def arguments(mask, num_queries: int, num_keys: int) -> dict:
  """jax.nn.dot_product_attention's mask arguments for `mask` (a `masks.Mask`, a boolean array
  or None): is_causal and local_window_size where they say it, `mask` for the rest."""
  if not isinstance(mask, masks.Mask):
    return {'mask': mask}
  structured = mask.causal and num_queries == num_keys and (
      mask.plain_positions or mask.segments is not None)
  if not structured:
    return {'mask': mask.dense(num_queries, num_keys)}
  rest = masks.Mask(segments=mask.segments, valid=mask.valid, other=mask.other)
  window = {} if mask.window is None else {'local_window_size': (mask.window - 1, 0)}
  return {'mask': rest.dense(num_queries, num_keys), 'is_causal': True, **window}


def decide(q, k, v, mask=None, training: bool = False, bias=None) -> tuple[dict | None, str]:
  """The arguments cuDNN runs this call with, and why; (None, why not) where it cannot. jax
  trains cuDNN's attention at even sequence lengths only (a ViT's 197 tokens are refused there);
  the forward pass alone takes odd ones without a dense mask or an additive bias."""
  if q.dtype not in _DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
    return None, f'cuDNN takes bfloat16 or float16, not {q.dtype}'
  kwargs = arguments(mask, q.shape[1], k.shape[1])
  if bias is not None:
    kwargs['bias'] = bias.astype(q.dtype)
  dense = kwargs['mask'] is not None or bias is not None
  if (training or dense) and (q.shape[1] % 2 or k.shape[1] % 2):
    return None, (f'cuDNN trains at even sequence lengths only, not {q.shape[1]} queries over '
                  f'{k.shape[1]} keys')
  how = ', '.join([name for name in ('is_causal', 'local_window_size') if name in kwargs]
                  + ['a dense mask' if kwargs['mask'] is not None else 'no dense mask']
                  + (['an additive bias'] if bias is not None else []))
  return kwargs, f'cuDNN with {how}'


@masks.takes_structure
def attention(q, k, v, mask=None, *, scale, bias=None):
  """The kernel signature of `transformer_jax.kernels`, taking a `masks.Mask` as well."""
  kwargs, why = decide(q, k, v, mask, bias=bias)
  if kwargs is not None:
    try:
      return jax.nn.dot_product_attention(q, k, v, scale=scale, implementation='cudnn', **kwargs)
    except (NotImplementedError, RuntimeError, ValueError) as refusal:  # jax's own checks
      why = f'jax refuses cuDNN here: {refusal}'
  _log_once(f'attention runs XLA, not cuDNN: {why} (q {q.shape} {q.dtype}, k {k.shape})')
  return xla.attention(q, k, v, masks.dense(mask, q.shape[1], k.shape[1]), scale=scale,
                       bias=bias)


def _log_once(message: str) -> None:
  if message not in _logged:
    _logged.add(message)
    log.info(message)
