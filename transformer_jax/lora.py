"""Low-rank adapters (Hu et al. 2021, LoRA): beside each chosen kernel W of a frozen base, a pair
A (inputs, rank), B (rank, outputs), the kernel's input axes and output axes each folded into one,
so that the model runs with W + (alpha / rank) * A @ B. B starts at zero, so the adapted model
starts as the base; A starts as Kaiming-uniform, as the paper's code and peft do.

The design is functional: no module changes. The adapters are a tree of their own,

  params/decoder/block_0/attn/query/kernel -> adapters/decoder/block_0/attn/query/lora_a/kernel
                                                                                 /lora_b/kernel

and `merged(base, adapters, settings)` is the parameter tree the model runs with, in the train
step's loss and everywhere else. An adapter sits where a Dense named lora_a would, so the
optimizer's weight-decay mask treats it as it treats the kernel it adapts.
"""
import dataclasses
import math
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import traverse_util

from transformer_jax.errors import ConfigError
from transformer_jax.ranges import Range
from transformer_jax.settings import Settings

__all__ = ['adapter_paths', 'check_targets', 'DEFAULT_TARGETS', 'init_adapters', 'LoraSettings',
           'merged']

# The query and value projections of every attention (self and cross), as Hu et al. adapt.
DEFAULT_TARGETS = r'(^|/)(attn|cross_attn)/(query|value)/kernel$'
_A, _B = 'lora_a', 'lora_b'
_STACKED = 'layers'  # the leading axis of scanned blocks' parameters: one adapter per block


@dataclasses.dataclass(frozen=True)
class LoraSettings(Settings):
  """The keys of config.lora."""
  SECTION = 'lora'
  rank: int = 0  # 0: no adapters, every parameter trains
  alpha: float = 8.0  # the update is scaled by alpha / rank (rank 8: by 1, as peft's default)
  # A regular expression searched in each parameter's '/'-joined path (decoder/block_0/attn/query
  # /kernel); every matrix it matches gets an adapter.
  targets: str = DEFAULT_TARGETS

  RANGES = {'rank': Range(0, integer=True), 'alpha': Range(0, open_low=True, example=8)}

  def check(self) -> None:
    super().check()
    check_targets(self)

  @property
  def scale(self) -> float:
    return self.alpha / self.rank


def check_targets(settings: LoraSettings) -> re.Pattern:
  """The compiled lora.targets, or a ConfigError saying why it does not compile."""
  try:
    return re.compile(settings.targets)
  except re.error as error:
    raise ConfigError(f'lora.targets={settings.targets!r} is not a regular expression ({error}): '
                      f'for example --config.lora.targets="{DEFAULT_TARGETS}".') from None


def adapter_paths(params, settings: LoraSettings) -> list[tuple[str, ...]]:
  """The paths of the parameters that lora.targets matches; a ConfigError where it matches none
  (naming some that exist) or matches a parameter that is no matrix."""
  pattern = check_targets(settings)
  flat = traverse_util.flatten_dict(params)
  paths = [path for path in flat if pattern.search('/'.join(path))]
  if not paths:
    shown = ', '.join('/'.join(path) for path in list(flat)[:6])
    raise ConfigError(f'lora.targets={settings.targets!r} matches no parameter; the parameters '
                      f'are named like {shown} (... {len(flat)} in all).')
  vectors = ['/'.join(path) for path in paths if len(_unstacked_names(flat[path])[0]) < 2]
  if vectors:
    raise ConfigError(f'lora.targets={settings.targets!r} matches parameters that are not '
                      f'matrices ({", ".join(vectors[:3])}): an adapter is low-rank in a matrix; '
                      'match kernels only, for example end the expression with /kernel$.')
  return paths


def _unstacked_names(leaf) -> tuple[tuple, int]:
  """(the logical axis names of a leaf, without the scanned blocks' leading axis; how many
  leading axes that leaves out)."""
  value = leaf.value if isinstance(leaf, nn.Partitioned) else leaf
  names = tuple(leaf.names) if isinstance(leaf, nn.Partitioned) else (None,) * value.ndim
  stacked = int(bool(names) and names[0] == _STACKED)
  return names[stacked:], stacked


def _input_axes(names: tuple) -> int:
  """How many leading axes of a kernel its input is: all but the last where the last is the
  model width (the attention's output projection, the MLP's down projection, a patch
  convolution), else the first (the query, key and value projections, the MLP's up projection)."""
  return len(names) - 1 if names[-1] == 'embed' else 1


def _adapter_pair(leaf, rank: int, rng):
  """A (stacked..., inputs, rank), Kaiming-uniform, and B (stacked..., rank, outputs) = 0, boxed
  with the kernel's axis names where it has them (a folded group takes its leading axis's name:
  the split of a row-major fold over that name's mesh axis is the kernel's)."""
  names, stacked = _unstacked_names(leaf)
  value = leaf.value if isinstance(leaf, nn.Partitioned) else leaf
  lead, shape = value.shape[:stacked], value.shape[stacked:]
  split = _input_axes(names)
  inputs, outputs = math.prod(shape[:split]), math.prod(shape[split:])
  bound = 1 / math.sqrt(inputs)  # torch.nn.init.kaiming_uniform_(a=sqrt(5)), as peft's A
  a = jax.random.uniform(rng, (*lead, inputs, rank), value.dtype, -bound, bound)
  b = jnp.zeros((*lead, rank, outputs), value.dtype)
  if not isinstance(leaf, nn.Partitioned):
    return a, b
  lead_names = tuple(leaf.names[:stacked])
  return (nn.Partitioned(a, lead_names + (names[0], None)),
          nn.Partitioned(b, lead_names + (None, names[split])))


def init_adapters(params, settings: LoraSettings, rng) -> dict:
  """Fresh adapters for the parameters (boxed with logical axis names or not) that lora.targets
  matches: the model with them merged is the base model."""
  flat = traverse_util.flatten_dict(params)
  adapters = {}
  for index, path in enumerate(adapter_paths(params, settings)):
    a, b = _adapter_pair(flat[path], settings.rank, jax.random.fold_in(rng, index))
    adapters[(*path[:-1], _A, path[-1])] = a
    adapters[(*path[:-1], _B, path[-1])] = b
  return traverse_util.unflatten_dict(adapters)


def merged(base, adapters, settings: LoraSettings):
  """The parameters the adapted model runs with: each adapted kernel W as W + scale * A @ B (in
  W's dtype), every other parameter the base's own."""
  flat = traverse_util.flatten_dict(base)
  pairs = traverse_util.flatten_dict(adapters)
  for path, kernel in flat.items():
    a = pairs.get((*path[:-1], _A, path[-1]))
    if a is not None:
      b = pairs[(*path[:-1], _B, path[-1])]
      delta = settings.scale * jnp.matmul(a, b).reshape(kernel.shape)
      flat[path] = kernel + delta.astype(kernel.dtype)
  return traverse_util.unflatten_dict(flat)
