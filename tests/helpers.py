"""Small shared helpers for the tests."""
import importlib.util
import pathlib

import flax.linen as nn
import jax

from transformer_jax import models

ROOT = pathlib.Path(__file__).resolve().parent.parent
CONFIG_FILES = sorted((ROOT / 'configs').glob('*.py'))


def load_config(path, arg=None):
  """get_config(arg) of a config file, as config_flags would load it."""
  spec = importlib.util.spec_from_file_location(pathlib.Path(path).stem, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg)


def tiny(family, **overrides):
  """A small model config of `family` for fast tests."""
  cfg = dict(family=family, width=32, num_layers=2, num_heads=4, vocab_size=40, max_len=16,
             image_size=8, patch_size=4, num_classes=5)
  cfg.update(overrides)
  return models.model_config(cfg)


def init(cfg, rng, *inputs):
  variables = models.build(cfg).init(rng, *(inputs or models.example_inputs(cfg, 2)))
  return nn.meta.unbox(variables['params'])
