"""Text in, text out: what `launch.py --mode=sample` runs."""
from typing import Protocol, Sequence

import jax
import jax.numpy as jnp

from transformer_jax.decode.beam import beam_search
from transformer_jax.decode.cache import decoding_of
from transformer_jax.decode.generation import generate
from transformer_jax.decode.settings import SampleSettings

__all__ = ['sample_text', 'TextVocab']


class TextVocab(Protocol):
  """What sample_text needs of a tokenizer; `eos_id` (stop there, and end an encoder-decoder's
  input), `bos_id` (the decoder prompt of an encoder-decoder), `text_bos` (the BOS before a
  decoder's prompt) and `size` (the ids it decodes; a model's larger vocabulary is never drawn
  from past it) are optional attributes. `encode` gives a text's ids alone, without special
  tokens (data.tokenizer's)."""

  def encode(self, text: str) -> Sequence[int]: ...

  def decode(self, ids: Sequence[int]) -> str: ...


def sample_text(model, params, vocab: TextVocab, settings: SampleSettings, *,
                seq_len: int | None = None, inputs=None,
                start_ids: Sequence[int] | None = None) -> list[str]:
  """`settings.num_samples` continuations of `settings.prompt` (decoded, cut before EOS), drawn
  in one batch, or with beam_size > 0 the `num_samples` best of beam_search's beams (the sampler
  settings unused).

  The sample mode calls sample_text(model, params, vocab, SampleSettings.of(config.sample),
  seq_len=config.data.seq_len). A decoder-only model continues the prompt, after the
  tokenizer's own BOS where it has one (`text_bos`: LLaMA's <s>, with which a language model's
  documents start, data.text_data); an encoder-decoder reads it and EOS as its encoder input
  (as every text-to-text task's inputs end, and T5's `tokenizer(prompt)`) and writes from
  `start_ids` (the sample mode passes the token its decoder was trained to start from: BOS, or
  T5's PAD), else `vocab.bos_id`.
  settings.window: as in `generate`, 0 the whole context; unset, `seq_len` (the context the
  model trained on), or the whole context without one. An encoder-decoder given `inputs` (one
  example, batch axis first: a speech model's features) reads them instead of the prompt
  (Whisper's `start_ids` are its decoder prompt).
  """
  encoder_decoder = decoding_of(model) == 'encoder_decoder'
  ids = [] if inputs is not None else list(vocab.encode(settings.prompt))
  if not ids and inputs is None:
    raise ValueError('The prompt encodes to no tokens: give at least one character.')
  eos_id, text_bos = getattr(vocab, 'eos_id', None), getattr(vocab, 'text_bos', None)
  if inputs is None and encoder_decoder and eos_id is not None:
    ids = ids + [eos_id]
  elif inputs is None and not encoder_decoder and text_bos is not None:
    ids = [text_bos] + ids
  rows = 1 if settings.beam_size else settings.num_samples
  extra = {}
  if encoder_decoder:
    bos_id = getattr(vocab, 'bos_id', None)
    if bos_id is None and not start_ids:
      raise ValueError('An encoder-decoder starts its output from start_ids, else the '
                       "vocabulary's BOS, which this one lacks: pass start_ids (T5 starts from "
                       'its pad id, 0).')
    extra['inputs'] = (jnp.asarray([ids] * rows, jnp.int32) if inputs is None
                       else jnp.repeat(jnp.asarray(inputs), rows, axis=0))
    ids = list(start_ids or [bos_id])
  window = seq_len if settings.window is None else settings.window
  common = dict(max_new_tokens=settings.max_new_tokens, eos_id=eos_id, window=window or None,
                token_limit=getattr(vocab, 'size', None), **extra)
  if settings.beam_size:
    out = beam_search(model, params, jnp.asarray([ids], jnp.int32), beam_size=settings.beam_size,
                      length_penalty=settings.length_penalty, **common)
    kept = settings.num_samples
    tokens, lengths = jax.device_get((out.tokens[0, :kept], out.lengths[0, :kept]))
  else:
    out = generate(model, params, jnp.asarray([ids] * rows, jnp.int32),
                   rng=jax.random.key(settings.seed), temperature=settings.temperature,
                   top_k=settings.top_k, top_p=settings.top_p, **common)
    tokens, lengths = jax.device_get((out.tokens, out.lengths))
  texts = []
  for row, length in zip(tokens, lengths):
    row = row[:length].tolist()
    texts.append(vocab.decode(row[:-1] if row and row[-1] == eos_id else row))
  return texts

