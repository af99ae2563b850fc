"""Samplers: pure float32 functions of the logits (..., V) and an explicit rng. Among equal
logits the lower token id ranks first, so top-k and top-p keep a definite set under ties."""
import jax
import jax.numpy as jnp

from transformer_jax.ranges import Range

__all__ = ['check_sampler', 'filter_logits', 'greedy', 'limited', 'log_probabilities',
           'log_probabilities_of', 'probabilities', 'sample', 'SAMPLER_RANGES', 'top_k_mask',
           'top_p_mask']

# What each sampler setting may be, and what its edge means (config.sample's keys check the same).
SAMPLER_RANGES = {'temperature': (Range(0), '0 means greedy'),
                  'top_k': (Range(0, integer=True), '0 keeps every token'),
                  'top_p': (Range(0, 1, open_low=True), '1 keeps every token')}


def check_sampler(temperature: float, top_k: int, top_p: float):
  """Fails on settings that have no meaning, naming the allowed range."""
  for name, value in (('temperature', temperature), ('top_k', top_k), ('top_p', top_p)):
    valid, meaning = SAMPLER_RANGES[name]
    if not valid.admits(value):
      raise ValueError(f'{name}={value} must be {valid.describe()} ({meaning}).')


def greedy(logits: jax.Array) -> jax.Array:
  """The most likely token (the lowest id among ties), int32."""
  return jnp.argmax(logits, axis=-1).astype(jnp.int32)


def top_k_mask(logits: jax.Array, k: int) -> jax.Array:
  """True on exactly the k largest logits: all those above the k-th largest value, then as many
  of those equal to it as there is room for, lowest id first."""
  kth = jax.lax.top_k(logits, k)[0][..., -1:]
  above, tied = logits > kth, logits == kth
  room = k - above.sum(axis=-1, keepdims=True)
  return above | (tied & (jnp.cumsum(tied, axis=-1) <= room))


def top_p_mask(logits: jax.Array, p: float) -> jax.Array:
  """True on the nucleus: the smallest set of most likely tokens whose probability reaches p.

  A token is kept when the tokens ranked before it hold less than p, so the token at which the
  cumulative probability first reaches p (exactly or beyond) is the last one kept.
  """
  probs = jax.nn.softmax(logits, axis=-1)
  order = jnp.argsort(-probs, axis=-1, stable=True)
  cumulative = jnp.cumsum(jnp.take_along_axis(probs, order, axis=-1), axis=-1)
  before = jnp.concatenate([jnp.zeros_like(cumulative[..., :1]), cumulative[..., :-1]], axis=-1)
  return jnp.put_along_axis(jnp.zeros(probs.shape, bool), order, before < p, axis=-1,
                            inplace=False)


def filter_logits(logits: jax.Array, *, temperature: float = 1.0, top_k: int = 0,
                  top_p: float = 1.0) -> jax.Array:
  """Float32 log-weights of the distribution to sample from, built in this order:

  1. temperature: z / tau (computed as log softmax(z) / tau, which cannot overflow); tau = 0 is the
     limit tau -> 0, all weight on the greedy token, and involves no division (top-k and top-p
     then change nothing: they always keep the greedy token);
  2. top-k (k > 0): -inf outside the k largest;
  3. top-p (p < 1): -inf outside the nucleus of what steps 1 and 2 left, renormalized.
  Softmax of the result is the sampled distribution: the kept tokens, renormalized.
  """
  check_sampler(temperature, top_k, top_p)
  logits = logits.astype(jnp.float32)
  if temperature == 0:
    return jnp.where(jax.nn.one_hot(greedy(logits), logits.shape[-1], dtype=bool), 0.0, -jnp.inf)
  z = log_probabilities(logits) / temperature
  if top_k and top_k < z.shape[-1]:
    z = jnp.where(top_k_mask(z, top_k), z, -jnp.inf)
  if top_p < 1:
    z = jnp.where(top_p_mask(z, top_p), z, -jnp.inf)
  return z


def probabilities(logits: jax.Array, **sampler) -> jax.Array:
  """The distribution `sample` draws from (float32, sums to 1); `sampler` as in filter_logits."""
  return jax.nn.softmax(filter_logits(logits, **sampler), axis=-1)


def sample(logits: jax.Array, rng: jax.Array | None, *, temperature: float = 1.0, top_k: int = 0,
           top_p: float = 1.0) -> jax.Array:
  """One int32 token per row of `logits` (..., V); temperature 0 is greedy and ignores `rng`."""
  if temperature == 0:
    check_sampler(temperature, top_k, top_p)
    return greedy(logits)
  weights = filter_logits(logits, temperature=temperature, top_k=top_k, top_p=top_p)
  return jax.random.categorical(rng, weights, axis=-1).astype(jnp.int32)


def log_probabilities(logits: jax.Array) -> jax.Array:
  """log softmax(logits) over the last axis (`log_probabilities_of` all of them)."""
  return log_probabilities_of(logits, logits)


def log_probabilities_of(chosen: jax.Array, logits: jax.Array) -> jax.Array:
  """log softmax(logits) at `chosen` logits of each row (..., n), as chosen - logsumexp(logits).
  Not jax.nn.log_softmax: XLA:CPU fuses the maximum it takes first into the library call of the
  head's product, which then runs about 3x slower (the LM head of T5 1.1 small on 128 rows: 58
  ms against 20)."""
  return chosen - jax.nn.logsumexp(logits, axis=-1, keepdims=True)


def limited(logits, token_limit):
  """-inf at the ids from `token_limit` on (None: none)."""
  if token_limit is None:
    return logits
  return jnp.where(jnp.arange(logits.shape[-1]) < token_limit, logits, -jnp.inf)
