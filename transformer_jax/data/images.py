"""Image classification batches from a random-access source (a TFDS split, or arrays in memory),
read record by record: decoded and preprocessed one by one by a preprocessing spec
(data.preprocess), stacked, and mixed in pairs by mixup or CutMix (data.mixing).

Nothing is held but the records in flight: memory does not grow with the dataset. Example k of
the run (step * batch_size + row) is record `permutation(seed, k // N)[k % N]` of the N training
records, preprocessed with numbers keyed by (seed, k), so a batch is a pure function of (seed,
step) whatever the number of processes, threads or workers that read it.
"""
import dataclasses
import functools
import sys

import grain
import numpy as np

from transformer_jax.data import mixing, preprocess, rng
from transformer_jax.errors import ConfigError

__all__ = ['ArraySource', 'channel_stats', 'ImageTask', 'Mixing', 'synthetic_images']


class ArraySource:
  """Images and labels held in memory, read like a TFDS data source."""

  def __init__(self, images: np.ndarray, labels: np.ndarray):
    self.images, self.labels = images, labels

  def __len__(self) -> int:
    return len(self.labels)

  def __getitem__(self, index: int) -> dict:
    return {'image': self.images[index], 'label': self.labels[index]}


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
  and 'mix_weight' (float32, the weight of 'label' in the row's target)."""

  # A spec without a resizing op (CIFAR-10's images all have one size) makes images of the
  # shape of its dataset's first record.
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

  def train_example(self, k: int) -> dict:
    """Example k of the run, preprocessed with numbers keyed by (seed, k)."""
    epoch, position = divmod(k, len(self.train))
    record = self.train[int(_permutation(self.seed, epoch, len(self.train))[position])]
    generator = rng.generator(rng.AUGMENT, self.seed, k) if self.pp_train.is_random else None
    return {'image': self.pp_train(record[self.image_key], generator),
            'label': np.int32(record[self.label_key])}

  def mixed(self, batch: dict, step: int, batch_size: int, rows: slice) -> dict:
    if not self.mix.active:
      return batch
    return mixing.mix_pairs(batch['image'], batch['label'], rng.generator(rng.MIX, self.seed, step),
                            batch_size=batch_size, rows=rows, mixup_alpha=self.mix.mixup_alpha,
                            cutmix_alpha=self.mix.cutmix_alpha, cutmix_prob=self.mix.cutmix_prob)

  def train_batch(self, step: int, batch_size: int, rows: slice) -> dict:
    examples = [self.train_example(step * batch_size + row)
                for row in range(batch_size)[rows]]
    return self.mixed(_stack(examples), step, batch_size, rows)

  def train_dataset(self, start_step: int, batch_size: int, rows: slice,
                    read_options: grain.ReadOptions) -> grain.IterDataset:
    """train_batch of start_step, start_step + 1, ...: the examples read, decoded and
    preprocessed by grain's threads, `read_options.prefetch_buffer_size` batches ahead."""
    share = len(range(batch_size)[rows])
    locate = functools.partial(_example_of, start_step=start_step, batch_size=batch_size,
                               first_row=rows.start or 0, share=share)
    examples = grain.MapDataset.range(0, sys.maxsize).map(locate).map(self._stepped_example)
    return (examples.to_iter_dataset(_per_example(read_options, share)).batch(share)
            .map(functools.partial(self._mixed_batch, batch_size=batch_size, rows=rows)))

  def _stepped_example(self, step_and_k: tuple[int, int]) -> dict:
    step, k = step_and_k
    return {**self.train_example(k), 'step': step}  # the batch's mix is keyed by its step

  def _mixed_batch(self, batch: dict, batch_size: int, rows: slice) -> dict:
    step = int(batch.pop('step')[0])
    return self.mixed(batch, step, batch_size, rows)

  def eval_examples(self, indices: np.ndarray) -> dict:
    return _stack([self.eval_example(int(index)) for index in indices])

  def eval_dataset(self, indices: np.ndarray, share: int,
                   read_options: grain.ReadOptions) -> grain.IterDataset:
    """The held-out examples `indices` in batches of `share`, preprocessed by grain's threads."""
    examples = grain.MapDataset.source(indices.tolist()).map(self.eval_example)
    return examples.to_iter_dataset(_per_example(read_options, share)).batch(share)

  def eval_example(self, index: int) -> dict:
    record = self.held_out[index]
    generator = rng.generator(rng.HELD_OUT, index) if self.pp_eval.is_random else None
    return {'image': self.pp_eval(record[self.image_key], generator),
            'label': np.int32(record[self.label_key])}


def _per_example(read_options: grain.ReadOptions, share: int) -> grain.ReadOptions:
  """Read options whose buffer holds prefetch_buffer_size batches of `share` examples."""
  return dataclasses.replace(read_options,
                             prefetch_buffer_size=read_options.prefetch_buffer_size * share)


def _example_of(index: int, *, start_step: int, batch_size: int, first_row: int,
                share: int) -> tuple[int, int]:
  """(step, k) of this process's `index`-th example from start_step: k = step * batch_size + row."""
  step, row = divmod(index, share)
  return start_step + step, (start_step + step) * batch_size + first_row + row


def _stack(examples: list[dict]) -> dict:
  return {key: np.stack([example[key] for example in examples]) for key in examples[0]}


@functools.lru_cache(maxsize=4)
def _permutation(seed: int, epoch: int, size: int) -> np.ndarray:
  return rng.generator(rng.SHUFFLE, seed, epoch).permutation(size)


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
                     key: tuple[int, ...]) -> ArraySource:
  """Learnable images: each class has its own colour (fixed for every seed), plus noise; a
  colour survives cropping and flipping."""
  colours = rng.generator(rng.TASK).integers(32, 224, size=(num_classes, 3))
  generator = rng.generator(*key)
  labels = generator.integers(0, num_classes, size=num_examples, dtype=np.int32)
  noise = generator.normal(0.0, 24.0, size=(num_examples, image_size, image_size, 3))
  images = np.clip(np.rint(colours[labels][:, None, None, :] + noise), 0, 255).astype(np.uint8)
  return ArraySource(images, labels)
