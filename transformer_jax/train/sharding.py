"""The device mesh, the logical-axis rule sets and the shardings of the state and the batch."""
import contextlib
import logging
import math

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from transformer_jax.errors import ConfigError

__all__ = [
    'activation_rules', 'batch_sharding', 'check_batches_divide', 'check_divisible',
    'check_rule_set', 'DATA_AXIS', 'global_batch', 'make_mesh', 'mesh_axes_of', 'mesh_sizes',
    'RULE_SETS', 'rules_of', 'state_shardings']

log = logging.getLogger(__name__)

DATA_AXIS = 'data'

# Logical axes (the parameters': vocab, embed, heads, kv_heads, mlp, ...; the activations':
# layers.axes) -> mesh axes; an axis no rule names is replicated. The batch is always split over
# 'data'. Tensor parallelism (Shoeybi et al. 2019) splits the heads and the MLP's hidden units
# over 'model', so that each block's attention output and MLP down projection end in one
# all-reduce; FSDP also splits every weight's width over 'data', gathering it where it is used.
# The vocabulary stays whole: GPT-2's 50,257 rows divide by no mesh axis (add
# ('vocab', 'model'), ('act_vocab', 'model') to config.sharding_rules for a vocabulary that
# divides).
_TENSOR_PARALLEL = (('heads', 'model'), ('kv_heads', 'model'), ('mlp', 'model'),
                    ('act_heads', 'model'), ('act_kv_heads', 'model'), ('act_mlp', 'model'))
RULE_SETS = {
    'dp': (('act_batch', 'data'),),
    'fsdp': (('act_batch', 'data'), ('embed', 'data')),
    'tp': (('act_batch', 'data'), *_TENSOR_PARALLEL),
    'fsdp_tp': (('act_batch', 'data'), ('embed', 'data'), *_TENSOR_PARALLEL),
}


def check_rule_set(rule_set: str, axes: tuple[str, ...]) -> None:
  """Raises ConfigError unless `rule_set` is one of RULE_SETS and the mesh's `axes` have the
  mesh axes it splits over."""
  if rule_set not in RULE_SETS:
    raise ConfigError(f'rule_set={rule_set!r} must be one of {list(RULE_SETS)}.')
  axes = tuple(axes)
  missing = sorted({mesh_axis for _, mesh_axis in RULE_SETS[rule_set]} - set(axes))
  if missing:
    raise ConfigError(f'rule_set={rule_set!r} splits over the mesh axis {missing[0]!r}, '
                      f'which mesh.axes={axes} lacks: for example --config.mesh.axes="(\'data\', '
                      f'\'{missing[0]}\')" --config.mesh.shape="(-1, 2)", or rule_set=\'fsdp\'.')


def rules_of(rule_set: str, sharding_rules=()) -> tuple[tuple[str, str | None], ...]:
  """The rules a run uses: config.sharding_rules first (the first rule for an axis wins), then
  the named rule set's (see check_rule_set)."""
  return tuple(tuple(rule) for rule in sharding_rules) + RULE_SETS[rule_set]


def make_mesh(mesh_config, devices=None) -> jax.sharding.Mesh:
  """A mesh over `devices` (default: every device of every process; a target's compile-only
  devices for --mode=compile), with Auto axes (GSPMD-style jit shardings).

  In a single process a shape may use fewer devices than there are (the first ones), which is
  how a test compares one device with eight.
  """
  axes = tuple(mesh_config.axes)
  if DATA_AXIS not in axes:
    raise ConfigError(f'mesh.axes={axes} must include {DATA_AXIS!r}: the batch is sharded on it.')
  devices = list(jax.devices() if devices is None else devices)
  shape = tuple(mesh_sizes(mesh_config, len(devices)).values())
  used = int(np.prod(shape))
  if used > len(devices) or (used < len(devices) and jax.process_count() > 1):
    raise ConfigError(f'mesh.shape={tuple(mesh_config.shape)} needs {used} devices but '
                      f'there are {len(devices)}: make the product equal the device count, or '
                      'use -1 for one axis.')
  if used < len(devices):
    log.warning('The mesh uses %d of the %d devices.', used, len(devices))
  return jax.make_mesh(shape, axes, axis_types=(jax.sharding.AxisType.Auto,) * len(axes),
                       devices=devices[:used])


def mesh_sizes(mesh_config, device_count: int | None = None) -> dict[str, int]:
  """mesh.shape as {axis: size}, a -1 entry resolved over `device_count` devices (default:
  this machine's)."""
  shape = list(mesh_config.shape)
  if shape.count(-1) > 1:
    raise ConfigError('At most one mesh.shape entry may be -1.')
  if -1 in shape:
    rest = int(np.prod([s for s in shape if s != -1]))
    devices = jax.device_count() if device_count is None else device_count
    if devices % rest:
      raise ConfigError(f'mesh.shape={tuple(mesh_config.shape)}: the fixed axes take {rest} '
                        f'devices, which does not divide the {devices} devices.')
    shape[shape.index(-1)] = devices // rest
  return dict(zip(mesh_config.axes, shape))


def mesh_axes_of(name: str | None, rules) -> tuple[str, ...]:
  """The mesh axes the rules map the logical axis `name` to; none: it stays whole."""
  mapped = nn.logical_to_mesh_axes((name,), rules)[0] if name else None
  return (mapped,) if isinstance(mapped, str) else tuple(mapped or ())


def state_shardings(abstract_boxed_state, mesh, rules):
  """NamedShardings for every leaf, from the logical axis names the modules attach; a dimension
  that its mesh axes do not divide fails first, with what to change (check_divisible)."""
  rules = [tuple(r) for r in rules]
  check_divisible(abstract_boxed_state, dict(mesh.shape), rules)
  return nn.logical_to_mesh_sharding(nn.get_partition_spec(abstract_boxed_state), mesh, rules)


def check_divisible(abstract_boxed_state, mesh_shape: dict[str, int], rules) -> None:
  """Raises ConfigError naming each parameter whose dimension the mesh axes its rule maps it to
  do not divide (the optimizer state mirrors the parameters, so they are the ones named)."""
  params = getattr(abstract_boxed_state, 'params', abstract_boxed_state)
  boxed = lambda x: isinstance(x, nn.Partitioned)
  problems = []
  for path, leaf in jax.tree_util.tree_flatten_with_path(params, is_leaf=boxed)[0]:
    if not boxed(leaf):  # a parameter without axis names is replicated
      continue
    for dim, (size, name) in enumerate(zip(leaf.value.shape, leaf.names)):
      mesh_axes = mesh_axes_of(name, rules)
      split = math.prod(mesh_shape[a] for a in mesh_axes)
      if size % split:
        where = '/'.join(str(getattr(k, 'key', k)) for k in path)
        problems.append(f'{where} {leaf.value.shape}: dimension {dim} ({name!r}, {size}) over mesh '
                        f'axis {"x".join(mesh_axes)} of size {split} (rule ({name!r}, '
                        f'{mesh_axes[0]!r}))')
  if problems:
    shown = '\n  '.join(problems[:5]) + (f'\n  ... and {len(problems) - 5} more'
                                           if len(problems) > 5 else '')
    raise ConfigError(f'The sharding rules split dimensions that the mesh does not divide:\n  '
                      f'{shown}\nChoose widths that divide (model.d_ff, model.num_heads, '
                      'model.num_kv_heads, model.vocab_size), another mesh.shape, or a rule set '
                      'that keeps these axes whole (config.rule_set, config.sharding_rules).')


@contextlib.contextmanager
def activation_rules(mesh, rules):
  """Inside a traced step: the mesh and the rules that `layers.axes.constrain` reads, so that
  the activations are laid out as the rules ask."""
  with jax.sharding.use_abstract_mesh(mesh.abstract_mesh), nn.logical_axis_rules(rules):
    yield


def batch_sharding(mesh) -> NamedSharding:
  return NamedSharding(mesh, P(DATA_AXIS))


def global_batch(local_batch: dict, mesh) -> dict:
  """One global array per key from each process's share of the rows."""
  sharding = batch_sharding(mesh)
  return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v))
          for k, v in local_batch.items()}


def check_batches_divide(batch_size: int, eval_batch_size: int, mesh, grad_accum_steps: int):
  """Every data-parallel device takes an equal share of each (micro)batch."""
  data = mesh.shape[DATA_AXIS]
  if batch_size % (data * grad_accum_steps):
    raise ConfigError(f'data.batch_size={batch_size} must be a multiple of the data-parallel '
                      f'devices ({data}) times training.grad_accum_steps ({grad_accum_steps}): '
                      f'for example --config.data.batch_size='
                      f'{_multiple(batch_size, data * grad_accum_steps)}.')
  if eval_batch_size % data:
    raise ConfigError(f'data.eval_batch_size={eval_batch_size} must be a multiple of the '
                      f'data-parallel devices ({data}): for example '
                      f'--config.data.eval_batch_size={_multiple(eval_batch_size, data)}.')


def _multiple(size: int, factor: int) -> int:
  """The multiple of `factor` nearest to `size` (at least `factor`)."""
  return max(factor, round(size / factor) * factor)
