"""Small shared helpers for the tests."""
import pathlib

import flax.linen as nn

from transformer_jax import config_lib, models

ROOT = pathlib.Path(__file__).resolve().parent.parent
CONFIG_FILES = sorted((ROOT / 'configs').glob('*.py'))


def load_config(path, arg=None):
  return config_lib.from_file(path, arg)


def tiny(family, **overrides):
  """A small model config of `family` for fast tests."""
  cfg = dict(family=family, width=32, num_layers=2, num_heads=4)
  cfg.update(dict(image_size=8, patch_size=4, num_classes=5) if family == 'vit' else
             dict(vocab_size=40, max_len=16))
  cfg.update(overrides)
  return models.model_config(cfg)


def init(cfg, rng, *inputs):
  variables = models.build(cfg).init(rng, *(inputs or models.example_inputs(cfg, 2)))
  return nn.meta.unbox(variables['params'])
