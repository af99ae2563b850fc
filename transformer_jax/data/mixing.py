"""Batch-level mixup (Zhang et al. 2018) and CutMix (Yun et al. 2019) in fixed pairs of rows.

Rows (2i, 2i + 1) of the global batch mix with each other (timm's 'pair' mode), and the random
numbers are drawn for every pair of the global batch before a process keeps its own: a process
whose rows start and end at even rows holds whole pairs, and a row is mixed alike whatever the
number of processes.
"""
import numpy as np

from transformer_jax.errors import ConfigError

__all__ = ['check_mixing', 'mix_pairs', 'pair_range']


def check_mixing(mixup_alpha: float, cutmix_alpha: float, cutmix_prob: float):
  """ConfigError unless both alphas are >= 0 (0 turns that mix off) and 0 <= cutmix_prob <= 1."""
  for key, alpha in (('data.mixup_alpha', mixup_alpha), ('data.cutmix_alpha', cutmix_alpha)):
    if not alpha >= 0:
      raise ConfigError(f'{key}={alpha!r}: the Beta(alpha, alpha) of the mixing weight needs '
                        f'alpha > 0; set 0 to turn it off')
  if not 0 <= cutmix_prob <= 1:
    raise ConfigError(f'data.cutmix_prob={cutmix_prob!r}: the probability of CutMix rather '
                      f'than mixup for a pair must be in [0, 1]')


def pair_range(batch_size: int, rows: slice) -> slice:
  """The global pairs a process holds: rows // 2; ConfigError unless its share is whole pairs."""
  start = 0 if rows.start is None else rows.start
  stop = batch_size if rows.stop is None else rows.stop
  if batch_size % 2 or start % 2 or stop % 2:
    raise ConfigError(f'mixup/CutMix pairs rows (2i, 2i+1) of the global batch, so the batch '
                      f'size and each process\'s share of it must be even: rows {start}:{stop} '
                      f'of {batch_size}')
  return slice(start // 2, stop // 2)


def _boxes(lam: np.ndarray, centres: np.ndarray, height: int, width: int) -> np.ndarray:
  """(top, bottom, left, right) per pair: a box of area fraction 1 - lam about each centre
  (fractions of the sides), clipped to the image."""
  cut = np.sqrt(1 - lam)
  sides = np.stack([np.rint(height * cut), np.rint(width * cut)], axis=-1).astype(int)
  starts = np.floor(centres * (height, width)).astype(int) - sides // 2
  limits = np.array([height, width])
  starts, ends = np.clip(starts, 0, limits), np.clip(starts + sides, 0, limits)
  return np.stack([starts[:, 0], ends[:, 0], starts[:, 1], ends[:, 1]], axis=-1)


def _draw(generator: np.random.Generator, num_pairs: int, height: int, width: int,
          mixup_alpha: float, cutmix_alpha: float,
          cutmix_prob: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(whether CutMix, lam, CutMix box) for every pair of the global batch, drawn in a fixed
  order; the boxes are empty where there is no CutMix."""
  choice = generator.random(num_pairs)
  cut_lam = generator.beta(cutmix_alpha, cutmix_alpha, num_pairs) if cutmix_alpha > 0 else None
  mix_lam = generator.beta(mixup_alpha, mixup_alpha, num_pairs) if mixup_alpha > 0 else None
  centres = generator.random((num_pairs, 2))
  if cut_lam is None:
    cutmix, cut_lam = np.zeros(num_pairs, bool), np.ones(num_pairs)
  else:
    cutmix = choice < cutmix_prob if mix_lam is not None else np.ones(num_pairs, bool)
  boxes = _boxes(cut_lam, centres, height, width) * cutmix[:, None]
  top, bottom, left, right = boxes.T
  box_lam = 1 - (bottom - top) * (right - left) / (height * width)
  return cutmix, np.where(cutmix, box_lam, 1.0 if mix_lam is None else mix_lam), boxes


def mix_pairs(images: np.ndarray, labels: np.ndarray, generator: np.random.Generator, *,
              batch_size: int, rows: slice, mixup_alpha: float, cutmix_alpha: float,
              cutmix_prob: float = 0.5) -> dict:
  """Mixes each pair (2i, 2i + 1) of this process's `rows` of a global batch of `batch_size`.

  A pair takes CutMix with probability cutmix_prob when both alphas are > 0 (always when only
  cutmix_alpha is, never when only mixup_alpha is): a box of area 1 - lam, lam ~ Beta(cutmix_alpha,
  cutmix_alpha), at a uniform centre and clipped to the image, swapped between the two rows, lam
  recomputed from the clipped box. Otherwise mixup: lam ~ Beta(mixup_alpha, mixup_alpha), each row
  lam x its own image + (1 - lam) x its partner's. Returns {'image': float32, 'label': own labels,
  'label_mix': the partner's labels (int32), 'mix_weight': lam, the weight of 'label' (float32)}.
  """
  check_mixing(mixup_alpha, cutmix_alpha, cutmix_prob)
  pairs = pair_range(batch_size, rows)
  b, height, width, _ = images.shape
  if b != 2 * (pairs.stop - pairs.start) or len(labels) != b:
    raise ValueError(f'rows {rows} of {batch_size} are {2 * (pairs.stop - pairs.start)} rows, '
                     f'got {b} images and {len(labels)} labels')
  draws = _draw(generator, batch_size // 2, height, width, mixup_alpha, cutmix_alpha,
                cutmix_prob)
  cutmix, lam, boxes = (np.repeat(x[pairs], 2, axis=0) for x in draws)
  lam = lam.astype(np.float32)
  partner = np.arange(b) ^ 1
  labels = np.asarray(labels, np.int32)
  return {'image': _mixed_images(images, cutmix, lam, boxes), 'label': labels,
          'label_mix': labels[partner], 'mix_weight': lam}


def _mixed_images(images: np.ndarray, cutmix: np.ndarray, lam: np.ndarray,
                  boxes: np.ndarray) -> np.ndarray:
  """float32 images, each row (CutMix) its own with its box from its partner or (mixup) lam x
  its own + (1 - lam) x its partner's, in float32: one copy of the batch, then only the rows and
  boxes that change."""
  out = images.astype(np.float32)
  rows = np.flatnonzero(~cutmix)  # whole pairs: a row's partner is among them
  own = lam[rows, None, None, None]
  mixed = out[rows]
  mixed *= own
  mixed += (1 - own) * out[rows ^ 1]
  out[rows] = mixed
  for row in np.flatnonzero(cutmix).tolist():
    top, bottom, left, right = boxes[row].tolist()
    out[row, top:bottom, left:right] = images[row ^ 1, top:bottom, left:right]
  return out
