"""Span corruption: the pairs merge back into the document, the noise has the density and span
lengths asked for, spans fall anywhere, and seqio's lengths."""
import itertools
import math

import numpy as np
import pytest

from transformer_jax.data import rng
from transformer_jax.data.span_corruption import (noise_mask, noise_span_counts, raw_length,
                                                  span_corruption)
from transformer_jax.errors import ConfigError

VOCAB, SENTINELS, EOS = 1000, 100, 1


def corrupt(tokens, seed, **kwargs):
  return span_corruption(tokens, seed, vocab_size=VOCAB, eos_id=EOS, num_sentinels=SENTINELS,
                         **kwargs)


def documents(count, low, high, seed=0):
  """`count` documents of random lengths in [low, high], of ids below the sentinels."""
  generator = np.random.default_rng(seed)
  return [generator.integers(2, VOCAB - SENTINELS, generator.integers(low, high + 1))
          for _ in range(count)]


def is_sentinel(token):
  return token >= VOCAB - SENTINELS


def merge(inputs, targets):
  """The document back from its pair: each sentinel of the inputs replaced by the tokens that
  follow it in the targets."""
  assert inputs[-1] == EOS and targets[-1] == EOS
  spans, sentinel = {}, None
  for token in targets[:-1].tolist():
    if is_sentinel(token):
      sentinel = spans.setdefault(token, [])
    else:
      sentinel.append(token)  # fails (None) if the targets do not start with a sentinel
  merged = []
  for token in inputs[:-1].tolist():
    merged.extend(spans.pop(token) if is_sentinel(token) else [token])
  assert not spans, 'a sentinel of the targets is missing from the inputs'
  return np.array(merged, int)


def spans_of(mask):
  """The lengths of the runs of True in a boolean mask."""
  edges = np.diff(np.concatenate([[0], mask.astype(int), [0]]))
  return np.flatnonzero(edges == -1) - np.flatnonzero(edges == 1)


@pytest.mark.parametrize('density,span', [(0.15, 3.0), (0.5, 2.0), (0.3, 8.0), (0.9, 3.0)])
def test_inputs_and_targets_merge_back_into_the_document(density, span):
  for index, tokens in enumerate(documents(200, 0, 300)):
    inputs, targets = corrupt(tokens, (7, index), noise_density=density,
                              mean_noise_span_length=span)
    np.testing.assert_array_equal(merge(inputs, targets), tokens)


def test_over_many_documents_the_noise_is_15_percent_in_spans_of_mean_3():
  noise = spans = total = 0
  for index, tokens in enumerate(documents(400, 100, 1000)):
    mask = noise_mask(tokens.size, 0.15, 3.0, rng.generator(3, index))
    noise, spans, total = noise + mask.sum(), spans + spans_of(mask).size, total + mask.size
  assert abs(noise / total - 0.15) < 0.001, noise / total
  assert abs(noise / spans - 3.0) < 0.03, noise / spans


def test_span_lengths_and_the_ends_follow_uniform_random_spans():
  """568 tokens: 85 noise tokens in 28 spans among 483 others. Every cut of 85 into 28 spans
  equally likely gives P(span = j) = C(85 - j - 1, 26) / C(84, 27); every choice of 28 of the
  484 gaps equally likely puts a span first (or last) with probability 28 / 484."""
  masks = np.stack([noise_mask(568, 0.15, 3.0, rng.generator(5, i)) for i in range(2000)])
  assert (masks.sum(1) == 85).all()
  lengths = np.concatenate([spans_of(mask) for mask in masks])
  assert lengths.size == 28 * 2000
  for j in range(1, 7):
    expected = math.comb(85 - j - 1, 26) / math.comb(84, 27)
    error = 5 * math.sqrt(expected * (1 - expected) / lengths.size)
    assert abs(np.mean(lengths == j) - expected) < error, (j, np.mean(lengths == j), expected)
  end_error = 5 * math.sqrt(0.058 * 0.942 / 2000)
  for end in (0, -1):
    assert abs(masks[:, end].mean() - 28 / 484) < end_error, (end, masks[:, end].mean())
  middle = masks[:, 100:468].mean(0)  # far from the ends, every position is noise 15% of the time
  assert abs(middle.mean() - 0.15) < 0.003 and np.abs(middle - 0.15).max() < 0.05


def test_every_mask_of_its_counts_is_equally_likely():
  """6 tokens at density 0.5, spans of 1.5: 3 noise tokens in 2 spans, which 12 masks have."""
  assert noise_span_counts(6, 0.5, 1.5) == (3, 2)
  possible = {bits for bits in itertools.product((False, True), repeat=6)
              if sum(bits) == 3 and spans_of(np.array(bits)).size == 2}
  assert len(possible) == 12
  draws = 12000
  counts = {}
  for i in range(draws):
    bits = tuple(noise_mask(6, 0.5, 1.5, rng.generator(11, i)).tolist())
    counts[bits] = counts.get(bits, 0) + 1
  assert set(counts) == possible
  error = 5 * math.sqrt((1 / 12) * (11 / 12) / draws)
  assert max(abs(c / draws - 1 / 12) for c in counts.values()) < error, counts


def test_sentinels_count_down_from_the_top_id_and_never_touch():
  for index, tokens in enumerate(documents(100, 50, 600)):
    inputs, targets = corrupt(tokens, index)
    sentinels_in = inputs[is_sentinel(inputs)]
    assert sentinels_in.size >= 1
    np.testing.assert_array_equal(sentinels_in, VOCAB - 1 - np.arange(sentinels_in.size))
    np.testing.assert_array_equal(targets[is_sentinel(targets)], sentinels_in)
    assert not (is_sentinel(inputs[1:]) & is_sentinel(inputs[:-1])).any()
    assert not (is_sentinel(targets[1:]) & is_sentinel(targets[:-1])).any()  # no empty span


def test_a_seed_gives_the_same_pair_and_another_seed_another():
  tokens = documents(1, 200, 200)[0]
  first, again, other = (corrupt(tokens, seed) for seed in ((1, 2, 3), (1, 2, 3), (1, 2, 4)))
  for a, b in zip(first, again):
    np.testing.assert_array_equal(a, b)
  assert not np.array_equal(first[0], other[0])
  np.testing.assert_array_equal(corrupt(tokens, 9)[0], corrupt(tokens, (9,))[0])


@pytest.mark.parametrize('density', [0.15, 0.5, 0.9])
def test_short_documents_get_spans_anywhere_and_no_more_spans_than_other_tokens(density):
  for length in range(2, 11):
    masks = np.stack([noise_mask(length, density, 3.0, rng.generator(length, i))
                      for i in range(400)])
    noise, spans = noise_span_counts(length, density, 3.0)
    assert spans <= length - noise
    assert (masks.sum(1) == noise).all()
    assert all(spans_of(mask).size == spans for mask in masks)
    assert masks.any(0).all(), f'length {length}: some position is never noise'
    assert not masks[:, -1].all(), f'length {length}: the last token is always noise'


def test_documents_shorter_than_two_tokens():
  assert noise_mask(0, 0.15, 3.0, rng.generator(0)).shape == (0,)
  inputs, targets = corrupt(np.array([], int), 0)
  assert inputs.tolist() == [EOS] and targets.tolist() == [EOS]
  for seed in range(10):
    inputs, targets = corrupt(np.array([5]), seed)
    np.testing.assert_array_equal(merge(inputs, targets), [5])


def test_t5_lengths_from_568_raw_tokens_fill_512_inputs_and_114_targets():
  assert raw_length(512) == (568, 114)
  assert noise_span_counts(568, 0.15, 3.0) == (85, 28)
  for index, tokens in enumerate(documents(20, 568, 568)):
    inputs, targets = corrupt(tokens, index)
    assert (inputs.size, targets.size) == (512, 114)
  assert raw_length(512, 0.5, 3.0)[1] <= 512  # seqio's adjustment at density 0.5
  settings = {'noise_density': 0.3, 'mean_noise_span_length': 2.0}
  for inputs_length in (3, 10, 100, 500):  # the most raw tokens that fit
    raw, targets_length = raw_length(inputs_length, **settings)
    inputs, targets = corrupt(np.arange(raw) % 800 + 2, 0, **settings)
    assert (inputs.size, targets.size) == (inputs_length, targets_length)
    longer, _ = corrupt(np.arange(raw + 1) % 800 + 2, 0, **settings)
    assert longer.size > inputs_length


@pytest.mark.parametrize('kwargs,message', [
    ({'noise_density': 0.0}, 'strictly between 0 and 1'),
    ({'noise_density': 1.0}, 'strictly between 0 and 1'),
    ({'mean_noise_span_length': 0.5}, 'at least 1'),
])
def test_bad_settings_name_the_fix(kwargs, message):
  with pytest.raises(ConfigError, match=message):
    corrupt(np.arange(2, 50), 0, **kwargs)
  settings = {'noise_density': 0.15, 'mean_noise_span_length': 3.0, **kwargs}
  with pytest.raises(ConfigError, match=message):
    raw_length(512, **settings)


def test_too_few_sentinels_name_the_fix():
  with pytest.raises(ConfigError, match='299 noise spans but'):
    corrupt(np.arange(2, 600), 0, noise_density=0.5, mean_noise_span_length=1.0)
  with pytest.raises(ConfigError, match='is one of the 100 sentinel ids'):
    corrupt(np.array([3, VOCAB - SENTINELS]), 0)
  with pytest.raises(ConfigError, match='at least 3'):
    raw_length(2)
