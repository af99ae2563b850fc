"""T5's span corruption (Raffel et al. 2020, section 3.1.4) as seqio's `span_corruption` does it.

Random spans of a document, 15% of its tokens in spans of mean length 3 by default, are each
replaced in the inputs by one sentinel id; the targets are the sentinels, each followed by the
span it replaced, then EOS:

    tokens  = [a b c d e f g h i j]
    inputs  = [a b <extra_id_0> f g <extra_id_1> j EOS]
    targets = [<extra_id_0> c d e <extra_id_1> h i EOS]

The sentinels are the top ids of the vocabulary: <extra_id_0> is vocab_size - 1, <extra_id_1>
vocab_size - 2, and so on down (T5's vocabulary reserves 100 of them).

    inputs, targets = span_corruption(tokens, seed=(stream, seed, index), vocab_size=32128,
                                      eos_id=1)

The corruption is a pure function of (tokens, seed). `raw_length` gives the number of raw tokens
whose corruption fills a given inputs length exactly (seqio's `random_spans_helper`).
"""
from collections.abc import Sequence

import numpy as np

from transformer_jax.data import rng
from transformer_jax.errors import ConfigError

__all__ = ['check_settings', 'corrupted_lengths', 'noise_mask', 'noise_span_counts', 'raw_length',
           'span_corruption']


def check_settings(noise_density: float, mean_noise_span_length: float) -> None:
  """Raises ConfigError unless 0 < noise_density < 1 and mean_noise_span_length >= 1."""
  if not 0 < noise_density < 1:
    raise ConfigError(f'noise_density={noise_density} is the share of tokens to corrupt: choose '
                      'one strictly between 0 and 1 (T5: 0.15).')
  if not mean_noise_span_length >= 1:
    raise ConfigError(f'mean_noise_span_length={mean_noise_span_length} is a mean number of '
                      'tokens per span: choose one of at least 1 (T5: 3.0).')


def noise_span_counts(length: int, noise_density: float,
                      mean_noise_span_length: float) -> tuple[int, int]:
  """(noise tokens, noise spans) of a document of `length` >= 2 tokens, as seqio counts them.

  round(length * noise_density) noise tokens, kept between 1 and length - 1 so that both kinds
  exist; round(noise / mean_noise_span_length) spans, at least 1, and never more than the
  non-noise tokens, which separate the spans (seqio's segmentation of the non-noise tokens
  breaks when the spans outnumber them, as at high densities on short inputs).
  """
  noise = min(max(int(np.round(length * noise_density)), 1), length - 1)
  spans = int(np.round(noise / mean_noise_span_length))
  return noise, min(max(spans, 1), length - noise)


def corrupted_lengths(length: int, noise_density: float,
                      mean_noise_span_length: float) -> tuple[int, int]:
  """(inputs, targets) lengths, EOS included, of the corruption of any `length` >= 2 tokens:
  N - noise + spans + 1 and noise + spans + 1 (`noise_span_counts`), whatever the seed."""
  noise, spans = noise_span_counts(length, noise_density, mean_noise_span_length)
  return length - noise + spans + 1, noise + spans + 1


def _random_segmentation(num_items: int, num_segments: int,
                         generator: np.random.Generator) -> np.ndarray:
  """The lengths of `num_segments` non-empty segments of `num_items` items, every such
  partition equally likely."""
  cuts = np.sort(generator.choice(num_items - 1, num_segments - 1, replace=False)) + 1
  return np.diff(np.concatenate([[0], cuts, [num_items]]))


def noise_mask(length: int, noise_density: float, mean_noise_span_length: float,
               generator: np.random.Generator) -> np.ndarray:
  """A boolean (length,) mask, True on the noise tokens: random spans, counted by
  `noise_span_counts`, drawn with `generator`.

  As in seqio's `random_spans_noise_mask`, the noise tokens are cut into that many non-empty
  spans, every cut equally likely. seqio then alternates non-noise and noise spans starting with
  non-noise, so that every document ends in noise and a short one holds its single span at its
  very end (google-research/text-to-text-transfer-transformer#905). Here the spans go instead into
  distinct gaps among the non-noise tokens, before the first and after the last included, every
  choice of gaps equally likely: as many spans and tokens, spans anywhere in the document. A
  document shorter than 2 tokens gets the first tokens of a 2-token mask, as in seqio.
  """
  check_settings(noise_density, mean_noise_span_length)
  if length < 2:
    return noise_mask(2, noise_density, mean_noise_span_length, generator)[:length]
  noise, spans = noise_span_counts(length, noise_density, mean_noise_span_length)
  span_lengths = _random_segmentation(noise, spans, generator)
  gaps = np.sort(generator.choice(length - noise + 1, spans, replace=False))
  runs_before = np.diff(np.concatenate([[0], gaps]))  # the non-noise tokens before each span
  runs = np.stack([runs_before, span_lengths], axis=1).ravel()
  runs = np.concatenate([runs, [length - noise - gaps[-1]]])
  return np.repeat(np.arange(runs.size) % 2 == 1, runs)


def span_corruption(tokens: np.ndarray, seed: int | Sequence[int], *, vocab_size: int,
                    eos_id: int, noise_density: float = 0.15,
                    mean_noise_span_length: float = 3.0,
                    num_sentinels: int = 100) -> tuple[np.ndarray, np.ndarray]:
  """(inputs, targets) of a document's (N,) token ids, both ending in `eos_id`.

  `seed`: one int or a sequence of non-negative ints (a pipeline passes its stream, its seed and
  the example's index) keying `rng.generator`; the same tokens and seed give the same pair in
  any process. The top `num_sentinels` ids of `vocab_size` are the sentinels, which the tokens
  must not use. The inputs have N - noise + spans + 1 ids, the targets noise + spans + 1 (see
  `noise_span_counts`). Raises ConfigError for a bad density or span length, a document with
  more spans than sentinels, or tokens that reach the sentinel ids.
  """
  tokens = np.asarray(tokens)
  first_sentinel = vocab_size - num_sentinels  # the lowest sentinel id
  if tokens.size and tokens.max() >= first_sentinel:
    raise ConfigError(f'Token id {tokens.max()} is one of the {num_sentinels} sentinel ids '
                      f'{first_sentinel}..{vocab_size - 1} at the top of the vocabulary: use a '
                      'tokenizer that leaves them free (or fewer num_sentinels).')
  mask = noise_mask(tokens.size, noise_density, mean_noise_span_length,
                    rng.generator(*np.atleast_1d(seed).tolist()))
  starts = mask & ~np.concatenate([[False], mask[:-1]])  # the first token of each span
  if starts.sum() > num_sentinels:
    raise ConfigError(f'A document of {tokens.size} tokens has {starts.sum()} noise spans but '
                      f'the vocabulary only {num_sentinels} sentinel ids: use shorter documents '
                      '(see raw_length), a longer mean_noise_span_length or more sentinels.')
  sentinels = (vocab_size - np.cumsum(starts)).astype(tokens.dtype)
  eos = np.array([eos_id], tokens.dtype)
  inputs = np.where(starts, sentinels, tokens)[~mask | starts]
  targets = np.insert(tokens[mask], np.flatnonzero(starts[mask]), sentinels[starts])
  return np.concatenate([inputs, eos]), np.concatenate([targets, eos])


def raw_length(inputs_length: int, noise_density: float = 0.15,
               mean_noise_span_length: float = 3.0) -> tuple[int, int]:
  """(raw tokens, targets length): the most raw tokens whose corruption, EOS included, fits
  `inputs_length`, and the length of its targets, as seqio's `random_spans_helper` computes
  them (T5: 512 inputs -> 568 raw tokens and 114 targets)."""
  check_settings(noise_density, mean_noise_span_length)
  if inputs_length < 3:
    raise ConfigError(f'inputs_length={inputs_length} leaves no room for a token, a sentinel '
                      'and EOS: choose at least 3.')
  lengths = lambda raw: corrupted_lengths(raw, noise_density, mean_noise_span_length)
  raw = 2
  while lengths(raw + 1)[0] <= inputs_length:
    raw += 1
  targets_length = lengths(raw)[1]
  # seqio's own adjustment: at density 0.5, targets as long as the inputs (a round number).
  if noise_density == 0.5 and targets_length > inputs_length:
    raw, targets_length = raw - 1, targets_length - 1
  return raw, targets_length
