"""Image classification batches from a random-access source (a TFDS split, or arrays in memory):
a batch's records are read at once by index, decoded, preprocessed one by one by a spec
(data.preprocess), stacked, and mixed in pairs by mixup or CutMix (data.mixing); grain's threads
make several batches at a time ahead of the device.

Nothing is held but the batches in flight: memory does not grow with the dataset. Example k of
the run (step * batch_size + row) is record `permutation(seed, k // N)[k % N]` of the N training
records, preprocessed with numbers keyed by (seed, k), so a batch is a pure function of (seed,
step) whatever the number of processes, threads or workers that read it.
"""
import dataclasses

import numpy as np

from transformer_jax.data import mixing, preprocess, rng
from transformer_jax.data.settings import DataPart, register_part
from transformer_jax.errors import ConfigError
from transformer_jax.ranges import Range

__all__ = ['ArraySource', 'channel_stats', 'ImageSettings', 'ImageTask', 'Mixing',
           'synthetic_images']


@register_part
@dataclasses.dataclass(frozen=True)
class ImageSettings(DataPart):
  """The keys of config.data that image datasets read."""
  PART = 'image'
  image_dir: str | None = None  # an image folder (data.name='imagefolder'; data.imagefolder)
  image_key: str = 'image'  # the image and ClassLabel features of an image dataset
  label_key: str = 'label'
  # Preprocessing of each training and held-out image, a spec of ops (data.preprocess), e.g.
  # 'decode|inception_crop(224)|flip_lr|randaug(2, 10)|value_range(-1, 1)'. None: the image
  # brought to model.image_size (resize_small + central crop), plus with `augment` a random
  # crop of the image padded by an eighth of its side and a flip, to values in [-1, 1].
  pp_train: str | None = None
  pp_eval: str | None = None
  augment: bool = True
  mixup_alpha: float = 0.0  # mixup (Zhang et al. 2018) of training images in pairs; 0: none
  cutmix_alpha: float = 0.0  # CutMix (Yun et al. 2019); 0: none
  cutmix_prob: float = 0.5  # with both: the share of pairs CutMix mixes

  RANGES = {'mixup_alpha': Range(0), 'cutmix_alpha': Range(0), 'cutmix_prob': Range(0, 1)}

  @property
  def mixing(self) -> 'Mixing':
    return Mixing(self.mixup_alpha, self.cutmix_alpha, self.cutmix_prob)


class ArraySource:
  """Images and labels held in memory, read like a TFDS data source."""

  def __init__(self, images: np.ndarray, labels: np.ndarray):
    self.images, self.labels = images, labels

  def __len__(self) -> int:
    return len(self.labels)

  def __getitem__(self, index: int) -> dict:
    return {'image': self.images[index], 'label': self.labels[index]}

  def __getitems__(self, indices: list[int]) -> list[dict]:
    return [self[index] for index in indices]


@dataclasses.dataclass(frozen=True)
class Mixing:
  """Batch-level mixing of training rows in pairs (data.mixing.mix_pairs); all zero: none."""
  mixup_alpha: float = 0.0
  cutmix_alpha: float = 0.0
  cutmix_prob: float = 0.5

  @property
  def active(self) -> bool:
    return self.mixup_alpha > 0 or self.cutmix_alpha > 0


class ImageTask:
  """{'image': float32 (b, H, W, 3), 'label': int32 (b,)}, and with mixing 'label_mix' (int32)
  and 'mix_weight' (float32, the weight of 'label' in the row's target).

  A spec without a resizing op (CIFAR-10's images all have one size) makes images of the shape
  of its dataset's first record.
  """

  def __init__(self, train, held_out, *, num_classes: int, seed: int,
               pp_train: preprocess.Preprocess, pp_eval: preprocess.Preprocess,
               image_key: str = 'image', label_key: str = 'label', mix: Mixing = Mixing()):
    first = lambda pp, source: pp(source[0][image_key], rng.generator(rng.AUGMENT)).shape
    shapes = {key: pp.output_shape() or first(pp, source)
              for key, pp, source in (('pp_train', pp_train, train),
                                      ('pp_eval', pp_eval, held_out))}
    if len(set(shapes.values())) > 1:
      raise ConfigError(f'data.pp_train and data.pp_eval give images of different shapes '
                        f'({shapes}): end each with resize(S), central_crop(S), random_crop(S) or '
                        'inception_crop(S) of the same S.')
    self.train, self.held_out = train, held_out
    self.seed, self.pp_train, self.pp_eval, self.mix = seed, pp_train, pp_eval, mix
    self.image_key, self.label_key = image_key, label_key
    self.num_eval_examples = len(held_out)
    self.vocab = None
    self.info = {'num_classes': num_classes, 'image_shape': shapes['pp_train'],
                 'num_train_examples': len(train)}

  def check_batch(self, batch_size: int, rows: slice) -> None:
    """Before any reading: a process's share of a mixed batch must be whole pairs."""
    if self.mix.active:
      mixing.pair_range(batch_size, rows)

  def train_batch(self, step: int, batch_size: int, rows: slice) -> dict:
    """This process's rows of training batch `step`: example k = step * batch_size + row."""
    ks = [step * batch_size + row for row in range(batch_size)[rows]]
    records = rng.shuffled(self.seed, step, batch_size, rows, len(self.train))
    batch = self._examples(self.train, records, self.pp_train,
                           [(rng.AUGMENT, self.seed, k) for k in ks])
    return self.mixed(batch, step, batch_size, rows)

  def mixed(self, batch: dict, step: int, batch_size: int, rows: slice) -> dict:
    if not self.mix.active:
      return batch
    return mixing.mix_pairs(batch['image'], batch['label'], rng.generator(rng.MIX, self.seed, step),
                            batch_size=batch_size, rows=rows, mixup_alpha=self.mix.mixup_alpha,
                            cutmix_alpha=self.mix.cutmix_alpha, cutmix_prob=self.mix.cutmix_prob)

  def eval_examples(self, indices: np.ndarray) -> dict:
    indices = [int(index) for index in indices]
    return self._examples(self.held_out, indices, self.pp_eval,
                          [(rng.HELD_OUT, index) for index in indices])

  def _examples(self, source, indices: list[int], pp: preprocess.Preprocess,
                keys: list[tuple[int, ...]]) -> dict:
    """Records `indices` of `source`, read at once, each preprocessed by `pp` with numbers
    keyed by its key, stacked."""
    records = source.__getitems__(indices)  # one read of the batch's records, in parallel
    is_random = pp.is_random
    return _stack([{'image': pp(record[self.image_key],
                                rng.generator(*key) if is_random else None),
                    'label': np.int32(record[self.label_key])}
                   for record, key in zip(records, keys)])


def _stack(examples: list[dict]) -> dict:
  return {key: np.stack([example[key] for example in examples]) for key in examples[0]}


def channel_stats(images: np.ndarray) -> tuple[tuple[float, ...], tuple[float, ...]]:
  """The mean and standard deviation per channel of uint8 images, in pixel units, exact (from
  each channel's 256-bin histogram, in float64) and rounded to float32."""
  values = np.arange(256, dtype=np.float64)
  counts = np.stack([np.bincount(images[..., c].ravel(), minlength=256)
                     for c in range(images.shape[-1])])
  mean = counts @ values / counts.sum(axis=1)
  var = (counts * (values - mean[:, None]) ** 2).sum(axis=1) / counts.sum(axis=1)
  return (tuple(mean.astype(np.float32).tolist()),
          tuple(np.sqrt(var).astype(np.float32).tolist()))


def synthetic_images(num_examples: int, image_size: int, num_classes: int,
                     key: tuple[int, ...], channels: int = 3) -> ArraySource:
  """Learnable images: each class has its own colour (fixed for every seed), plus noise; a
  colour survives cropping and flipping. `channels` other than 3: uint8 arrays of that many
  channels in the same way, stand-ins of latents (read with decode(channels))."""
  colours = rng.generator(rng.TASK).integers(32, 224, size=(num_classes, channels))
  generator = rng.generator(*key)
  labels = generator.integers(0, num_classes, size=num_examples, dtype=np.int32)
  images = np.empty((num_examples, image_size, image_size, channels), np.uint8)
  # In chunks: the float64 noise of a compile stand-in's 10,240 images of 224 pixels is 12 GB.
  rows = max(1, 2**22 // (image_size * image_size * channels))
  for start in range(0, num_examples, rows):
    noise = generator.normal(0.0, 24.0, size=images[start:start + rows].shape)
    colour = colours[labels[start:start + rows]][:, None, None, :]
    images[start:start + rows] = np.clip(np.rint(colour + noise), 0, 255)
  return ArraySource(images, labels)
