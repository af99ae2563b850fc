"""Synthetic sequence-to-sequence tasks whose accuracy means something: reverse, sort, copy."""
import numpy as np

from transformer_jax.data import rng
from transformer_jax.data.vocab import Vocab
from transformer_jax.errors import ConfigError

__all__ = ['copy', 'reverse', 'Seq2SeqTask', 'sort', 'TASKS']


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


class Seq2SeqTask:
  """{'inputs': (b, S) source ids padded, 'input_valid': bool (b, S), 'decoder_inputs': (b, T)
  = [BOS] + targets[:-1], 'targets': (b, T) = target + [EOS] padded, 'weights': float32 (b, T)
  1.0 on the target and its EOS}, S = T = seq_len.

  Sources are `min_len`..`max_len` random symbols (max_len < seq_len leaves room for EOS).
  Training pairs are drawn afresh at every step; the held-out split is `num_eval` pairs drawn
  from a stream of their own, the same for every seed.
  """

  def __init__(self, name: str, *, alphabet: str, seq_len: int, min_len: int, max_len: int,
               seed: int, num_eval: int):
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
    self.info = {'vocab_size': self.vocab.size, 'seq_len': seq_len}

  def train_batch(self, step: int, batch_size: int, rows: slice) -> dict:
    return self._pairs(rng.generator(rng.GENERATE, self.seed, step), batch_size, rows)

  def eval_examples(self, indices: np.ndarray) -> dict:
    return {key: value[indices] for key, value in self._held_out.items()}

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
    bos = np.full((len(targets), 1), self.vocab.bos_id, np.int32)
    return {'inputs': inputs, 'input_valid': valid,
            'decoder_inputs': np.concatenate([bos, targets[:, :-1]], axis=1), 'targets': targets,
            'weights': (positions <= lengths[:, None]).astype(np.float32)}
