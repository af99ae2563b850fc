"""Scores of generated images: the accuracy of a classifier trained by this codebase on images
conditioned on each class, and the Fréchet distance between real and generated images in a
feature space (Heusel et al. 2017).

FID proper is this distance in the pool features of the Inception-v3 network that Heusel et al.
released; those weights are not part of this codebase (nor downloaded by it). The features are
a setting (FEATURES_HELP): the classifier's pre-logits (its pooled representation, `encode`), or
a function of your own, such as one that runs Inception-v3 from weights you have, which gives
the standard FID:

    # my_fid.py, on the PYTHONPATH: uint8 images (N, H, W, 3) -> float features (N, 2048)
    def inception_pool3(images): ...

    --config.eval.fid_features=my_fid:inception_pool3
"""
import dataclasses
import functools
import importlib
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax import config_lib
from transformer_jax.data import preprocess
from transformer_jax.errors import ConfigError, UserError
from transformer_jax.models import dit

__all__ = ['Classifier', 'evaluate_samples', 'FEATURES_HELP', 'feature_function',
           'feature_statistics', 'frechet_distance', 'load_classifier', 'score_samples']

FEATURES_HELP = ("'classifier' (the pre-logits of eval.sample_classifier) or 'MODULE:FUNCTION', a "
                 'function of uint8 images (N, H, W, 3) -> features (N, D) (for the standard FID: '
                 'Inception-v3 pool features from weights you have)')


def feature_statistics(features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """The mean (D,) and covariance (D, D) of features (N, D), in float64 (the covariance with
  N - 1 in the denominator, as numpy.cov and pytorch-fid)."""
  features = np.asarray(features, np.float64)
  if features.ndim != 2 or len(features) < 2:
    raise ValueError(f'feature statistics need (N >= 2, D) features, got {features.shape}')
  return features.mean(axis=0), np.atleast_2d(np.cov(features, rowvar=False))


def _sqrt_psd(matrix: np.ndarray) -> np.ndarray:
  values, vectors = np.linalg.eigh((matrix + matrix.T) / 2)
  return (vectors * np.sqrt(np.clip(values, 0, None))) @ vectors.T


def frechet_distance(mean1, cov1, mean2, cov2) -> float:
  """||mean1 - mean2||^2 + tr(cov1) + tr(cov2) - 2 tr((cov1 cov2)^(1/2)): the squared 2-Wasserstein
  distance between the two Gaussians. tr((cov1 cov2)^(1/2)) is the sum of the square roots of
  the eigenvalues of cov1^(1/2) cov2 cov1^(1/2) (the same eigenvalues, of a symmetric positive
  semi-definite matrix): no complex parts to drop, unlike scipy.linalg.sqrtm of cov1 cov2."""
  mean1, mean2 = np.asarray(mean1, np.float64), np.asarray(mean2, np.float64)
  cov1, cov2 = np.asarray(cov1, np.float64), np.asarray(cov2, np.float64)
  root1 = _sqrt_psd(cov1)
  values = np.linalg.eigvalsh(root1 @ cov2 @ root1)
  trace_sqrt = np.sqrt(np.clip(values, 0, None)).sum()
  return float(np.sum((mean1 - mean2) ** 2) + np.trace(cov1) + np.trace(cov2) - 2 * trace_sqrt)


@dataclasses.dataclass(frozen=True)
class Classifier:
  """An image classifier of a run of this codebase: its model (with `encode`, the pooled
  representation, and `head`), parameters and eval preprocessing (data.pp_eval)."""
  model: object
  params: dict
  preprocess: preprocess.Preprocess
  image_size: int
  num_classes: int
  workdir: str

  @functools.cached_property
  def _apply(self):
    def features_and_logits(module, images):
      features = module.encode(images)
      return features.astype(jnp.float32), module.head(features).astype(jnp.float32)
    return jax.jit(lambda params, images: self.model.apply(
        {'params': params}, images, method=features_and_logits))

  def __call__(self, images: np.ndarray, batch_size: int = 500) -> tuple[np.ndarray, np.ndarray]:
    """uint8 images (N, H, W, 3) -> (pre-logit features (N, D), predicted classes (N,)), in
    batches of batch_size, each image preprocessed by the classifier's data.pp_eval."""
    features, predictions = [], []
    for start in range(0, len(images), batch_size):
      batch = np.stack([self.preprocess(image, None) for image in images[start:start + batch_size]])
      feats, logits = jax.device_get(self._apply(self.params, jnp.asarray(batch)))
      features.append(feats)
      predictions.append(np.argmax(logits, axis=-1))
    return np.concatenate(features), np.concatenate(predictions)


def load_classifier(workdir: str, restore) -> Classifier:
  """The classifier that a run of this codebase trained in `workdir` (its saved config and
  latest checkpoint; a ViT run, or any family whose model has `encode` and a class head);
  restore(config, workdir) -> (run, params, step) is train.restore_trained (which this module,
  below the training code, cannot import)."""
  config = config_lib.run_config(workdir)
  if config is None:
    raise UserError(f'eval.sample_classifier={workdir!r} holds no run (no config.json): give the '
                    'workdir of a classifier trained by launch.py (for example a '
                    'configs/vit_reference.py run on the real training images).')
  run, params, _ = restore(config, workdir)
  if not hasattr(run.model, 'encode') or not run.model_config.num_classes:
    raise ConfigError(f'eval.sample_classifier={workdir!r} is a {run.family.name!r} run, not an '
                      'image classifier: give the workdir of a ViT run.')
  return Classifier(run.model, params, run.data.task.pp_eval,
                    run.model_config.image_size, run.model_config.num_classes, workdir)


def feature_function(name: str, classifier: Classifier | None
                     ) -> Callable[[np.ndarray], np.ndarray]:
  """The features of eval.fid_features (FEATURES_HELP): uint8 images (N, H, W, 3) -> (N, D)."""
  if name == 'classifier':
    if classifier is None:
      raise ConfigError("eval.fid_features='classifier' needs eval.sample_classifier=WORKDIR of a "
                        "classifier run, or set eval.fid_features='MODULE:FUNCTION'.")
    return lambda images: classifier(images)[0]
  module, _, function = name.partition(':')
  try:
    return getattr(importlib.import_module(module), function)
  except (ImportError, AttributeError, ValueError) as error:
    raise ConfigError(f'eval.fid_features={name!r} ({error}): give {FEATURES_HELP}.') from None


def score_samples(images: np.ndarray, labels: np.ndarray, real: np.ndarray, features,
                  classifier=None) -> dict:
  """Scores of uint8 samples (N, H, W, 3) conditioned on labels (N,) against uint8 real images:
  'sample_fd' the Fréchet distance of their `features` (uint8 images -> (N, D)); with a
  classifier (Classifier) 'sample_accuracy', the share classified as the class
  each was conditioned on, and 'per_class' {class: accuracy}."""
  scores = {'sample_fd': frechet_distance(
      *feature_statistics(features(real)),
      *feature_statistics(features(images)))}
  if classifier is not None:
    correct = classifier(images)[1] == labels
    scores['sample_accuracy'] = float(correct.mean())
    scores['per_class'] = {int(c): float(correct[labels == c].mean()) for c in np.unique(labels)}
  return scores


def draw_and_score(run, params, wanted: dit.SampleSettings, real: np.ndarray, features,
                   classifier=None) -> tuple[np.ndarray, np.ndarray, dict]:
  """(uint8 samples, their labels, scores) of a DiT run drawn as `wanted` (its classes cycled):
  score_samples' scores against `real`, and 'sample_seconds', the drawing's wall time."""
  labels = wanted.labels(run.model_config.num_classes)
  start = time.perf_counter()
  images = dit.draw(run.model, params, labels, wanted, run.data.eval_batch_size)
  seconds = time.perf_counter() - start
  return images, labels, {'sample_seconds': seconds,
                          **score_samples(images, labels, real, features, classifier)}


def _check_classifier(classifier: Classifier, cfg) -> None:
  if (classifier.image_size, classifier.num_classes) != (cfg.image_size, cfg.num_classes):
    raise ConfigError(f'eval.sample_classifier={classifier.workdir!r} classifies '
                      f'{classifier.image_size}x{classifier.image_size} images into '
                      f'{classifier.num_classes} classes, the DiT makes {cfg.image_size}x'
                      f'{cfg.image_size} images of {cfg.num_classes}: give a classifier trained '
                      'on the DiT\'s dataset.')


def evaluate_samples(run, params, restore) -> dict[str, float]:
  """eval_sample_fd and, with eval.sample_classifier, eval_sample_accuracy of a DiT run's
  samples drawn by config.sample (dit.EvalSettings); restore as load_classifier's."""
  cfg, wanted = run.model_config, run.settings.eval
  classifier = None
  if wanted.sample_classifier:
    classifier = load_classifier(wanted.sample_classifier, restore)
    _check_classifier(classifier, cfg)
  count = wanted.fid_examples or run.data.info['num_eval_examples']
  real = dit.to_uint8(dit.held_out(run, count)[0])
  _, _, scores = draw_and_score(run, params, run.settings.sample, real,
                                feature_function(wanted.fid_features, classifier), classifier)
  return {f'eval_{name}': value for name, value in scores.items()
          if name not in ('per_class', 'sample_seconds')}
