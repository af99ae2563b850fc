"""Beam search: the `beam_size` most likely outputs of each prompt under a length penalty, in
one jitted loop over a KV cache of a row per beam (the cache protocol of `decode.cache`)."""
import functools
from typing import Any

import flax
import jax
import jax.numpy as jnp

from transformer_jax.decode.cache import (cache_slots, cached_forward, checked_lengths,
                                          encoder_outputs, end_aligned, init_cache, prefill)
from transformer_jax.decode.samplers import limited, log_probabilities_of

__all__ = ['beam_search', 'Beams', 'length_penalty_of']


@flax.struct.dataclass
class Beams:
  """The `beam_size` best outputs of each prompt, best first. tokens (B, K, N): the new tokens,
  `pad_id` after a beam's EOS; lengths (B, K): new tokens up to and including EOS (N without
  one); log_probs (B, K): float32 log-probability of those tokens after the prompt; scores (B, K):
  log_probs / length_penalty_of(lengths), what the beams are ranked by."""
  tokens: jax.Array
  lengths: jax.Array
  log_probs: jax.Array
  scores: jax.Array


def length_penalty_of(lengths, alpha: float):
  """Wu et al. (2016)'s length penalty ((5 + |Y|) / 6) ** alpha, which a beam's log-probability
  is divided by: alpha 0 ranks by log-probability alone, larger alphas favour longer outputs."""
  return ((5.0 + jnp.asarray(lengths, jnp.float32)) / 6.0) ** alpha


@flax.struct.dataclass
class _Search:
  step: jax.Array  # index of the new token the next extension chooses
  token: jax.Array  # (B * K,) each live beam's last token, fed at this iteration
  live: Beams  # the K most likely beams without EOS; their scores unused
  finished: Beams  # the K best ended beams (EOS, or N tokens), -inf scores where none yet
  cache: Any  # B * K rows, row b * K + k the cache of live beam k of prompt b


def beam_search(model, params, prompt_tokens, *, beam_size: int, max_new_tokens: int,
                length_penalty: float = 0.6, eos_id: int | None = None, pad_id: int = 0,
                prompt_lengths=None, inputs=None, input_valid=None, window: int | None = None,
                token_limit: int | None = None) -> Beams:
  """The `beam_size` best continuations of each prompt, by log-probability over Wu et al.
  (2016)'s length penalty with exponent `length_penalty` (0.6, as T5 and Flax's WMT example).

  One jitted loop over a KV cache of B * beam_size rows: at each step every live beam's 2K best
  extensions are ranked, those ending in EOS (or at the N-th token) join the finished beams, the
  K best others live on, and the cache rows are reordered to follow them. The loop stops early
  once no live beam can overtake the K-th finished one. Beam 1 is greedy decoding. The arguments
  are `generate`'s.
  """
  if int(beam_size) != beam_size or beam_size < 1:
    raise ValueError(f'beam_size={beam_size} must be a whole number >= 1.')
  if length_penalty < 0:
    raise ValueError(f'length_penalty={length_penalty} must be >= 0 (0: none).')
  prompt_lengths = checked_lengths(model, prompt_tokens, prompt_lengths, max_new_tokens, inputs,
                                   window)
  return _beam_search(
      model, params, jnp.asarray(prompt_tokens, jnp.int32), prompt_lengths, inputs, input_valid,
      jnp.int32(-1 if eos_id is None else eos_id), jnp.int32(pad_id), beam_size=int(beam_size),
      max_new_tokens=max_new_tokens, length_penalty=float(length_penalty), window=window,
      token_limit=token_limit)


def _rows_of(cache, rows, one_row, two_rows, shared=None):
  """The cache of the batch rows `rows`, whatever its layout: each leaf along its batch axis (the
  one whose size grows with the batch, B or B * kv_heads folded), found by comparing the shapes
  of a cache of one row and of two. Leaves where the tree `shared` is True are left as they are:
  `rows` only reorders rows that hold the same values there."""
  shared = jax.tree.map(lambda _: False, one_row) if shared is None else shared

  def take(x, one, two, same):
    if same:
      return x
    axis = next(i for i, (m, n) in enumerate(zip(one.shape, two.shape)) if m != n)
    per_row = one.shape[axis]
    grouped = x.reshape(x.shape[:axis] + (-1, per_row) + x.shape[axis + 1:])
    taken = jnp.take(grouped, rows, axis=axis)
    return taken.reshape(x.shape[:axis] + (-1,) + x.shape[axis + 1:])
  return jax.tree.map(take, cache, one_row, two_rows, shared)


def _extend(state: _Search, logits, rows_of, token_limit, eos_id, length_penalty: float):
  """The beams after choosing the token at `state.step` from `logits` (B * K, V), the cache rows
  reordered by rows_of(cache, rows) to follow the live ones (their tokens are fed next)."""
  live, finished = state.live, state.finished
  batch, k, n = live.tokens.shape
  logits = limited(logits.astype(jnp.float32), token_limit)
  # 2K candidates always hold K that do not end, however many of them end in EOS. A prompt's 2K
  # best extensions are among its beams' 2K best tokens each: a top-k of each beam's logits, then
  # of those K * 2K, rather than one over K * V log-probabilities (Whisper's 51,865 ids at beam
  # 5: 4.4 against 5.8 ms a step on 2 cores), and the log-softmax on those alone.
  per_beam = min(2 * k, logits.shape[-1])
  beam_top, beam_token = jax.lax.top_k(logits, per_beam)
  log_probs = log_probabilities_of(beam_top, logits).reshape(batch, k, per_beam)
  top, index = jax.lax.top_k((log_probs + live.log_probs[..., None]).reshape(batch, -1), 2 * k)
  parent = index // per_beam
  token = jnp.take_along_axis(beam_token.reshape(batch, -1), index, axis=1)
  at_step = (jnp.arange(n) == state.step)[None, None, :]
  tokens = jnp.where(at_step, token[..., None],
                     jnp.take_along_axis(live.tokens, parent[..., None], axis=1))
  ends = (token == eos_id) | (state.step == n - 1)
  lengths = jnp.full(top.shape, state.step + 1, jnp.int32)
  scores = jnp.where(ends, top / length_penalty_of(state.step + 1, length_penalty), -jnp.inf)
  candidates = Beams(tokens=tokens, lengths=lengths, log_probs=top, scores=scores)
  best = lambda beams, order: jax.tree.map(
      lambda x: jnp.take_along_axis(x, order.reshape(order.shape + (1,) * (x.ndim - 2)), axis=1),
      beams)
  merged = jax.tree.map(lambda a, b: jnp.concatenate([a, b], axis=1), finished, candidates)
  finished = best(merged, jax.lax.top_k(merged.scores, k)[1])
  live_log_probs, kept = jax.lax.top_k(jnp.where(ends, -jnp.inf, top), k)
  live = best(candidates, kept).replace(log_probs=live_log_probs)
  rows = (jnp.arange(batch)[:, None] * k + jnp.take_along_axis(parent, kept, axis=1)).reshape(-1)
  return _Search(step=state.step + 1, token=jnp.take_along_axis(token, kept, axis=1).reshape(-1),
                 live=live, finished=finished, cache=rows_of(state.cache, rows))


def _search_over(state: _Search, max_new_tokens: int, length_penalty: float):
  """Whether a live beam can still beat the K-th finished one: log-probabilities only fall as a
  beam grows, so its best is its log-probability now over the largest penalty it can reach."""
  reach = jnp.maximum(length_penalty_of(state.step + 1, length_penalty),
                      length_penalty_of(max_new_tokens, length_penalty))
  best_live = state.live.log_probs[:, 0] / reach
  return jnp.all(state.finished.scores[:, -1] > best_live)


@functools.partial(jax.jit, static_argnames=('model', 'beam_size', 'max_new_tokens',
                                             'length_penalty', 'window', 'token_limit'))
def _beam_search(model, params, prompt_tokens, prompt_lengths, inputs, input_valid, eos_id,
                 pad_id, *, beam_size, max_new_tokens, length_penalty, window, token_limit):
  batch, prompt_len = prompt_tokens.shape
  k = beam_size
  ring_slots = cache_slots(prompt_len + max_new_tokens - 1, window)
  prompt, pad = end_aligned(prompt_tokens, prompt_lengths)
  encoded = encoder_outputs(model, params, inputs, input_valid)
  logits, cache = prefill(model, cached_forward(model, params, window, input_valid), prompt,
                          pad, ring_slots, encoded)
  source_len = None if encoded is None else encoded.shape[1]
  one_row, two_rows = (jax.eval_shape(lambda b=b: init_cache(model, b, ring_slots, source_len))
                       for b in (1, 2))
  # The cross-attention keys and values (the leaves whose shape does not follow the slots) are
  # the same for a prompt's K rows and never written after the prefill: a step's reorder, which
  # keeps each row among its prompt's, need not copy them (Whisper's are most of the cache).
  more_slots = jax.eval_shape(lambda: init_cache(model, 1, ring_slots + 1, source_len))
  cross = jax.tree.map(lambda a, b: a.shape == b.shape, one_row, more_slots)
  rows_of = lambda cache, rows: _rows_of(cache, rows, one_row, two_rows, cross)
  # Every prompt's K rows start as copies of its prefill; only the first is live, so the first
  # step's K beams are K different tokens. The cross-attention leaves stay one row per prompt,
  # which layers.Attention reads for the prompt's K consecutive rows: each step reads the
  # encoder's keys and values once per prompt, not once per beam.
  beam_rows = jnp.repeat(jnp.arange(batch), k)
  empty = jnp.full((batch, k, max_new_tokens), pad_id, jnp.int32)
  nothing = jnp.full((batch, k), -jnp.inf)
  zeros = jnp.zeros((batch, k), jnp.int32)
  first_live = jnp.broadcast_to(jnp.where(jnp.arange(k) == 0, 0.0, -jnp.inf), (batch, k))
  state = _Search(
      step=jnp.int32(0), token=jnp.zeros((batch * k,), jnp.int32),
      live=Beams(tokens=empty, lengths=zeros, log_probs=first_live, scores=nothing),
      finished=Beams(tokens=empty, lengths=zeros, log_probs=nothing, scores=nothing),
      cache=_rows_of(cache, beam_rows, one_row, two_rows, cross))
  state = _extend(state, logits[beam_rows, -1], rows_of, token_limit, eos_id, length_penalty)
  beam_pad = pad[beam_rows]
  forward = cached_forward(model, params, window,
                            None if input_valid is None else input_valid[beam_rows])

  def not_finished(state):
    return (state.step < max_new_tokens) & ~_search_over(state, max_new_tokens, length_penalty)

  def step(state):
    slot = prompt_len - 1 + state.step  # where the previous token goes
    logits, cache = forward(state.cache, ring_slots, state.token[:, None],
                            (slot - beam_pad)[:, None], slot[None])
    return _extend(state.replace(cache=cache), logits[:, 0], rows_of, token_limit, eos_id,
                   length_penalty)

  state = jax.lax.while_loop(not_finished, step, state)
  return state.finished

