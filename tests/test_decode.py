"""Decoding: cached generation against the uncached forward pass, the samplers, the cache size."""
import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from helpers import tiny
from transformer_jax import accounting, decode, kernels, layers, models
from transformer_jax.models import styles
from transformer_jax.train import losses

# Three prompts of different lengths in one batch, start-aligned; the tail of a short row is
# junk that must never be read.
PROMPTS = jnp.array([[3, 7, 1, 9, 4, 2, 8], [6, 1, 39, 39, 39, 39, 39], [5, 2, 5, 11, 5, 0, 0]])
LENGTHS = jnp.array([7, 2, 5])
# Encoder inputs with their valid lengths (6, 3, 5), and decoder prompts of 1 to 3 tokens.
INPUTS = jnp.array([[4, 8, 15, 16, 23, 12], [9, 9, 2, 0, 0, 0], [1, 3, 5, 7, 9, 0]])
INPUT_VALID = jnp.arange(6)[None, :] < jnp.array([[6], [3], [5]])
TARGET_PROMPTS, TARGET_LENGTHS = jnp.array([[1, 0, 0], [1, 7, 3], [1, 12, 0]]), jnp.array([1, 3, 2])
NEW_TOKENS = 6

CASES = {
    'gpt2': dict(family='decoder', **styles.STYLES['gpt2']),
    'llama-gqa-scanned': dict(family='decoder', num_kv_heads=2, scan_layers=True,
                              **styles.STYLES['llama']),
    'llama-mqa': dict(family='decoder', num_kv_heads=1, **styles.STYLES['llama']),
    'seq2seq': dict(family='encoder_decoder', **styles.STYLES['transformer']),
    'seq2seq-llama-gqa-scanned': dict(family='encoder_decoder', num_kv_heads=2, scan_layers=True,
                                      **styles.STYLES['llama']),
    # Few buckets, so that the short sequences reach the logarithmic ones.
    't5': dict(family='encoder_decoder', relative_buckets=8, relative_max_distance=12,
               **styles.STYLES['t5']),
    't5-v1_1-scanned': dict(family='encoder_decoder', scan_layers=True, head_width=6,
                            relative_buckets=6, relative_max_distance=10,
                            **styles.STYLES['t5_v1_1']),
    'no-positions': dict(family='decoder', **dict(styles.STYLES['llama'], positions='none')),
    'sinusoidal': dict(family='decoder', **styles.STYLES['transformer']),
}


def build(case, seed=0, **overrides):
  """The model of `case` with parameters drawn by numpy in the shapes of its init (compiling the
  random init would take longer than the test): norm scales 1 + N(0, 0.1^2), the rest N(0, 0.1^2),
  biases included, so that no term is trivially zero."""
  cfg = tiny(**CASES[case], **overrides)
  shapes = nn.meta.unbox(models.abstract_variables(cfg)['params'])
  noise = np.random.default_rng(seed)
  draw = lambda path, leaf: jnp.asarray(
      (path[-1].key == 'scale') + 0.1 * noise.standard_normal(leaf.shape), leaf.dtype)
  return models.build(cfg), jax.tree_util.tree_map_with_path(draw, shapes)


@functools.partial(jax.jit, static_argnames=('model', 'steps', 'window'))
def uncached_greedy(model, params, prompt, length, steps, inputs=None, input_valid=None,
                    window=None):
  """Argmax rollout of the full forward pass, no cache: one prompt (1, T) holding `length` real
  tokens, each step re-running the model over the whole buffer and reading the logits at the
  last real token (the causal mask keeps the unused tail out of them). With `window`, a query
  also sees no key more than window - 1 slots before it: the model's causal mask AND a band."""
  buffer = jnp.zeros((1, prompt.shape[1] + steps), jnp.int32).at[:, :prompt.shape[1]].set(prompt)
  slots = np.arange(buffer.shape[1])
  band = None if window is None else (slots[None, :] > slots[:, None] - window)[None, None]
  decode_banded = lambda m, i, t, v: m.decode(t, m.encode(i, v), v, attention_mask=band)

  def step(i, carry):
    buffer, logits = carry
    if inputs is None:
      all_logits = model.apply({'params': params}, buffer, attention_mask=band)
    else:
      all_logits = model.apply({'params': params}, inputs, buffer, input_valid,
                               method=decode_banded)
    new = all_logits[0, length - 1 + i]
    return buffer.at[0, length + i].set(jnp.argmax(new)), logits.at[i].set(new)

  logits = jnp.zeros((steps, model.cfg.vocab_size), jnp.float32)
  buffer, logits = jax.lax.fori_loop(0, steps, step, (buffer, logits))
  return jax.lax.dynamic_slice_in_dim(buffer[0], length, steps), logits


def prompts_of(model):
  """(prompts, their lengths, encoder inputs): a decoder's prompts, or an encoder-decoder's
  decoder prompts with its encoder's inputs."""
  if model.cfg.family == 'encoder_decoder':
    return TARGET_PROMPTS, TARGET_LENGTHS, dict(inputs=INPUTS, input_valid=INPUT_VALID)
  return PROMPTS, LENGTHS, {}


@pytest.mark.parametrize('case', CASES)
def test_greedy_cached_generation_equals_the_uncached_rollout(case):
  model, params = build(case)
  prompts, lengths, encoder = prompts_of(model)
  out = decode.generate(model, params, prompts, prompt_lengths=lengths,
                        max_new_tokens=NEW_TOKENS, return_logits=True, **encoder)
  for row in range(len(prompts)):
    alone = {k: v[row:row + 1] for k, v in encoder.items()}
    tokens, logits = uncached_greedy(model, params, prompts[row:row + 1], lengths[row],
                                     NEW_TOKENS, **alone)
    np.testing.assert_array_equal(out.tokens[row], tokens, err_msg=f'row {row}')
    np.testing.assert_allclose(out.logits[row], logits, atol=1e-5, rtol=0, err_msg=f'row {row}')
  np.testing.assert_array_equal(out.lengths, NEW_TOKENS)


WINDOW, WINDOW_NEW_TOKENS = 3, 9  # the ring wraps; the reference's 16 slots fit gpt2's table


@pytest.mark.parametrize('case', ['gpt2', 'llama-gqa-scanned', 'llama-mqa', 'no-positions',
                                  'sinusoidal', 'seq2seq-llama-gqa-scanned', 't5'])
def test_windowed_generation_equals_the_banded_uncached_rollout(case):
  # Two layers: sliding-window attention, where a token's second-layer key was computed when it
  # saw its own last WINDOW tokens; prompts of 7 and 5 tokens outgrow the ring at the prefill.
  model, params = build(case)
  prompts, lengths, encoder = prompts_of(model)
  out = decode.generate(model, params, prompts, prompt_lengths=lengths, window=WINDOW,
                        max_new_tokens=WINDOW_NEW_TOKENS, return_logits=True, **encoder)
  for row in range(len(prompts)):
    alone = {k: v[row:row + 1] for k, v in encoder.items()}
    tokens, logits = uncached_greedy(model, params, prompts[row:row + 1], lengths[row],
                                     WINDOW_NEW_TOKENS, window=WINDOW, **alone)
    np.testing.assert_array_equal(out.tokens[row], tokens, err_msg=f'row {row}')
    np.testing.assert_allclose(out.logits[row], logits, atol=1e-5, rtol=0, err_msg=f'row {row}')
  whole = decode.generate(model, params, prompts, prompt_lengths=lengths,
                          max_new_tokens=WINDOW_NEW_TOKENS, return_logits=True, **encoder)
  assert not np.allclose(whole.logits, out.logits, atol=1e-3)  # the window changed something


@functools.partial(jax.jit, static_argnames='model')
def last_logits(model, params, context, length):
  """The logits after the first `length` tokens of `context` (1, W), run alone from position 0."""
  return model.apply({'params': params}, context)[0, length - 1]


@pytest.mark.parametrize('case', ['llama-mqa', 'no-positions'])
def test_one_layer_window_equals_recomputing_the_last_window_tokens(case):
  # With one layer a window is exactly nanoGPT's crop: each new token from a fresh forward pass
  # over the last WINDOW tokens at positions 0.., which RoPE's relative angles make equivalent.
  model, params = build(case, num_layers=1)
  out = decode.generate(model, params, PROMPTS, prompt_lengths=LENGTHS, window=WINDOW,
                        max_new_tokens=WINDOW_NEW_TOKENS, return_logits=True)
  for row, length in enumerate(LENGTHS.tolist()):
    sequence = PROMPTS[row, :length].tolist()
    for i in range(WINDOW_NEW_TOKENS):
      context = sequence[-WINDOW:]
      padded = jnp.zeros((1, WINDOW), jnp.int32).at[0, :len(context)].set(jnp.array(context))
      logits = last_logits(model, params, padded, len(context))
      np.testing.assert_allclose(out.logits[row, i], logits, atol=1e-5, err_msg=f'row {row}')
      sequence.append(int(jnp.argmax(logits)))
    np.testing.assert_array_equal(out.tokens[row], sequence[length:], err_msg=f'row {row}')


@pytest.mark.parametrize('prompt_len', [1, 6])
def test_teacher_forcing_through_the_window_cache_equals_the_banded_forward_pass(prompt_len):
  model, params = build('llama-gqa-scanned')
  tokens = jnp.asarray(np.random.default_rng(1).integers(0, 40, (2, 20)), jnp.int32)
  band = (np.arange(20)[None, :] > np.arange(20)[:, None] - 4)[None, None]
  expected = model.apply({'params': params}, tokens, attention_mask=band)
  got = decode.forced_logits(model, params, tokens, prompt_len=prompt_len, window=4)
  np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize('window', [None, 4])
def test_t5_teacher_forcing_through_the_cache_equals_the_forward_pass(window):
  """The relative bias of each cached step (over a ring of 4 slots, too) is that of its tokens'
  distances: forced_logits equals the (banded) uncached decoder on the same targets."""
  model, params = build('t5-v1_1-scanned')
  tokens = jnp.asarray(np.random.default_rng(1).integers(0, 40, (3, 14)), jnp.int32)
  band = None if window is None else (
      np.arange(14)[None, :] > np.arange(14)[:, None] - window)[None, None]
  expected = model.apply({'params': params}, INPUTS, tokens, INPUT_VALID,
                         method=lambda m, i, t, v: m.decode(t, m.encode(i, v), v,
                                                            attention_mask=band))
  got = decode.forced_logits(model, params, tokens, prompt_len=3, window=window, inputs=INPUTS,
                             input_valid=INPUT_VALID)
  np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)


def word_text(num_chars: int, seed: int) -> np.ndarray:
  """Ids of words drawn at random from one lexicon of 40 (2 to 5 of 15 letters, then a space,
  id 0): text whose next letter depends on the few before it, learned in a few hundred steps."""
  lexicon_draws = np.random.default_rng(0)
  lexicon = [lexicon_draws.integers(1, 16, lexicon_draws.integers(2, 6)) for _ in range(40)]
  draws = np.random.default_rng(seed)
  words = [np.append(lexicon[i], 0) for i in draws.integers(0, 40, num_chars // 2)]
  return np.concatenate(words)[:num_chars].astype(np.int32)


def train_on(ids, context: int, steps: int):
  """A 2-block RoPE model of width 32, trained by Adam on random windows of `context` tokens."""
  cfg = tiny('decoder', vocab_size=16, **styles.STYLES['llama'])
  model, optimizer = models.build(cfg), optax.adam(3e-3)
  params = models.init_params(cfg, jax.random.key(0))

  @jax.jit
  def step(params, opt_state, window):
    def loss(params):
      logits = model.apply({'params': params}, window[:, :-1])
      sums = losses.loss_sums(logits, window[:, 1:], jnp.ones(window[:, 1:].shape))
      return sums['loss'] / sums['weight']
    updates, opt_state = optimizer.update(jax.grad(loss)(params), opt_state)
    return optax.apply_updates(params, updates), opt_state

  opt_state = optimizer.init(params)
  for starts in np.random.default_rng(1).integers(0, len(ids) - context, (steps, 32)):
    params, opt_state = step(params, opt_state, ids[starts[:, None] + np.arange(context + 1)])
  return model, params


@pytest.mark.slow
def test_a_window_keeps_the_loss_far_past_the_training_context_at_its_trained_level():
  context = 16
  model, params = train_on(word_text(50_000, seed=1), context, steps=200)
  held_out = jnp.asarray(word_text(38 * (16 * context + 1), seed=2).reshape(38, -1))
  inputs, targets = held_out[:, :-1], held_out[:, 1:]
  loss = lambda logits: -jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None],
                                             axis=-1)[..., 0]
  whole = loss(model.apply({'params': params}, inputs))
  windowed = loss(decode.forced_logits(model, params, inputs, window=context))
  np.testing.assert_allclose(windowed[:, :context], whole[:, :context], atol=1e-5)
  trained = whole[:, :context].mean()
  far = slice(8 * context, 16 * context)
  # Far out every prediction has a full window of context, where the first positions of the
  # trained one have less: a little lower is expected, much lower would be a leak of the target.
  assert trained - 0.2 < windowed[:, far].mean() < trained + 0.05
  assert whole[:, far].mean() > trained + 1.0  # RoPE distances past 16: out of its depth


def while_loop_carry(fn, *args):
  """Shapes and dtypes of what the first lax.while_loop in fn's program carries between steps."""
  def find(jaxpr):
    for eqn in jaxpr.eqns:
      if eqn.primitive.name == 'while':
        return eqn.params['body_jaxpr'].in_avals[eqn.params['body_nconsts']:]
      for inner in (getattr(p, 'jaxpr', p) for p in eqn.params.values()):
        if hasattr(inner, 'eqns') and (found := find(inner)):
          return found
    return None
  return find(jax.make_jaxpr(fn)(*args).jaxpr)


def is_key(path) -> bool:
  """Whether a cache leaf's tree path is an attention layer's keys (not its values)."""
  return 'cached_key' in jax.tree_util.keystr(path)


@pytest.mark.parametrize('case', ['llama-gqa-scanned', 'llama-mqa'])
def test_the_window_cache_is_a_ring_of_window_slots_as_the_accounting_says(case):
  model, params = build(case)
  batch, prompt_len = PROMPTS.shape
  fed = prompt_len + WINDOW_NEW_TOKENS - 1
  for window, slots in ((WINDOW, WINDOW), (None, fed), (fed + 5, fed)):
    carry = while_loop_carry(lambda p, window=window: decode.generate(
        model, p, PROMPTS, max_new_tokens=WINDOW_NEW_TOKENS, window=window).tokens, params)
    cache = [a for a in carry if a.ndim >= 3]  # the rest: step, token, done, tokens
    expected = jax.tree.leaves_with_path(decode.init_cache(model, batch, slots))
    assert sorted(a.shape for a in cache) == sorted(leaf.shape for _, leaf in expected)
    layout = kernels.cache.layout_for(model.cfg.attention_kernel)
    assert all(leaf.shape[kernels.cache.slot_axis(layout, is_key(path))] == slots
               for path, leaf in expected), window
    assert sum(a.size * a.dtype.itemsize for a in cache) == accounting.kv_cache_bytes(
        model.cfg, fed, batch, window=window)


@pytest.mark.parametrize('window', [0, -2, 2.5])
def test_a_window_must_be_a_whole_number_of_tokens(window):
  model, params = build('llama-mqa')
  with pytest.raises(ValueError, match=f'window={window} must be a whole number'):
    decode.generate(model, params, PROMPTS, max_new_tokens=2, window=window)


@pytest.mark.parametrize('tau,expected', [(1.0, (0.665, 0.245, 0.090)),
                                          (0.5, (0.867, 0.117, 0.016)),
                                          (2.0, (0.506, 0.307, 0.186))])
def test_temperature_softmax_of_logits_2_1_0(tau, expected):
  probs = decode.probabilities(jnp.array([2.0, 1.0, 0.0]), temperature=tau)
  assert probs.dtype == jnp.float32
  np.testing.assert_allclose(np.round(np.asarray(probs, np.float64), 3), expected, atol=1e-9)


def test_log_probabilities_are_log_softmax_minus_infinity_kept():
  logits = jnp.array([[2.0, 1.0, 0.0, -jnp.inf], [1e4, -1e4, 0.0, 3.0]])
  got = np.asarray(decode.samplers.log_probabilities(logits))
  np.testing.assert_allclose(got, jax.nn.log_softmax(logits), rtol=1e-6)
  assert got[0, 3] == -np.inf and np.isclose(np.exp(got[0]).sum(), 1.0)


def test_temperature_zero_is_greedy_without_nan():
  logits = jnp.array([[2.0, 5.0, 5.0, -1.0], [1e30, -1e30, 0.0, 3.0]])
  probs = decode.probabilities(logits, temperature=0.0)
  np.testing.assert_array_equal(probs, [[0, 1, 0, 0], [1, 0, 0, 0]])
  np.testing.assert_array_equal(decode.sample(logits, None, temperature=0.0), [1, 0])
  # A tiny positive temperature approaches greedy without overflowing to inf - inf.
  near_zero = decode.probabilities(logits, temperature=1e-30)
  assert np.isfinite(near_zero).all()
  np.testing.assert_array_equal(near_zero[1], [1, 0, 0, 0])


def kept(logits, **sampler):
  return set(np.flatnonzero(decode.probabilities(jnp.array(logits), **sampler) > 0).tolist())


def test_top_k_keeps_exactly_the_k_largest_lowest_id_first_among_ties():
  logits = [1.0, 3.0, 3.0, 2.0, 3.0]
  assert kept(logits, top_k=1) == {1}
  assert kept(logits, top_k=2) == {1, 2}
  assert kept(logits, top_k=3) == {1, 2, 4}
  assert kept(logits, top_k=4) == {1, 2, 3, 4}
  assert kept(logits, top_k=5) == kept(logits, top_k=0) == {0, 1, 2, 3, 4}
  assert kept([3.0, 2.0, 2.0, 2.0], top_k=2) == {0, 1}  # one above the tie, room for one of it
  probs = decode.probabilities(jnp.array(logits), top_k=2)
  np.testing.assert_allclose(probs, [0, 0.5, 0.5, 0, 0], atol=1e-7)


def test_top_p_keeps_the_smallest_set_that_reaches_p():
  # Probabilities 1/4, 1/8, 1/2, 1/8 (exact in float32); ranked: token 2, 0, then 1 before 3.
  logits = np.log([0.25, 0.125, 0.5, 0.125]).tolist()
  assert kept(logits, top_p=0.3) == {2}
  assert kept(logits, top_p=0.5) == {2}  # reached exactly by the first token
  assert kept(logits, top_p=0.75) == {2, 0}  # reached exactly by the second
  assert kept(logits, top_p=0.76) == {2, 0, 1}  # a tie at 1/8: the lower id comes first
  assert kept(logits, top_p=1.0) == {0, 1, 2, 3}
  np.testing.assert_allclose(decode.probabilities(jnp.array(logits), top_p=0.75),
                             [1 / 3, 0, 2 / 3, 0], atol=1e-7)
  # Four equal tokens: p = 1/2 is reached exactly by two of them.
  assert kept([0.0] * 4, top_p=0.5) == {0, 1}
  assert kept([0.0] * 4, top_p=0.51) == {0, 1, 2}


def test_samplers_combine_as_temperature_then_top_k_then_top_p():
  logits = [2.0, 1.0, 0.0]  # softmax: (0.665, 0.245, 0.090) at tau = 1
  assert kept(logits, top_p=0.8) == {0, 1}
  assert kept(logits, top_p=0.8, temperature=0.5) == {0}  # nucleus of (0.867, 0.117, 0.016)
  assert kept(logits, top_p=0.7) == {0, 1}
  assert kept(logits, top_p=0.7, top_k=2) == {0}  # nucleus of the renormalized (0.731, 0.269)


@pytest.mark.parametrize('settings,message', [
    (dict(temperature=-1.0), 'temperature'), (dict(top_k=-2), 'top_k'), (dict(top_k=1.5), 'top_k'),
    (dict(top_p=0.0), 'top_p'), (dict(top_p=1.5), 'top_p')])
def test_meaningless_sampler_settings_fail(settings, message):
  with pytest.raises(ValueError, match=message):
    decode.probabilities(jnp.zeros(3), **settings)


def test_sampling_is_reproducible_and_follows_the_distribution():
  logits = jnp.broadcast_to(jnp.array([2.0, 1.0, 0.0, -1.0]), (20000, 4))
  sample = jax.jit(functools.partial(decode.sample, top_k=3))
  draws = sample(logits, jax.random.key(7))
  np.testing.assert_array_equal(draws, sample(logits, jax.random.key(7)))
  assert not np.array_equal(draws, sample(logits, jax.random.key(8)))
  frequencies = np.bincount(draws, minlength=4) / len(draws)
  expected = decode.probabilities(logits[0], top_k=3)
  assert frequencies[3] == 0
  np.testing.assert_allclose(frequencies, expected, atol=0.01)


def test_generate_samples_reproducibly_from_its_rng():
  model, params = build('llama-mqa')
  draw = lambda seed: decode.generate(model, params, PROMPTS, prompt_lengths=LENGTHS,
                                      max_new_tokens=NEW_TOKENS, rng=jax.random.key(seed),
                                      temperature=1.0, top_p=0.9).tokens
  first = draw(1)
  np.testing.assert_array_equal(first, draw(1))
  assert not np.array_equal(first, draw(2))
  with pytest.raises(ValueError, match='needs an rng'):
    decode.generate(model, params, PROMPTS, max_new_tokens=2, temperature=1.0)


def test_eos_stops_a_row_and_pads_the_rest():
  model, params = build('gpt2')
  # return_logits as in the greedy test, so that both runs reuse its compiled program.
  generate = functools.partial(decode.generate, model, params, PROMPTS, prompt_lengths=LENGTHS,
                               max_new_tokens=NEW_TOKENS, return_logits=True)
  free = np.asarray(generate().tokens)
  eos = int(free[0, 2])
  out = generate(eos_id=eos, pad_id=-1)
  for row, tokens in enumerate(free):
    stop = list(tokens).index(eos) + 1 if eos in tokens else NEW_TOKENS
    expected = np.concatenate([tokens[:stop], np.full(NEW_TOKENS - stop, -1)])
    np.testing.assert_array_equal(out.tokens[row], expected, err_msg=f'row {row}')
    assert out.lengths[row] == stop
  assert out.lengths[0] <= 3


@pytest.mark.parametrize('case', ['gpt2', 'llama-gqa-scanned', 'llama-mqa',
                                  'seq2seq-llama-gqa-scanned'])
def test_cache_holds_kv_heads_and_matches_the_accounting(case):
  cfg = tiny(**CASES[case])
  batch, slots, source = 3, 10, 6
  model = models.build(cfg)
  cache = decode.init_cache(model, batch, slots, source)
  # On this CPU the keys are kept transposed (kernels.cache.layout_for).
  transposed = kernels.cache.layout_for(model.cfg.attention_kernel) == 'keys_transposed'
  for path, leaf in jax.tree.leaves_with_path(cache):
    shapes = [(batch * cfg.kv_heads, n, cfg.head_dim) for n in (slots, source)]
    if transposed and is_key(path):
      shapes = [(rows, width, n) for rows, n, width in shapes]
    assert leaf.shape[-3:] in shapes, (path, leaf.shape)
  leaves = jax.tree.leaves(cache)
  assert sum(leaf.nbytes for leaf in leaves) == accounting.kv_cache_bytes(
      cfg, slots, batch, source_len=source)


def test_the_keys_are_kept_transposed_for_the_cpu_kernel_alone():
  """A model built for XLA:CPU (the 'cpu' kernel) keeps its keys (B * kv_heads, head_dim, S), where
  XLA:CPU multiplies the queries by them fastest; for a TPU or GPU (B * kv_heads, S, head_dim)."""
  cfg = tiny(**CASES['llama-gqa-scanned'])
  rows, slots = 3 * cfg.kv_heads, 10
  for platform, keys in (('cpu', (rows, cfg.head_dim, slots)), ('tpu', (rows, slots, cfg.head_dim)),
                         ('gpu', (rows, slots, cfg.head_dim))):
    cache = decode.init_cache(models.build(cfg, platform), 3, slots)
    for path, leaf in jax.tree.leaves_with_path(cache):
      expected = keys if is_key(path) else (rows, slots, cfg.head_dim)
      assert leaf.shape[-3:] == expected, (platform, path)


# Keys and values (B, S, kv_heads, head_dim) in each layout of kernels.cache.
_FOLDED = lambda x: jnp.swapaxes(x, 1, 2).reshape(-1, x.shape[1], x.shape[3])
IN_LAYOUT = {'folded': _FOLDED, 'heads_first': lambda x: jnp.swapaxes(x, 1, 2),
             'slots_first': lambda x: x, 'keys_transposed': _FOLDED}
KEYS_IN_LAYOUT = {**IN_LAYOUT, 'keys_transposed': lambda x: jnp.swapaxes(_FOLDED(x), 1, 2)}


@pytest.mark.parametrize('layout', kernels.cache.LAYOUTS)
def test_cached_attention_over_each_cache_layout_matches_the_reference(layout):
  # 'folded' keeps (B * kv_heads, S, head_dim); query groups fold onto their key-value head.
  # With and without an additive bias (T5's relative positions), per head.
  @jax.jit
  def both(q, k, v, mask, bias):
    return (kernels.reference.attention(q, k, v, mask, scale=8 ** -0.5, bias=bias),
            kernels.cache.attention(q, KEYS_IN_LAYOUT[layout](k), IN_LAYOUT[layout](v), mask,
                                    scale=8 ** -0.5, bias=bias, layout=layout))

  noise = np.random.default_rng(0)
  q = noise.standard_normal((2, 3, 4, 8), np.float32)
  mask = (noise.random((2, 1, 3, 7)) < 0.7) | (np.arange(7) == 0)
  for kv_heads in (4, 2, 1):
    k, v = noise.standard_normal((2, 2, 7, kv_heads, 8), np.float32)
    for bias in (None, noise.standard_normal((1, 4, 3, 7), np.float32)):
      expected, got = both(q, k, v, mask, bias)
      np.testing.assert_allclose(got, expected, atol=1e-6, err_msg=f'{kv_heads} kv heads')


def test_an_unknown_cache_layout_fails_naming_the_layouts():
  with pytest.raises(ValueError, match=r"cache_layout='bshd'.*'folded', 'heads_first'"):
    layers.Attention(num_heads=2, head_dim=4, cache_layout='bshd')


@pytest.mark.parametrize('family', ['encoder', 'vit'])
def test_encoder_only_models_cannot_decode(family):
  model = models.build(tiny(family))
  with pytest.raises(ValueError, match='without a causal mask'):
    decode.generate(model, {}, PROMPTS, max_new_tokens=2)
  with pytest.raises(ValueError, match='without a causal mask'):
    decode.init_cache(model, 1, 4)


def test_learned_positions_past_max_len_fail():
  model, params = build('gpt2')
  with pytest.raises(ValueError, match='max_len=16'):
    decode.generate(model, params, PROMPTS, max_new_tokens=11)
  with pytest.raises(ValueError, match='a window does not help'):
    decode.generate(model, params, PROMPTS, max_new_tokens=11, window=4)
  with pytest.raises(ValueError, match='max_len=16'):
    decode.forced_logits(model, params, jnp.zeros((1, 17), jnp.int32), window=4)
  with pytest.raises(ValueError, match='prompt_lengths'):
    decode.generate(model, params, PROMPTS, prompt_lengths=jnp.array([7, 0, 5]), max_new_tokens=2)


class CharVocab:
  """Characters a..z and space as ids 0..26 (within the tiny vocabulary of 40)."""
  chars = 'abcdefghijklmnopqrstuvwxyz '

  def __init__(self, eos_id=None):
    self.eos_id = eos_id

  def encode(self, text):
    return [self.chars.index(c) for c in text]

  def decode(self, ids):
    return ''.join(self.chars[i] if i < len(self.chars) else '?' for i in ids)


def test_sample_text_continues_the_prompt_and_cuts_at_eos():
  model, params = build('llama-mqa')
  vocab = CharVocab()
  greedy = decode.SampleSettings(prompt='to be', max_new_tokens=NEW_TOKENS, temperature=0.0)
  (text,) = decode.sample_text(model, params, vocab, greedy)
  (tokens,) = decode.generate(model, params, jnp.array([vocab.encode('to be')]),
                              max_new_tokens=NEW_TOKENS).tokens
  assert text == vocab.decode(tokens.tolist())
  last = max(i for i, c in enumerate(text) if c not in text[:i])  # a first occurrence
  eos_vocab = CharVocab(eos_id=int(tokens[last]))
  assert decode.sample_text(model, params, eos_vocab, greedy) == [text[:last]]
  (windowed,) = decode.generate(model, params, jnp.array([vocab.encode('to be')]), window=2,
                                max_new_tokens=NEW_TOKENS).tokens
  assert decode.sample_text(model, params, vocab, dataclasses.replace(greedy, window=2)) == [
      vocab.decode(windowed.tolist())]


def test_sample_text_windows_to_the_training_context_unless_told():
  """An unset window is the context the model trained on (seq_len), 0 the whole context."""
  model, params = build('llama-mqa')
  vocab = CharVocab()
  greedy = decode.SampleSettings(prompt='to be', max_new_tokens=NEW_TOKENS, temperature=0.0)
  text = lambda settings, seq_len=None: decode.sample_text(model, params, vocab, settings,
                                                           seq_len=seq_len)
  (whole,) = decode.generate(model, params, jnp.array([vocab.encode('to be')]),
                             max_new_tokens=NEW_TOKENS).tokens
  (windowed,) = decode.generate(model, params, jnp.array([vocab.encode('to be')]), window=2,
                                max_new_tokens=NEW_TOKENS).tokens
  assert whole.tolist() != windowed.tolist()  # the window changes what this model writes
  assert text(greedy) == [vocab.decode(whole.tolist())]
  assert text(greedy, seq_len=2) == [vocab.decode(windowed.tolist())]
  assert text(dataclasses.replace(greedy, window=0), seq_len=2) == text(greedy)
  assert text(dataclasses.replace(greedy, window=2), seq_len=100) == text(greedy, seq_len=2)


class SizedCharVocab(CharVocab):
  """CharVocab that says how many ids it decodes: the model's rows past 27 have no text."""
  size = len(CharVocab.chars)

  def decode(self, ids):
    return ''.join(self.chars[i] for i in ids)  # an id past the characters would fail here


def test_sample_text_draws_only_ids_the_vocabulary_decodes():
  model, params = build('gpt2')
  unrestricted = decode.generate(model, params, jnp.array([[0, 1]] * 64), max_new_tokens=8,
                                 rng=jax.random.key(0), temperature=2.0)
  assert (unrestricted.tokens >= SizedCharVocab.size).any()  # the model itself draws past 27
  texts = decode.sample_text(model, params, SizedCharVocab(), decode.SampleSettings(
      prompt='ab', max_new_tokens=8, temperature=2.0, num_samples=64))
  assert len(texts) == 64 and all(len(text) == 8 for text in texts)


class UsersDecoder(nn.Module):
  """A decoder a researcher writes from our layers, with choices of their own (learned
  positions, pre-LN LayerNorm blocks with GQA, an untied flax Dense head), following the cache
  protocol of transformer_jax.decode."""
  vocab_size: int = 40
  width: int = 32
  max_positions: int = 24  # the learned table's rows: generate refuses to go past them
  cache_layout: str = 'folded'

  @nn.compact
  def __call__(self, tokens, positions=None, *, attention_mask=None, cache_index=None):
    t = tokens.shape[1]
    if positions is None:
      positions = jnp.broadcast_to(jnp.arange(t) + (cache_index or 0), tokens.shape)
    if attention_mask is None:
      attention_mask = layers.causal_mask(jnp.arange(t), positions, t)
    x = layers.TextEmbed(self.vocab_size, self.width, positions='learned',
                         max_len=self.max_positions, init_std=0.5)(tokens, positions)
    block = functools.partial(
        layers.Block, norm=layers.LayerNorm,
        attention=functools.partial(layers.Attention, num_heads=4, num_kv_heads=2, head_dim=8,
                                    init_std=0.3, cache_layout=self.cache_layout),
        mlp=functools.partial(layers.MLP, hidden=64, init_std=0.3))
    for i in range(2):
      x = block(name=f'block_{i}')(x, attention_mask, positions, cache_index=cache_index)
    return nn.Dense(self.vocab_size, name='lm_head')(layers.LayerNorm()(x))


@pytest.mark.parametrize('window', [None, 3])  # 3: the 5-token prompt outgrows the ring
@pytest.mark.parametrize('layout', kernels.cache.LAYOUTS)
def test_a_users_own_decoder_generates_with_the_cache_as_its_uncached_rollout(layout, window):
  model = UsersDecoder(cache_layout=layout)
  prompt = jnp.array([[3, 17, 5, 29, 11]])
  params = model.init(jax.random.key(4), prompt)['params']
  out = decode.generate(model, params, prompt, max_new_tokens=10, return_logits=True,
                        window=window)
  # The uncached forward pass over a buffer of every token so far (the causal mask keeps the
  # unwritten tail out of the logits read), one compile for all steps.
  mask = layers.causal_mask(jnp.arange(15), jnp.arange(15)[None], 15, window)
  forward = jax.jit(lambda buffer: model.apply({'params': params}, buffer, attention_mask=mask))
  buffer, expected = jnp.zeros((1, 15), jnp.int32).at[:, :5].set(prompt), []
  for i in range(10):
    logits = forward(buffer)[:, 4 + i]
    expected.append(logits)
    buffer = buffer.at[:, 5 + i].set(jnp.argmax(logits, -1))
  np.testing.assert_array_equal(out.tokens, buffer[:, 5:])
  assert len(set(out.tokens[0].tolist())) > 3  # not a degenerate repetition
  np.testing.assert_allclose(out.logits[0], jnp.concatenate(expected), atol=1e-4)
  with pytest.raises(ValueError, match='max_len=24 rows'):
    decode.generate(model, params, prompt, max_new_tokens=21)
