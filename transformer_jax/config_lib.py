"""Helpers for the config files under configs/: the base config and argument strings."""
import dataclasses
import types
import typing

import ml_collections
from ml_collections import config_dict

from transformer_jax.model_config import ModelConfig


def model_defaults() -> ml_collections.ConfigDict:
  """Every ModelConfig field with its default, so a typo in --config.model.x fails."""
  hints = typing.get_type_hints(ModelConfig)
  model = ml_collections.ConfigDict()
  for field in dataclasses.fields(ModelConfig):
    if field.default is None:  # an `X | None` field: a typed placeholder that flags can set
      (kind,) = [t for t in typing.get_args(hints[field.name]) if t is not types.NoneType]
      model[field.name] = config_dict.placeholder(kind)
    else:
      model[field.name] = field.default
  return model


def parse_arg(arg: str | None, **defaults) -> ml_collections.ConfigDict:
  """'variant=S/4,smoke' -> {'variant': 'S/4', 'smoke': True}, typed like `defaults`.

  Unknown names fail, naming the known ones.
  """
  values = ml_collections.ConfigDict(defaults)
  for item in filter(None, (arg or '').split(',')):
    key, _, value = item.partition('=')
    if key not in defaults:
      raise ValueError(f'Unknown config argument {key!r}; known: {sorted(defaults)}.')
    default = defaults[key]
    if isinstance(default, bool):
      values[key] = value.lower() in ('', '1', 'true', 'yes')
    else:
      values[key] = type(default)(value) if default is not None else value
  return values


# Block styles of the named families; a config applies one, then sets the sizes.
STYLES = {
    'gpt2': dict(norm='layernorm', norm_eps=1e-5, mlp='gelu_tanh', positions='learned',
                 use_bias=True, tie_embeddings=True, norm_position='pre'),
    'llama': dict(norm='rmsnorm', norm_eps=1e-6, mlp='swiglu', positions='rope', use_bias=False,
                  tie_embeddings=False, norm_position='pre'),
    'bert': dict(norm='layernorm', norm_eps=1e-12, mlp='gelu', positions='learned', use_bias=True,
                 tie_embeddings=True, norm_position='post', embed_norm=True, type_vocab_size=2),
    'vit': dict(norm='layernorm', norm_eps=1e-6, mlp='gelu', positions='learned', use_bias=True,
                norm_position='pre', pool='cls'),
    # Vaswani et al. 2017: post-LN, ReLU, sinusoidal positions, one shared and tied embedding.
    'transformer': dict(norm='layernorm', norm_eps=1e-6, mlp='relu', positions='sinusoidal',
                        use_bias=True, tie_embeddings=True, norm_position='post'),
}

# ViT sizes by name: (width, depth, heads).
VIT_SIZES = {'XS': (128, 6, 4), 'Ti': (192, 12, 3), 'S': (384, 12, 6), 'M': (512, 12, 8),
             'B': (768, 12, 12), 'L': (1024, 24, 16)}


def vit_variant(variant: str) -> dict:
  """'S/4' -> width, depth, heads of ViT-S and patch size 4."""
  name, _, patch = variant.partition('/')
  if name not in VIT_SIZES or not patch.isdigit():
    raise ValueError(f'ViT variant {variant!r} is not NAME/PATCH with NAME in '
                     f'{list(VIT_SIZES)} (for example "S/4").')
  width, depth, heads = VIT_SIZES[name]
  return dict(width=width, num_layers=depth, num_heads=heads, patch_size=int(patch))


def base_config() -> ml_collections.ConfigDict:
  """The sections every config has; each config file fills in its model and run."""
  config = ml_collections.ConfigDict()
  config.seed = 0
  config.model = model_defaults()
  config.data = ml_collections.ConfigDict({'seq_len': 64})
  config.optimizer = ml_collections.ConfigDict()
  config.training = ml_collections.ConfigDict()
  return config
