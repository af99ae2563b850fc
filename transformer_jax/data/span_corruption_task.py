"""T5's pre-training data (Raffel et al. 2020, section 3.1.4): span corruption of a text corpus,
in the encoder-decoder's batches. A run chooses it with data.task='span_corruption'.

Any text source of the data layer (data.name tiny_shakespeare, text_file, jsonl, or a TFDS
dataset with a text feature) is tokenized once into token files, its documents one after
another with nothing between them (as seqio's reduce_concat_tokens joins them). Each split's
stream is cut into windows of R = raw_length(data.seq_len) tokens, and each window corrupted by
`span_corruption.span_corruption`: its inputs fill data.seq_len, its targets
data.span_targets_length (default: what a window's corruption needs; T5: R = 568 raw tokens for
512 inputs and 114 targets).

The sentinels are the tokenizer's top ids, <extra_id_0> the last: data.tokenizer='bpe' reserves
data.num_sentinels of them; a tokenizer.json brings its own (T5's has 100).

Batches are seq2seq.Seq2SeqTask's: 'inputs' (the corrupted window and EOS, padded), 'input_valid',
'targets' (the sentinels, each followed by its span, then EOS, padded), 'decoder_inputs' (the
start id, BOS or else PAD as T5 starts, then targets[:-1]) and 'weights' (1.0 on the targets and
their EOS). Training example k = step * batch_size + row is window permutation(seed, k // W)[k % W]
of the W training windows, corrupted with the key (SPANS, seed, k): a batch is a pure function of
(seed, step), so a resumed run sees the batches of an uninterrupted one. Held-out windows tile the
held-out stream in order, corrupted the same for every seed.
"""
import dataclasses
import functools

import numpy as np

from transformer_jax.data import corpus as corpus_lib
from transformer_jax.data import rng, span_corruption, text_data, token_files
from transformer_jax.data import tokenizer as tokenizer_lib
from transformer_jax.data.corpus import TextSettings
from transformer_jax.data.settings import DataPart, DataSettings, register_part
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
  if text_settings.packing:
    raise ConfigError('data.packing: span-corruption windows are cut from one running stream and '
                      'fill their rows already; set --config.data.packing=False.')
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
  train_ids, held_out_ids = (token_files.tokenized(split, tokenizer, root, None).tokens
                             for split in (train, held_out))
  return SpanCorruptionTask(train_ids, held_out_ids, tokenizer, seq_len=settings.seq_len,
                            targets_length=targets_length, raw_length=raw,
                            num_sentinels=sentinels, seed=seed, **own.corruption())


class SpanCorruptionTask:
  """The batches of the module docstring from the training and held-out token streams."""

  def __init__(self, train_ids, eval_ids, tokenizer, *, seq_len: int, targets_length: int,
               raw_length: int, num_sentinels: int, seed: int, noise_density: float,
               mean_noise_span_length: float):
    for split, ids in (('training', train_ids), ('held-out', eval_ids)):
      if len(ids) < raw_length:
        raise ConfigError(f'The {split} text has {len(ids)} tokens, fewer than one window of '
                          f'{raw_length} (corrupted into data.seq_len={seq_len} inputs): lower '
                          'data.seq_len.')
    self.vocab, self.token_bytes = tokenizer, tokenizer.token_bytes
    self.train_ids, self.eval_ids, self.seed = train_ids, eval_ids, seed
    self.seq_len, self.targets_length, self.raw_length = seq_len, targets_length, raw_length
    self.num_train_windows = len(train_ids) // raw_length
    self.num_eval_examples = len(eval_ids) // raw_length
    self.pad_id = tokenizer.pad_id or 0
    self.start_id = self.pad_id if tokenizer.bos_id is None else tokenizer.bos_id
    self.corrupt = functools.partial(
        span_corruption.span_corruption, vocab_size=tokenizer.size, eos_id=tokenizer.eos_id,
        num_sentinels=num_sentinels, noise_density=noise_density,
        mean_noise_span_length=mean_noise_span_length)
    self.info = {'vocab_size': tokenizer.size, 'seq_len': seq_len,
                 'targets_length': targets_length, 'raw_length': raw_length,
                 'num_train_windows': self.num_train_windows, 'tokenizer': tokenizer.kind}

  def train_batch(self, step: int, batch_size: int, rows: slice) -> dict:
    examples = step * batch_size + np.arange(batch_size)[rows]
    windows = rng.shuffled(self.seed, step, batch_size, rows, self.num_train_windows)
    return self._batch(self.train_ids, windows,
                       [(rng.SPANS, self.seed, int(k)) for k in examples])

  def eval_examples(self, indices: np.ndarray) -> dict:
    return self._batch(self.eval_ids, indices,
                       [(rng.HELD_OUT, rng.SPANS, int(i)) for i in indices])

  def window(self, ids, index: int) -> np.ndarray:
    """The raw tokens of window `index` of a stream."""
    start = int(index) * self.raw_length
    return np.asarray(ids[start:start + self.raw_length], np.int32)

  def _batch(self, ids, windows, keys: list[tuple[int, ...]]) -> dict:
    count = len(keys)
    inputs = np.full((count, self.seq_len), self.pad_id, np.int32)
    targets = np.full((count, self.targets_length), self.pad_id, np.int32)
    input_lengths, target_lengths = np.zeros(count, np.int32), np.zeros(count, np.int32)
    for row, (index, key) in enumerate(zip(windows, keys)):
      source, target = self.corrupt(self.window(ids, index), key)
      inputs[row, :source.size], targets[row, :target.size] = source, target
      input_lengths[row], target_lengths[row] = source.size, target.size
    start = np.full((count, 1), self.start_id, np.int32)
    return {'inputs': inputs,
            'input_valid': np.arange(self.seq_len) < input_lengths[:, None],
            'decoder_inputs': np.concatenate([start, targets[:, :-1]], axis=1),
            'targets': targets,
            'weights': (np.arange(self.targets_length) < target_lengths[:, None]).astype(
                np.float32)}
