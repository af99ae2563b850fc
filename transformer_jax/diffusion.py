"""Gaussian diffusion: the noise schedule, the forward process, the losses and the samplers.

Ho et al. 2020 (DDPM), Nichol & Dhariwal 2021 (improved DDPM: the cosine schedule, the learned
variance range and the hybrid loss), Song et al. 2021 (DDIM). The formulas are those of the
ADM / improved-diffusion code that DiT (Peebles & Xie 2023) reuses: the schedule is computed in
float64 and cast to float32, timestep index t = 0 is the first step of noise, and a respaced
schedule keeps the cumulative alphas of the steps it keeps.

    schedule = diffusion.respace(diffusion.make_schedule('linear', 1000), 50)
    x_0 = jax.jit(lambda noise: diffusion.ddim_sample(schedule, model_fn, noise))(noise)

A model function maps (x_t, timesteps) to the predicted noise epsilon, the timesteps (B,) int32
on the original (training) scale; with variance='learned_range' its output carries a second
half on the last (channel) axis, the variance interpolation in [-1, 1]. Arrays are channels-last:
x is (B, ..., C).
"""
import dataclasses
import math
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax.errors import ConfigError

__all__ = [
    'SCHEDULES', 'VARIANCES', 'Schedule', 'bound_timesteps', 'bpd_loop',
    'classifier_free_guidance', 'ddim_invert', 'ddim_sample', 'ddpm_sample',
    'discretized_gaussian_log_likelihood', 'guided_model_fn', 'make_schedule', 'normal_kl',
    'p_mean_variance', 'predict_x0_from_eps', 'prior_bpd', 'q_posterior_mean_variance',
    'q_sample', 'respace', 'space_timesteps', 'training_losses', 'vb_terms_bpd',
]

SCHEDULES = ('linear', 'cosine')
# How p(x_{t-1} | x_t)'s variance is set: by the model within [posterior variance, beta]
# (improved DDPM), or fixed at beta ('fixed_large', DiT without learn_sigma) or at the posterior
# variance ('fixed_small').
VARIANCES = ('learned_range', 'fixed_large', 'fixed_small')
COSINE_MAX_BETA = 0.999  # Nichol & Dhariwal 2021: avoids the singularity at t = T

ModelFn = Callable[[jax.Array, jax.Array], jax.Array]


@dataclasses.dataclass(frozen=True, eq=False)
class Schedule:
  """A diffusion process of `num_steps` steps. `betas` is float64 (respacing recomputes from
  it); the rest are float32 arrays of (num_steps,), named as in ADM, computed in float64.
  `timesteps` maps each step to the timestep of the process the model was trained on (the
  identity unless respaced): the model is called with those."""
  betas: np.ndarray
  timesteps: np.ndarray
  alphas_cumprod: np.ndarray
  alphas_cumprod_prev: np.ndarray
  alphas_cumprod_next: np.ndarray
  sqrt_alphas_cumprod: np.ndarray
  sqrt_one_minus_alphas_cumprod: np.ndarray
  sqrt_recip_alphas_cumprod: np.ndarray
  sqrt_recipm1_alphas_cumprod: np.ndarray
  log_betas: np.ndarray
  log_variance_large: np.ndarray
  posterior_variance: np.ndarray
  posterior_log_variance_clipped: np.ndarray
  posterior_mean_coef1: np.ndarray
  posterior_mean_coef2: np.ndarray

  @property
  def num_steps(self) -> int:
    return len(self.betas)

  @classmethod
  def from_betas(cls, betas: Sequence[float], timesteps: Sequence[int] | None = None):
    """The schedule of these betas (each in (0, 1)); `timesteps` as the class says."""
    betas = np.asarray(betas, np.float64)
    if betas.ndim != 1 or len(betas) < 1:
      raise ConfigError(f'a diffusion schedule needs at least one beta, got shape {betas.shape}')
    if not ((betas > 0) & (betas < 1)).all():
      raise ConfigError(f'diffusion betas must lie in (0, 1); got min {betas.min():.3g}, '
                        f'max {betas.max():.3g}: change the schedule or its number of steps')
    timesteps = np.arange(len(betas)) if timesteps is None else np.asarray(timesteps)
    alphas = 1.0 - betas
    acp = np.cumprod(alphas)
    acp_prev = np.append(1.0, acp[:-1])
    posterior_variance = betas * (1.0 - acp_prev) / (1.0 - acp)
    # The posterior variance is 0 at t = 0: its log takes the value of t = 1 there (beta_0 in a
    # one-step schedule, which has no t = 1).
    first = posterior_variance[1:2] if len(betas) > 1 else betas[:1]
    clipped = np.append(first, posterior_variance[1:])
    f32 = lambda array: np.asarray(array, np.float32)
    return cls(
        betas=betas, timesteps=timesteps.astype(np.int32),
        alphas_cumprod=f32(acp), alphas_cumprod_prev=f32(acp_prev),
        alphas_cumprod_next=f32(np.append(acp[1:], 0.0)),
        sqrt_alphas_cumprod=f32(np.sqrt(acp)), sqrt_one_minus_alphas_cumprod=f32(np.sqrt(1 - acp)),
        sqrt_recip_alphas_cumprod=f32(np.sqrt(1 / acp)),
        sqrt_recipm1_alphas_cumprod=f32(np.sqrt(1 / acp - 1)),
        log_betas=f32(np.log(betas)),
        # beta_t, but the posterior variance at t = 0, for a better decoder likelihood (ADM).
        log_variance_large=f32(np.log(np.append(first, betas[1:]))),
        posterior_variance=f32(posterior_variance),
        posterior_log_variance_clipped=f32(np.log(clipped)),
        posterior_mean_coef1=f32(betas * np.sqrt(acp_prev) / (1 - acp)),
        posterior_mean_coef2=f32((1 - acp_prev) * np.sqrt(alphas) / (1 - acp)))


def make_schedule(name: str = 'linear', num_steps: int = 1000) -> Schedule:
  """'linear': Ho et al.'s 1e-4 to 0.02 over 1,000 steps, both ends scaled by 1000 / num_steps
  so that the process ends at the same noise level for any number of steps; 'cosine': Nichol &
  Dhariwal's alpha_bar(t) = cos^2((t + 0.008) / 1.008 * pi / 2), betas capped at 0.999."""
  if not isinstance(num_steps, int) or isinstance(num_steps, bool) or num_steps < 1:
    raise ConfigError(f'diffusion num_steps must be a positive int, got {num_steps!r}')
  if name == 'linear':
    scale = 1000 / num_steps
    betas = np.linspace(scale * 1e-4, scale * 0.02, num_steps, dtype=np.float64)
  elif name == 'cosine':
    alpha_bar = lambda t: math.cos((t + 0.008) / 1.008 * math.pi / 2) ** 2
    betas = [min(1 - alpha_bar((i + 1) / num_steps) / alpha_bar(i / num_steps), COSINE_MAX_BETA)
             for i in range(num_steps)]
  else:
    raise ConfigError(f'unknown diffusion schedule {name!r}: choose one of {SCHEDULES}')
  return Schedule.from_betas(betas)


def space_timesteps(num_steps: int, section_counts: int | str | Sequence[int]) -> list[int]:
  """The timesteps of a num_steps process kept by ADM's spacing, sorted: the process is cut
  into len(section_counts) equal sections and section i keeps section_counts[i] evenly spaced
  steps, its first and last included; 'ddimN' keeps N steps at an integer stride from 0 (the
  DDIM paper's spacing); an int N is [N]."""
  if isinstance(section_counts, str) and section_counts.startswith('ddim'):
    count = int(section_counts[len('ddim'):])
    for stride in range(1, num_steps):
      if len(range(0, num_steps, stride)) == count:
        return list(range(0, num_steps, stride))
    raise ConfigError(f'no integer stride gives {count} of {num_steps} steps: choose another '
                      'ddimN, or a plain number of steps')
  if isinstance(section_counts, str):
    section_counts = [int(count) for count in section_counts.split(',')]
  elif isinstance(section_counts, int):
    section_counts = [section_counts]
  size_per, extra = divmod(num_steps, len(section_counts))
  start, kept = 0, []
  for i, count in enumerate(section_counts):
    size = size_per + (1 if i < extra else 0)
    if not 1 <= count <= size:
      raise ConfigError(f'cannot take {count} sampling steps from a section of {size} of the '
                        f'{num_steps} training steps: sample with 1 to {size} steps there')
    stride = (size - 1) / (count - 1) if count > 1 else 1
    kept += [start + round(j * stride) for j in range(count)]  # Python's round, as ADM
    start += size
  return sorted(set(kept))


def respace(schedule: Schedule, steps: int | str | Sequence[int]) -> Schedule:
  """The process on the timesteps space_timesteps(schedule.num_steps, steps) keeps, with the
  same cumulative alphas there: new beta_i = 1 - acp[t_i] / acp[t_{i-1}] (acp in float64)."""
  kept = space_timesteps(schedule.num_steps, steps)
  acp = np.cumprod(1.0 - schedule.betas)[kept]
  betas = 1.0 - acp / np.append(1.0, acp[:-1])
  return Schedule.from_betas(betas, schedule.timesteps[kept])


def _at(array: np.ndarray, t: jax.Array, ndim: int) -> jax.Array:
  """array[t] for a batch of step indices t (B,), shaped (B, 1, ...) to broadcast over rank
  ndim; a scalar t gives a scalar."""
  values = jnp.asarray(array)[t]
  return values.reshape(values.shape + (1,) * (ndim - values.ndim)) if values.ndim else values


def q_sample(schedule: Schedule, x_0: jax.Array, t: jax.Array, noise: jax.Array) -> jax.Array:
  """x_t ~ q(x_t | x_0) = N(sqrt(acp_t) x_0, (1 - acp_t) I), with this noise; t (B,)."""
  return (_at(schedule.sqrt_alphas_cumprod, t, x_0.ndim) * x_0 +
          _at(schedule.sqrt_one_minus_alphas_cumprod, t, x_0.ndim) * noise)


def q_posterior_mean_variance(schedule: Schedule, x_0: jax.Array, x_t: jax.Array, t: jax.Array):
  """The mean, variance and clipped log-variance of q(x_{t-1} | x_t, x_0)."""
  mean = (_at(schedule.posterior_mean_coef1, t, x_t.ndim) * x_0 +
          _at(schedule.posterior_mean_coef2, t, x_t.ndim) * x_t)
  return (mean, _at(schedule.posterior_variance, t, x_t.ndim),
          _at(schedule.posterior_log_variance_clipped, t, x_t.ndim))


def predict_x0_from_eps(schedule: Schedule, x_t: jax.Array, t: jax.Array, eps: jax.Array):
  """x_0 = (x_t - sqrt(1 - acp_t) eps) / sqrt(acp_t)."""
  return (_at(schedule.sqrt_recip_alphas_cumprod, t, x_t.ndim) * x_t -
          _at(schedule.sqrt_recipm1_alphas_cumprod, t, x_t.ndim) * eps)


def _eps_from_x0(schedule: Schedule, x_t: jax.Array, t: jax.Array, x_0: jax.Array):
  return ((_at(schedule.sqrt_recip_alphas_cumprod, t, x_t.ndim) * x_t - x_0) /
          _at(schedule.sqrt_recipm1_alphas_cumprod, t, x_t.ndim))


def _check_variance(variance: str):
  if variance not in VARIANCES:
    raise ConfigError(f'unknown diffusion variance {variance!r}: choose one of {VARIANCES}')


def p_mean_variance(schedule: Schedule, model_output: jax.Array, x_t: jax.Array, t: jax.Array,
                    *, variance: str, clip_denoised: bool = False) -> dict[str, jax.Array]:
  """p(x_{t-1} | x_t) from the model's output at step indices t (B,): {'mean', 'variance',
  'log_variance', 'pred_x0'}. The output's first C channels are epsilon; with 'learned_range'
  the last C are v in [-1, 1], log-variance = (v+1)/2 log(beta_t) + (1-v)/2 log(posterior
  variance_t). clip_denoised clips the predicted x_0 to [-1, 1] (pixels; not latents)."""
  _check_variance(variance)
  channels = x_t.shape[-1]
  eps = model_output[..., :channels].astype(jnp.float32)
  if variance == 'learned_range':
    if model_output.shape[-1] != 2 * channels:
      raise ValueError(f'a learned variance needs {2 * channels} output channels (epsilon, '
                       f'then the variance), got {model_output.shape[-1]}')
    frac = (model_output[..., channels:].astype(jnp.float32) + 1) / 2
    log_variance = (frac * _at(schedule.log_betas, t, x_t.ndim) +
                    (1 - frac) * _at(schedule.posterior_log_variance_clipped, t, x_t.ndim))
  else:
    fixed = (schedule.log_variance_large if variance == 'fixed_large' else
             schedule.posterior_log_variance_clipped)
    log_variance = jnp.broadcast_to(_at(fixed, t, x_t.ndim), x_t.shape)
  pred_x0 = predict_x0_from_eps(schedule, x_t, t, eps)
  if clip_denoised:
    pred_x0 = jnp.clip(pred_x0, -1, 1)
  mean, _, _ = q_posterior_mean_variance(schedule, pred_x0, x_t, t)
  return {'mean': mean, 'variance': jnp.exp(log_variance), 'log_variance': log_variance,
          'pred_x0': pred_x0}


def normal_kl(mean1, logvar1, mean2, logvar2):
  """KL(N(mean1, exp(logvar1)) || N(mean2, exp(logvar2))) elementwise, in nats."""
  return 0.5 * (-1.0 + logvar2 - logvar1 + jnp.exp(logvar1 - logvar2) +
                (mean1 - mean2) ** 2 * jnp.exp(-logvar2))


def _approx_standard_normal_cdf(x):
  # ADM's tanh approximation of Phi (the one GELU uses), kept for its numbers.
  return 0.5 * (1.0 + jnp.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def discretized_gaussian_log_likelihood(x, *, means, log_scales):
  """log P(x) in nats, elementwise, for x uint8 values scaled to [-1, 1]: the Gaussian's mass
  on x's bin of width 2/255, the edge bins extended to -inf and +inf."""
  centered = x - means
  inv_stdv = jnp.exp(-log_scales)
  cdf_plus = _approx_standard_normal_cdf(inv_stdv * (centered + 1.0 / 255.0))
  cdf_min = _approx_standard_normal_cdf(inv_stdv * (centered - 1.0 / 255.0))
  log_cdf_plus = jnp.log(jnp.maximum(cdf_plus, 1e-12))
  log_one_minus_cdf_min = jnp.log(jnp.maximum(1.0 - cdf_min, 1e-12))
  log_cdf_delta = jnp.log(jnp.maximum(cdf_plus - cdf_min, 1e-12))
  return jnp.where(x < -0.999, log_cdf_plus,
                   jnp.where(x > 0.999, log_one_minus_cdf_min, log_cdf_delta))


def _mean_over_examples(x: jax.Array) -> jax.Array:
  return x.mean(axis=tuple(range(1, x.ndim)))


def vb_terms_bpd(schedule: Schedule, model_output: jax.Array, x_0: jax.Array, x_t: jax.Array,
                 t: jax.Array, *, variance: str = 'learned_range',
                 clip_denoised: bool = False) -> jax.Array:
  """The variational bound's term at step t per example (B,), in bits per dimension:
  KL(q(x_{t-1} | x_t, x_0) || p(x_{t-1} | x_t)), and at t = 0 the decoder's negative
  discretized log-likelihood of x_0."""
  true_mean, _, true_log_variance = q_posterior_mean_variance(schedule, x_0, x_t, t)
  p = p_mean_variance(schedule, model_output, x_t, t, variance=variance,
                      clip_denoised=clip_denoised)
  kl = _mean_over_examples(normal_kl(true_mean, true_log_variance, p['mean'],
                                     p['log_variance'])) / math.log(2.0)
  decoder_nll = -_mean_over_examples(discretized_gaussian_log_likelihood(
      x_0, means=p['mean'], log_scales=0.5 * p['log_variance'])) / math.log(2.0)
  return jnp.where(t == 0, decoder_nll, kl)


def prior_bpd(schedule: Schedule, x_0: jax.Array) -> jax.Array:
  """KL(q(x_T | x_0) || N(0, I)) per example (B,), in bits per dimension: the bound's term
  that no model changes (ADM's _prior_bpd)."""
  last = schedule.num_steps - 1
  mean = schedule.sqrt_alphas_cumprod[last] * x_0
  log_variance = jnp.log(1.0 - schedule.alphas_cumprod[last])
  return _mean_over_examples(normal_kl(mean, log_variance, 0.0, 0.0)) / math.log(2.0)


def bound_timesteps(num_steps: int, count: int = 0) -> tuple[np.ndarray, np.ndarray]:
  """The steps at which bpd_loop evaluates the bound and the weight of each term: count 0 (or
  >= num_steps) all of them, weight 1 (ADM's calc_bpd_loop); else step 0 (the decoder term,
  exact) and count - 1 steps evenly spaced over 1 .. num_steps - 1, each weighted (num_steps -
  1) / (count - 1): a stratified estimate of the sum of the KL terms."""
  if not count or count >= num_steps:
    return np.arange(num_steps), np.ones(num_steps)
  if count < 2:
    raise ConfigError(f'the bound needs at least 2 timesteps (the decoder and one KL term), got '
                      f'{count}: set 0 for all {num_steps}, or 2 or more')
  kl_steps = np.unique(np.rint(np.linspace(1, num_steps - 1, count - 1)).astype(int))
  return (np.append(0, kl_steps),
          np.append(1.0, np.full(len(kl_steps), (num_steps - 1) / len(kl_steps))))


def bpd_loop(schedule: Schedule, model_fn: ModelFn, x_0: jax.Array, rng: jax.Array, *,
             variance: str, steps: int = 0, clip_denoised: bool = True) -> dict[str, jax.Array]:
  """The variational bound on -log p(x_0) in bits per dimension per example, as ADM's
  calc_bpd_loop: at each step t of bound_timesteps(num_steps, steps) x_t = q_sample(x_0, t,
  noise) with fresh noise (fold_in(rng, t)) and the model's vb_terms_bpd there, in one lax.scan.
  x_0: (B, ..., C) pixels in [-1, 1] on the 8-bit grid. Returns 'total_bpd' (B,) = weighted sum
  of the terms + 'prior_bpd' (B,), 'vb' (K, B) the terms at 'timesteps' (K,), and 'mse' (K, B)
  of the predicted noise there."""
  timesteps, weights = bound_timesteps(schedule.num_steps, steps)
  batch = x_0.shape[0]

  def term(_, t):
    noise = jax.random.normal(jax.random.fold_in(rng, t), x_0.shape, jnp.float32)
    t_batch = jnp.full((batch,), t)
    x_t = q_sample(schedule, x_0, t_batch, noise)
    output = model_fn(x_t, _model_timesteps(schedule, t, batch))
    vb = vb_terms_bpd(schedule, output, x_0, x_t, t_batch, variance=variance,
                      clip_denoised=clip_denoised)
    mse = _mean_over_examples((noise - output[..., :x_0.shape[-1]].astype(jnp.float32)) ** 2)
    return None, (vb, mse)

  x_0 = x_0.astype(jnp.float32)
  _, (vb, mse) = jax.lax.scan(term, None, jnp.asarray(timesteps))
  prior = prior_bpd(schedule, x_0)
  total = jnp.einsum('k,kb->b', jnp.asarray(weights, jnp.float32), vb) + prior
  return {'total_bpd': total, 'prior_bpd': prior, 'vb': vb, 'mse': mse,
          'timesteps': jnp.asarray(timesteps)}


def training_losses(schedule: Schedule, model_output: jax.Array, x_0: jax.Array,
                    x_t: jax.Array, t: jax.Array, noise: jax.Array, *,
                    variance: str = 'fixed_large') -> dict[str, jax.Array]:
  """Per-example losses of the model's output at x_t = q_sample(x_0, t, noise): 'mse' of the
  predicted noise; with 'learned_range' also 'vb' (vb_terms_bpd with the epsilon half held
  fixed, so that only the variance learns from it: the hybrid loss of improved DDPM); 'loss'
  their sum. In float32."""
  _check_variance(variance)
  channels = x_0.shape[-1]
  eps = model_output[..., :channels].astype(jnp.float32)
  losses = {'mse': _mean_over_examples((noise - eps) ** 2)}
  losses['loss'] = losses['mse']
  if variance == 'learned_range':
    frozen = jnp.concatenate([jax.lax.stop_gradient(eps), model_output[..., channels:]], -1)
    losses['vb'] = vb_terms_bpd(schedule, frozen, x_0, x_t, t, variance=variance)
    losses['loss'] = losses['mse'] + losses['vb']
  return losses


def _model_timesteps(schedule: Schedule, i: jax.Array, batch: int) -> jax.Array:
  return jnp.full((batch,), jnp.asarray(schedule.timesteps)[i], jnp.int32)


def ddpm_sample(schedule: Schedule, model_fn: ModelFn, noise: jax.Array, rng: jax.Array, *,
                variance: str = 'fixed_large', clip_denoised: bool = False) -> jax.Array:
  """Ancestral sampling (Ho et al. 2020) from x_T = noise down to x_0, one lax.scan over the
  schedule's steps (jit the call to compile it as one program); the step i noise is drawn from
  fold_in(rng, i), none at i = 0."""
  batch = noise.shape[0]

  def step(x, i):
    t = jnp.full((batch,), i)
    p = p_mean_variance(schedule, model_fn(x, _model_timesteps(schedule, i, batch)), x, t,
                        variance=variance, clip_denoised=clip_denoised)
    z = jax.random.normal(jax.random.fold_in(rng, i), x.shape, jnp.float32)
    return p['mean'] + jnp.where(i > 0, jnp.exp(0.5 * p['log_variance']), 0.0) * z, None

  x, _ = jax.lax.scan(step, noise.astype(jnp.float32), jnp.arange(schedule.num_steps)[::-1])
  return x


def _ddim_eps_and_x0(schedule, model_fn, x, i, clip_denoised):
  """The model's x_0 prediction at step i and the epsilon re-derived from it (after clipping)."""
  batch = x.shape[0]
  eps = model_fn(x, _model_timesteps(schedule, i, batch))[..., :x.shape[-1]].astype(jnp.float32)
  t = jnp.full((batch,), i)
  pred_x0 = predict_x0_from_eps(schedule, x, t, eps)
  if clip_denoised:
    pred_x0 = jnp.clip(pred_x0, -1, 1)
  return _eps_from_x0(schedule, x, t, pred_x0), pred_x0


def ddim_sample(schedule: Schedule, model_fn: ModelFn, noise: jax.Array,
                rng: jax.Array | None = None, *, eta: float = 0.0,
                clip_denoised: bool = False) -> jax.Array:
  """DDIM (Song et al. 2021, eq. 12) from x_T = noise to x_0 in one lax.scan: x_{t-1} =
  sqrt(acp_{t-1}) x0_hat + sqrt(1 - acp_{t-1} - sigma^2) eps_hat + sigma z, sigma = eta
  sqrt((1 - acp_{t-1}) / (1 - acp_t)) sqrt(1 - acp_t / acp_{t-1}). eta 0 is deterministic (rng
  unused); eta 1 is DDPM's posterior variance."""
  if eta != 0 and rng is None:
    raise ValueError('DDIM with eta > 0 draws noise: pass an rng')

  def step(x, i):
    eps, pred_x0 = _ddim_eps_and_x0(schedule, model_fn, x, i, clip_denoised)
    acp = jnp.asarray(schedule.alphas_cumprod)[i]
    acp_prev = jnp.asarray(schedule.alphas_cumprod_prev)[i]
    sigma = eta * jnp.sqrt((1 - acp_prev) / (1 - acp)) * jnp.sqrt(1 - acp / acp_prev)
    x = jnp.sqrt(acp_prev) * pred_x0 + jnp.sqrt(1 - acp_prev - sigma ** 2) * eps
    if eta != 0:
      z = jax.random.normal(jax.random.fold_in(rng, i), x.shape, jnp.float32)
      x = x + jnp.where(i > 0, sigma, 0.0) * z
    return x, None

  x, _ = jax.lax.scan(step, noise.astype(jnp.float32), jnp.arange(schedule.num_steps)[::-1])
  return x


def ddim_invert(schedule: Schedule, model_fn: ModelFn, x_0: jax.Array, *,
                clip_denoised: bool = False) -> jax.Array:
  """The deterministic DDIM process run forward (ADM's reverse ODE step): x_0 taken as the state
  at step 0 (acp_0 is close to 1), then for i = 0 .. T-2 x_{i+1} = sqrt(acp_{i+1}) x0_hat +
  sqrt(1 - acp_{i+1}) eps_hat, the model evaluated at (x_i, i). Returns the state at the last
  step, where ddim_sample starts: ddim_sample(schedule, model_fn, ddim_invert(...)) gives x_0
  back up to the discretisation error."""

  def step(x, i):
    eps, pred_x0 = _ddim_eps_and_x0(schedule, model_fn, x, i, clip_denoised)
    acp_next = jnp.asarray(schedule.alphas_cumprod_next)[i]
    return jnp.sqrt(acp_next) * pred_x0 + jnp.sqrt(1 - acp_next) * eps, None

  x, _ = jax.lax.scan(step, x_0.astype(jnp.float32), jnp.arange(schedule.num_steps - 1))
  return x


def classifier_free_guidance(output: jax.Array, scale: float, channels: int) -> jax.Array:
  """Combines a model output of a doubled batch (2B, ..., D), conditional half first, then the
  null-class half, into (B, ..., D): the first `channels` (epsilon) are uncond + scale * (cond -
  uncond) (Ho & Salimans 2022); the rest (a learned variance) the conditional half's, as DiT.
  (DiT's code guides only 3 of its 4 latent channels for reproducibility; here all of epsilon.)"""
  cond, uncond = jnp.split(output, 2, axis=0)
  guided = uncond[..., :channels] + scale * (cond[..., :channels] - uncond[..., :channels])
  return jnp.concatenate([guided, cond[..., channels:]], axis=-1)


def guided_model_fn(model_fn: Callable[[jax.Array, jax.Array, jax.Array], jax.Array],
                    labels: jax.Array, null_label: int, scale: float) -> ModelFn:
  """A ModelFn for the samplers from a class-conditional model_fn(x, t, labels): one call on
  the batch doubled (labels, then the null class), combined by classifier_free_guidance."""

  def guided(x, t):
    doubled = model_fn(jnp.concatenate([x, x]), jnp.concatenate([t, t]),
                       jnp.concatenate([labels, jnp.full_like(labels, null_label)]))
    return classifier_free_guidance(doubled, scale, x.shape[-1])

  return guided
