"""The plain einsum attention: the definition every other kernel is tested against, and the
kernel that drops attention probabilities (it computes them explicitly)."""
import jax
import jax.numpy as jnp

from transformer_jax.kernels import masks

__all__ = ['attention', 'dropped', 'takes_dropout', 'weights']


def takes_dropout(fn):
  """Marks a kernel that takes `dropout_rate` and `dropout_rng` (dropout of the attention
  probabilities in training); returns `fn`."""
  fn.takes_dropout = True
  return fn


def weights(q, k, mask, scale, bias=None):
  """softmax(Q K^T * scale + bias) in float32 (B, heads, T, S), hidden keys at zero weight.

  q (B, T, heads, head_dim); k (B, S, kv_heads, head_dim); mask boolean, broadcastable to
  (B, heads, T, S), or None; bias float, broadcastable to (B, heads, T, S), or None. A query
  that sees no key weighs all keys alike, as jax.nn does.
  """
  b, t, h, d = q.shape
  kv_heads = k.shape[2]
  q = q.reshape(b, t, kv_heads, h // kv_heads, d)
  logits = jnp.einsum('btkgd,bskd->bkgts', q, k, preferred_element_type=jnp.float32) * scale
  if bias is not None:
    logits = logits + masks.grouped(bias, kv_heads).astype(jnp.float32)
  if mask is not None:
    logits = jnp.where(masks.grouped(mask, kv_heads), logits, jnp.finfo(jnp.float32).min)
  return jax.nn.softmax(logits, axis=-1).reshape(b, h, t, -1)


def dropped(probs, rate: float, rng):
  """Dropout of the attention probabilities (B, heads, T, S), as T5 and BERT drop them: each
  is zeroed with probability `rate` and the kept ones are scaled by 1 / (1 - rate), so that a
  row still sums to 1 in expectation."""
  keep = jax.random.bernoulli(rng, 1.0 - rate, probs.shape)
  return jnp.where(keep, probs / (1.0 - rate), 0.0)


@takes_dropout
def attention(q, k, v, mask=None, *, scale, bias=None, dropout_rate: float = 0.0,
              dropout_rng=None):
  """The kernel signature of `transformer_jax.kernels`: (B, T, heads, head_dim) out. With
  `dropout_rate` > 0 the probabilities are dropped (`dropped`) with the key `dropout_rng`."""
  b, t, h, d = q.shape
  kv_heads = k.shape[2]
  probs = weights(q, k, mask, scale, bias)
  if dropout_rate > 0:
    if dropout_rng is None:
      raise ValueError('Attention dropout needs a key: pass dropout_rng with dropout_rate.')
    probs = dropped(probs, dropout_rate, dropout_rng)
  probs = probs.reshape(b, kv_heads, h // kv_heads, t, -1)
  out = jnp.einsum('bkgts,bskd->btkgd', probs.astype(v.dtype), v)
  return out.reshape(b, t, h, d)
