"""`generate`: one parallel prefill of the prompt, then one cached token per step; and
`forced_logits`, the same cached computation fed the true tokens (teacher forcing).

The whole generation (cache allocation, prefill, token loop) is one jitted program whose loop is
a `lax.while_loop`; the host waits only for the finished tokens. The model follows a cache
protocol, and a batch of prompts and a sliding window sit in the cache, as `decode.cache` says.
"""
import functools
from typing import Any

import flax
import jax
import jax.numpy as jnp

from transformer_jax.decode.cache import (cache_slots, cached_forward, check_inputs,
                                          check_positions, check_window, checked_lengths,
                                          encoder_outputs, end_aligned, prefill)
from transformer_jax.decode.samplers import check_sampler, limited, sample

__all__ = ['forced_logits', 'generate', 'Generation']


@flax.struct.dataclass
class Generation:
  """tokens (B, N): the new tokens, `pad_id` after a row's EOS; lengths (B,): new tokens up to and
  including the first EOS (N without one); logits (B, N, V): the float32 logits each token was
  drawn from, when asked for (rows past their EOS keep computing them: ignore those)."""
  tokens: jax.Array
  lengths: jax.Array
  logits: jax.Array | None = None


@flax.struct.dataclass
class _Loop:
  step: jax.Array  # index of the new token this iteration draws
  token: jax.Array  # (B,) the previous new token, fed at this iteration
  done: jax.Array  # (B,) rows that have produced EOS
  tokens: jax.Array  # (B, N)
  logits: jax.Array | None  # (B, N, V) or None
  cache: Any


def generate(model, params, prompt_tokens, *, max_new_tokens: int, rng=None,
             temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
             eos_id: int | None = None, pad_id: int = 0, prompt_lengths=None, inputs=None,
             input_valid=None, window: int | None = None, return_logits: bool = False,
             token_limit: int | None = None) -> Generation:
  """`max_new_tokens` new tokens after each prompt, drawn by `sample` (temperature 0: greedy).

  model: a module that follows a cache protocol (`decode.cache`), such as one of our 'decoder' or
  'encoder_decoder' models; params its parameters (scanned or unrolled as the module is).
  prompt_tokens (B, P) int: start-aligned prompts, the first prompt_lengths[b] (default P, at
  least 1) tokens of row b real. An encoder-decoder takes
  the encoder input `inputs` (B, S) and `input_valid` (B, S) and starts its decoder from
  prompt_tokens (typically one BOS per row); the encoder and the cross-attention keys and values
  run once, at the prefill. A row stops at `eos_id` (kept in its tokens) and is padded with
  `pad_id`; the loop ends when every row has stopped. Step i draws with
  jax.random.fold_in(rng, i), so the result is a pure function of the rng.

  window: None, every token attends to its whole context; an int W, to its last W tokens only
  (itself included), through a ring of W cache slots per layer, so that a step costs the same
  however long the generation runs. With L > 1 layers this is sliding-window attention (each
  layer looks back W - 1 tokens, so the last layer's output depends on up to L (W - 1) earlier
  tokens), not a re-run over the last W tokens alone. With RoPE the distances a token sees stay
  within W, the context the model was trained on when W is its training length. Sinusoidal
  positions stay absolute, and a model without positions infers them from how many tokens it
  sees: for these a window bounds the span but not what the model was trained on
  (experiments/long_context.py measures all three). Learned positions limit the prompt slots
  plus the new tokens to model.max_len, window or not.
  `token_limit` restricts the draws to the ids below it: for a model whose vocabulary rows are
  padded past its tokenizer's ids, which have no text.
  """
  check_sampler(temperature, top_k, top_p)
  if temperature > 0 and rng is None:
    raise ValueError(f'Sampling at temperature={temperature} needs an rng (a jax.random.key).')
  prompt_lengths = checked_lengths(model, prompt_tokens, prompt_lengths, max_new_tokens, inputs,
                                   window)
  return _generate(
      model, params, jnp.asarray(prompt_tokens, jnp.int32), prompt_lengths, inputs, input_valid,
      jax.random.key(0) if rng is None else rng,  # greedy ignores the rng
      jnp.int32(-1 if eos_id is None else eos_id),  # no token id is negative: never stops
      jnp.int32(pad_id), max_new_tokens=max_new_tokens, temperature=float(temperature),
      top_k=int(top_k), top_p=float(top_p), window=window, return_logits=return_logits,
      token_limit=token_limit)


@functools.partial(jax.jit, static_argnames=('model', 'max_new_tokens', 'temperature', 'top_k',
                                             'top_p', 'window', 'return_logits', 'token_limit'))
def _generate(model, params, prompt_tokens, prompt_lengths, inputs, input_valid, rng, eos_id,
              pad_id, *, max_new_tokens, temperature, top_k, top_p, window, return_logits,
              token_limit):
  batch, prompt_len = prompt_tokens.shape
  # The last new token is never fed back.
  ring_slots = cache_slots(prompt_len + max_new_tokens - 1, window)
  prompt, pad = end_aligned(prompt_tokens, prompt_lengths)
  def draw(logits, step):
    return sample(limited(logits, token_limit), jax.random.fold_in(rng, step),
                  temperature=temperature, top_k=top_k, top_p=top_p)

  forward = cached_forward(model, params, window, input_valid)
  encoded = encoder_outputs(model, params, inputs, input_valid)

  # Prefill: the whole prompt in one pass; its last slot predicts the first new token.
  logits, cache = prefill(model, forward, prompt, pad, ring_slots, encoded)
  first = draw(logits[:, -1], 0)
  tokens = jnp.full((batch, max_new_tokens), pad_id, jnp.int32).at[:, 0].set(first)
  kept = None
  if return_logits:
    kept = jnp.zeros((batch, max_new_tokens, logits.shape[-1]), jnp.float32).at[:, 0].set(
        logits[:, -1])
  state = _Loop(step=jnp.int32(1), token=first, done=first == eos_id, tokens=tokens, logits=kept,
                cache=cache)

  def not_finished(state):
    return (state.step < max_new_tokens) & ~jnp.all(state.done)

  def step(state):
    slot = prompt_len - 1 + state.step  # where the previous new token goes
    logits, cache = forward(state.cache, ring_slots, state.token[:, None], (slot - pad)[:, None],
                            slot[None])
    token = draw(logits[:, 0], state.step)  # fed on in a stopped row too, but never written
    written = jnp.where(state.done, pad_id, token)[:, None]
    kept = state.logits
    if kept is not None:
      kept = jax.lax.dynamic_update_slice(kept, logits, (0, state.step, 0))
    return _Loop(step=state.step + 1, token=token, done=state.done | (token == eos_id),
                 tokens=jax.lax.dynamic_update_slice(state.tokens, written, (0, state.step)),
                 logits=kept, cache=cache)

  state = jax.lax.while_loop(not_finished, step, state)
  ended = state.tokens == eos_id
  lengths = jnp.where(ended.any(axis=1), jnp.argmax(ended, axis=1) + 1, max_new_tokens)
  return Generation(tokens=state.tokens, lengths=lengths.astype(jnp.int32), logits=state.logits)


@functools.partial(jax.jit, static_argnames=('model', 'prompt_len', 'window'))
def forced_logits(model, params, tokens, *, prompt_len: int = 1, window: int | None = None,
                  inputs=None, input_valid=None) -> jax.Array:
  """Float32 logits (B, T, V) of the token after each of `tokens` (B, T), computed as `generate`
  computes them: the first `prompt_len` tokens in one prefill, then one token per step through
  the cache (a ring of `window` slots, or one slot per token), each step fed the true next token
  instead of a drawn one (teacher forcing). This measures the loss of cached decoding far past
  a model's training length; `inputs` and `input_valid` as in `generate`.
  """
  check_window(window)
  check_inputs(model, inputs)
  batch, length = tokens.shape
  check_positions(model, length, f'{length} tokens', 'score fewer tokens')
  if not 1 <= prompt_len <= length:
    raise ValueError(f'prompt_len={prompt_len} must be between 1 and the {length} tokens.')
  ring_slots = cache_slots(length, window)
  pad = jnp.zeros((batch,), jnp.int32)
  forward = cached_forward(model, params, window, input_valid)
  encoded = encoder_outputs(model, params, inputs, input_valid)
  logits, cache = prefill(model, forward, tokens[:, :prompt_len], pad, ring_slots, encoded)

  def step(cache, slot):
    token = jax.lax.dynamic_slice_in_dim(tokens, slot, 1, axis=1)
    logits, cache = forward(cache, ring_slots, token, jnp.broadcast_to(slot, (batch, 1)),
                            slot[None])
    return cache, logits[:, 0]

  _, later = jax.lax.scan(step, cache, jnp.arange(prompt_len, length))
  return jnp.concatenate([logits, jnp.swapaxes(later, 0, 1)], axis=1)

