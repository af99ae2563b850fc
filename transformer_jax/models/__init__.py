"""The families, built from a config: `build(config.model)`. Each family is one entry of
`registry` (the four below register themselves on import), with its settings beside its module
(decoder.DecoderConfig, vit.ViTConfig, ...); `styles` holds the named block styles."""
from typing import Any, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer_jax.model_config import ModelConfig, defaults, names
from transformer_jax.models import decoder, encoder, encoder_decoder, registry, styles, vit


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
  config_class = registry.get(values.get('family', 'decoder')).config
  return config_class.from_dict(_own_settings(values, config_class))


def _own_settings(values: dict[str, Any], config_class: type[ModelConfig]) -> dict[str, Any]:
  own = set(names(config_class))
  elsewhere: dict[str, list] = {}
  for name in registry.names():
    for key, default in defaults(registry.get(name).config).items():
      elsewhere.setdefault(key, []).append(default)
  return {key: value for key, value in values.items()
          if key in own or value not in elsewhere.get(key, [])}


def family_of(model: ModelConfig | Mapping[str, Any]) -> registry.Family:
  return registry.get(model_config(model).family)


def build(model: ModelConfig | Mapping[str, Any]) -> nn.Module:
  """The Flax module of `model.family`, after validating every option."""
  cfg = model_config(model)
  return registry.get(cfg.family).module(cfg)


def example_inputs(cfg: ModelConfig, batch: int = 1, seq_len: int | None = None) -> tuple:
  """Positional arguments of the family's __call__, with the right shapes (for init)."""
  return registry.get(cfg.family).example_inputs(cfg, batch, seq_len)


def abstract_variables(model: ModelConfig | Mapping[str, Any]):
  """Shapes and dtypes of every variable, boxed with logical axis names; allocates nothing."""
  cfg = model_config(model)
  return jax.eval_shape(build(cfg).init, jax.random.key(0), *example_inputs(cfg))


def init_params(model, rng, unbox: bool = True):
  cfg = model_config(model)
  variables = build(cfg).init(rng, *example_inputs(cfg))
  return nn.meta.unbox(variables['params']) if unbox else variables['params']


def unstack_layers(tree):
  """Scanned parameters ('layers', leading layer axis) -> unrolled ones (block_0, block_1, ...)."""
  if not isinstance(tree, Mapping):
    return tree
  out = {}
  for key, value in tree.items():
    if key == 'layers':
      num = jax.tree.leaves(value)[0].shape[0]
      out.update({f'block_{i}': jax.tree.map(lambda a, i=i: a[i], value) for i in range(num)})
    else:
      out[key] = unstack_layers(value)
  return out


def stack_layers(tree):
  """Unrolled parameters (block_0, block_1, ...) -> scanned ones ('layers', leading layer axis)."""
  if not isinstance(tree, Mapping):
    return tree
  blocks = sorted((k for k in tree if k.startswith('block_')), key=lambda k: int(k[6:]))
  out = {k: stack_layers(v) for k, v in tree.items() if not k.startswith('block_')}
  if blocks:
    out['layers'] = jax.tree.map(lambda *a: jnp.stack(a), *(tree[k] for k in blocks))
  return out
