"""The DiT family: DiT-XL/2's parameter count, its 2-D positions, its initialization, its loss
and its guidance against DiT's code written out here, labels dropped in training only, training
through the run with an EMA, --mode=sample (a folder per run), and the settings it refuses."""
import functools
import json
import os
import pathlib
import re
import subprocess
import sys
import threading
import types

import flax
import jax
import jax.numpy as jnp
import numpy as np
from PIL import Image
import pytest

from transformer_jax import accounting, aot, config_lib, data, diffusion, models, run, train
from transformer_jax.errors import ConfigError
from transformer_jax.models import dit
from transformer_jax.train import checkpoint, loop

CONFIGS = pathlib.Path(__file__).parent.parent / 'configs'


def tiny(**model):
  return dit.DiTConfig(**{**dict(image_size=8, patch_size=4, num_channels=3, num_classes=3,
                                 width=16, num_layers=2, num_heads=2, dtype='float32'), **model})


def test_dit_xl2_counts_the_papers_parameters_and_multiply_adds():
  config = config_lib.from_file(CONFIGS / 'dit_xl2.py')
  cfg = models.model_config(config.model)
  assert dit.param_counts(cfg)['total'] == 675_129_632
  flops = accounting.forward_flops(cfg)
  # The paper's 118.6 GFLOPs count a multiply-add once.
  assert flops['total'] / 2 / 1e9 == pytest.approx(118.6, abs=0.05)


def test_the_dit_configs_train_as_dits_train_py():
  """DiT's initialization, no gradient clipping, and an EMA of 0.9999 warmed up, whatever the
  length of the run (the argument or a --config.training.steps override)."""
  for name, arg in (('dit_xl2.py', None), ('dit_reference.py', None),
                    ('dit_reference.py', 'steps=300'), ('dit_digits.py', None)):
    config = config_lib.from_file(CONFIGS / name, arg)
    assert config.optimizer.grad_clip_norm == 0 and config.optimizer.weight_decay == 0
    assert (config.training.ema_decay, config.training.ema_warmup) == (0.9999, True)
    assert models.model_config(config.model).init == 'xavier_uniform'


def test_the_compile_stand_in_of_dit_xl2_makes_latents_of_its_four_channels():
  """--mode=compile's generated data (aot.stand_in) for a latent DiT: 32x32x4 batches whose
  channels are standardized, the shape the model takes (check_data)."""
  config = config_lib.from_file(CONFIGS / 'dit_xl2.py')
  config.data.update(batch_size=8, eval_batch_size=8)
  settings = aot.stand_in(train.resolve(config, 'cpu'))
  family = settings.family
  dataset = data.make_data(settings.data, family.task, seed=0,
                           **family.data_sizes(settings.model))
  family.check_data(dataset.info, settings.model)
  batch = dataset.train_batch(0)
  assert batch['image'].shape == (8, 32, 32, 4) and batch['image'].dtype == np.float32
  held_out = next(iter(dataset.eval_batches()))
  assert held_out['image'].shape == (8, 32, 32, 4)
  # Standardized with the channel statistics of all 72 generated training arrays: a batch of 8
  # is near 0 and 1 in each channel.
  np.testing.assert_allclose(batch['image'].mean(axis=(0, 1, 2)), 0, atol=0.5)
  np.testing.assert_allclose(batch['image'].std(axis=(0, 1, 2)), 1, atol=0.5)


def test_the_formulas_equal_the_initialized_tree():
  for cfg in (tiny(), tiny(learn_sigma=False, scan_layers=True)):
    params = models.init_params(cfg, jax.random.key(0))
    assert dit.param_counts(cfg) == accounting.count_params(params)


def dit_initialization(path: str, shape: tuple, cfg) -> tuple[str, float]:
  """(distribution, parameter) of each tensor as facebookresearch/DiT's models.py
  initialize_weights draws it, written from that code: every nn.Linear xavier_uniform_ with zero
  bias (timm's attention: one qkv Linear(D, 3D) and proj Linear(D, D); the MLP's Linear(D, 4D)
  and Linear(4D, D)); the patch Conv2d's weight viewed as (D, C*P*P), xavier_uniform_, its bias
  PyTorch's Conv2d default U(+-1/sqrt(C*P*P)); the class table and the timestep MLP's weights
  normal(0.02); adaLN modulation and the final layer zero. Xavier-uniform over (fan_in, fan_out)
  is U(+-sqrt(6 / (fan_in + fan_out)))."""
  d, p, c = cfg.width, cfg.patch_size, cfg.num_channels
  xavier = lambda fan_in, fan_out: ('uniform', np.sqrt(6 / (fan_in + fan_out)))
  if path.endswith('bias') and not path.startswith('patch_embed'):
    return 'zero', 0.0
  if 'modulation' in path or path.startswith('head'):
    return 'zero', 0.0
  if path.startswith('t_embed') or path.startswith('y_embed'):
    return 'normal', 0.02
  if path == 'patch_embed/conv/kernel':
    return xavier(c * p * p, d)
  if path == 'patch_embed/conv/bias':
    return 'uniform', 1 / np.sqrt(c * p * p)
  layer = path.split('/')[-2]
  return {'query': xavier(d, 3 * d), 'key': xavier(d, 3 * d), 'value': xavier(d, 3 * d),
          'out': xavier(d, d), 'up': xavier(d, 4 * d), 'down': xavier(4 * d, d)}[layer]


def test_each_tensor_starts_as_dits_initialize_weights():
  """Every parameter but the fixed positions against dit_initialization: uniform ones within
  their bound and with its standard deviation bound / sqrt(3), normal ones with theirs (within
  5 standard errors of the estimate), zero ones zero. For DiT-XL/2 the patch matrix's std is
  sqrt(2 / (16 + 1152)) = 0.041 (LeCun normal's was 1 / sqrt(16) = 0.25)."""
  cfg = tiny(width=64, num_heads=4, patch_size=2, num_channels=4, num_classes=10)
  params = jax.device_get(jax.jit(lambda rng: models.init_params(cfg, rng))(jax.random.key(0)))
  flat = flax.traverse_util.flatten_dict(params, sep='/')
  checked = set()
  for path, value in flat.items():
    if path == 'pos_embed':
      continue
    kind, scale = dit_initialization(path, value.shape, cfg)
    value = np.asarray(value, np.float64)
    if kind == 'zero':
      assert not value.any(), path
    elif kind == 'uniform':
      assert np.abs(value).max() <= scale * (1 + 1e-6) and np.abs(value).max() > 0.8 * scale, path
      error = 5 * np.sqrt(0.2 / value.size)  # the relative error of a uniform's std estimate
      assert value.std() == pytest.approx(scale / np.sqrt(3), rel=error), path
    else:
      assert value.std() == pytest.approx(scale, rel=5 * np.sqrt(0.5 / value.size)), path
    checked.add(path)
  assert len(checked) == 2 * 16 + 11  # 16 tensors a block; patches, conditioning, head
  assert np.sqrt(2 / (16 + 1152)) == pytest.approx(0.0414, abs=1e-4)


def test_the_position_table_is_dits_2d_sincos():
  """MAE's/DiT's get_2d_sincos_pos_embed at a 2x2 grid and width 8, worked out: each row is
  [sin, cos of the column at 1, 1/100], then [sin, cos of the row]."""
  table = dit.sincos_2d(8, 2)
  rows, columns = np.divmod(np.arange(4), 2)
  half = lambda pos: np.concatenate([np.sin(pos[:, None] * [1, 0.01]),
                                     np.cos(pos[:, None] * [1, 0.01])], axis=1)
  np.testing.assert_allclose(table, np.concatenate([half(columns), half(rows)], 1), atol=1e-7)


def test_a_new_dit_predicts_zero_and_its_loss_is_the_noise_variance():
  """The zero head predicts no noise: the MSE is the mean square of the drawn noise."""
  cfg = tiny(learn_sigma=False)
  model = models.build(cfg)
  params = models.init_params(cfg, jax.random.key(0))
  images = jax.random.uniform(jax.random.key(1), (4, 8, 8, 3), minval=-1, maxval=1)
  labels = jnp.array([0, 1, 2, 0])
  out = model.apply({'params': params}, images, jnp.array([0, 5, 999, 3]), labels)
  assert out.shape == (4, 8, 8, 3) and not out.any()
  sums = model.apply({'params': params}, images, labels, jax.random.key(2),
                     method='diffusion_losses')
  noise = jax.random.normal(jax.random.split(jax.random.key(2), 3)[1], images.shape)
  assert sums['weight'] == 4
  np.testing.assert_allclose(sums['mse'], jnp.sum(jnp.mean(noise ** 2, axis=(1, 2, 3))),
                             rtol=1e-5)


def dits_training_losses(x_0, t, noise, model_output):
  """DiT's diffusion/gaussian_diffusion.py training_losses for its default diffusion (the linear
  schedule of 1,000 steps, epsilon prediction, LEARNED_RANGE variance, LossType.MSE), written
  out in float64 NumPy on channels-last arrays: mse = mean((noise - eps)^2); vb = _vb_terms_bpd
  of the output with eps detached and clip_denoised=False: KL(q(x_{t-1} | x_t, x_0) ||
  p(x_{t-1} | x_t)) in bits per dimension, at t = 0 the decoder's negative discretized
  log-likelihood (the tanh approximation of Phi); loss = mse + vb, per example."""
  betas = np.linspace(1e-4, 0.02, 1000, dtype=np.float64)
  acp = np.cumprod(1 - betas)
  acp_prev = np.append(1.0, acp[:-1])
  post_var = betas * (1 - acp_prev) / (1 - acp)
  post_log_var = np.log(np.append(post_var[1], post_var[1:]))
  coef1 = betas * np.sqrt(acp_prev) / (1 - acp)
  coef2 = (1 - acp_prev) * np.sqrt(1 - betas) / (1 - acp)
  at = lambda a: a[t][:, None, None, None]
  x_t = np.sqrt(at(acp)) * x_0 + np.sqrt(1 - at(acp)) * noise
  c = x_0.shape[-1]
  eps, v = model_output[..., :c], model_output[..., c:]
  axes = (1, 2, 3)
  mse = ((noise - eps) ** 2).mean(axis=axes)
  frac = (v + 1) / 2
  log_var = frac * np.log(at(betas)) + (1 - frac) * at(post_log_var)
  pred_x0 = np.sqrt(1 / at(acp)) * x_t - np.sqrt(1 / at(acp) - 1) * eps
  mean = at(coef1) * pred_x0 + at(coef2) * x_t
  true_mean = at(coef1) * x_0 + at(coef2) * x_t
  true_log_var = at(post_log_var)
  kl = 0.5 * (-1 + log_var - true_log_var + np.exp(true_log_var - log_var)
              + (true_mean - mean) ** 2 * np.exp(-log_var))
  phi = lambda x: 0.5 * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))
  inv_std = np.exp(-0.5 * log_var)
  cdf_plus = phi(inv_std * (x_0 - mean + 1 / 255))
  cdf_min = phi(inv_std * (x_0 - mean - 1 / 255))
  log_prob = np.where(x_0 < -0.999, np.log(np.maximum(cdf_plus, 1e-12)),
                      np.where(x_0 > 0.999, np.log(np.maximum(1 - cdf_min, 1e-12)),
                               np.log(np.maximum(cdf_plus - cdf_min, 1e-12))))
  vb = np.where(t == 0, -log_prob.mean(axis=axes), kl.mean(axis=axes)) / np.log(2)
  return x_t, {'mse': mse, 'vb': vb, 'loss': mse + vb}


@functools.cache
def perturbed():
  """tiny()'s initial parameters plus N(0, 0.1) everywhere, so that adaLN, the head and the
  labels all act (the same tree for any class_dropout)."""
  def draw(rng):
    leaves, tree = jax.tree.flatten(models.init_params(tiny(), rng))
    keys = jax.random.split(jax.random.fold_in(rng, 1), len(leaves))
    return jax.tree.unflatten(tree, [leaf + 0.1 * jax.random.normal(key, leaf.shape)
                                     for leaf, key in zip(leaves, keys)])
  return jax.jit(draw)(jax.random.key(0))


def test_the_loss_at_fixed_draws_is_dits_training_losses():
  """diffusion_terms at fixed (image, t, noise, label) against dits_training_losses of the
  model's own output at that x_t, t = 0 (the decoder term) included; and the stop-gradient: the
  bound moves only the head's variance columns, the MSE only its noise columns."""
  cfg = tiny()
  model = models.build(cfg)
  params = perturbed()
  x_0 = np.asarray(jax.random.randint(jax.random.key(3), (4, 8, 8, 3), 0, 256), np.float64)
  x_0 = x_0 / 127.5 - 1
  noise = np.asarray(jax.random.normal(jax.random.key(4), x_0.shape), np.float64)
  t, labels = np.array([0, 1, 400, 999]), jnp.array([0, 1, 2, 3])  # 3: the null class
  x_t = dits_training_losses(x_0, t, noise, np.zeros(x_0.shape[:3] + (6,)))[0]
  output = np.asarray(jax.jit(model.apply)({'params': params}, jnp.asarray(x_t, jnp.float32),
                                           jnp.asarray(t), labels), np.float64)
  want = dits_training_losses(x_0, t, noise, output)[1]
  terms = lambda params: model.apply({'params': params}, jnp.asarray(x_0, jnp.float32),
                                     labels, jnp.asarray(t), jnp.asarray(noise, jnp.float32),
                                     method='diffusion_terms')
  got = jax.jit(terms)(params)
  assert float(np.min(want['vb'])) > 1e-3  # the bound is not trivially zero
  for name in ('mse', 'vb', 'loss'):
    np.testing.assert_allclose(got[name], want[name], rtol=2e-4, err_msg=name)
  sums = lambda p: jnp.stack([terms(p)['vb'].sum(), terms(p)['mse'].sum()])
  grads = jax.jit(jax.jacrev(sums))(params)['head']['kernel']
  # The head's columns are (row, column, channel) of a patch, channels eps then variance.
  vb_grad, mse_grad = np.asarray(grads).reshape(2, cfg.width, 4, 4, 6)
  assert not vb_grad[..., :3].any() and np.abs(vb_grad[..., 3:]).max() > 0
  assert not mse_grad[..., 3:].any() and np.abs(mse_grad[..., :3]).max() > 0


def test_labels_are_dropped_in_training_only():
  """A training step (deterministic=False, as a DiT with class_dropout trains) drops labels to
  the null class at class_dropout (here the draw of diffusion_losses's third key drops three of
  four); evaluation (the eval step's batch_sums) scores the true ones, as DiT's LabelEmbedder
  drops only in train mode."""
  cfg = tiny(class_dropout=0.5)
  assert cfg.drops_in_training and not tiny(class_dropout=0.0).drops_in_training
  model = models.build(cfg)
  params = perturbed()
  images = jax.random.uniform(jax.random.key(1), (4, 8, 8, 3), minval=-1, maxval=1)
  labels = jnp.array([0, 1, 2, 0])

  def loss_at_draws(rng, labels):  # diffusion_terms at diffusion_losses's draws of t and noise
    t_rng, noise_rng, _ = jax.random.split(rng, 3)
    return model.apply({'params': params}, images, labels,
                       jax.random.randint(t_rng, (4,), 0, 1000),
                       jax.random.normal(noise_rng, images.shape),
                       method='diffusion_terms')['loss'].sum()

  rng = jax.random.key(2)
  dropped = jax.random.bernoulli(jax.random.split(rng, 3)[2], 0.5, (4,))
  assert dropped.sum() == 3
  true, partly_null = loss_at_draws(rng, labels), loss_at_draws(rng, jnp.where(dropped, 3, labels))
  assert abs(true - partly_null) > 1e-4 * abs(true)  # the labels matter to this model
  trained = model.apply({'params': params}, images, labels, rng, deterministic=False,
                        method='diffusion_losses')
  held_out = model.apply({'params': params}, images, labels, rng, method='diffusion_losses')
  np.testing.assert_allclose(trained['loss'], partly_null, rtol=1e-6)
  np.testing.assert_allclose(held_out['loss'], true, rtol=1e-6)
  # The eval step's loss (its family loss given fold_in(key, 1)) is the true labels'.
  evaluated = train.losses.batch_sums(model, models.registry.get('dit'), params,
                                      {'image': images, 'label': labels}, jax.random.key(5))
  np.testing.assert_allclose(evaluated['loss'],
                             loss_at_draws(jax.random.fold_in(jax.random.key(5), 1), labels),
                             rtol=1e-6)


def test_guidance_is_dits_forward_with_cfg():
  """dit.generate's guided model function against DiT's forward_with_cfg written out in NumPy on
  NCHW arrays: the batch doubled (labels, then the null class), the first three channels
  guided, uncond + s (cond - uncond), the rest (with learned sigma, the variance) the
  conditional half's. A pixel DiT has three noise channels, so DiT's default of guiding three
  channels (for reproducibility, its comment says) guides all of them, as ours does."""
  cfg = tiny()
  model = models.build(cfg)
  params = perturbed()
  nchw = lambda x: np.transpose(np.asarray(x, np.float64), (0, 3, 1, 2))
  forward = lambda x, t, y: nchw(model.apply({'params': params},
                                             jnp.asarray(np.transpose(x, (0, 2, 3, 1)),
                                                         jnp.float32), t, y))

  def forward_with_cfg(x, t, y, cfg_scale):
    half = x[:len(x) // 2]
    model_out = forward(np.concatenate([half, half]), t, y)
    eps, rest = model_out[:, :3], model_out[:, 3:]
    cond_eps, uncond_eps = np.split(eps, 2)
    half_eps = uncond_eps + cfg_scale * (cond_eps - uncond_eps)
    return np.concatenate([np.concatenate([half_eps, half_eps]), rest], axis=1)

  x = jax.random.normal(jax.random.key(6), (2, 8, 8, 3))
  t, labels = jnp.array([500, 500]), jnp.array([2, 0])
  want = forward_with_cfg(nchw(np.concatenate([x, x])), jnp.concatenate([t, t]),
                          jnp.array([2, 0, 3, 3]), 4.0)[:2]
  model_fn = lambda x, t, y: model.apply({'params': params}, x, t, y)
  got = diffusion.guided_model_fn(model_fn, labels, cfg.num_classes, 4.0)(x, t)
  np.testing.assert_allclose(nchw(got), want, rtol=1e-5, atol=1e-6)
  assert np.abs(want[:, 3:] - forward(nchw(x), t, labels)[:, 3:]).max() < 1e-6


def test_the_loss_by_timestep_quarter_sums_to_the_loss():
  """quarter_sums puts each example in its quarter of the steps; loop.means reports each
  quarter over its own count, and their mean weighted by the counts is the loss."""
  sums = dit.quarter_sums(jnp.array([1.0, 2.0, 3.0, 4.0, 5.0]), jnp.array([0, 249, 250, 999, 3]),
                          1000)
  assert [float(sums[f'loss_t{q}']) for q in range(4)] == [8.0, 3.0, 0.0, 4.0]
  assert [float(sums[f'weight_loss_t{q}']) for q in range(4)] == [3.0, 1.0, 0.0, 1.0]
  cfg = tiny()
  model = models.build(cfg)
  params = jax.tree.map(lambda p: p + 0.05, models.init_params(cfg, jax.random.key(0)))
  images = jax.random.uniform(jax.random.key(1), (16, 8, 8, 3), minval=-1, maxval=1)
  losses = jax.jit(lambda params: model.apply({'params': params}, images, jnp.arange(16) % 3,
                                               jax.random.key(2), method='diffusion_losses'))
  sums = jax.device_get(losses(params))
  reported = loop.means({key: float(value) for key, value in sums.items()})
  assert set(reported) == {'loss', 'mse', 'vb', 'loss_t0', 'loss_t1', 'loss_t2', 'loss_t3'}
  weighted = sum(reported[f'loss_t{q}'] * sums[f'weight_loss_t{q}'] for q in range(4)
                 if sums[f'weight_loss_t{q}'])
  np.testing.assert_allclose(weighted / sums['weight'], reported['loss'], rtol=1e-6)
  assert sum(sums[f'weight_loss_t{q}'] for q in range(4)) == 16


def test_the_bound_of_a_tiny_dit_is_the_mean_of_its_per_image_loop():
  """bound_bpd over batches of 2 (the noise of batch i from fold_in(key(0), i)) is the mean of
  diffusion.bpd_loop run on each batch, and its parts add up: total = prior + decoder + KLs."""
  cfg = tiny(diffusion_steps=30)
  model = models.build(cfg)
  params = jax.tree.map(lambda p: p + 0.02, models.init_params(cfg, jax.random.key(0)))
  images = np.asarray(jax.random.randint(jax.random.key(1), (4, 8, 8, 3), 0, 256),
                      np.float32) / 127.5 - 1
  labels = np.array([0, 1, 2, 0])
  got = dit.bound_bpd(model, params, images, labels, batch_size=2)
  loops = [diffusion.bpd_loop(dit.schedule_of(cfg),
                              lambda x, t, y=labels[i:i + 2]: model.apply({'params': params},
                                                                          x, t, y),
                              images[i:i + 2], jax.random.fold_in(jax.random.key(0), i // 2),
                              variance='learned_range') for i in (0, 2)]
  np.testing.assert_allclose(got['bpd'], np.mean([out['total_bpd'] for out in loops]),
                             rtol=1e-5)
  np.testing.assert_allclose(got['bpd_decoder'], np.mean([out['vb'][0] for out in loops]),
                             rtol=1e-5)
  kl_terms = np.mean([out['vb'][1:].sum(0) for out in loops])
  np.testing.assert_allclose(got['bpd'], got['bpd_prior'] + got['bpd_decoder'] + kl_terms,
                             rtol=1e-5)


def test_bad_settings_name_the_fix():
  with pytest.raises(ConfigError, match='does not divide model.image_size'):
    tiny(patch_size=3)
  with pytest.raises(ConfigError, match='betas must lie in'):
    tiny(diffusion_steps=10)
  with pytest.raises(ConfigError, match='at most 1000'):
    dit.SampleSettings(steps=1001).check_for(tiny())
  with pytest.raises(ConfigError, match='learned the null class'):
    dit.SampleSettings(guidance_scale=4.0).check_for(tiny(class_dropout=0.0))
  with pytest.raises(ConfigError, match="must be one of \\['ddpm', 'ddim'\\]"):
    dit.SampleSettings(sampler='euler')


@pytest.mark.parametrize('overrides,message', [
    ({'model.patch_size': 3}, 'choose a patch size from'),
    ({'model.diffusion_steps': 10}, 'the linear schedule needs at least 21 steps'),
    ({'eval.sample_classifier': 'W', 'sample.steps': 2000}, 'set --config.sample.steps'),
    ({'eval.sample_classifier': 'W', 'model.class_dropout': 0.0},
     'set --config.sample.guidance_scale=1'),
    ({'eval.bpd_examples': 8, 'model.num_channels': 4}, 'set --config.eval.bpd_examples=0'),
])
def test_a_bad_setting_is_one_line_naming_the_fix_before_anything_compiles(overrides, message):
  """At the top of every mode (train.resolve): the model's rules, and the sample settings that
  an evaluation scoring samples will use."""
  config = small()
  for key, value in overrides.items():
    section, name = key.split('.')
    config[section][name] = value
  with pytest.raises(ConfigError, match=message) as error:
    train.resolve(config)
  assert '\n' not in str(error.value)


def test_sampling_refuses_more_steps_than_training_before_reading_anything(tmp_path):
  config = small()
  config.sample.steps = 1001
  with pytest.raises(ConfigError, match='at most 1000'):
    run.run(config, str(tmp_path), 'sample')  # no checkpoint there: refused before reading


def test_labels_cycle_over_the_classes_or_the_chosen_ones():
  np.testing.assert_array_equal(dit.SampleSettings(num_samples=5).labels(3), [0, 1, 2, 0, 1])
  np.testing.assert_array_equal(dit.SampleSettings(num_samples=3, classes=(2,)).labels(3),
                                [2, 2, 2])


def test_the_grid_lays_images_out_row_by_row():
  images = np.arange(5, dtype=np.uint8).reshape(5, 1, 1, 1) * np.ones((5, 2, 2, 3), np.uint8)
  grid = dit.grid(images)
  assert grid.shape == (4, 6, 3)  # 3 columns, 2 rows, the last short of one
  np.testing.assert_array_equal(grid[::2, ::2, 0], [[0, 1, 2], [3, 4, 0]])


def test_an_oracle_samples_its_one_image_back():
  """A model that predicts the true noise of a one-image dataset (eps = (x_t - sqrt(acp) x0) /
  sqrt(1 - acp)) brings any noise back to that image with DDIM, through `generate`."""
  cfg = tiny(learn_sigma=False)
  target = jax.random.uniform(jax.random.key(0), (1, 8, 8, 3), minval=-1, maxval=1)
  schedule = dit.schedule_of(cfg)

  class Oracle:
    def __init__(self):
      self.cfg = cfg

    def apply(self, params, x, t, y):
      del params, y
      acp = jnp.asarray(schedule.alphas_cumprod)[t][:, None, None, None]
      return (x - jnp.sqrt(acp) * target) / jnp.sqrt(1 - acp)

  settings = dit.SampleSettings(num_samples=2, steps=20, sampler='ddim', clip_denoised=False)
  images = dit.generate(Oracle(), None, jnp.array([0, 1]), jax.random.key(1), settings)
  np.testing.assert_allclose(images, jnp.broadcast_to(target, images.shape), atol=1e-4)


def small(workdir_steps=4):
  config = config_lib.base_config('dit')
  config.model.update(image_size=8, patch_size=4, num_channels=3, num_classes=3, width=16,
                      num_layers=2, num_heads=2, dtype='float32')
  config.data.update(name='synthetic', batch_size=8, eval_batch_size=8, eval_steps=1,
                     augment=False)
  config.training.update(steps=workdir_steps, log_every=2, eval_every=workdir_steps,
                         checkpoint_every=workdir_steps, ema_decay=0.5)
  config.sample.update(num_samples=3, steps=5, sampler='ddpm', guidance_scale=2.0)
  return config


@pytest.mark.slow  # two compiles of the step, the sampler, two launch.py --mode=sample: 3 min
def test_it_trains_with_an_ema_and_samples_through_the_run(tmp_path):
  workdir = str(tmp_path)
  run.run(small(), workdir, 'train')
  assert checkpoint.latest_step(workdir) == 4
  # The EMA is checkpointed beside the parameters, and is what eval and sample restore.
  run_, params, _ = train.restore_trained(small(), workdir)
  manager = checkpoint.Checkpoints(f'{workdir}/checkpoints', read_only=True)
  state, _ = manager.restore_latest(run_.abstract_state)
  manager.close()
  leaves = lambda tree: jax.tree.leaves(jax.device_get(tree))
  for got, ema in zip(leaves(params), leaves(state.ema)):
    np.testing.assert_array_equal(got, ema)
  assert any((a != b).any() for a, b in zip(leaves(state.ema), leaves(state.params)))
  folder = run.run(small(), workdir, 'sample')
  saved = np.load(f'{folder}/samples.npz')
  assert saved['images'].shape == (3, 8, 8, 3) and saved['images'].dtype == np.uint8
  np.testing.assert_array_equal(saved['labels'], [0, 1, 2])
  assert {p.name for p in pathlib.Path(folder).glob('*.png')} == {
      'sample_0.png', 'sample_1.png', 'sample_2.png', 'grid.png'}
  # Two --mode=sample commands at once, as a user trying two seeds in two terminals runs them:
  # each names the folder it wrote, which holds all of its files.
  command = [sys.executable, str(CONFIGS.parent / 'launch.py'),
             f'--config={CONFIGS / "dit_reference.py"}', f'--workdir={workdir}', '--mode=sample']
  runs = {seed: subprocess.Popen([*command, f'--config.sample.seed={seed}'], text=True,
                                 stderr=subprocess.PIPE, env={'JAX_PLATFORMS': 'cpu', 'PATH': ''})
          for seed in (1, 2)}
  for seed, process in runs.items():
    log = process.communicate(timeout=600)[1]
    assert process.returncode == 0, log[-3000:]
    (written,) = re.findall(r'Wrote 3 samples of step 4 \(.*\) to (.*)\.$', log, re.M)
    assert written.startswith(f'{workdir}/samples/') and written.endswith(f'-seed{seed}')
    assert sorted(os.listdir(written)) == ['grid.png', 'sample.json', 'sample_0.png',
                                           'sample_1.png', 'sample_2.png', 'samples.npz']
    assert not (np.load(f'{written}/samples.npz')['images'] == saved['images']).all()


def test_two_sample_runs_at_once_each_write_a_whole_folder_of_their_own(tmp_path, monkeypatch,
                                                                         caplog):
  """--mode=sample twice on one workdir at the same second (the function in two threads, each
  held with its files half-written until the other has its own half-written too): two folders,
  each holding all of its run's files and nothing of the other's; a third run of the first's
  settings in that second takes the name with -2."""
  def draw(model, params, labels, wanted, batch_size):  # images that tell the runs apart
    del model, params, batch_size
    return np.random.default_rng(wanted.seed).integers(0, 256, (len(labels), 8, 8, 3), np.uint8)
  both_half_written, real_grid = threading.Barrier(2), dit.grid

  def grid(images):  # called between the PNGs and grid.png
    both_half_written.wait(timeout=60)
    return real_grid(images)
  monkeypatch.setattr(dit, 'draw', draw)
  monkeypatch.setattr(dit, 'grid', grid)
  monkeypatch.setattr(dit, 'time', types.SimpleNamespace(strftime=lambda form: '20250102-030405'))
  model = types.SimpleNamespace(cfg=tiny())
  wanted = {seed: dit.SampleSettings(num_samples=3, steps=5, guidance_scale=2.0, seed=seed)
            for seed in (0, 1)}
  folders = {}
  caplog.set_level('INFO', logger='transformer_jax')
  threads = [threading.Thread(target=lambda s=seed: folders.update(
      {s: dit.sample(model, None, 7, wanted[s], str(tmp_path))})) for seed in (0, 1)]
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join(timeout=120)
  monkeypatch.setattr(dit, 'grid', real_grid)
  again = dit.sample(model, None, 7, wanted[0], str(tmp_path))
  samples = tmp_path / 'samples'
  assert folders == {seed: str(samples / f'20250102-030405-step7-ddpm-5steps-g2-seed{seed}')
                     for seed in (0, 1)}
  assert again == f'{folders[0]}-2'
  assert sorted(p.name for p in samples.iterdir()) == sorted(  # no partial folder is left
      pathlib.Path(f).name for f in (*folders.values(), again))
  for seed, folder in ((0, folders[0]), (1, folders[1]), (0, again)):
    images = draw(None, None, np.zeros(3), wanted[seed], 3)
    saved = np.load(f'{folder}/samples.npz')
    np.testing.assert_array_equal(saved['images'], images)
    np.testing.assert_array_equal(saved['labels'], [0, 1, 2])
    for number in range(3):
      np.testing.assert_array_equal(np.asarray(Image.open(f'{folder}/sample_{number}.png')),
                                    images[number])
    np.testing.assert_array_equal(np.asarray(Image.open(f'{folder}/grid.png')), dit.grid(images))
    assert json.loads(pathlib.Path(f'{folder}/sample.json').read_text()) == {
        'step': 7, 'num_samples': 3, 'classes': [], 'steps': 5, 'sampler': 'ddpm',
        'guidance_scale': 2.0, 'seed': seed, 'clip_denoised': True}
    assert sum(record.getMessage().endswith(f' to {folder}.') for record in caplog.records) == 1
