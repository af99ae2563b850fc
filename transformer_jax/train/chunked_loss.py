"""The language-model head and its cross-entropy in one, over a few positions at a time.

A text model's logits (B, T, V) are the largest array of its step (Whisper's 51,865 ids at batch
8 x 448 tokens: 743 MB in float32), and the loss reads them several times: their maximum and
log-sum, the target's logit, the argmax, then the softmax again for the gradient. Here the head's
product and the loss run over chunks of `chunk` positions of every sequence in turn, and the
gradients with respect to the features and the unembedding matrix are made in the same pass
(as Liger-Kernel's fused linear cross-entropy, Hsu et al. 2024): no array of size V outlives its
chunk, the softmax is computed once, and the three products of the head (the logits, and the two
of their gradient) stay the only work of size V.

The gradient of the summed loss with respect to the logits of row i is c_loss w_i (p_i - t_i)
+ c_z k_i p_i (p the softmax, t the smoothed one-hot target, k_i = 2 z w_i log Z_i, and c_loss,
c_z the cotangents of the loss and z-loss sums, which only the backward pass learns). The
forward pass therefore keeps each factor's product apart: (p - t) U^T for the features'
gradient, scaled by row afterwards (plus t U^T, rows of U gathered, for the z-loss's share), and
(w x)^T (p - t) and, with a z-loss, (k x)^T p for the matrix's, the one extra product a z-loss
costs.
"""
import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer_jax.kernels.contraction import contract
from transformer_jax.layers import axes

__all__ = ['head_loss_sums']


def head_loss_sums(features, unembedding, targets, weights, *, chunk: int,
                   label_smoothing: float = 0.0, z_loss: float = 0.0) -> dict[str, jax.Array]:
  """losses.loss_sums (without mixed targets or top-5) of the logits features @ unembedding,
  computed `chunk` positions of each sequence at a time.

  features (B, T, D) and unembedding (D, V), both in the compute dtype (the product's output
  is float32, as the head's); targets (B, T) int; weights (B, T) float32. The sequences are
  split into ceil(T / chunk) equal chunks, the last padded with positions of weight 0.
  """
  if features.dtype != unembedding.dtype:
    raise ValueError(f'The features ({features.dtype}) and the unembedding '
                     f'({unembedding.dtype}) must both be in the compute dtype.')
  # Whole along the width before the loop (FSDP splits it over the batch's devices), else XLA
  # gathers it again in every chunk (measured compiling for TPU v5e).
  unembedding = nn.with_logical_constraint(unembedding, (None, axes.VOCAB))
  num_chunks = math.ceil(features.shape[1] / chunk)
  length = math.ceil(features.shape[1] / num_chunks)
  chunked = [_in_chunks(x, num_chunks, length) for x in (features, targets, weights)]
  loss, z, correct = _head_loss(label_smoothing, z_loss, unembedding, *chunked)
  sums = {'loss': loss, 'weight': jnp.sum(weights), 'correct': correct}
  if z_loss:
    sums['z_loss'] = z
  return sums


def _in_chunks(x, num_chunks: int, length: int):
  """(B, T, ...) -> (num_chunks, B, length, ...), T padded with zeros to num_chunks x length."""
  pad = num_chunks * length - x.shape[1]
  x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
  return jnp.moveaxis(x.reshape((x.shape[0], num_chunks, length) + x.shape[2:]), 1, 0)


def _summed_over_chunks(one_chunk, chunks):
  """(the sum over the chunks of one_chunk(chunk)[0], the stacked one_chunk(chunk)[1]). The sum
  starts from the first chunk's own, not from zeros, which inside shard_map would not vary over
  the devices as the carry that grows from them does."""
  first, first_out = one_chunk(jax.tree.map(lambda x: x[0], chunks))

  def add_chunk(total, chunk):
    part, out = one_chunk(chunk)
    return jax.tree.map(jnp.add, total, part), out

  total, outs = jax.lax.scan(add_chunk, first, jax.tree.map(lambda x: x[1:], chunks))
  return total, jax.tree.map(lambda a, b: jnp.concatenate([a[None], b]), first_out, outs)


def _chunk_loss(x, unembedding, targets, weights, label_smoothing: float, z_loss: float):
  """The summed loss terms of one chunk's rows, and what its gradient needs: (loss, z, correct),
  the softmax (B, C, V) and log Z (B, C)."""
  logits = axes.constrain(contract(x, unembedding, 1, jnp.float32), axes.VOCAB)
  top = jnp.max(logits, axis=-1, keepdims=True)
  exp = jnp.exp(logits - top)
  total = jnp.sum(exp, axis=-1, keepdims=True)
  log_z = (top + jnp.log(total))[..., 0]
  nll = log_z - jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
  if label_smoothing:
    nll = (1.0 - label_smoothing) * nll + label_smoothing * (log_z - logits.mean(axis=-1))
  correct = (jnp.argmax(logits, axis=-1) == targets) * weights
  sums = (jnp.sum(nll * weights), jnp.sum(z_loss * jnp.square(log_z) * weights),
          jnp.sum(correct))
  return sums, exp / total, log_z


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _head_loss(label_smoothing, z_loss, unembedding, features, targets, weights):
  """(loss, z-loss, correct) summed over chunks (num_chunks, B, C, ...) of the rows."""
  def one_chunk(chunk):
    return _chunk_loss(chunk[0], unembedding, *chunk[1:], label_smoothing, z_loss)[0], ()
  return _summed_over_chunks(one_chunk, (features, targets, weights))[0]


def _head_loss_forward(label_smoothing, z_loss, unembedding, features, targets, weights):
  # Summed over the batch in every chunk; over devices, XLA sums the total once after the loop.
  rows_times = lambda rows, probs: jnp.einsum('bcd,bcv->dv', rows.astype(probs.dtype), probs,
                                              preferred_element_type=jnp.float32)

  def one_chunk(chunk):
    x, chunk_targets, chunk_weights = chunk
    sums, probs, log_z = _chunk_loss(x, unembedding, chunk_targets, chunk_weights,
                                     label_smoothing, z_loss)
    ids = jax.lax.broadcasted_iota(chunk_targets.dtype, probs.shape, probs.ndim - 1)
    p_minus_t = (probs - (1.0 - label_smoothing) * (ids == chunk_targets[..., None])
                 - label_smoothing / probs.shape[-1]).astype(x.dtype)
    rows = [rows_times(chunk_weights[..., None] * x, p_minus_t)]
    if z_loss:
      rows.append(rows_times((2.0 * z_loss * chunk_weights * log_z)[..., None] * x,
                             probs.astype(x.dtype)))
    return (sums, rows), (contract(p_minus_t, unembedding.T, 1, jnp.float32), log_z)

  (sums, rows), (p_minus_t_times_matrix, log_z) = _summed_over_chunks(
      one_chunk, (features, targets, weights))
  return sums, (unembedding, targets, weights, rows, p_minus_t_times_matrix, log_z)


def _head_loss_backward(label_smoothing, z_loss, residuals, cotangents):
  unembedding, targets, weights, rows, p_minus_t_times_matrix, log_z = residuals
  c_loss, c_z, _ = cotangents  # the count of correct predictions has no gradient
  grad_matrix = c_loss * rows[0] + (c_z * rows[1] if z_loss else 0.0)
  # c_loss w (p - t) U^T + c_z k p U^T, with p U^T = (p - t) U^T + t U^T.
  z_scale = c_z * 2.0 * z_loss * weights * log_z
  grad_features = (c_loss * weights + z_scale)[..., None] * p_minus_t_times_matrix
  if z_loss:
    matrix = unembedding.astype(jnp.float32)
    target_rows = (1.0 - label_smoothing) * jnp.take(matrix.T, targets, axis=0)
    grad_features = grad_features + z_scale[..., None] * (
        target_rows + label_smoothing * matrix.mean(axis=1).reshape((1,) * targets.ndim + (-1,)))
  # Both in the compute dtype (head_loss_sums).
  return (grad_matrix.astype(unembedding.dtype), grad_features.astype(unembedding.dtype), None,
          None)


_head_loss.defvjp(_head_loss_forward, _head_loss_backward)
