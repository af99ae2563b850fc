"""The families, built from a config: `build(config.model)`. Each family is one entry of
`registry` (the five below register themselves on import), with its settings beside its module
(decoder.DecoderConfig, vit.ViTConfig, ...); `styles` holds the named block styles."""
import dataclasses
from typing import Any, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer_jax import kernels
from transformer_jax.errors import ConfigError
from transformer_jax.layers.block import LAYERS
from transformer_jax.model_config import ModelConfig, compute_dtype_of, defaults, names
from transformer_jax.models import (decoder, dit, encoder, encoder_decoder, registry, styles, vit,
                                    whisper)
from transformer_jax.models import clip  # after vit, whose towers it builds

__all__ = ['abstract_variables', 'attention_kernel', 'build', 'clip', 'decoder', 'dit', 'encoder',
           'encoder_decoder', 'example_inputs', 'family_of', 'init_params', 'model_config',
           'registry', 'require_sizes', 'resolved', 'stack_layers', 'styles', 'unstack_layers',
           'vit', 'whisper']


def model_config(model: ModelConfig | Mapping[str, Any]) -> ModelConfig:
  """The typed config of a model section (a ConfigDict or a dict): its family's config class,
  which checks every setting as it is made. Resolve a section once, at the top, and pass the
  result down: a typed config is returned as it is.

  A setting of another family that holds that family's default is left out (the config.json of
  a run of earlier versions holds every family's settings); one set otherwise fails, naming it.
  """
  if isinstance(model, ModelConfig):
    return model
  values = dict(model.to_dict() if hasattr(model, 'to_dict') else model)
  if 'attention_kernel' in values:
    values['attention_kernel'] = kernels.current_name(values['attention_kernel'])
  config_class = registry.get(values.get('family', 'decoder')).config
  return config_class.from_dict(_own_settings(values, config_class))


# Defaults other families' settings had in earlier versions, which their saved configs hold.
_FORMER_DEFAULTS = {'num_classes': [10]}  # a ViT's, before it followed the data's classes


def _own_settings(values: dict[str, Any], config_class: type[ModelConfig]) -> dict[str, Any]:
  own = set(names(config_class))
  elsewhere: dict[str, list] = {key: list(old) for key, old in _FORMER_DEFAULTS.items()}
  for name in registry.names():
    for key, default in defaults(registry.get(name).config).items():
      elsewhere.setdefault(key, []).append(default)
  return {key: value for key, value in values.items()
          if key in own or value not in elsewhere.get(key, [])}


def family_of(model: ModelConfig | Mapping[str, Any]) -> registry.Family:
  return registry.get(model_config(model).family)


def attention_kernel(model: ModelConfig | Mapping[str, Any],
                     platform: str | None = None) -> kernels.Choice:
  """The attention kernel `model` runs when compiled for `platform` ('cpu', 'gpu', 'tpu'; None:
  whichever the step is lowered for, for 'auto'): the reference kernel where the model drops
  attention probabilities in training."""
  cfg = model_config(model)
  return kernels.resolve(cfg.attention_kernel, platform, cfg.attention_dropout_rate)


def resolved(model: ModelConfig | Mapping[str, Any], platform: str
             ) -> tuple[ModelConfig, kernels.Choice, str]:
  """(the config with its compute dtype and attention kernel decided for `platform` ('cpu',
  'gpu', 'tpu': that of the devices the steps are compiled for), the kernel chosen, why the
  dtype): what a run decides once, at the top."""
  cfg = model_config(model)
  dtype, dtype_reason = compute_dtype_of(cfg.dtype, platform)
  kernel = attention_kernel(cfg, platform)
  return dataclasses.replace(cfg, dtype=dtype, attention_kernel=kernel.name), kernel, dtype_reason


def require_sizes(cfg: ModelConfig) -> ModelConfig:
  """`cfg`, whose sizes that follow the data (a vocabulary, classes) are all known: one left
  unset (a config resolved before its data stated it) fails, naming the key."""
  unset = [size for size, value in registry.get(cfg.family).data_sizes(cfg).items()
           if not value]
  if unset:
    raise ConfigError(f'model.{unset[0]} is unset and no data has stated it: set '
                      f'--config.model.{unset[0]}'
                      + (' or --config.data.vocab_size (the tokenizer\'s ids)'
                         if unset[0] == 'vocab_size' else '')
                      + ', or take the model of the run\'s settings (train.resolve(config).model).')
  return cfg


def build(model: ModelConfig | Mapping[str, Any], platform: str | None = None) -> nn.Module:
  """The Flax module of `model.family`, after validating every option. A config resolved for a
  platform (`resolved`: what a run builds) is built as it is; one that leaves the dtype or the
  kernel to 'auto' is resolved for `platform` (default: this machine's, for a module used
  outside a run)."""
  cfg = require_sizes(model_config(model))
  family = registry.get(cfg.family)
  if 'auto' in (cfg.dtype, cfg.attention_kernel):
    cfg = resolved(cfg, platform or jax.default_backend())[0]
  return family.module(cfg)


def example_inputs(cfg: ModelConfig, batch: int = 1, seq_len: int | None = None) -> tuple:
  """Positional arguments of the family's __call__, with the right shapes (for init)."""
  return registry.get(cfg.family).example_inputs(cfg, batch, seq_len)


def abstract_variables(model: ModelConfig | Mapping[str, Any]):
  """Shapes and dtypes of every variable, boxed with logical axis names; allocates nothing.
  Traced with XLA's attention: no variable depends on the kernel, and 'auto' would trace every
  platform's kernel, each logging why it would fall back on a platform that runs nothing here."""
  cfg = dataclasses.replace(model_config(model), attention_kernel='xla')
  return jax.eval_shape(build(cfg).init, jax.random.key(0), *example_inputs(cfg))


def init_params(model, rng, unbox: bool = True):
  cfg = model_config(model)
  variables = build(cfg).init(rng, *example_inputs(cfg))
  return nn.meta.unbox(variables['params']) if unbox else variables['params']


_LAYER_AXIS = {nn.PARTITION_NAME: LAYERS}  # what nn.scan tells a box about the axis it adds


def _is_box(leaf) -> bool:
  return isinstance(leaf, nn.meta.AxisMetadata)


def _layer(leaf, i: int):
  """Layer i of a stacked parameter; a box (as init returns them) loses its 'layers' name."""
  if not _is_box(leaf):
    return leaf[i]
  if isinstance(leaf, nn.Partitioned) and leaf.names[:1] != (LAYERS,):
    raise ValueError(f'A stacked parameter has axis names {leaf.names}, which do not start with '
                     f'{LAYERS!r}: it was not stacked by nn.scan or stack_layers.')
  return jax.tree.map(lambda a: a[i], leaf).remove_axis(0, _LAYER_AXIS)


def unstack_layers(tree):
  """Scanned parameters ('layers', leading layer axis) -> unrolled ones (block_0, block_1, ...),
  arrays or boxed with axis names as init returns them (the names lose 'layers')."""
  if not isinstance(tree, Mapping):
    return tree
  out = {}
  for key, value in tree.items():
    if key == LAYERS:
      num = jax.tree.leaves(value)[0].shape[0]
      out.update({f'block_{i}': jax.tree.map(lambda a, i=i: _layer(a, i), value, is_leaf=_is_box)
                  for i in range(num)})
    else:
      out[key] = unstack_layers(value)
  return out


def stack_layers(tree):
  """Unrolled parameters (block_0, block_1, ...) -> scanned ones ('layers', leading layer axis),
  arrays or boxed with axis names as init returns them (the names gain 'layers', as nn.scan's)."""
  if not isinstance(tree, Mapping):
    return tree
  blocks = sorted((k for k in tree if k.startswith('block_')), key=lambda k: int(k[6:]))
  out = {k: stack_layers(v) for k, v in tree.items() if not k.startswith('block_')}
  if blocks:
    stacked = jax.tree.map(lambda *a: jnp.stack(a), *(tree[k] for k in blocks))
    out[LAYERS] = jax.tree.map(lambda a: a.add_axis(0, _LAYER_AXIS) if _is_box(a) else a,
                               stacked, is_leaf=_is_box)
  return out
