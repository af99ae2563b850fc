"""Synthetic sequence-to-sequence tasks whose accuracy means something: reverse, sort, copy."""
import dataclasses

import numpy as np

from transformer_jax.data import rng
from transformer_jax.data.settings import DataPart, register_part
from transformer_jax.data.vocab import Vocab, decoder_start_id
from transformer_jax.errors import ConfigError
from transformer_jax.ranges import COUNT, Range

__all__ = ['copy', 'decode_held_out', 'exact_match', 'GeneratedSettings', 'reverse',
           'Seq2SeqSettings', 'Seq2SeqTask', 'sort', 'TASKS']


@register_part
@dataclasses.dataclass(frozen=True)
class GeneratedSettings(DataPart):
  """The symbols of generated text and of the seq2seq tasks."""
  PART = 'generated'
  alphabet: str = 'abcdefghijklmnopqrstuvwxyz'


@register_part
@dataclasses.dataclass(frozen=True)
class Seq2SeqSettings(DataPart):
  """The keys of config.data that encoder-decoder data reads: the generated tasks' lengths, and
  how many held-out pairs evaluation decodes (a translation's and a seq2seq task's)."""
  PART = 'seq2seq'
  seq2seq_min_len: int = 1  # shortest source, in symbols
  seq2seq_max_len: int | None = None  # longest source; None: seq_len - 1 (the target needs its EOS)
  exact_match_examples: int = 0  # held-out pairs decoded for eval_exact_match; 0: none

  RANGES = {'seq2seq_min_len': COUNT, 'seq2seq_max_len': Range(1, integer=True, optional=True),
            'exact_match_examples': Range(0, integer=True)}


def reverse(sources: np.ndarray, lengths: np.ndarray) -> np.ndarray:
  """Each row's first `length` symbols in reverse order (what follows is garbage)."""
  index = np.clip(lengths[:, None] - 1 - np.arange(sources.shape[1]), 0, None)
  return np.take_along_axis(sources, index, axis=1)


def sort(sources: np.ndarray, lengths: np.ndarray) -> np.ndarray:
  """Each row's first `length` symbols in ascending id order (the alphabet's order)."""
  valid = np.arange(sources.shape[1]) < lengths[:, None]
  return np.sort(np.where(valid, sources, np.iinfo(sources.dtype).max), axis=1)


def copy(sources: np.ndarray, lengths: np.ndarray) -> np.ndarray:
  del lengths
  return sources


TASKS = {'seq2seq_reverse': reverse, 'seq2seq_sort': sort, 'synthetic': copy}


def decode_held_out(generate, pairs, count: int, batch_size: int, vocab, max_new_tokens: int,
                    prompt: list[int] | None = None):
  """The outputs (token lists, cut before EOS) of held-out pairs 0..count-1, whose encoder inputs
  pairs(rows) gives, decoded from `prompt` (default: the decoder's start token, BOS or else PAD
  as the training targets are shifted: `vocab.decoder_start_id`) by generate(**keywords) ->
  (B, N) new tokens (decode.generate's keywords) on batches of `batch_size`, the last filled up
  with repeats so that every batch has one shape."""
  prompt = np.tile(np.asarray(prompt or [decoder_start_id(vocab)], np.int32), (batch_size, 1))
  outputs = []
  for start in range(0, count, batch_size):
    batch = pairs([min(row, count - 1) for row in range(start, start + batch_size)])
    tokens = generate(prompt_tokens=prompt,
                      inputs=batch['inputs'], input_valid=batch['input_valid'],
                      max_new_tokens=max_new_tokens, eos_id=vocab.eos_id,
                      pad_id=vocab.pad_id or 0, token_limit=vocab.size)
    for row in np.asarray(tokens)[:count - start].tolist():
      outputs.append(row[:row.index(vocab.eos_id)] if vocab.eos_id in row else row)
  return outputs


def exact_match(outputs: list, references: list) -> float:
  """The share of outputs equal to their reference."""
  return float(np.mean([output == reference for output, reference in zip(outputs, references)]))


class Seq2SeqTask:
  """{'inputs': (b, S) source ids padded, 'input_valid': bool (b, S), 'decoder_inputs': (b, T)
  = [BOS] + targets[:-1], 'targets': (b, T) = target + [EOS] padded, 'weights': float32 (b, T)
  1.0 on the target and its EOS}, S = T = seq_len.

  Sources are `min_len`..`max_len` random symbols (max_len < seq_len leaves room for EOS).
  Training pairs are drawn afresh at every step; the held-out split is `num_eval` pairs drawn
  from a stream of their own, the same for every seed.
  """

  def __init__(self, name: str, *, alphabet: str, seq_len: int, min_len: int, max_len: int,
               seed: int, num_eval: int, exact_match_examples: int = 0):
    if not 1 <= min_len <= max_len < seq_len:
      raise ConfigError(f'Sources of data.seq2seq_min_len={min_len} to data.seq2seq_max_len='
                        f'{max_len} symbols need 1 <= min_len <= max_len < data.seq_len={seq_len} '
                        '(the target needs room for EOS).')
    self.transform = TASKS[name]
    self.vocab = Vocab.seq2seq(alphabet)
    self.token_bytes = self.vocab.token_bytes
    self.seq_len, self.min_len, self.max_len, self.seed = seq_len, min_len, max_len, seed
    self.num_eval_examples = num_eval
    self._held_out = self._pairs(rng.generator(rng.HELD_OUT), num_eval, slice(None))
    self.exact_match_examples = min(exact_match_examples, num_eval)
    self.info = {'vocab_size': self.vocab.size, 'seq_len': seq_len}

  def train_batch(self, step: int, batch_size: int, rows: slice) -> dict:
    return self._pairs(rng.generator(rng.GENERATE, self.seed, step), batch_size, rows)

  def eval_examples(self, indices: np.ndarray) -> dict:
    return {key: value[indices] for key, value in self._held_out.items()}

  def generation_metrics(self, generate, batch_size: int) -> dict:
    """{'eval_exact_match': the share of the first data.exact_match_examples held-out pairs
    whose decoded output is exactly the target} ({} for none); generate as decode_held_out's."""
    count = self.exact_match_examples
    if not count:
      return {}
    outputs = decode_held_out(generate, self.eval_examples, count, batch_size, self.vocab,
                              self.seq_len)
    held_out = self._held_out
    targets = [row[:length].tolist() for row, length in
               zip(held_out['targets'], held_out['input_valid'].sum(axis=1))]
    return {'eval_exact_match': exact_match(outputs, targets[:count])}

  def _pairs(self, generator: np.random.Generator, count: int, rows: slice) -> dict:
    """Draws `count` pairs' numbers and builds the `rows` of them."""
    lengths = generator.integers(self.min_len, self.max_len + 1, size=count)[rows]
    first = self.vocab.eos_id + 1
    symbols = generator.integers(first, self.vocab.size, size=(count, self.seq_len),
                                 dtype=np.int32)[rows]
    positions = np.arange(self.seq_len)
    valid = positions < lengths[:, None]
    inputs = np.where(valid, symbols, self.vocab.pad_id)
    target = np.where(valid, self.transform(inputs, lengths), self.vocab.pad_id)
    targets = np.where(positions == lengths[:, None], self.vocab.eos_id, target)
    start = np.full((len(targets), 1), decoder_start_id(self.vocab), np.int32)
    return {'inputs': inputs, 'input_valid': valid,
            'decoder_inputs': np.concatenate([start, targets[:, :-1]], axis=1), 'targets': targets,
            'weights': (positions <= lengths[:, None]).astype(np.float32)}
