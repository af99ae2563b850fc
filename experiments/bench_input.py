"""The image input pipeline's speed beside the train step's: whether augmentation keeps up.

  python experiments/bench_input.py --tfds_data_dir DIR [--manual_dir DIR_WITH_CIFAR10]
Prints, on this machine:
- images/s of the input pipeline alone (grain's threads, no model): CIFAR-10 with the main job's
  strong recipe (crop, flip, RandAugment(2, 9), mixup/CutMix) and with its basic recipe (crop,
  flip), and 224x224 crops of JPEG photos (decode + inception crop + flip, the ImageNet recipe
  without RandAugment, on 375x500 synthetic JPEGs: experiments/image_datasets.py);
- the reference ViT's train step (configs/vit_reference.py, batch 128) in images/s, fed from a
  few batches already made (no input work), and fed from each CIFAR-10 pipeline as the training
  loop feeds it: the difference is what the input pipeline costs the step.
CIFAR-10 is read from --tfds_data_dir (prepared there, or prepared from --manual_dir). A
benchmark, not a test: it prints figures, each with the 1-minute load average beside it.
"""
import os
import pathlib
import statistics
import time

from absl import app, flags
import jax

import image_datasets
import step_timing
from transformer_jax import config_lib, data
from transformer_jax.train import cpu_runtime

ROOT = pathlib.Path(__file__).resolve().parent.parent
_DATA_DIR = flags.DEFINE_string('tfds_data_dir', None, 'TFDS data dir of CIFAR-10 and of the '
                                'synthetic JPEGs.', required=True)
_MANUAL_DIR = flags.DEFINE_string('manual_dir', None, 'CIFAR-10 archives, where it is not yet '
                                  'prepared in --tfds_data_dir.')
_BATCHES = flags.DEFINE_integer('batches', 30, 'Timed batches or steps per measurement.')
_REPEATS = flags.DEFINE_integer('repeats', 2, 'Interleaved measurements of each step.')


def cifar_config(recipe: str):
  config = config_lib.from_file(ROOT / 'configs' / 'vit_reference.py', f'recipe={recipe}')
  config.data.update(tfds_data_dir=_DATA_DIR.value, manual_dir=_MANUAL_DIR.value,
                     download=False)
  return config


def jpeg_config():
  config = config_lib.from_file(ROOT / 'configs' / 'vit_i1k.py')
  name = image_datasets.prepare('jpeg_1000', _DATA_DIR.value)
  config.data.update(name=name, tfds_data_dir=_DATA_DIR.value, batch_size=128,
                     train_split='train', eval_split='test', num_threads=2, prefetch_buffer_size=4,
                     pp_train='decode|inception_crop(224)|flip_lr|value_range(-1, 1)')
  config.model.num_classes = image_datasets.CLASSES
  return config


def pipeline_rate(config) -> float:
  """Images per second of the training batches alone, after three warm-up batches."""
  ds = data.make_data(config.data, 'image', seed=0, image_size=config.model.image_size)
  batches = ds.train_iterator(0)
  for _ in range(3):
    next(batches)
  start = time.perf_counter()
  for _ in range(_BATCHES.value):
    next(batches)
  return _BATCHES.value * config.data.batch_size / (time.perf_counter() - start)


def step_rate(config, from_pipeline: bool) -> float:
  """Images per second of the train step (median step), fed from a few batches made ahead or
  from the pipeline, one batch per step as the training loop feeds it."""
  times = step_timing.step_seconds(config, _BATCHES.value, warmup=3, from_pipeline=from_pipeline)
  return config.data.batch_size / statistics.median(times)


def report(name: str, images_per_second: float):
  print(f'  {name:<44} {images_per_second:8,.0f} images/s  (load average '
        f'{os.getloadavg()[0]:.2f})', flush=True)


def main(argv):
  del argv
  cpu_runtime.configure()  # as launch.py runs a step
  print(f'jax {jax.__version__}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}')
  print('Input pipeline alone (training batches of 128):')
  for recipe in ('strong', 'basic'):
    report(f'CIFAR-10, {recipe} recipe', pipeline_rate(cifar_config(recipe)))
  report('375x500 JPEG -> decode, inception crop 224, flip', pipeline_rate(jpeg_config()))
  print('The reference ViT\'s train step (batch 128):')
  for _ in range(_REPEATS.value):
    report('batches made ahead (no input work)', step_rate(cifar_config('basic'), False))
    for recipe in ('basic', 'strong'):
      report(f'fed by the CIFAR-10 pipeline, {recipe} recipe',
             step_rate(cifar_config(recipe), True))


if __name__ == '__main__':
  app.run(main)
