"""Scores of generated images: the Fréchet distance against scipy's sqrtm formula and a closed
form, and a DiT's sample scores by a ViT classifier trained by the run, end to end."""
import numpy as np
import pytest
from scipy import linalg

from transformer_jax import config_lib, image_scores, run, train
from transformer_jax.errors import ConfigError
from transformer_jax.models import dit


def scipy_frechet(features1, features2):
  """pytorch-fid's formula: ||mu1 - mu2||^2 + tr(S1 + S2 - 2 sqrtm(S1 S2)), sqrtm by scipy."""
  mu1, mu2 = features1.mean(0), features2.mean(0)
  s1, s2 = (np.atleast_2d(np.cov(f, rowvar=False)) for f in (features1, features2))
  covmean = linalg.sqrtm(s1 @ s2).real
  return np.sum((mu1 - mu2) ** 2) + np.trace(s1) + np.trace(s2) - 2 * np.trace(covmean)


def test_the_frechet_distance_is_scipys_sqrtm_formula_on_random_gaussians():
  rng = np.random.default_rng(0)
  for dim in (1, 8, 32):
    a = rng.normal(size=(400, dim)) @ rng.normal(size=(dim, dim))
    b = rng.normal(size=(300, dim)) @ rng.normal(size=(dim, dim)) + 0.5
    got = image_scores.frechet_distance(*image_scores.feature_statistics(a),
                                        *image_scores.feature_statistics(b))
    np.testing.assert_allclose(got, scipy_frechet(a, b), rtol=1e-7)


def test_the_frechet_distance_of_a_set_with_itself_is_zero_and_of_diagonals_closed_form():
  features = np.random.default_rng(1).normal(size=(200, 16)) * np.arange(1, 17)
  stats = image_scores.feature_statistics(features)
  assert abs(image_scores.frechet_distance(*stats, *stats)) < 1e-9
  # Diagonal covariances: sum (sqrt(a) - sqrt(b))^2 + ||mu1 - mu2||^2.
  a, b = np.array([1.0, 4.0, 9.0]), np.array([4.0, 4.0, 1.0])
  got = image_scores.frechet_distance(np.zeros(3), np.diag(a), np.ones(3), np.diag(b))
  assert got == pytest.approx(np.sum((np.sqrt(a) - np.sqrt(b)) ** 2) + 3)


def test_the_feature_network_is_a_setting():
  assert image_scores.feature_function('numpy:ravel', None) is np.ravel
  with pytest.raises(ConfigError, match='needs eval.sample_classifier'):
    image_scores.feature_function('classifier', None)
  with pytest.raises(ConfigError, match="MODULE:FUNCTION"):
    image_scores.feature_function('no_such_module:inception', None)


def tiny_config(family, steps):
  config = config_lib.base_config(family)
  config.model.update(image_size=8, patch_size=4, num_classes=3, width=16, num_layers=1,
                      num_heads=2, dtype='float32')
  config.data.update(name='synthetic', batch_size=8, eval_batch_size=8, eval_steps=2,
                     augment=False, pp_train='decode|value_range(-1, 1)',
                     pp_eval='decode|value_range(-1, 1)')
  config.training.update(steps=steps, log_every=steps, eval_every=steps, checkpoint_every=steps)
  return config


@pytest.mark.slow  # 12 minutes on 2 heavily shared cores: two runs trained, samples drawn
def test_a_vit_run_scores_the_samples_of_a_dit_run(tmp_path):
  """eval.sample_classifier: the accuracy is the ViT's own argmax on the samples --mode=sample
  writes (the same draws) against their labels; the distance is scipy's formula on the ViT's
  pooled features (`encode`) of the 16 held-out images and of the samples."""
  vit_dir, dit_dir = str(tmp_path / 'vit'), str(tmp_path / 'dit')
  run.run(tiny_config('vit', 30), vit_dir, 'train')
  config = tiny_config('dit', 2)
  config.model.update(num_channels=3)
  config.sample.update(num_samples=6, steps=4, sampler='ddim', guidance_scale=2.0)
  run.run(config, dit_dir, 'train')
  config.eval.update(sample_classifier=vit_dir, bpd_examples=4, bpd_steps=3)
  results = run.run(config, dit_dir, 'eval')
  samples = np.load(f'{run.run(config, dit_dir, "sample")}/samples.npz')
  classifier = image_scores.load_classifier(vit_dir, train.restore_trained)
  model, params = classifier.model, classifier.params
  pixels = lambda images: (images.astype(np.float32) / 127.5 - 1)  # the ViT's pp_eval
  logits = model.apply({'params': params}, pixels(samples['images']))
  assert results['eval_sample_accuracy'] == pytest.approx(
      np.mean(np.argmax(logits, -1) == samples['labels']))
  dit_run = __import__('transformer_jax').train.build_run(config, dit_dir)
  real = dit.to_uint8(dit.held_out(dit_run, 16)[0])
  encode = lambda images: np.asarray(model.apply({'params': params}, pixels(images),
                                                 method='encode'), np.float64)
  assert results['eval_sample_fd'] == pytest.approx(
      scipy_frechet(encode(real), encode(samples['images'])), rel=1e-4)
  assert np.isfinite(results['eval_bpd']) and results['eval_bpd'] > results['eval_bpd_prior']
