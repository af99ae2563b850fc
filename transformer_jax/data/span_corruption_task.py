"""T5's pre-training data (Raffel et al. 2020, section 3.1.4): span corruption of a text corpus,
in the encoder-decoder's batches. A run chooses it with data.task='span_corruption'.

Any text source of the data layer (data.name tiny_shakespeare, text_file, jsonl, or a TFDS
dataset with a text feature) is tokenized once into token files, its documents one after
another with nothing between them (as seqio's reduce_concat_tokens joins them; not even the
</s> that T5's tokenizer.json adds after a text, which `encode` leaves out). Each split's
stream is cut into windows of R = raw_length(data.seq_len) tokens, and each window corrupted by
`span_corruption.span_corruption`: its inputs fill data.seq_len, its targets
data.span_targets_length (default: what a window's corruption needs; T5: R = 568 raw tokens for
512 inputs and 114 targets).

The sentinels are the tokenizer's top ids, <extra_id_0> the last: data.tokenizer='bpe' reserves
data.num_sentinels of them; a tokenizer.json brings its own (T5's has 100).

Batches are seq2seq.Seq2SeqTask's: 'inputs' (the corrupted window and EOS, padded), 'input_valid',
'targets' (the sentinels, each followed by its span, then EOS, padded), 'decoder_inputs' (the
start id, BOS or else PAD as T5 starts, then targets[:-1]) and 'weights' (1.0 on the targets and
their EOS).

With data.packing, each document is cut into windows of R tokens of its own (its last one
shorter; windows under 2 tokens left out) and the corrupted pairs fill rows next-fit, a new row
where the inputs would overflow data.seq_len or the targets their length (a window's length
fixes both of its corruption's: span_corruption.corrupted_lengths); as translation's packed
pairs, 'input_valid' gives way to 'input_segment_ids', 'input_positions', 'target_segment_ids'
and 'target_positions', segment j of the targets being the corruption of segment j of the
inputs. The layout is cached beside the token files.

Training example k = step * batch_size + row is row permutation(seed, k // W)[k % W] of the W
training rows (windows, or packed rows), its window corrupted with the key (SPANS, seed, k)
(window j of a packed row: (SPANS, seed, k, j)): a batch is a pure function of (seed, step), so
a resumed run sees the batches of an uninterrupted one. Held-out rows are read in order,
corrupted the same for every seed.
"""
import dataclasses
import functools

import numpy as np

from transformer_jax.data import corpus as corpus_lib
from transformer_jax.data import packing, rng, span_corruption, text_data, token_files
from transformer_jax.data import tokenizer as tokenizer_lib
from transformer_jax.data.corpus import TextSettings
from transformer_jax.data.settings import DataPart, DataSettings, register_part
from transformer_jax.data.vocab import decoder_start_id
from transformer_jax.errors import ConfigError
from transformer_jax.ranges import Range

__all__ = ['make_span_corruption_task', 'SOURCES', 'SpanCorruptionSettings',
           'SpanCorruptionTask']

SOURCES = ('tiny_shakespeare', 'text_file', 'jsonl')  # and any TFDS dataset with text


@register_part
@dataclasses.dataclass(frozen=True)
class SpanCorruptionSettings(DataPart):
  """The keys of config.data that span corruption reads."""
  PART = 'span_corruption'
  noise_density: float = 0.15  # the share of a window's tokens that become targets
  mean_noise_span_length: float = 3.0  # their mean number per span
  span_targets_length: int | None = None  # None: what a window's corruption needs
  num_sentinels: int = 100  # sentinel ids data.tokenizer='bpe' reserves at its top (T5: 100)

  RANGES = {'noise_density': Range(0, 1, open_low=True, open_high=True),
            'mean_noise_span_length': Range(1),
            'span_targets_length': Range(1, integer=True, optional=True),
            'num_sentinels': Range(1, integer=True)}

  def corruption(self) -> dict:
    """The keywords of span_corruption.span_corruption and raw_length."""
    return {'noise_density': self.noise_density,
            'mean_noise_span_length': self.mean_noise_span_length}


def make_span_corruption_task(settings: DataSettings, seed: int, tokenizer_dir: str | None,
                              vocab_size: int | None = None, **unused) -> 'SpanCorruptionTask':
  """The span corruption of the text source data.name; vocab_size: a trained BPE's size where
  data.vocab_size is unset (the model's)."""
  del unused
  own, text_settings = settings.part(SpanCorruptionSettings), settings.part(TextSettings)
  raw, targets_length = span_corruption.raw_length(settings.seq_len, **own.corruption())
  spans = span_corruption.noise_span_counts(raw, **own.corruption())[1]
  if own.span_targets_length is not None:
    if own.span_targets_length < targets_length:
      raise ConfigError(f'data.span_targets_length={own.span_targets_length} is shorter than the '
                        f'{targets_length} target tokens of a window of {raw} (data.seq_len='
                        f'{settings.seq_len}): raise it, or leave it unset.')
    targets_length = own.span_targets_length
  if text_settings.tokenizer == 'bpe' and own.num_sentinels < spans:  # before training one
    raise ConfigError(f'A window of {raw} tokens has {spans} noise spans but data.num_sentinels='
                      f'{own.num_sentinels}: set --config.data.num_sentinels={spans} or more.')
  train, held_out = corpus_lib.open_corpus(settings, settings.name)
  tokenizer = text_data.resolve_tokenizer(settings, train, held_out, mask=False, separated=False,
                                          vocab_size=vocab_size, saved_dir=tokenizer_dir,
                                          sentinels=own.num_sentinels)
  sentinels = tokenizer_lib.sentinel_count(tokenizer)
  if sentinels < spans:
    raise ConfigError(f'Span corruption of windows of {raw} tokens needs {spans} sentinels '
                      f'<extra_id_0>, <extra_id_1>, ... at the top ids of the vocabulary, and '
                      f'the {tokenizer.kind} tokenizer has {sentinels}: use data.tokenizer='
                      "'bpe' (it reserves data.num_sentinels) or a tokenizer.json that has them "
                      "(T5's), or a shorter data.seq_len.")
  if tokenizer.eos_id is None:
    raise ConfigError(f'Span corruption ends inputs and targets with EOS, which the '
                      f'{tokenizer.kind} tokenizer lacks: use data.tokenizer=\'bpe\' or a '
                      'tokenizer.json with </s> or <eos>.')
  root = text_settings.token_dir or token_files.default_root()
  train_file, held_out_file = (token_files.tokenized(split, tokenizer, root, None)
                               for split in (train, held_out))
  windows = None
  if text_settings.packing:
    windows = [_packed_windows(file, raw, (settings.seq_len, targets_length), own)
               for file in (train_file, held_out_file)]
  return SpanCorruptionTask(train_file.tokens, held_out_file.tokens, tokenizer,
                            seq_len=settings.seq_len, targets_length=targets_length,
                            raw_length=raw, num_sentinels=sentinels, seed=seed,
                            packed_windows=windows, **own.corruption())


def _packed_windows(file: token_files.TokenFile, raw: int, row_lengths: tuple[int, int],
                    own: SpanCorruptionSettings) -> packing.Packing:
  """A split's documents cut into windows of `raw` tokens, packed into rows by the lengths of
  their corruptions (which the window's length fixes), cached beside its token file."""
  # By window length (windows have 2 tokens at least).
  table = np.array([span_corruption.corrupted_lengths(max(n, 2), **own.corruption())
                    for n in range(raw + 1)])
  grown = lambda lengths: (table[lengths, 0], table[lengths, 1])
  layout = (f'spans-{raw}-{row_lengths[0]}-{row_lengths[1]}-{own.noise_density}-'
            f'{own.mean_noise_span_length}')
  return packing.cached_windows(file.directory / layout, file.starts, raw, grown, row_lengths)


class SpanCorruptionTask:
  """The batches of the module docstring from the training and held-out token streams; with
  `packed_windows` (the two splits' packings, `_packed_windows`), packed rows of them."""

  def __init__(self, train_ids, eval_ids, tokenizer, *, seq_len: int, targets_length: int,
               raw_length: int, num_sentinels: int, seed: int, noise_density: float,
               mean_noise_span_length: float, packed_windows=None):
    self.packed = packed_windows is not None
    if not self.packed:
      packed_windows = [self._stream_windows(ids, raw_length, seq_len, split)
                        for ids, split in ((train_ids, 'training'), (eval_ids, 'held-out'))]
    self.train_windows, self.eval_windows = packed_windows
    for windows, split in zip(packed_windows, ('training', 'held-out')):
      if not windows.num_rows:
        raise ConfigError(f'The {split} text has no document of 2 tokens or more to corrupt: '
                          'give it text.')
    self.vocab, self.token_bytes = tokenizer, tokenizer.token_bytes
    self.train_ids, self.eval_ids, self.seed = train_ids, eval_ids, seed
    self.seq_len, self.targets_length, self.raw_length = seq_len, targets_length, raw_length
    self.num_train_windows = self.train_windows.num_rows
    self.num_eval_examples = self.eval_windows.num_rows
    self.pad_id = tokenizer.pad_id or 0
    self.start_id = decoder_start_id(tokenizer)
    self.corrupt = functools.partial(
        span_corruption.span_corruption, vocab_size=tokenizer.size, eos_id=tokenizer.eos_id,
        num_sentinels=num_sentinels, noise_density=noise_density,
        mean_noise_span_length=mean_noise_span_length)
    self.info = {'vocab_size': tokenizer.size, 'seq_len': seq_len,
                 'targets_length': targets_length, 'raw_length': raw_length,
                 'num_train_windows': self.num_train_windows, 'tokenizer': tokenizer.kind,
                 'packed': self.packed}

  @staticmethod
  def _stream_windows(ids, raw_length: int, seq_len: int, split: str) -> packing.Packing:
    """The windows that tile a stream, one per row."""
    count = len(ids) // raw_length
    if not count:
      raise ConfigError(f'The {split} text has {len(ids)} tokens, fewer than one window of '
                        f'{raw_length} (corrupted into data.seq_len={seq_len} inputs): lower '
                        'data.seq_len, or set data.packing=True to corrupt shorter documents.')
    return packing.Packing(np.arange(count, dtype=np.int64) * raw_length,
                           np.full(count, raw_length, np.int32), np.ones(count, bool),
                           np.arange(count + 1, dtype=np.int64))

  def train_batch(self, step: int, batch_size: int, rows: slice) -> dict:
    examples = step * batch_size + np.arange(batch_size)[rows]
    windows = rng.shuffled(self.seed, step, batch_size, rows, self.num_train_windows)
    return self._batch(self.train_ids, self.train_windows, windows,
                       [(rng.SPANS, self.seed, int(k)) for k in examples])

  def eval_examples(self, indices: np.ndarray) -> dict:
    return self._batch(self.eval_ids, self.eval_windows, indices,
                       [(rng.HELD_OUT, rng.SPANS, int(i)) for i in indices])

  def window(self, ids, index: int) -> np.ndarray:
    """The raw tokens of window `index` of an unpacked stream."""
    start = int(index) * self.raw_length
    return np.asarray(ids[start:start + self.raw_length], np.int32)

  @staticmethod
  def _windows_of(windows: packing.Packing, row: int) -> list[tuple[int, int]]:
    """(start, length) in the stream of each window of a row."""
    pieces = range(windows.row_starts[row], windows.row_starts[row + 1])
    return [(int(windows.piece_starts[i]), int(windows.piece_lengths[i])) for i in pieces]

  def _batch(self, ids, windows: packing.Packing, rows, keys: list[tuple[int, ...]]) -> dict:
    """The rows' windows corrupted, window j of a packed row with key + (j,)."""
    shapes = {'inputs': self.seq_len, 'input_segment_ids': self.seq_len,
              'input_positions': self.seq_len, 'targets': self.targets_length,
              'decoder_inputs': self.targets_length, 'target_segment_ids': self.targets_length,
              'target_positions': self.targets_length}
    out = {key: np.zeros((len(keys), length), np.int32) for key, length in shapes.items()}
    for name in ('inputs', 'targets', 'decoder_inputs'):
      out[name][:] = self.pad_id
    for r, (row, key) in enumerate(zip(rows, keys)):
      pairs = [self.corrupt(np.asarray(ids[start:start + size], np.int32),
                            key + (j,) if self.packed else key)
               for j, (start, size) in enumerate(self._windows_of(windows, row))]
      for side, name, pieces in (('input', 'inputs', [source for source, _ in pairs]),
                                 ('target', 'targets', [target for _, target in pairs])):
        size = sum(piece.size for piece in pieces)
        out[name][r, :size] = np.concatenate(pieces)
        out[f'{side}_segment_ids'][r, :size] = np.repeat(np.arange(1, len(pieces) + 1),
                                                         [piece.size for piece in pieces])
        out[f'{side}_positions'][r, :size] = np.concatenate([np.arange(p.size) for p in pieces])
      previous = np.concatenate([[self.start_id, *target[:-1]] for _, target in pairs])
      out['decoder_inputs'][r, :previous.size] = previous
    batch = {name: out[name] for name in ('inputs', 'decoder_inputs', 'targets')}
    batch['weights'] = (out['target_segment_ids'] > 0).astype(np.float32)
    if not self.packed:
      return {**batch, 'input_valid': out['input_segment_ids'] > 0}
    return {**batch, **{name: out[name] for name in (
        'input_segment_ids', 'input_positions', 'target_segment_ids', 'target_positions')}}
