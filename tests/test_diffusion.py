"""The diffusion process against closed forms written here: the forward chain, Bayes' posterior,
the schedules' formulas, Gaussian KL and likelihoods (scipy), and samplers driven by exact
noise predictors (oracles) whose samples are known."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import integrate, stats

from transformer_jax import diffusion
from transformer_jax.errors import ConfigError


def base_alphas_cumprod(num_steps=1000):
  return np.cumprod(1 - np.linspace(1e-4 * 1000 / num_steps, 0.02 * 1000 / num_steps, num_steps))


def one_image_oracle(x_0, acp):
  """The exact noise predictor for a dataset of the one image x_0 (B, ..., C): eps = (x_t -
  sqrt(acp) x_0) / sqrt(1 - acp), acp at the model's (original) timestep."""
  acp = jnp.asarray(acp, jnp.float32)

  def model_fn(x, t):
    a = acp[t].reshape((-1,) + (1,) * (x.ndim - 1))
    return (x - jnp.sqrt(a) * x_0) / jnp.sqrt(1 - a)

  return model_fn


def gaussian_oracle(mean, std, acp):
  """The exact noise predictor E[eps | x_t] for data ~ N(mean, std^2), elementwise: x_t ~
  N(sqrt(a) mean, a std^2 + 1 - a), so E[eps | x_t] = sqrt(1 - a) (x_t - sqrt(a) mean) /
  (a std^2 + 1 - a)."""
  acp = jnp.asarray(acp, jnp.float32)

  def model_fn(x, t):
    a = acp[t].reshape((-1,) + (1,) * (x.ndim - 1))
    return jnp.sqrt(1 - a) * (x - jnp.sqrt(a) * mean) / (a * std ** 2 + 1 - a)

  return model_fn


def test_linear_betas_run_from_1e_4_to_0_02_scaled_by_1000_over_the_steps():
  for steps, scale in ((1000, 1.0), (250, 4.0)):
    betas = diffusion.make_schedule('linear', steps).betas
    assert betas.dtype == np.float64 and betas.shape == (steps,)
    np.testing.assert_allclose(betas[[0, -1]], [1e-4 * scale, 0.02 * scale], rtol=1e-12)
    np.testing.assert_allclose(np.diff(betas), (0.02 - 1e-4) * scale / (steps - 1), rtol=1e-9)


def test_the_cosine_schedule_follows_alpha_bar_and_caps_beta_at_0_999():
  steps, s = 100, 0.008
  schedule = diffusion.make_schedule('cosine', steps)
  f = np.cos((np.arange(steps + 1) / steps + s) / (1 + s) * np.pi / 2) ** 2
  # Until the cap binds, the product of (1 - beta) telescopes to alpha_bar(t) / alpha_bar(0).
  np.testing.assert_allclose(schedule.alphas_cumprod[:-1], (f[1:] / f[0])[:-1], rtol=1e-6)
  assert schedule.betas[-1] == 0.999  # alpha_bar(1) = 0: the cap
  assert schedule.betas[0] == pytest.approx(1 - f[1] / f[0], rel=1e-12)


def test_q_sample_is_the_closed_form_of_the_step_by_step_chain():
  schedule = diffusion.make_schedule('linear', 1000)
  # Coefficients exactly: x_t = sqrt(1 - b_t) x_{t-1} + sqrt(b_t) eps_t keeps x_t = m_t x_0 +
  # (noise of variance v_t) with m_t = sqrt(1 - b_t) m_{t-1}, v_t = (1 - b_t) v_{t-1} + b_t.
  m, v, means, variances = 1.0, 0.0, [], []
  for beta in schedule.betas:
    m, v = math.sqrt(1 - beta) * m, (1 - beta) * v + beta
    means.append(m)
    variances.append(v)
  np.testing.assert_allclose(schedule.sqrt_alphas_cumprod, means, rtol=1e-6)
  np.testing.assert_allclose(schedule.sqrt_one_minus_alphas_cumprod, np.sqrt(variances),
                             rtol=1e-6)
  # In distribution: the chain run on samples against q_sample, at t = 99 and t = 999.
  generator = np.random.default_rng(0)
  x_0 = np.full(20000, 0.7)
  x, chain = x_0, {}
  for t, beta in enumerate(schedule.betas):
    x = np.sqrt(1 - beta) * x + np.sqrt(beta) * generator.standard_normal(x.shape)
    chain[t] = x
  for t in (99, 999):
    noise = jax.random.normal(jax.random.key(t), x_0.shape)
    direct = np.asarray(diffusion.q_sample(schedule, jnp.asarray(x_0, jnp.float32),
                                           jnp.full(x_0.shape, t), noise))
    assert abs(direct.mean() - chain[t].mean()) < 0.03
    assert abs(direct.std() - chain[t].std()) < 0.02


def test_the_posterior_is_bayes_rule_of_the_forward_process():
  schedule = diffusion.make_schedule('cosine', 50)
  t = np.array([0, 1, 17, 49])
  generator = np.random.default_rng(1)
  x_0, x_t = generator.standard_normal((2, 4, 3, 2))
  mean, variance, log_variance = diffusion.q_posterior_mean_variance(
      schedule, jnp.asarray(x_0), jnp.asarray(x_t), jnp.asarray(t))
  # q(x_{t-1} | x_0) = N(sqrt(acp') x_0, 1 - acp'), q(x_t | x_{t-1}) = N(sqrt(1 - b) x_{t-1}, b):
  # the product of the two Gaussians in x_{t-1}.
  betas = schedule.betas[t]
  acp_prev = np.append(1.0, np.cumprod(1 - schedule.betas))[t]
  precision = 1 / np.maximum(1 - acp_prev, 1e-300) + (1 - betas) / betas
  expected_variance = np.where(t == 0, 0.0, 1 / precision)[:, None, None]
  expected_mean = np.where(
      (t == 0)[:, None, None], x_0,
      expected_variance * (np.sqrt(acp_prev)[:, None, None] * x_0 /
                           np.maximum(1 - acp_prev, 1e-300)[:, None, None] +
                           np.sqrt(1 - betas)[:, None, None] * x_t / betas[:, None, None]))
  np.testing.assert_allclose(mean, expected_mean, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(variance, expected_variance, rtol=1e-5)
  # The log is clipped at t = 0 (variance 0) to t = 1's value.
  np.testing.assert_allclose(log_variance[1:], np.log(expected_variance[1:]), rtol=1e-5)
  np.testing.assert_allclose(log_variance[0], log_variance[1], rtol=1e-6)


def test_space_timesteps_follows_adm():
  assert diffusion.space_timesteps(1000, 'ddim50') == list(range(0, 1000, 20))
  kept = diffusion.space_timesteps(300, [10, 15, 20])
  assert len(kept) == 45 and kept[:2] == [0, 11] and kept[-1] == 299
  assert [kept[9], kept[10], kept[24], kept[25]] == [99, 100, 199, 200]
  assert diffusion.space_timesteps(1000, 1) == [0]
  assert diffusion.space_timesteps(10, 4) == [0, 3, 6, 9]
  assert diffusion.space_timesteps(10, 10) == list(range(10))


@pytest.mark.parametrize('name', diffusion.SCHEDULES)
def test_respacing_keeps_the_cumulative_alphas_of_the_kept_steps(name):
  base = diffusion.make_schedule(name, 1000)
  spaced = diffusion.respace(base, 50)
  kept = diffusion.space_timesteps(1000, 50)
  np.testing.assert_array_equal(spaced.timesteps, kept)
  np.testing.assert_allclose(spaced.alphas_cumprod, base.alphas_cumprod[kept], rtol=1e-6)
  np.testing.assert_allclose(np.cumprod(1 - spaced.betas), np.cumprod(1 - base.betas)[kept],
                             rtol=1e-10)
  # Respacing a respaced schedule maps to the original timesteps.
  twice = diffusion.respace(spaced, 10)
  np.testing.assert_array_equal(twice.timesteps,
                                np.asarray(kept)[diffusion.space_timesteps(50, 10)])


@pytest.mark.parametrize('make,message', [
    (lambda: diffusion.make_schedule('linear', 0), 'positive int'),
    (lambda: diffusion.make_schedule('linear', 10), 'betas must lie in'),  # beta_end = 2
    (lambda: diffusion.make_schedule('quadratic', 10), 'unknown diffusion schedule'),
    (lambda: diffusion.Schedule.from_betas([0.1, 1.0]), 'betas must lie in'),
    (lambda: diffusion.Schedule.from_betas([0.0, 0.1]), 'betas must lie in'),
    (lambda: diffusion.respace(diffusion.make_schedule('linear', 100), 250),
     'sample with 1 to 100 steps'),
    (lambda: diffusion.space_timesteps(100, 'ddim33'), 'no integer stride'),
])
def test_bad_settings_are_config_errors_naming_the_fix(make, message):
  with pytest.raises(ConfigError, match=message):
    make()


def test_the_normal_kl_matches_the_closed_form_and_an_integral():
  mean1, logvar1, mean2, logvar2 = 0.3, math.log(0.5), -0.2, math.log(2.0)
  kl = float(diffusion.normal_kl(mean1, logvar1, mean2, logvar2))
  s1, s2 = math.exp(logvar1 / 2), math.exp(logvar2 / 2)
  assert kl == pytest.approx(math.log(s2 / s1) + (s1 ** 2 + (mean1 - mean2) ** 2) /
                             (2 * s2 ** 2) - 0.5, rel=1e-6)
  p, q = stats.norm(mean1, s1), stats.norm(mean2, s2)
  integral, _ = integrate.quad(lambda x: p.pdf(x) * (p.logpdf(x) - q.logpdf(x)), -20, 20)
  assert kl == pytest.approx(integral, rel=1e-5)


def test_the_discretized_likelihood_is_the_mass_of_the_pixel_bin():
  pixels = np.array([0, 1, 37, 128, 200, 254, 255])
  x = pixels / 127.5 - 1
  means = x + np.array([0.0, 0.01, -0.02, 0.005, 0.03, -0.01, 0.0])
  scales = np.array([0.02, 0.05, 0.03, 0.01, 0.1, 0.04, 0.02])
  log_probs = np.asarray(diffusion.discretized_gaussian_log_likelihood(
      jnp.asarray(x, jnp.float32), means=jnp.asarray(means, jnp.float32),
      log_scales=jnp.asarray(np.log(scales), jnp.float32)))
  # The exact normal CDF over the bin [x - 1/255, x + 1/255], the edges open: ADM's tanh
  # approximation of the CDF is within 2e-4 of it, which moves these masses by under 1%.
  upper = np.where(pixels == 255, 1.0, stats.norm.cdf(x + 1 / 255, means, scales))
  lower = np.where(pixels == 0, 0.0, stats.norm.cdf(x - 1 / 255, means, scales))
  np.testing.assert_allclose(log_probs, np.log(upper - lower), atol=1e-2)
  # And ADM's formula itself, written out in float64.
  cdf = lambda z: 0.5 * (1 + np.tanh(np.sqrt(2 / np.pi) * (z + 0.044715 * z ** 3)))
  upper = np.where(pixels == 255, 1.0, cdf((x - means + 1 / 255) / scales))
  lower = np.where(pixels == 0, 0.0, cdf((x - means - 1 / 255) / scales))
  np.testing.assert_allclose(log_probs, np.log(upper - lower), rtol=1e-4, atol=1e-5)


def test_the_learned_range_interpolates_log_variance_between_posterior_and_beta():
  schedule = diffusion.make_schedule('linear', 100)
  x_t = jnp.ones((3, 2, 2, 1))
  t = jnp.array([0, 5, 99])
  output = jnp.concatenate([jnp.zeros_like(x_t), jnp.full_like(x_t, 0.5)], axis=-1)
  got = diffusion.p_mean_variance(schedule, output, x_t, t, variance='learned_range')
  posterior_variance = schedule.betas * (1 - np.append(1, np.cumprod(1 - schedule.betas))[:-1]) / (
      1 - np.cumprod(1 - schedule.betas))
  low = np.log(np.where(np.arange(100) == 0, posterior_variance[1], posterior_variance))
  expected = 0.75 * np.log(schedule.betas) + 0.25 * low  # v = 0.5: 3/4 of the way to beta
  np.testing.assert_allclose(got['log_variance'][:, 0, 0, 0], expected[[0, 5, 99]], rtol=1e-5)
  large = diffusion.p_mean_variance(schedule, output[..., :1], x_t, t, variance='fixed_large')
  np.testing.assert_allclose(large['variance'][:, 0, 0, 0],
                             [posterior_variance[1], schedule.betas[5], schedule.betas[99]],
                             rtol=1e-5)
  with pytest.raises(ValueError, match='needs 2 output channels'):
    diffusion.p_mean_variance(schedule, x_t, x_t, t, variance='learned_range')


def test_the_vb_term_is_zero_for_the_true_posterior_and_the_kl_in_bits_otherwise():
  schedule = diffusion.make_schedule('linear', 100)
  generator = np.random.default_rng(2)
  x_0 = jnp.asarray(generator.uniform(-1, 1, (3, 4, 4, 2)), jnp.float32)
  noise = jnp.asarray(generator.standard_normal((3, 4, 4, 2)), jnp.float32)
  t = jnp.array([1, 40, 99])
  x_t = diffusion.q_sample(schedule, x_0, t, noise)
  exact = jnp.concatenate([noise, -jnp.ones_like(noise)], axis=-1)  # v = -1: posterior variance
  np.testing.assert_allclose(diffusion.vb_terms_bpd(schedule, exact, x_0, x_t, t), 0, atol=1e-4)
  wrong = jnp.concatenate([noise + 0.1, jnp.zeros_like(noise)], axis=-1)
  p = diffusion.p_mean_variance(schedule, wrong, x_t, t, variance='learned_range')
  true_mean, _, true_log_variance = diffusion.q_posterior_mean_variance(schedule, x_0, x_t, t)
  s1, s2 = np.exp(true_log_variance / 2), np.exp(np.asarray(p['log_variance']) / 2)
  kl = np.log(s2 / s1) + (s1 ** 2 + (true_mean - p['mean']) ** 2) / (2 * s2 ** 2) - 0.5
  np.testing.assert_allclose(diffusion.vb_terms_bpd(schedule, wrong, x_0, x_t, t),
                             kl.mean(axis=(1, 2, 3)) / np.log(2), rtol=1e-4)
  # At t = 0 the term is the decoder's negative log-likelihood in bits.
  t0 = jnp.zeros(3, jnp.int32)
  x_1 = diffusion.q_sample(schedule, x_0, t0, noise)
  p0 = diffusion.p_mean_variance(schedule, wrong, x_1, t0, variance='learned_range')
  nll = -diffusion.discretized_gaussian_log_likelihood(
      x_0, means=p0['mean'], log_scales=0.5 * p0['log_variance'])
  np.testing.assert_allclose(diffusion.vb_terms_bpd(schedule, wrong, x_0, x_1, t0),
                             nll.mean(axis=(1, 2, 3)) / np.log(2), rtol=1e-5)


def test_the_hybrid_loss_trains_epsilon_on_the_mse_alone():
  schedule = diffusion.make_schedule('linear', 100)
  generator = np.random.default_rng(3)
  x_0, noise, output = (jnp.asarray(generator.standard_normal(shape), jnp.float32)
                        for shape in ((2, 4, 4, 3), (2, 4, 4, 3), (2, 4, 4, 6)))
  t = jnp.array([3, 70])
  x_t = diffusion.q_sample(schedule, x_0, t, noise)
  loss = lambda out, name: diffusion.training_losses(
      schedule, out, x_0, x_t, t, noise, variance='learned_range')[name].sum()
  losses = diffusion.training_losses(schedule, output, x_0, x_t, t, noise,
                                     variance='learned_range')
  np.testing.assert_allclose(losses['mse'], ((noise - output[..., :3]) ** 2).mean((1, 2, 3)),
                             rtol=1e-6)
  np.testing.assert_allclose(losses['loss'], losses['mse'] + losses['vb'], rtol=1e-6)
  grad_total, grad_mse = jax.grad(loss)(output, 'loss'), jax.grad(loss)(output, 'mse')
  np.testing.assert_allclose(grad_total[..., :3], grad_mse[..., :3], rtol=1e-6)
  assert np.abs(grad_total[..., 3:]).min() > 0  # the variance learns from the bound
  plain = diffusion.training_losses(schedule, output[..., :3], x_0, x_t, t, noise)
  assert set(plain) == {'mse', 'loss'}


@pytest.mark.parametrize('variance', diffusion.VARIANCES)
@pytest.mark.parametrize('steps', [1000, 25])
def test_ddpm_samples_the_one_image_of_an_oracle_back(variance, steps):
  schedule = diffusion.respace(diffusion.make_schedule('linear', 1000), steps)
  x_0 = jax.random.uniform(jax.random.key(1), (2, 8, 8, 3), minval=-1, maxval=1)
  eps_fn = one_image_oracle(x_0, base_alphas_cumprod())
  model_fn = eps_fn
  if variance == 'learned_range':
    model_fn = lambda x, t: jnp.concatenate([eps_fn(x, t), jnp.zeros_like(x)], axis=-1)
  noise = jax.random.normal(jax.random.key(2), x_0.shape)
  sample = jax.jit(lambda noise, rng: diffusion.ddpm_sample(
      schedule, model_fn, noise, rng, variance=variance))(noise, jax.random.key(3))
  np.testing.assert_allclose(sample, x_0, atol=2e-4)


@pytest.mark.parametrize('eta', [0.0, 1.0])
def test_ddim_samples_the_one_image_of_an_oracle_back(eta):
  schedule = diffusion.respace(diffusion.make_schedule('cosine', 1000), 20)
  x_0 = jax.random.uniform(jax.random.key(1), (2, 8, 8, 3), minval=-1, maxval=1)
  model_fn = one_image_oracle(x_0, np.asarray(diffusion.make_schedule('cosine').alphas_cumprod,
                                              np.float64))
  noise = jax.random.normal(jax.random.key(2), x_0.shape)
  sample = diffusion.ddim_sample(schedule, model_fn, noise, jax.random.key(3), eta=eta)
  np.testing.assert_allclose(sample, x_0, atol=2e-4)


def test_ddim_inverts_to_the_noise_that_samples_the_data_back():
  # Data ~ N(mean, std^2): the deterministic DDIM flow keeps each value's standard score, so
  # x_0 = mean + std z maps to x_T = sqrt(a_T) mean + sqrt(a_T std^2 + 1 - a_T) z. DDIM is a
  # first-order solver: at 1,000 steps both directions are within 0.013 of the flow (0.11 at
  # 100 steps).
  mean, std = 0.3, 0.5
  schedule = diffusion.make_schedule('linear', 1000)
  model_fn = gaussian_oracle(mean, std, base_alphas_cumprod())
  z = jax.random.normal(jax.random.key(0), (4, 4, 4, 2))
  x_0 = mean + std * z
  x_T = jax.jit(lambda x: diffusion.ddim_invert(schedule, model_fn, x))(x_0)
  a_T = base_alphas_cumprod()[-1]
  np.testing.assert_allclose(x_T, math.sqrt(a_T) * mean + math.sqrt(a_T * std ** 2 + 1 - a_T) * z,
                             atol=2e-2)
  back = jax.jit(lambda x: diffusion.ddim_sample(schedule, model_fn, x))(x_T)
  np.testing.assert_allclose(back, x_0, atol=2e-2)


@pytest.mark.parametrize('sampler', ['ddpm', 'ddim'])
def test_samplers_draw_the_data_distribution_from_its_exact_noise_predictor(sampler):
  # Measured at 1,000 steps on these 8,192 draws: mean -0.395 and -0.400, std 0.3003 and 0.2997
  # (the standard error of the mean is 0.003).
  mean, std = -0.4, 0.3
  schedule = diffusion.make_schedule('linear', 1000)
  model_fn = gaussian_oracle(mean, std, base_alphas_cumprod())
  noise = jax.random.normal(jax.random.key(5), (8192, 1))
  run = {'ddpm': lambda: diffusion.ddpm_sample(schedule, model_fn, noise, jax.random.key(6)),
         'ddim': lambda: diffusion.ddim_sample(schedule, model_fn, noise)}[sampler]
  samples = np.asarray(jax.jit(run)())
  assert samples.mean() == pytest.approx(mean, abs=0.01)
  assert samples.std() == pytest.approx(std, rel=0.01)


def test_ddim_with_eta_1_is_ddpm_with_the_posterior_variance():
  schedule = diffusion.respace(diffusion.make_schedule('cosine', 1000), 50)
  model_fn = gaussian_oracle(-0.4, 0.3, diffusion.make_schedule('cosine', 1000).alphas_cumprod)
  noise = jax.random.normal(jax.random.key(5), (64, 2))
  ddim = diffusion.ddim_sample(schedule, model_fn, noise, jax.random.key(6), eta=1.0)
  ddpm = diffusion.ddpm_sample(schedule, model_fn, noise, jax.random.key(6),
                               variance='fixed_small')
  np.testing.assert_allclose(ddim, ddpm, atol=1e-5)
  eta_0 = diffusion.ddim_sample(schedule, model_fn, noise, jax.random.key(6))
  assert np.abs(eta_0 - ddpm).max() > 0.1
  with pytest.raises(ValueError, match='pass an rng'):
    diffusion.ddim_sample(schedule, model_fn, noise, eta=0.5)


def test_a_sampler_compiles_to_one_loop_over_the_steps():
  schedule = diffusion.respace(diffusion.make_schedule('linear', 1000), 50)
  calls = []

  def model_fn(x, t):
    calls.append(t.shape)
    return x * 0.1

  lowered = jax.jit(lambda x, rng: diffusion.ddpm_sample(schedule, model_fn, x, rng)).lower(
      jnp.zeros((2, 4, 4, 3)), jax.random.key(0))
  assert calls == [(2,)]  # traced once, not once per step
  assert 'while' in lowered.as_text()


def test_guidance_combines_the_conditional_and_null_halves():
  generator = np.random.default_rng(4)
  output = jnp.asarray(generator.standard_normal((4, 3, 3, 4)), jnp.float32)
  cond, uncond = np.asarray(output[:2]), np.asarray(output[2:])
  np.testing.assert_allclose(diffusion.classifier_free_guidance(output, 1.0, 2), cond, atol=1e-6)
  guided = np.asarray(diffusion.classifier_free_guidance(output, 4.0, 2))
  np.testing.assert_allclose(guided[..., :2], uncond[..., :2] + 4 * (cond - uncond)[..., :2],
                             rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(guided[..., 2:], cond[..., 2:])  # the variance: conditional's

  def model_fn(x, t, labels):  # a class-conditional model: each class shifts its output
    return jnp.concatenate([x + labels[:, None, None, None] + t[:, None, None, None],
                            jnp.zeros_like(x)], axis=-1)

  labels, null = jnp.array([3, 7]), 10
  x = jnp.asarray(generator.standard_normal((2, 3, 3, 2)), jnp.float32)
  t = jnp.array([5, 5])
  fn = diffusion.guided_model_fn(model_fn, labels, null, 1.5)
  expected = x + null + 5 + 1.5 * (labels - null)[:, None, None, None]
  np.testing.assert_allclose(fn(x, t)[..., :2], expected, rtol=1e-5)


def numpy_bound(betas, model_fn, x_0, noises, timesteps, weights):
  """ADM's calc_bpd_loop written out in float64 NumPy for a learned-range model: for each step t
  the KL between the true posterior and the model's Gaussian (the decoder's discretized
  likelihood with the tanh approximation of Phi at t = 0), weighted, plus the prior term."""
  acp = np.cumprod(1 - betas)
  acp_prev = np.append(1.0, acp[:-1])
  post_var = betas * (1 - acp_prev) / (1 - acp)
  post_log_var = np.log(np.append(post_var[1], post_var[1:]))
  coef1, coef2 = betas * np.sqrt(acp_prev) / (1 - acp), (1 - acp_prev) * np.sqrt(1 - betas) / (
      1 - acp)
  axes = tuple(range(1, x_0.ndim))
  kl = lambda m1, lv1, m2, lv2: 0.5 * (-1 + lv2 - lv1 + np.exp(lv1 - lv2) +
                                       (m1 - m2) ** 2 * np.exp(-lv2))
  phi = lambda x: 0.5 * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
  total = np.zeros(len(x_0))
  for t, weight, noise in zip(timesteps, weights, noises):
    x_t = np.sqrt(acp[t]) * x_0 + np.sqrt(1 - acp[t]) * noise
    out = np.asarray(model_fn(jnp.asarray(x_t, jnp.float32), jnp.full((len(x_0),), t)),
                     np.float64)
    eps, frac = out[..., :3], (out[..., 3:] + 1) / 2
    log_var = frac * np.log(betas[t]) + (1 - frac) * post_log_var[t]
    pred_x0 = np.clip((x_t - np.sqrt(1 - acp[t]) * eps) / np.sqrt(acp[t]), -1, 1)
    mean = coef1[t] * pred_x0 + coef2[t] * x_t
    if t == 0:
      scale = np.exp(-0.5 * log_var)
      upper = np.where(x_0 > 0.999, 1.0, phi(scale * (x_0 - mean + 1 / 255)))
      lower = np.where(x_0 < -0.999, 0.0, phi(scale * (x_0 - mean - 1 / 255)))
      term = -np.log(np.maximum(upper - lower, 1e-12)).mean(axis=axes)
    else:
      true_mean = coef1[t] * x_0 + coef2[t] * x_t
      term = kl(true_mean, post_log_var[t], mean, log_var).mean(axis=axes)
    total += weight * term / math.log(2)
  prior = kl(np.sqrt(acp[-1]) * x_0, np.log(1 - acp[-1]), 0.0, 0.0).mean(axis=axes)
  return total + prior / math.log(2)


@pytest.mark.parametrize('steps', [0, 6])
def test_the_bound_in_bits_per_dimension_is_adms_loop_written_out(steps):
  """bpd_loop (all 40 steps, or step 0 and 5 strided ones weighted 39/5) against numpy_bound of
  the same model output, the same noise at each step."""
  schedule = diffusion.make_schedule('linear', 40)
  pixels = jax.random.randint(jax.random.key(0), (3, 4, 4, 3), 0, 256)
  x_0 = pixels.astype(jnp.float32) / 127.5 - 1
  weights_in = jax.random.normal(jax.random.key(1), (3, 6)) * 0.5

  def model_fn(x, t):
    out = jnp.einsum('...c,cd->...d', x, weights_in) + t[:, None, None, None] / 40
    return jnp.concatenate([out[..., :3], jnp.tanh(out[..., 3:])], axis=-1)

  rng = jax.random.key(2)
  got = diffusion.bpd_loop(schedule, model_fn, x_0, rng, variance='learned_range', steps=steps)
  timesteps, weights = diffusion.bound_timesteps(40, steps)
  np.testing.assert_array_equal(got['timesteps'], timesteps)
  noises = [np.asarray(jax.random.normal(jax.random.fold_in(rng, t), x_0.shape), np.float64)
            for t in timesteps]
  want = numpy_bound(schedule.betas, model_fn, np.asarray(x_0, np.float64), noises, timesteps,
                     weights)
  np.testing.assert_allclose(got['total_bpd'], want, rtol=2e-5)
  assert got['vb'].shape == (len(timesteps), 3)


def test_the_bound_timesteps_keep_the_decoder_and_stratify_the_rest():
  np.testing.assert_array_equal(diffusion.bound_timesteps(5)[0], range(5))
  steps, weights = diffusion.bound_timesteps(1000, 5)
  np.testing.assert_array_equal(steps, [0, 1, 334, 666, 999])
  np.testing.assert_allclose(weights, [1, 999 / 4, 999 / 4, 999 / 4, 999 / 4])
  assert weights.sum() == 1000  # each of the 1,000 terms counted once on average
  with pytest.raises(ConfigError, match='at least 2 timesteps'):
    diffusion.bound_timesteps(1000, 1)


def test_the_prior_term_is_the_kl_to_the_standard_normal():
  schedule = diffusion.make_schedule('linear', 1000)
  x_0 = jnp.full((1, 2, 2, 3), 1.0)
  acp = schedule.alphas_cumprod[-1].astype(np.float64)
  # KL(N(m, v) || N(0, 1)) = (v + m^2 - 1 - log v) / 2, here m^2 = acp, v = 1 - acp.
  want = (1 - acp + acp - 1 - np.log(1 - acp)) / 2 / math.log(2)
  np.testing.assert_allclose(diffusion.prior_bpd(schedule, x_0), [want], rtol=1e-4)
