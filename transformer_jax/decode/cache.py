"""The cache protocol: how a model is run over a KV cache, and how prompts sit in it.

With a causal mask the keys and values of token j never change when later tokens arrive, so
each is computed once and kept in the 'cache' collection, and a step runs only the newest token.

The cache protocol: `generate`, `beam_search` and `forced_logits` run any Flax module that
follows one of two.
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
  An encoder whose input is not (B, S) token ids, S of them encoded into S positions (Whisper's
  log-Mel features), names the input of S encoder positions by a method
  encoder_input(batch_size, S) -> jax.ShapeDtypeStruct.
Our models decode as their family's registry entry says (`Family.decoding`); a module of your
own decodes as its optional attribute `decoding` says ('decoder' by default), and an optional
attribute `max_positions` bounds the tokens its position table covers.

A batch holds prompts of different lengths: `prompt_tokens` (B, P) are start-aligned with
`prompt_lengths` (B,). Inside, every row is shifted right so that all prompts end at slot P - 1
(`end_aligned`); a row padded by k slots has positions -k..-1 there, which `causal_mask` hides
from every query, so each row decodes exactly as its prompt alone would. The new token i sits at
slot P - 1 + i with its true position, prompt length + i.

With a sliding window of W tokens, each layer's cache is a ring of W slots: the token at slot s
writes its keys and values to slot s % W and attends to the slots holding its last W tokens, so
a step costs the same however long the generation runs. A prompt longer than the ring is
prefilled over a cache of its own length under the same banded mask; its last W slots, rotated
into place, become the ring (`prefill`).
"""
import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax.layers import causal_mask, row_blocks
from transformer_jax.models import registry
from transformer_jax.models.common import TextConfig

__all__ = [
    'cache_slots', 'cached_forward', 'check_inputs', 'check_positions', 'check_window',
    'checked_lengths', 'decoding_of', 'encoder_outputs', 'end_aligned', 'init_cache',
    'max_positions', 'prefill', 'PROTOCOLS']

PROTOCOLS = ('decoder', 'encoder_decoder')


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
  """Zeros shaped like the 'cache' collection for `cache_len` decoder slots (and the
  `source_len` encoder positions of an encoder-decoder).

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
    inputs = (model.encoder_input(batch_size, source_len) if hasattr(model, 'encoder_input')
              else jax.ShapeDtypeStruct((batch_size, source_len), jnp.int32))
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


def checked_lengths(model, prompt_tokens, prompt_lengths, max_new_tokens, inputs, window):
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


def cached_forward(model, params, window, input_valid=None):
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


def prefill(model, forward, prompt, pad, ring_slots: int, encoded=None):
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


def end_aligned(prompt_tokens, prompt_lengths):
  """The prompts shifted right so that each ends at slot P - 1, and each row's left padding."""
  prompt_len = prompt_tokens.shape[1]
  pad = prompt_len - prompt_lengths
  slots = jnp.arange(prompt_len)
  shifted = jnp.take_along_axis(prompt_tokens, (slots[None, :] - pad[:, None]) % prompt_len, 1)
  # Padding slots hold token 0: never attended to, but their keys and values must be finite,
  # since a masked weight of exactly 0 times NaN is still NaN.
  return jnp.where(slots[None, :] >= pad[:, None], shifted, 0), pad


def encoder_outputs(model, params, inputs, input_valid):
  """An encoder-decoder's encoder outputs; None for a decoder."""
  if decoding_of(model) != 'encoder_decoder':
    return None
  with row_blocks():
    return model.apply({'params': params}, inputs, input_valid, method='encode')
