"""Beam search against greedy decoding, an exhaustive search, and the uncached forward pass."""
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from test_decode import CASES, CharVocab, build, prompts_of, uncached_greedy
from train_helpers import small_config
from transformer_jax import decode, train
from transformer_jax.train import loop

NEW_TOKENS = 5
SLOW = pytest.mark.slow


def wu_length_penalty(length: int, alpha: float) -> float:
  """lp(Y) = (5 + |Y|)^alpha / (5 + 1)^alpha, Wu et al. (2016), "Google's Neural Machine
  Translation System", eq. 14; a beam's score is its log-probability over lp."""
  return (5 + length) ** alpha / (5 + 1) ** alpha


def test_the_length_penalty_is_wu_et_al_s():
  assert wu_length_penalty(1, 0.6) == 1.0 and wu_length_penalty(7, 1.0) == 2.0
  lengths = np.arange(1, 40)
  for alpha in (0.0, 0.6, 1.0, 2.0):
    np.testing.assert_allclose(decode.length_penalty_of(lengths, alpha),
                               [wu_length_penalty(n, alpha) for n in lengths], rtol=1e-6)


@pytest.mark.parametrize('case', ['gpt2', pytest.param('llama-gqa-scanned', marks=SLOW),
                                  pytest.param('seq2seq', marks=SLOW),
                                  'seq2seq-llama-gqa-scanned', 't5'])
def test_beam_one_is_greedy_decoding_with_its_log_probability(case):
  model, params = build(case)
  prompts, lengths, encoder = prompts_of(model)
  beams = decode.beam_search(model, params, prompts, prompt_lengths=lengths, beam_size=1,
                             max_new_tokens=NEW_TOKENS, **encoder)
  for row in range(len(prompts)):
    alone = {k: v[row:row + 1] for k, v in encoder.items()}
    tokens, logits = uncached_greedy(model, params, prompts[row:row + 1], lengths[row],
                                     NEW_TOKENS, **alone)
    np.testing.assert_array_equal(beams.tokens[row, 0], tokens, err_msg=f'row {row}')
    log_prob = jnp.take_along_axis(jax.nn.log_softmax(logits), tokens[:, None], 1).sum()
    np.testing.assert_allclose(beams.log_probs[row, 0], log_prob, atol=1e-5, rtol=0)
  np.testing.assert_allclose(beams.scores, beams.log_probs / wu_length_penalty(NEW_TOKENS, 0.6),
                             rtol=1e-6)


def test_beam_one_with_a_window_is_windowed_greedy_decoding():
  model, params = build('llama-mqa')
  prompts, lengths, _ = prompts_of(model)
  greedy = decode.generate(model, params, prompts, prompt_lengths=lengths, max_new_tokens=8,
                           window=3)
  beams = decode.beam_search(model, params, prompts, prompt_lengths=lengths, beam_size=1,
                             max_new_tokens=8, window=3)
  np.testing.assert_array_equal(beams.tokens[:, 0], greedy.tokens)


VOCAB, EOS, STEPS = 4, 1, 3


def log_probs_of(model, params, prompt, outputs, encoder):
  """log p(output | prompt) of each output, from one uncached forward pass over every prompt +
  output (padded at the end, which the causal mask keeps out of the earlier logits)."""
  tokens = jnp.asarray([list(prompt) + list(new) + [0] * (STEPS - len(new)) for new in outputs])
  if encoder:
    repeat = lambda x: jnp.repeat(x, len(outputs), axis=0)
    logits = model.apply({'params': params}, repeat(encoder['inputs']), tokens,
                         repeat(encoder['input_valid']))
  else:
    logits = model.apply({'params': params}, tokens)
  log_probs = jax.nn.log_softmax(logits[:, len(prompt) - 1:-1].astype(jnp.float32))
  chosen = jnp.take_along_axis(log_probs, tokens[:, len(prompt):, None], axis=2)[..., 0]
  lengths = jnp.asarray([len(new) for new in outputs])
  return np.asarray(jnp.where(jnp.arange(STEPS)[None, :] < lengths[:, None], chosen, 0).sum(1))


def exhaustive(model, params, prompt, encoder, alpha):
  """Every output of up to STEPS tokens (cut at its first EOS), by score, best first."""
  outputs = sorted({draw[:draw.index(EOS) + 1] if EOS in draw else draw
                    for draw in itertools.product(range(VOCAB), repeat=STEPS)})
  log_probs = log_probs_of(model, params, prompt, outputs, encoder)
  return sorted(((float(p) / wu_length_penalty(len(new), alpha), float(p), new)
                 for p, new in zip(log_probs, outputs)), reverse=True)


@pytest.mark.parametrize('case,alpha', [('gpt2', 0.0), ('gpt2', 1.5),
                                        pytest.param('llama-gqa-scanned', 0.6, marks=SLOW),
                                        pytest.param('seq2seq', 2.0, marks=SLOW),
                                        ('t5-v1_1-scanned', 1.0)])
def test_a_large_beam_finds_what_an_exhaustive_search_finds(case, alpha):
  """With more beams than there are outputs of STEPS - 1 tokens, no beam that could win is ever
  dropped: the K results are the exhaustive search's K best, with their log-probabilities as
  the uncached forward pass computes them. Prompts of different lengths share the batch."""
  model, params = build(case, vocab_size=VOCAB, seed=3)
  prompts, lengths = jnp.array([[2, 3, 0], [3, 2, 2]]), jnp.array([1, 3])
  encoder = {}
  if CASES[case]['family'] == 'encoder_decoder':
    prompts, lengths = jnp.array([[0, 0], [0, 2]]), jnp.array([1, 2])
    encoder = dict(inputs=jnp.array([[2, 3, 3], [3, 2, 0]]),
                   input_valid=jnp.array([[True, True, True], [True, True, False]]))
  beam_size = VOCAB ** (STEPS - 1)
  beams = decode.beam_search(model, params, prompts, prompt_lengths=lengths, beam_size=beam_size,
                             max_new_tokens=STEPS, length_penalty=alpha, eos_id=EOS, **encoder)
  for row in range(len(prompts)):
    alone = {k: v[row:row + 1] for k, v in encoder.items()}
    prompt = prompts[row, :lengths[row]].tolist()
    best = exhaustive(model, params, prompt, alone, alpha)[:beam_size]
    found = [tuple(beams.tokens[row, k, :beams.lengths[row, k]].tolist())
             for k in range(beam_size)]
    assert found == [new for _, _, new in best], f'row {row}'
    np.testing.assert_allclose(beams.log_probs[row], [p for _, p, _ in best], atol=1e-5, rtol=0)
    np.testing.assert_allclose(beams.scores[row], [s for s, _, _ in best], atol=1e-5, rtol=0)
    # After its EOS a beam holds padding.
    for k in range(beam_size):
      assert not beams.tokens[row, k, beams.lengths[row, k]:].any()


def test_a_step_extends_the_beams_by_the_best_of_all_k_times_v_log_probabilities():
  """A step ranks each beam's 2K best tokens, then the best 2K of those: the same candidates, in
  the same order, as one ranking of every beam's every token (K x V), here with a vocabulary
  far larger than 2K, a beam giving more than K of the candidates and some of them ending in
  EOS."""
  from transformer_jax.decode import beam  # pylint: disable=g-import-not-at-top
  batch, k, vocab, eos = 3, 4, 50, 7
  noise = np.random.default_rng(0)
  logits = (3 * noise.standard_normal((batch * k, vocab))).astype(np.float32)
  logits[:, eos] += 8  # each beam's best token ends it
  # Two beams far ahead of the others: all 2K candidates come from them, most from the first.
  live_log_probs = np.array([[0.0, -0.5, -30.0, -31.0]] * batch, np.float32)
  empty = decode.Beams(tokens=jnp.zeros((batch, k, 6), jnp.int32),
                       lengths=jnp.zeros((batch, k), jnp.int32),
                       log_probs=jnp.asarray(live_log_probs), scores=jnp.full((batch, k), -jnp.inf))
  state = beam._Search(step=jnp.int32(2), token=jnp.zeros(batch * k, jnp.int32), live=empty,
                       finished=empty.replace(log_probs=jnp.full((batch, k), -jnp.inf)),
                       cache=jnp.arange(batch * k))
  step = beam._extend(state, jnp.asarray(logits), lambda cache, rows: cache[rows], None,
                      jnp.int32(eos), 0.6)

  log_probs = logits - jax.scipy.special.logsumexp(logits, axis=1, keepdims=True)
  every = (log_probs.reshape(batch, k, vocab) + live_log_probs[..., None]).reshape(batch, -1)
  for row in range(batch):
    best = np.argsort(-every[row], kind='stable')[:2 * k]
    parents, tokens = best // vocab, best % vocab
    assert np.bincount(parents).max() > k  # more than K of the 2K from one beam
    live = [i for i in range(2 * k) if tokens[i] != eos][:k]
    np.testing.assert_allclose(step.live.log_probs[row], every[row, best[live]], rtol=1e-6)
    np.testing.assert_array_equal(step.token.reshape(batch, k)[row], tokens[live])
    np.testing.assert_array_equal(step.cache.reshape(batch, k)[row], row * k + parents[live])
    ended = every[row, best[tokens == eos]]
    assert len(ended) >= 1
    np.testing.assert_allclose(step.finished.log_probs[row, :len(ended)], ended, rtol=1e-6)


def test_early_stopping_keeps_the_best_beams():
  """With EOS likely the search ends before max_new_tokens; a longer limit changes nothing."""
  model, params = build('gpt2', vocab_size=VOCAB, seed=3)
  prompts = jnp.array([[2, 3, 2]])
  short, long = (decode.beam_search(model, params, prompts, beam_size=2, max_new_tokens=n,
                                    length_penalty=0.0, eos_id=EOS) for n in (6, 12))
  assert int(short.lengths.max()) < 6, 'the test needs beams that end before the limit'
  np.testing.assert_array_equal(short.tokens, long.tokens[..., :6])
  np.testing.assert_allclose(short.scores, long.scores, rtol=1e-6)


@pytest.mark.parametrize('settings,message', [
    (dict(beam_size=0), 'beam_size=0 must be a whole number >= 1'),
    (dict(beam_size=2, length_penalty=-1.0), 'length_penalty=-1.0 must be >= 0'),
    (dict(beam_size=2, max_new_tokens=0), 'max_new_tokens=0 must be at least 1')])
def test_meaningless_beam_settings_fail(settings, message):
  model, params = build('gpt2')
  with pytest.raises(ValueError, match=message):
    decode.beam_search(model, params, jnp.array([[3, 4]]), **{'max_new_tokens': 3, **settings})


def test_sample_text_with_beams_gives_the_best_beams_decoded():
  model, params = build('llama-mqa')
  vocab = CharVocab()
  texts = decode.sample_text(model, params, vocab, decode.SampleSettings(
      prompt='to be', max_new_tokens=6, beam_size=3, num_samples=2, length_penalty=0.0))
  beams = decode.beam_search(model, params, jnp.array([vocab.encode('to be')]), beam_size=3,
                             max_new_tokens=6, length_penalty=0.0)
  assert texts == [vocab.decode(beams.tokens[0, k].tolist()) for k in range(2)]


@SLOW
def test_the_evaluation_decodes_with_the_best_beam_and_reports_exact_match(tmp_path):
  config = small_config('encoder_decoder', steps=4, **{
      'data.name': 'seq2seq_reverse', 'data.exact_match_examples': 8, 'data.eval_batch_size': 8,
      'eval.beam_size': 3})
  train.train(config, str(tmp_path))
  run, params, _ = train.restore_trained(config, str(tmp_path))
  pairs, vocab = run.data.task.eval_examples(np.arange(8)), run.data.task.vocab
  keywords = dict(prompt_tokens=np.full((8, 1), vocab.bos_id, np.int32), inputs=pairs['inputs'],
                  input_valid=pairs['input_valid'], max_new_tokens=16, eos_id=vocab.eos_id)
  beams = decode.beam_search(run.model, params, beam_size=3, length_penalty=0.6, **keywords)
  np.testing.assert_array_equal(loop._decoded(run, params, **keywords), beams.tokens[:, 0])
  right = [beams.tokens[row, 0, :beams.lengths[row, 0]].tolist() ==
           pairs['targets'][row, :pairs['input_valid'][row].sum() + 1].tolist()
           for row in range(8)]
  results = train.evaluate(config, str(tmp_path))
  assert results['eval_exact_match'] == pytest.approx(np.mean(right))
