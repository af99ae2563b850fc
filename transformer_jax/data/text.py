"""Token streams as next-token windows (decoder) or BERT's masked view (encoder), and packed rows
of whole documents for both (data.packing).

Every task holds its tokenizer as `vocab` and `token_bytes` (the UTF-8 bytes of each id), which
evaluation turns into bits per byte.
"""
import numpy as np

from transformer_jax.data import packing, rng
from transformer_jax.errors import ConfigError

__all__ = ['MaskedTask', 'NextTokenTask', 'PackedMaskedTask', 'PackedNextTokenTask',
           'synthetic_text', 'windows']


def windows(ids: np.ndarray, starts: np.ndarray, length: int) -> np.ndarray:
  return np.asarray(ids[starts[:, None] + np.arange(length)], np.int32)


class _Stream:
  """The train and held-out token streams (1-D integer arrays, memory-mapped or not)."""

  def __init__(self, train_ids, eval_ids, tokenizer, *, seq_len: int, seed: int):
    for split, ids in (('train', train_ids), ('held-out', eval_ids)):
      if len(ids) <= seq_len:
        raise ConfigError(f'The {split} text has {len(ids)} tokens, too few for windows of '
                          f'data.seq_len={seq_len}: lower --config.data.seq_len.')
    self.vocab, self.token_bytes = tokenizer, tokenizer.token_bytes
    self.train_ids, self.eval_ids = train_ids, eval_ids
    self.seq_len, self.seed = seq_len, seed
    self.info = {'vocab_size': tokenizer.size, 'seq_len': seq_len,
                 'num_train_tokens': len(train_ids), 'tokenizer': tokenizer.kind}


class NextTokenTask(_Stream):
  """{'inputs': int32 (b, T), 'targets': int32 (b, T)}, the targets one token ahead.

  Training windows start anywhere, uniformly (as the PyTorch reference's get_batch draws them);
  held-out windows tile the held-out stream without overlap.
  """

  def __init__(self, train_ids, eval_ids, tokenizer, *, seq_len: int, seed: int):
    super().__init__(train_ids, eval_ids, tokenizer, seq_len=seq_len, seed=seed)
    self.num_eval_examples = (len(self.eval_ids) - 1) // seq_len

  def train_batch(self, step: int, batch_size: int, rows: slice) -> dict:
    generator = rng.generator(rng.WINDOWS, self.seed, step)
    starts = generator.integers(0, len(self.train_ids) - self.seq_len, size=batch_size)
    return self._pairs(self.train_ids, starts[rows])

  def eval_examples(self, indices: np.ndarray) -> dict:
    return self._pairs(self.eval_ids, indices * self.seq_len)

  def _pairs(self, ids, starts: np.ndarray) -> dict:
    window = windows(ids, starts, self.seq_len + 1)
    return {'inputs': window[:, :-1], 'targets': window[:, 1:]}


def ordinary_ids(tokenizer) -> np.ndarray:
  """The ids that are not special tokens: what BERT's random replacements draw from."""
  return np.flatnonzero(tokenizer.token_bytes > 0).astype(np.int32)


class _Masking:
  """BERT's corruption: each position is selected with `probability`; a selected one becomes
  MASK (80%), a random ordinary token (10%) or stays as it is (10%); the loss counts the selected
  positions only."""

  def __init__(self, tokenizer, probability: float):
    if tokenizer.mask_id is None:
      raise ConfigError(f'The masked LM needs a MASK token, which this {tokenizer.kind} tokenizer '
                        "lacks: use data.tokenizer='bpe' or 'chars', or a tokenizer.json with "
                        '[MASK] or <mask>.')
    self.mask_id, self.probability = tokenizer.mask_id, probability
    self.ordinary = ordinary_ids(tokenizer)

  def draws(self, generator: np.random.Generator, shape: tuple[int, int]) -> tuple:
    """Uniforms that select positions and choose what they become, and random ordinary ids."""
    return (generator.random(shape), generator.random(shape),
            self.ordinary[generator.integers(0, len(self.ordinary), size=shape, dtype=np.int32)])

  def corrupt(self, tokens, select, action, random_ids) -> dict:
    selected = select < self.probability
    inputs = np.where(selected & (action < 0.8), self.mask_id,
                      np.where(selected & (action < 0.9), random_ids, tokens))
    return {'inputs': inputs.astype(np.int32), 'targets': tokens,
            'weights': selected.astype(np.float32)}


class MaskedTask(_Stream):
  """{'inputs': corrupted ids, 'targets': original ids, 'weights': float32 1.0 where selected}:
  BERT's view (_Masking) of T-token windows. Held-out windows tile the held-out stream, their
  corruption the same for every seed."""

  def __init__(self, train_ids, eval_ids, tokenizer, *, seq_len: int, seed: int,
               probability: float):
    super().__init__(train_ids, eval_ids, tokenizer, seq_len=seq_len, seed=seed)
    self.masking = _Masking(tokenizer, probability)
    self.num_eval_examples = len(self.eval_ids) // seq_len
    tokens = windows(self.eval_ids, np.arange(self.num_eval_examples) * seq_len, seq_len)
    self._held_out = self.masking.corrupt(
        tokens, *self.masking.draws(rng.generator(rng.HELD_OUT), tokens.shape))

  def train_batch(self, step: int, batch_size: int, rows: slice) -> dict:
    generator = rng.generator(rng.WINDOWS, self.seed, step)
    starts = generator.integers(0, len(self.train_ids) - self.seq_len + 1, size=batch_size)
    draws = self.masking.draws(generator, (batch_size, self.seq_len))
    tokens = windows(self.train_ids, starts[rows], self.seq_len)
    return self.masking.corrupt(tokens, *(draw[rows] for draw in draws))

  def eval_examples(self, indices: np.ndarray) -> dict:
    return {key: value[indices] for key, value in self._held_out.items()}


class _Packed:
  """Rows of whole documents (data.packing) of two token files (`tokens` and `starts` each).

  Example k of the run (step * batch_size + row) is packed row permutation(seed, k // R)[k % R]
  of the R training rows; held-out rows are read in order.
  """

  def __init__(self, train, held_out, tokenizer, *, seq_len: int, seed: int):
    self.vocab, self.token_bytes = tokenizer, tokenizer.token_bytes
    self.train, self.held_out, self.seq_len, self.seed = train, held_out, seq_len, seed
    self.train_rows, self.eval_rows = (
        packing.cached(split.directory / f'packed-{seq_len}', split.starts, seq_len)
        for split in (train, held_out))
    self.start_id = tokenizer.bos_id if tokenizer.bos_id is not None else tokenizer.eos_id
    self.pad_id = tokenizer.pad_id or 0
    self.num_eval_examples = self.eval_rows.num_rows
    self.info = {'vocab_size': tokenizer.size, 'seq_len': seq_len, 'tokenizer': tokenizer.kind,
                 'num_train_tokens': len(train.tokens), 'num_train_rows': self.train_rows.num_rows,
                 'packed_fill': round(len(train.tokens) / (self.train_rows.num_rows * seq_len), 4)}

  def _train_rows(self, step: int, batch_size: int, rows: slice) -> list[int]:
    return rng.shuffled(self.seed, step, batch_size, rows, self.train_rows.num_rows)

  def _rows(self, rows_of, source, rows) -> dict:
    out = packing.packed_rows(rows_of, source.tokens, rows, self.seq_len, start_id=self.start_id,
                              pad_id=self.pad_id)
    out['real'] = out['segment_ids'] > 0
    return out


class PackedNextTokenTask(_Packed):
  """{'inputs', 'targets', 'weights' (float32, 0 on padding), 'segment_ids', 'positions'}: each
  document's tokens are its targets, each read after the one before it (BOS, else EOS, before
  the first)."""

  def train_batch(self, step: int, batch_size: int, rows: slice) -> dict:
    return self._pairs(self.train_rows, self.train, self._train_rows(step, batch_size, rows))

  def eval_examples(self, indices: np.ndarray) -> dict:
    return self._pairs(self.eval_rows, self.held_out, [int(i) for i in indices])

  def _pairs(self, rows_of, source, rows) -> dict:
    out = self._rows(rows_of, source, rows)
    return {'inputs': out['previous'], 'targets': out['tokens'],
            'weights': out['real'].astype(np.float32), 'segment_ids': out['segment_ids'],
            'positions': out['positions']}


class PackedMaskedTask(_Packed):
  """{'inputs', 'targets', 'weights' (1.0 where selected, never on padding), 'segment_ids',
  'positions'}: BERT's corruption (_Masking) of packed rows; the held-out rows' is keyed by
  their index, the same for every seed."""

  def __init__(self, train, held_out, tokenizer, *, seq_len: int, seed: int, probability: float):
    super().__init__(train, held_out, tokenizer, seq_len=seq_len, seed=seed)
    self.masking = _Masking(tokenizer, probability)

  def train_batch(self, step: int, batch_size: int, rows: slice) -> dict:
    draws = self.masking.draws(rng.generator(rng.WINDOWS, self.seed, step),
                               (batch_size, self.seq_len))
    out = self._rows(self.train_rows, self.train, self._train_rows(step, batch_size, rows))
    return self._corrupt(out, [draw[rows] for draw in draws])

  def eval_examples(self, indices: np.ndarray) -> dict:
    out = self._rows(self.eval_rows, self.held_out, [int(i) for i in indices])
    draws = [self.masking.draws(rng.generator(rng.HELD_OUT, int(i)), (1, self.seq_len))
             for i in indices]
    return self._corrupt(out, [np.concatenate(parts) for parts in zip(*draws)])

  def _corrupt(self, out: dict, draws) -> dict:
    batch = self.masking.corrupt(out['tokens'], *draws)
    batch['weights'] = batch['weights'] * out['real']
    return {**batch, 'segment_ids': out['segment_ids'], 'positions': out['positions']}


def synthetic_text(alphabet: str, num_eval_windows: int, seq_len: int) -> tuple[str, str]:
  """A learnable text: one random order of `alphabet` (the same for every seed), repeated, so
  each character determines the next. (train, held-out): the held-out part has exactly
  `num_eval_windows` windows of `seq_len`, and the train part is 9 times as long."""
  cycle = ''.join(rng.generator(rng.TASK).permutation(list(alphabet)))
  eval_length = num_eval_windows * seq_len + 1
  text = cycle * (10 * eval_length // len(cycle) + 1)
  return text[:9 * eval_length], text[9 * eval_length:10 * eval_length]
