"""Character-level text as next-character windows (decoder) or BERT's masked view (encoder)."""
import numpy as np

from transformer_jax.data import rng
from transformer_jax.data.vocab import Vocab
from transformer_jax.errors import ConfigError

__all__ = ['MaskedTask', 'NextTokenTask', 'synthetic_text', 'windows']


class _CharText:
  """The train and held-out texts as int32 ids of their sorted characters."""

  def __init__(self, train_text: str, eval_text: str, *, seq_len: int, seed: int, mask: bool):
    self.vocab = Vocab.of_text(train_text + eval_text, mask=mask)
    self.train_ids = np.array(self.vocab.encode(train_text), np.int32)
    self.eval_ids = np.array(self.vocab.encode(eval_text), np.int32)
    for split, ids in (('train', self.train_ids), ('held-out', self.eval_ids)):
      if len(ids) <= seq_len:
        raise ConfigError(f'The {split} text has {len(ids)} characters, too few for windows of '
                          f'data.seq_len={seq_len}: lower --config.data.seq_len.')
    self.seq_len, self.seed = seq_len, seed
    self.info = {'vocab_size': self.vocab.size, 'seq_len': seq_len,
                 'num_train_tokens': len(self.train_ids)}


def windows(ids: np.ndarray, starts: np.ndarray, length: int) -> np.ndarray:
  return ids[starts[:, None] + np.arange(length)]


class NextTokenTask(_CharText):
  """{'inputs': int32 (b, T), 'targets': int32 (b, T)}, the targets one character ahead.

  Training windows start anywhere, uniformly (as the PyTorch reference's get_batch draws them);
  held-out windows tile the held-out text without overlap.
  """

  def __init__(self, train_text: str, eval_text: str, *, seq_len: int, seed: int):
    super().__init__(train_text, eval_text, seq_len=seq_len, seed=seed, mask=False)
    self.num_eval_examples = (len(self.eval_ids) - 1) // seq_len

  def train_batch(self, step: int, batch_size: int, rows: slice) -> dict:
    generator = rng.generator(rng.WINDOWS, self.seed, step)
    starts = generator.integers(0, len(self.train_ids) - self.seq_len, size=batch_size)
    return self._pairs(self.train_ids, starts[rows])

  def eval_examples(self, indices: np.ndarray) -> dict:
    return self._pairs(self.eval_ids, indices * self.seq_len)

  def _pairs(self, ids: np.ndarray, starts: np.ndarray) -> dict:
    window = windows(ids, starts, self.seq_len + 1)
    return {'inputs': window[:, :-1], 'targets': window[:, 1:]}


class MaskedTask(_CharText):
  """{'inputs': corrupted ids, 'targets': original ids, 'weights': float32 1.0 where selected}.

  BERT's view of T-character windows: each position is selected with `probability`; a selected
  one becomes MASK (80%), a random character (10%) or stays as it is (10%); the loss counts the
  selected positions only. Held-out windows tile the held-out text, their corruption the same
  for every seed.
  """

  def __init__(self, train_text: str, eval_text: str, *, seq_len: int, seed: int,
               probability: float):
    super().__init__(train_text, eval_text, seq_len=seq_len, seed=seed, mask=True)
    self.probability = probability
    self.num_eval_examples = len(self.eval_ids) // seq_len
    tokens = self.eval_ids[:self.num_eval_examples * seq_len].reshape(-1, seq_len)
    self._held_out = self._corrupt(tokens, *self._draws(rng.generator(rng.HELD_OUT), tokens.shape))

  def train_batch(self, step: int, batch_size: int, rows: slice) -> dict:
    generator = rng.generator(rng.WINDOWS, self.seed, step)
    starts = generator.integers(0, len(self.train_ids) - self.seq_len + 1, size=batch_size)
    draws = self._draws(generator, (batch_size, self.seq_len))
    tokens = windows(self.train_ids, starts[rows], self.seq_len)
    return self._corrupt(tokens, *(draw[rows] for draw in draws))

  def eval_examples(self, indices: np.ndarray) -> dict:
    return {key: value[indices] for key, value in self._held_out.items()}

  def _draws(self, generator: np.random.Generator, shape: tuple[int, int]) -> tuple:
    """Uniforms that select positions and choose what they become, and random characters (the
    ids below MASK)."""
    return (generator.random(shape), generator.random(shape),
            generator.integers(0, self.vocab.mask_id, size=shape, dtype=np.int32))

  def _corrupt(self, tokens, select, action, random_ids) -> dict:
    selected = select < self.probability
    inputs = np.where(selected & (action < 0.8), self.vocab.mask_id,
                      np.where(selected & (action < 0.9), random_ids, tokens))
    return {'inputs': inputs.astype(np.int32), 'targets': tokens,
            'weights': selected.astype(np.float32)}


def synthetic_text(alphabet: str, num_eval_windows: int, seq_len: int) -> tuple[str, str]:
  """A learnable text: one random order of `alphabet` (the same for every seed), repeated, so
  each character determines the next. (train, held-out): the held-out part has exactly
  `num_eval_windows` windows of `seq_len`, and the train part is 9 times as long."""
  cycle = ''.join(rng.generator(rng.TASK).permutation(list(alphabet)))
  eval_length = num_eval_windows * seq_len + 1
  text = cycle * (10 * eval_length // len(cycle) + 1)
  return text[:9 * eval_length], text[9 * eval_length:10 * eval_length]
