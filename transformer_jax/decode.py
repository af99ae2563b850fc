"""Samplers and `generate`: one parallel prefill of the prompt, then one cached token per step.

With a causal mask the keys and values of token j never change when later tokens arrive, so
each is computed once and kept in the 'cache' collection, and a step runs only the newest
token. The whole generation (cache allocation, prefill, token loop) is one jitted
program whose loop is a `lax.while_loop`; the host waits only for the finished tokens.

A batch holds prompts of different lengths: `prompt_tokens` (B, P) are start-aligned with
`prompt_lengths` (B,). Inside, every row is shifted right so that all prompts end at slot P - 1;
a row padded by k slots has positions -k..-1 there, which `causal_mask` hides from every query,
so each row decodes exactly as its prompt alone would. The new token i sits at slot P - 1 + i
with its true position, prompt length + i.

With a sliding window of W tokens, each layer's cache is a ring of W slots: the token at slot s
writes its keys and values to slot s % W and attends to the slots holding its last W tokens, so
a step costs the same however long the generation runs. A prompt longer than the ring is
prefilled over a cache of its own length under the same banded mask; its last W slots, rotated
into place, become the ring.

The cache protocol: `generate` and `forced_logits` run any Flax module that follows one of two.
- 'decoder': called as
      logits, variables = model.apply({'params': params, 'cache': cache}, tokens, positions,
                                      attention_mask=mask, cache_index=index, mutable=['cache'])
  with tokens and positions (B, T) int32, mask (B, 1, T, S) bool over S cache slots (from
  `layers.causal_mask`), and index the slot of tokens[:, 0] (int32). It returns float logits
  (B, T, V) and keeps the keys and values of each attention layer in the 'cache' collection, S
  slots each, as `layers.Attention` does when given cache_index; the same call to `model.init`
  creates that collection (init_cache takes its shapes from jax.eval_shape, so init never runs).
- 'encoder_decoder': methods encode(inputs, input_valid) -> encoded, and decode(targets,
  encoded, input_valid, positions, *, attention_mask, cache_index) -> logits as above; called
  with encoded=None, decode reads the cross-attention keys and values cached at the prefill.
Our models decode as their family's registry entry says (`Family.decoding`); a module of your
own decodes as its optional attribute `decoding` says ('decoder' by default), and an optional
attribute `max_positions` bounds the tokens its position table covers.
"""
import dataclasses
import functools
from typing import Any, Protocol, Sequence

import flax
import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax.layers import causal_mask
from transformer_jax.models import registry
from transformer_jax.models.common import TextConfig
from transformer_jax.ranges import COUNT, Range
from transformer_jax.settings import Settings

__all__ = [
    'beam_search', 'Beams', 'cache_slots', 'check_inputs', 'check_positions', 'check_sampler',
    'check_window', 'decoding_of', 'filter_logits', 'forced_logits', 'generate', 'Generation',
    'greedy', 'init_cache', 'length_penalty_of', 'max_positions', 'probabilities', 'PROTOCOLS',
    'sample', 'sample_settings', 'sample_text', 'SAMPLER_RANGES', 'TextVocab', 'top_k_mask',
    'top_p_mask']

PROTOCOLS = ('decoder', 'encoder_decoder')


# Samplers: pure float32 functions of the logits (..., V) and an explicit rng. Among equal
# logits the lower token id ranks first, so top-k and top-p keep a definite set under ties.

# What each sampler setting may be, and what its edge means (config.sample's keys check the same).
SAMPLER_RANGES = {'temperature': (Range(0), '0 means greedy'),
                  'top_k': (Range(0, integer=True), '0 keeps every token'),
                  'top_p': (Range(0, 1, open_low=True), '1 keeps every token')}


def check_sampler(temperature: float, top_k: int, top_p: float):
  """Fails on settings that have no meaning, naming the allowed range."""
  for name, value in (('temperature', temperature), ('top_k', top_k), ('top_p', top_p)):
    valid, meaning = SAMPLER_RANGES[name]
    if not valid.admits(value):
      raise ValueError(f'{name}={value} must be {valid.describe()} ({meaning}).')


def greedy(logits: jax.Array) -> jax.Array:
  """The most likely token (the lowest id among ties), int32."""
  return jnp.argmax(logits, axis=-1).astype(jnp.int32)


def top_k_mask(logits: jax.Array, k: int) -> jax.Array:
  """True on exactly the k largest logits: all those above the k-th largest value, then as many
  of those equal to it as there is room for, lowest id first."""
  kth = jax.lax.top_k(logits, k)[0][..., -1:]
  above, tied = logits > kth, logits == kth
  room = k - above.sum(axis=-1, keepdims=True)
  return above | (tied & (jnp.cumsum(tied, axis=-1) <= room))


def top_p_mask(logits: jax.Array, p: float) -> jax.Array:
  """True on the nucleus: the smallest set of most likely tokens whose probability reaches p.

  A token is kept when the tokens ranked before it hold less than p, so the token at which the
  cumulative probability first reaches p (exactly or beyond) is the last one kept.
  """
  probs = jax.nn.softmax(logits, axis=-1)
  order = jnp.argsort(-probs, axis=-1, stable=True)
  cumulative = jnp.cumsum(jnp.take_along_axis(probs, order, axis=-1), axis=-1)
  before = jnp.concatenate([jnp.zeros_like(cumulative[..., :1]), cumulative[..., :-1]], axis=-1)
  return jnp.put_along_axis(jnp.zeros(probs.shape, bool), order, before < p, axis=-1,
                            inplace=False)


def filter_logits(logits: jax.Array, *, temperature: float = 1.0, top_k: int = 0,
                  top_p: float = 1.0) -> jax.Array:
  """Float32 log-weights of the distribution to sample from, built in this order:

  1. temperature: z / tau (computed as (z - max z) / tau, which cannot overflow); tau = 0 is the
     limit tau -> 0, all weight on the greedy token, and involves no division (top-k and top-p
     then change nothing: they always keep the greedy token);
  2. top-k (k > 0): -inf outside the k largest;
  3. top-p (p < 1): -inf outside the nucleus of what steps 1 and 2 left, renormalized.
  Softmax of the result is the sampled distribution: the kept tokens, renormalized.
  """
  check_sampler(temperature, top_k, top_p)
  logits = logits.astype(jnp.float32)
  if temperature == 0:
    return jnp.where(jax.nn.one_hot(greedy(logits), logits.shape[-1], dtype=bool), 0.0, -jnp.inf)
  z = (logits - logits.max(axis=-1, keepdims=True)) / temperature
  if top_k and top_k < z.shape[-1]:
    z = jnp.where(top_k_mask(z, top_k), z, -jnp.inf)
  if top_p < 1:
    z = jnp.where(top_p_mask(z, top_p), z, -jnp.inf)
  return z


def probabilities(logits: jax.Array, **sampler) -> jax.Array:
  """The distribution `sample` draws from (float32, sums to 1); `sampler` as in filter_logits."""
  return jax.nn.softmax(filter_logits(logits, **sampler), axis=-1)


def sample(logits: jax.Array, rng: jax.Array | None, *, temperature: float = 1.0, top_k: int = 0,
           top_p: float = 1.0) -> jax.Array:
  """One int32 token per row of `logits` (..., V); temperature 0 is greedy and ignores `rng`."""
  if temperature == 0:
    check_sampler(temperature, top_k, top_p)
    return greedy(logits)
  weights = filter_logits(logits, temperature=temperature, top_k=top_k, top_p=top_p)
  return jax.random.categorical(rng, weights, axis=-1).astype(jnp.int32)


# Generation.

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


def decoding_of(model) -> str:
  """The cache protocol `model` follows (PROTOCOLS). A cache is only exact under a causal mask,
  so a family without one (an encoder, a ViT) cannot decode."""
  family = registry.of_module(model)
  if family is not None:
    if family.decoding is None:
      raise ValueError(
          f'A {family.name!r} model cannot decode: without a causal mask a new token changes the '
          'keys and values of every earlier token, so there is nothing to cache and no next '
          'token to predict. Decode with a model of a family that has one (decoder, '
          'encoder_decoder).')
    return family.decoding
  decoding = getattr(model, 'decoding', 'decoder')
  if decoding not in PROTOCOLS:
    raise ValueError(f'{type(model).__name__}.decoding={decoding!r} must be one of {PROTOCOLS}.')
  return decoding


def max_positions(model) -> int | None:
  """The most tokens the model's positions cover: its learned table's rows, or None (no limit)."""
  cfg = getattr(model, 'cfg', None)
  if isinstance(cfg, TextConfig):
    return cfg.max_len if cfg.positions == 'learned' else None
  return getattr(model, 'max_positions', None)


def init_cache(model, batch_size: int, cache_len: int, source_len: int | None = None):
  """Zeros shaped like the 'cache' collection for `cache_len` decoder slots (and `source_len`
  encoder outputs of an encoder-decoder).

  The shapes come from jax.eval_shape of init with the decode signature, so init never runs;
  each attention layer holds its keys and values in its layout (`kernels.cache.LAYOUTS`; ours
  (B * num_kv_heads, slots, head_dim)).
  """
  tokens = jax.ShapeDtypeStruct((batch_size, cache_len), jnp.int32)
  mask = jax.ShapeDtypeStruct((batch_size, 1, cache_len, cache_len), jnp.bool_)
  if decoding_of(model) == 'encoder_decoder':
    if source_len is None:
      raise ValueError('An encoder-decoder cache also holds the cross-attention keys and values: '
                       'pass source_len, the length of the encoder input.')
    inputs = jax.ShapeDtypeStruct((batch_size, source_len), jnp.int32)
    init = lambda i, t, m: model.init(
        jax.random.key(0), i, t, method=lambda self, i, t: self.decode(
            t, self.encode(i), attention_mask=m, cache_index=0))
    shapes = jax.eval_shape(init, inputs, tokens, mask)
  else:
    init = lambda t, m: model.init(jax.random.key(0), t, attention_mask=m, cache_index=0)
    shapes = jax.eval_shape(init, tokens, mask)
  return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes['cache'])


def check_window(window):
  """None (the whole context) or a whole number of tokens >= 1."""
  if window is not None and (int(window) != window or window < 1):
    raise ValueError(f'window={window} must be a whole number >= 1 (None attends to the whole '
                     'context).')


def check_positions(model, num_tokens: int, what: str, fix: str):
  """Learned positions stop at the table's last row, window or not."""
  rows = max_positions(model)
  if rows is not None and num_tokens > rows:
    raise ValueError(
        f'{what} need positions up to {num_tokens - 1}, but the learned position table has '
        f'model.max_len={rows} rows: {fix} (a window does not help: it bounds what a token '
        'attends to, not the table row of its position).')


def check_inputs(model, inputs):
  if (inputs is not None) != (decoding_of(model) == 'encoder_decoder'):
    raise ValueError('An encoder-decoder needs its encoder input `inputs`; a decoder-only model '
                     'takes none (its whole context is its tokens).')


def cache_slots(num_tokens: int, window: int | None = None) -> int:
  """Self-attention cache slots for `num_tokens` fed tokens: all of them, or a ring of `window`."""
  return num_tokens if window is None else min(window, num_tokens)


def generate(model, params, prompt_tokens, *, max_new_tokens: int, rng=None,
             temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
             eos_id: int | None = None, pad_id: int = 0, prompt_lengths=None, inputs=None,
             input_valid=None, window: int | None = None, return_logits: bool = False,
             token_limit: int | None = None) -> Generation:
  """`max_new_tokens` new tokens after each prompt, drawn by `sample` (temperature 0: greedy).

  model: a module that follows a cache protocol (above), such as one of our 'decoder' or
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
  prompt_lengths = _checked_lengths(model, prompt_tokens, prompt_lengths, max_new_tokens, inputs,
                                    window)
  return _generate(
      model, params, jnp.asarray(prompt_tokens, jnp.int32), prompt_lengths, inputs, input_valid,
      jax.random.key(0) if rng is None else rng,  # greedy ignores the rng
      jnp.int32(-1 if eos_id is None else eos_id),  # no token id is negative: never stops
      jnp.int32(pad_id), max_new_tokens=max_new_tokens, temperature=float(temperature),
      top_k=int(top_k), top_p=float(top_p), window=window, return_logits=return_logits,
      token_limit=token_limit)


def _checked_lengths(model, prompt_tokens, prompt_lengths, max_new_tokens, inputs, window):
  """The prompt lengths (B,) int32 (default: every row full), after the checks that generate and
  beam_search share: a window, the new tokens, the position table, the encoder input."""
  check_window(window)
  batch, prompt_len = np.shape(prompt_tokens)
  if max_new_tokens < 1:
    raise ValueError(f'max_new_tokens={max_new_tokens} must be at least 1.')
  check_positions(model, prompt_len + max_new_tokens - 1,
                  f'A prompt of {prompt_len} slots and {max_new_tokens} new tokens',
                  'shorten the prompt or max_new_tokens')
  check_inputs(model, inputs)
  if prompt_lengths is None:
    return jnp.full((batch,), prompt_len, jnp.int32)
  if not isinstance(prompt_lengths, jax.core.Tracer):
    lengths = np.asarray(prompt_lengths)
    if lengths.shape != (batch,) or lengths.min() < 1 or lengths.max() > prompt_len:
      raise ValueError(f'prompt_lengths {lengths} must give each of the {batch} rows between 1 '
                       f'and {prompt_len} tokens (an empty prompt has nothing to predict from: '
                       'start it with a BOS token).')
  return jnp.asarray(prompt_lengths, jnp.int32)


def _cached_forward(model, params, window, input_valid=None):
  """forward(cache, slots, tokens, positions, query_slots, encoded=None) -> (logits, cache).

  Runs `tokens` (B, T), which sit at `query_slots` (T,) of their rows' sequences, over a cache of
  `slots` self-attention slots, writing their keys and values from slot query_slots[0] % slots
  on: a ring once the sequence outgrows it, which takes one token per call (see `causal_mask`).
  """
  encoder_decoder = decoding_of(model) == 'encoder_decoder'

  def forward(cache, slots, tokens, positions, query_slots, encoded=None):
    args = (tokens, encoded, input_valid, positions) if encoder_decoder else (tokens, positions)
    logits, variables = model.apply(
        {'params': params, 'cache': cache}, *args,
        attention_mask=causal_mask(query_slots, positions, slots, window),
        cache_index=query_slots[0] % slots, mutable=['cache'],
        method='decode' if encoder_decoder else None)
    return logits, variables['cache']

  return forward


def _prefill(model, forward, prompt, pad, ring_slots: int, encoded=None):
  """Logits (B, P, V) of a whole prompt in one pass, and a cache of `ring_slots` self-attention
  slots that holds the keys and values of its last `ring_slots` tokens, token s at slot
  s % ring_slots (the cross-attention keys and values of an encoder-decoder as they are).

  A prompt longer than the ring runs over a cache of its own length, under the same banded mask
  as the steps, whose last slots then become the ring.
  """
  batch, prompt_len = prompt.shape
  slots = max(prompt_len, ring_slots)
  source_len = None if encoded is None else encoded.shape[1]
  query_slots = jnp.arange(prompt_len)
  logits, cache = forward(init_cache(model, batch, slots, source_len), slots, prompt,
                          query_slots[None, :] - pad[:, None], query_slots, encoded)
  if slots > ring_slots:
    kept = slots - ring_slots + (np.arange(ring_slots) - slots) % ring_slots
    ring = jax.eval_shape(lambda: init_cache(model, batch, ring_slots, source_len))
    cache = jax.tree.map(lambda x, r: _ring_of(x, r.shape, kept), cache, ring)
  return logits, cache


def _ring_of(x, ring_shape, kept):
  """The `kept` slots of a self-attention cache, along the one axis on which its shape differs
  from the ring's, whatever the layout; a cross-attention cache (no such axis) as it is."""
  differs = [axis for axis, (n, r) in enumerate(zip(x.shape, ring_shape)) if n != r]
  return jnp.take(x, kept, axis=differs[0]) if differs else x


def _end_aligned(prompt_tokens, prompt_lengths):
  """The prompts shifted right so that each ends at slot P - 1, and each row's left padding."""
  prompt_len = prompt_tokens.shape[1]
  pad = prompt_len - prompt_lengths
  slots = jnp.arange(prompt_len)
  shifted = jnp.take_along_axis(prompt_tokens, (slots[None, :] - pad[:, None]) % prompt_len, 1)
  # Padding slots hold token 0: never attended to, but their keys and values must be finite,
  # since a masked weight of exactly 0 times NaN is still NaN.
  return jnp.where(slots[None, :] >= pad[:, None], shifted, 0), pad


def _limited(logits, token_limit):
  """-inf at the ids from `token_limit` on (None: none)."""
  if token_limit is None:
    return logits
  return jnp.where(jnp.arange(logits.shape[-1]) < token_limit, logits, -jnp.inf)


def _encoded(model, params, inputs, input_valid):
  """An encoder-decoder's encoder outputs; None for a decoder."""
  if decoding_of(model) != 'encoder_decoder':
    return None
  return model.apply({'params': params}, inputs, input_valid, method='encode')


@functools.partial(jax.jit, static_argnames=('model', 'max_new_tokens', 'temperature', 'top_k',
                                             'top_p', 'window', 'return_logits', 'token_limit'))
def _generate(model, params, prompt_tokens, prompt_lengths, inputs, input_valid, rng, eos_id,
              pad_id, *, max_new_tokens, temperature, top_k, top_p, window, return_logits,
              token_limit):
  batch, prompt_len = prompt_tokens.shape
  # The last new token is never fed back.
  ring_slots = cache_slots(prompt_len + max_new_tokens - 1, window)
  prompt, pad = _end_aligned(prompt_tokens, prompt_lengths)
  def draw(logits, step):
    return sample(_limited(logits, token_limit), jax.random.fold_in(rng, step),
                  temperature=temperature, top_k=top_k, top_p=top_p)

  forward = _cached_forward(model, params, window, input_valid)
  encoded = _encoded(model, params, inputs, input_valid)

  # Prefill: the whole prompt in one pass; its last slot predicts the first new token.
  logits, cache = _prefill(model, forward, prompt, pad, ring_slots, encoded)
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


# Beam search.

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
  prompt_lengths = _checked_lengths(model, prompt_tokens, prompt_lengths, max_new_tokens, inputs,
                                    window)
  return _beam_search(
      model, params, jnp.asarray(prompt_tokens, jnp.int32), prompt_lengths, inputs, input_valid,
      jnp.int32(-1 if eos_id is None else eos_id), jnp.int32(pad_id), beam_size=int(beam_size),
      max_new_tokens=max_new_tokens, length_penalty=float(length_penalty), window=window,
      token_limit=token_limit)


def _rows_of(cache, rows, one_row, two_rows):
  """The cache of the batch rows `rows`, whatever its layout: each leaf along its batch axis (the
  one whose size grows with the batch, B or B * kv_heads folded), found by comparing the shapes
  of a cache of one row and of two."""
  def take(x, one, two):
    axis = next(i for i, (m, n) in enumerate(zip(one.shape, two.shape)) if m != n)
    per_row = one.shape[axis]
    grouped = x.reshape(x.shape[:axis] + (-1, per_row) + x.shape[axis + 1:])
    taken = jnp.take(grouped, rows, axis=axis)
    return taken.reshape(x.shape[:axis] + (-1,) + x.shape[axis + 1:])
  return jax.tree.map(take, cache, one_row, two_rows)


def _extend(state: _Search, logits, rows_of, token_limit, eos_id, length_penalty: float):
  """The beams after choosing the token at `state.step` from `logits` (B * K, V), the cache rows
  reordered by rows_of(cache, rows) to follow the live ones (their tokens are fed next)."""
  live, finished = state.live, state.finished
  batch, k, n = live.tokens.shape
  log_probs = jax.nn.log_softmax(_limited(logits.astype(jnp.float32), token_limit))
  log_probs = log_probs.reshape(batch, k, -1) + live.log_probs[..., None]
  vocab = log_probs.shape[-1]
  # 2K candidates always hold K that do not end, however many of them end in EOS.
  top, index = jax.lax.top_k(log_probs.reshape(batch, -1), 2 * k)
  parent, token = index // vocab, index % vocab
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
  prompt, pad = _end_aligned(prompt_tokens, prompt_lengths)
  encoded = _encoded(model, params, inputs, input_valid)
  logits, cache = _prefill(model, _cached_forward(model, params, window, input_valid), prompt,
                           pad, ring_slots, encoded)
  source_len = None if encoded is None else encoded.shape[1]
  one_row, two_rows = (jax.eval_shape(lambda b=b: init_cache(model, b, ring_slots, source_len))
                       for b in (1, 2))
  rows_of = lambda cache, rows: _rows_of(cache, rows, one_row, two_rows)
  # Every prompt's K rows start as copies of its prefill; only the first is live, so the first
  # step's K beams are K different tokens.
  beam_rows = jnp.repeat(jnp.arange(batch), k)
  empty = jnp.full((batch, k, max_new_tokens), pad_id, jnp.int32)
  nothing = jnp.full((batch, k), -jnp.inf)
  zeros = jnp.zeros((batch, k), jnp.int32)
  first_live = jnp.broadcast_to(jnp.where(jnp.arange(k) == 0, 0.0, -jnp.inf), (batch, k))
  state = _Search(
      step=jnp.int32(0), token=jnp.zeros((batch * k,), jnp.int32),
      live=Beams(tokens=empty, lengths=zeros, log_probs=first_live, scores=nothing),
      finished=Beams(tokens=empty, lengths=zeros, log_probs=nothing, scores=nothing),
      cache=rows_of(cache, beam_rows))
  state = _extend(state, logits[beam_rows, -1], rows_of, token_limit, eos_id, length_penalty)
  beam_pad = pad[beam_rows]
  forward = _cached_forward(model, params, window,
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
  forward = _cached_forward(model, params, window, input_valid)
  encoded = _encoded(model, params, inputs, input_valid)
  logits, cache = _prefill(model, forward, tokens[:, :prompt_len], pad, ring_slots, encoded)

  def step(cache, slot):
    token = jax.lax.dynamic_slice_in_dim(tokens, slot, 1, axis=1)
    logits, cache = forward(cache, ring_slots, token, jnp.broadcast_to(slot, (batch, 1)),
                            slot[None])
    return cache, logits[:, 0]

  _, later = jax.lax.scan(step, cache, jnp.arange(prompt_len, length))
  return jnp.concatenate([logits, jnp.swapaxes(later, 0, 1)], axis=1)


# Text in, text out: what `launch.py --mode=sample` runs.

class TextVocab(Protocol):
  """What sample_text needs of a tokenizer; `eos_id` (stop there), `bos_id` (the decoder prompt
  of an encoder-decoder) and `size` (the ids it decodes; a model's larger vocabulary is never
  drawn from past it) are optional attributes."""

  def encode(self, text: str) -> Sequence[int]: ...

  def decode(self, ids: Sequence[int]) -> str: ...


def sample_text(model, params, vocab: TextVocab, prompt: str = 'ROMEO:', *,
                max_new_tokens: int = 256, temperature: float = 0.8, top_k: int = 0,
                top_p: float = 1.0, seed: int = 0, num_samples: int = 1,
                window: int | None = None, beam_size: int = 0,
                length_penalty: float = 0.6) -> list[str]:
  """`num_samples` continuations of `prompt` (decoded, cut before EOS), drawn in one batch, or
  with beam_size > 0 the `num_samples` best of beam_search's beams (the sampler settings unused).

  The keyword arguments are the keys of config.sample, so the sample mode calls
  sample_text(model, params, vocab, **sample_settings(config)). A decoder-only model continues
  the prompt; an encoder-decoder reads it as its encoder input and writes from `vocab.bos_id`.
  window: as in `generate` (0 or None: the whole context).
  """
  if beam_size and num_samples > beam_size:
    raise ValueError(f'num_samples={num_samples} beams of beam_size={beam_size}: a beam search '
                     'returns at most beam_size outputs; raise beam_size or lower num_samples.')
  encoder_decoder = decoding_of(model) == 'encoder_decoder'
  ids = list(vocab.encode(prompt))
  if not ids:
    raise ValueError('The prompt encodes to no tokens: give at least one character.')
  eos_id = getattr(vocab, 'eos_id', None)
  rows = 1 if beam_size else num_samples
  extra = {}
  if encoder_decoder:
    bos_id = getattr(vocab, 'bos_id', None)
    if bos_id is None:
      raise ValueError('An encoder-decoder starts its output from a BOS token: the vocabulary '
                       'needs a bos_id.')
    extra['inputs'] = jnp.asarray([ids] * rows, jnp.int32)
    ids = [bos_id]
  common = dict(max_new_tokens=max_new_tokens, eos_id=eos_id, window=window or None,
                token_limit=getattr(vocab, 'size', None), **extra)
  if beam_size:
    out = beam_search(model, params, jnp.asarray([ids], jnp.int32), beam_size=beam_size,
                      length_penalty=length_penalty, **common)
    tokens, lengths = jax.device_get((out.tokens[0, :num_samples], out.lengths[0, :num_samples]))
  else:
    out = generate(model, params, jnp.asarray([ids] * rows, jnp.int32), rng=jax.random.key(seed),
                   temperature=temperature, top_k=top_k, top_p=top_p, **common)
    tokens, lengths = jax.device_get((out.tokens, out.lengths))
  texts = []
  for row, length in zip(tokens, lengths):
    row = row[:length].tolist()
    texts.append(vocab.decode(row[:-1] if row and row[-1] == eos_id else row))
  return texts


def sample_settings(config) -> dict:
  """The keyword arguments of sample_text from a run's config: config.sample, whose window
  defaults to the context the run trained on, data.seq_len (0: the whole context)."""
  settings = dict(config.sample)
  if settings['window'] is None:
    settings['window'] = config.data.seq_len
  return settings


@dataclasses.dataclass(frozen=True)
class SampleSettings(Settings):
  """The keys of config.sample: sample_text's keyword arguments. window None: the context the run
  trained on (data.seq_len); 0: the whole context."""
  SECTION = 'sample'
  prompt: str = 'ROMEO:'
  max_new_tokens: int = 256
  temperature: float = 0.8
  top_k: int = 0
  top_p: float = 1.0
  seed: int = 0
  num_samples: int = 1
  window: int | None = None
  beam_size: int = 0
  length_penalty: float = 0.6

  RANGES = {'max_new_tokens': COUNT, **{name: valid for name, (valid, _) in SAMPLER_RANGES.items()},
            'seed': Range(0, integer=True), 'num_samples': COUNT,
            'window': Range(0, integer=True, optional=True), 'beam_size': Range(0, integer=True),
            'length_penalty': Range(0)}


@dataclasses.dataclass(frozen=True)
class EvalSettings(Settings):
  """The keys of config.eval: how an encoder-decoder's held-out outputs are decoded at each
  evaluation: greedily, or with beam_size > 0 the best beam under the length penalty."""
  SECTION = 'eval'
  beam_size: int = 0
  length_penalty: float = 0.6

  RANGES = {'beam_size': Range(0, integer=True), 'length_penalty': Range(0)}
