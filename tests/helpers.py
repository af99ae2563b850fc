"""Small shared helpers for the tests."""
import contextlib
import functools
import importlib.util
import pathlib
import sys
from unittest import mock

import flax.linen as nn
from PIL import Image
import tensorflow_datasets as tfds
from tensorflow_datasets.core.data_sources import array_record
from tensorflow_datasets.core.features import image_feature
from tensorflow_datasets.testing import mocking

from transformer_jax import config_lib, models, train

ROOT = pathlib.Path(__file__).resolve().parent.parent
CONFIG_FILES = sorted((ROOT / 'configs').glob('*.py'))


@contextlib.contextmanager
def mock_tfds(num_examples: int, equal_lengths: bool = False):
  """tfds.testing.mock_data: every split of every dataset holds `num_examples` random records of
  the dataset's own features. TFDS 4.9's mock binds a data source's __getitems__ without its
  self, so batches are read record by record under it. An image read undecoded (as
  data.sources reads PNG and JPEG images) is a record the mock encodes, with TensorFlow, which
  is not installed: Pillow encodes it instead, as TFDS encodes a PIL image. `equal_lengths`:
  every dimension of unknown size is 10 (images 10x10), without which the mock cannot make a
  Sequence of several features (coco_captions', clevr's), drawing a length for each."""
  one_by_one = lambda source, keys: [source[key] for key in keys]
  with_pillow = lambda encoder, array: encoder._encode_pil_image(
      Image.fromarray(array[..., 0] if array.shape[-1] == 1 else array))
  generator = mocking.RandomFakeGenerator
  init = functools.partialmethod(generator.__init__, constant_dynamic_shape=equal_lengths)
  with tfds.testing.mock_data(num_examples=num_examples), mock.patch.object(
      array_record.ArrayRecordDataSource, '__getitems__', one_by_one), mock.patch.object(
          image_feature._ImageEncoder, '_encode_image', with_pillow), mock.patch.object(
              generator, '__init__', init):
    yield


def load_config(path, arg=None):
  return config_lib.from_file(path, arg)


def tiny(family, **overrides):
  """A small model config of `family` for fast tests."""
  cfg = dict(family=family, width=32, num_layers=2, num_heads=4)
  cfg.update(dict(image_size=8, patch_size=4, num_classes=5) if family == 'vit' else
             dict(vocab_size=40, max_len=16))
  cfg.update(overrides)
  return models.model_config(cfg).on('cpu')  # the platform the tests run on


def model_of(config):
  """The model settings a run of `config` resolves on this machine (the tests' CPU): a size the
  data states (data.vocab_size) filled in, the dtype decided."""
  return train.resolve(config, 'cpu').model


def init(cfg, rng, *inputs):
  variables = models.build(cfg).init(rng, *(inputs or models.example_inputs(cfg, 2)))
  return nn.meta.unbox(variables['params'])


@functools.cache
def load_experiment(name):
  """The module of experiments/NAME.py, its folder on the import path as when run as a script
  (the experiments share modules such as step_timing); loaded once per session, as a second
  load of a script would define its absl flags again, which absl refuses."""
  if str(ROOT / 'experiments') not in sys.path:
    sys.path.insert(0, str(ROOT / 'experiments'))
  spec = importlib.util.spec_from_file_location(name, ROOT / 'experiments' / f'{name}.py')
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module
