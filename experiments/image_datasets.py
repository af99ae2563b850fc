"""Synthetic TFDS image-classification datasets of any size, prepared in array_record with
Pillow only, for the input benchmarks: `synthetic_images/png32_N` (N 32x32 PNG images of ten
colour classes, CIFAR-10's shape and encoding) and `synthetic_images/jpeg_N` (N JPEG photos'
stand-ins of 375x500, ImageNet's median size, smooth gradients plus noise).

Once prepared, TFDS reads them back by name from the data dir without this module:
--config.data.name=synthetic_images/png32_50000 --config.data.tfds_data_dir=DIR.
"""
import numpy as np
from PIL import Image
import tensorflow_datasets as tfds
from tensorflow_datasets.core import shuffle as tfds_shuffle

CLASSES = 10
SIZES = (1_000, 50_000, 500_000)
CONFIGS = [tfds.core.BuilderConfig(name=f'png32_{n}') for n in SIZES]
CONFIGS += [tfds.core.BuilderConfig(name=f'jpeg_{n}') for n in (1_000,)]


class SyntheticImages(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Images whose class is their colour; train holds N images, test 1,000."""
  VERSION = tfds.core.Version('1.0.0')
  BUILDER_CONFIGS = CONFIGS

  def _info(self):
    png = self.builder_config.name.startswith('png32')
    image = (tfds.features.Image(shape=(32, 32, 3)) if png else
             tfds.features.Image(shape=(None, None, 3), encoding_format='jpeg'))
    return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
        'image': image, 'label': tfds.features.ClassLabel(num_classes=CLASSES)}))

  def _split_generators(self, dl_manager):
    del dl_manager
    count = int(self.builder_config.name.rpartition('_')[2])
    return {'train': self._generate_examples(count, 0), 'test': self._generate_examples(1000, 1)}

  def _generate_examples(self, count: int, seed: int):
    png = self.builder_config.name.startswith('png32')
    colours = np.random.default_rng(123).integers(32, 224, size=(CLASSES, 3))
    noise = np.random.default_rng(seed)
    shape = (32, 32) if png else (375, 500)
    for index in range(count):
      label = int(noise.integers(CLASSES))
      yield index, {'image': stand_in(colours[label], noise, shape), 'label': label}


def stand_in(colour: np.ndarray, noise: np.random.Generator, shape=(375, 500)) -> Image.Image:
  """A photo's stand-in of `shape` (height, width): the RGB `colour`, a horizontal ramp of
  +-40 and Gaussian noise of 12 drawn from `noise`."""
  ramp = np.linspace(-40, 40, shape[1])[None, :, None]
  pixels = colour + ramp + noise.normal(0, 12, size=(*shape, 3))
  return Image.fromarray(np.clip(np.rint(pixels), 0, 255).astype(np.uint8))


def prepare(config_name: str, data_dir: str) -> str:
  """Prepares synthetic_images/CONFIG in data_dir (once); returns the name to train on."""
  builder = SyntheticImages(config=config_name, data_dir=data_dir, file_format='array_record')
  if not builder.is_prepared():
    tfds.disable_progress_bar()
    # Past 1 GB TFDS's shuffler spills to disk through TensorFlow's file API; without
    # TensorFlow, hold the serialized examples in memory instead (the writing process only).
    tfds_shuffle.MAX_MEM_BUFFER_SIZE = 16 << 30
    builder.download_and_prepare()
  return f'synthetic_images/{config_name}'
