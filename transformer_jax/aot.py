"""`--mode=compile`: the run's train and eval steps compiled ahead of time for a target
(`compile.target`: a TPU topology, a Cloud TPU type or GPUs; see `targets`) that this machine
need not have, with XLA's memory per device beside the project's plan and, on TPUs, XLA's FLOPs
beside the accounting's. Nothing is read from the dataset and nothing is written.

The batch is abstract: the shapes and dtypes of the config's batch, taken from a generated
stand-in of the same family, sizes and preprocessing (data.name='synthetic'), laid out as the
family's packed batches are where data.packing is on (its registry entry's packed_shapes).

`train_step_memory` is --mode=describe's figure: the train step alone, compiled for a target or
for this machine's devices, its memory analysis kept in the user's cache under a hash of what
makes the step and the compiler's versions (_cache_key), so that describing it again compiles
nothing.
"""
import contextlib
import dataclasses
import hashlib
import importlib.metadata
import json
import logging
import os
import pathlib
import re
import sys
import time
import types
from typing import Callable

import jax
from jax.experimental.compilation_cache import compilation_cache
import ml_collections

from transformer_jax import accounting, config_lib, memory, targets
from transformer_jax.data import files
from transformer_jax.data.corpus import TextSettings
from transformer_jax.errors import UserError
from transformer_jax.train import metrics, run_settings, setup, sharding, vmapped
from transformer_jax.train.run_settings import RunSettings

__all__ = ['abstract_batch', 'compile_for', 'compile_options', 'compiled_stacked_step',
           'compiled_train_step', 'CompileReport', 'packed_layout', 'report_lines', 'stand_in',
           'StepMemory', 'train_step_memory', 'without_compilation_cache']

log = logging.getLogger(__name__)

_FIELDS = ('argument', 'output', 'alias', 'temporary', 'code')


@dataclasses.dataclass(frozen=True)
class CompileReport:
  """Per device: XLA's bytes of the compiled train step and the plan's, by field."""
  target: str
  devices: int
  mesh: dict  # {axis: size} over the target's devices
  memory_bytes: int  # of one device of the target
  xla_bytes: dict  # _FIELDS, 'buffers' and 'total' (train.metrics.compiled_memory)
  plan_bytes: dict  # the same fields, from memory.plan (which plans no code)
  flops_per_device: float | None  # XLA's cost analysis (TPU; XLA:GPU reports none)
  planned_flops_per_device: float  # the accounting's
  compile_seconds: float  # train step and eval step

  @property
  def plan_ratio(self) -> float:
    """The plan over XLA's buffers: what the plan plans (code is no part of it)."""
    return self.plan_bytes['buffers'] / self.xla_bytes['buffers']

  @property
  def fits(self) -> bool:
    return self.xla_bytes['total'] <= self.memory_bytes

  def as_json(self) -> str:
    return json.dumps({
        'target': self.target, 'devices': self.devices, 'mesh': self.mesh, 'fits': self.fits,
        'xla_bytes_per_device': self.xla_bytes, 'plan_bytes_per_device': self.plan_bytes,
        'flops_per_device': self.flops_per_device,
        'compile_seconds': round(self.compile_seconds, 2)})


def stand_in(settings: RunSettings) -> RunSettings:
  """The run with its data generated (of the model's sizes, its family's data_sizes): the same
  batch sizes, sequence length and preprocessing, one small held-out batch, nothing downloaded
  or tokenized, no weights read."""
  data = settings.data
  parts = dict(data.parts)
  parts['text'] = dataclasses.replace(data.part(TextSettings), tokenizer='chars', token_dir=None)
  generated = dataclasses.replace(
      data, name='synthetic', eval_examples=data.eval_batch_size or data.batch_size,
      eval_steps=1, parts=types.MappingProxyType(parts))
  return dataclasses.replace(settings, data=generated, init_from_hf='', init_from_checkpoint='')


def abstract_batch(batch: dict, mesh, packed: Callable[[dict], dict] | None = None) -> dict:
  """ShapeDtypeStructs of a global batch split over the mesh's data axis; `packed`: the family's
  packed_shapes where the run's batches are packed (data.packing), which the stand-in's are not
  (`packed_layout`)."""
  shapes = {key: jax.ShapeDtypeStruct(value.shape, value.dtype) for key, value in batch.items()}
  if packed:
    shapes = packed(shapes)
  spec = sharding.batch_sharding(mesh)
  return {key: jax.ShapeDtypeStruct(value.shape, value.dtype, sharding=spec)
          for key, value in shapes.items()}


def compile_for(config: 'ml_collections.ConfigDict | RunSettings') -> CompileReport:
  """Compiles the run (its RunSettings, or a config resolved here) for its compile target; a
  program that does not fit the target's memory raises UserError saying by how much."""
  target = targets.target(config.compile.target)
  settings = run_settings.resolve(config, target.platform)
  run, batch = _stand_in_run(settings, target.devices)
  eval_batch = abstract_batch(next(iter(run.data.eval_batches())), run.mesh, packed_layout(run))
  try:
    train, seconds = compiled_train_step(run, batch)
    start = time.perf_counter()
    with without_compilation_cache():
      run.eval_step.lower(run.abstract_params, eval_batch).compile(compile_options(run))
  except jax.errors.JaxRuntimeError as error:
    if 'RESOURCE_EXHAUSTED' not in str(error):
      raise
    raise UserError(_does_not_fit(str(error), target)) from None
  cost = train.cost_analysis() or {}
  return CompileReport(
      target=target.name, devices=target.num_devices, mesh=dict(run.mesh.shape),
      memory_bytes=target.chip.memory_bytes, xla_bytes=metrics.compiled_memory(train),
      plan_bytes=_planned(run), flops_per_device=cost.get('flops'),
      planned_flops_per_device=_train_flops(run, batch) / target.num_devices,
      compile_seconds=seconds + time.perf_counter() - start)


def compiled_train_step(run, batch: dict | None = None):
  """(the compiled train step of `run`, the seconds it took) for the run's devices, with an
  abstract batch (default: of the run's first batch)."""
  batch = batch or abstract_batch(run.data.train_batch(0), run.mesh)
  start = time.perf_counter()
  with without_compilation_cache():
    compiled = run.train_step.lower(run.abstract_state, batch).compile(compile_options(run))
  return compiled, time.perf_counter() - start


def _stand_in_run(settings: RunSettings, devices) -> tuple:
  """(the stand-in's run on `devices`, the abstract batch of its train step) as compile_for
  compiles it."""
  run = setup.build_run(stand_in(settings), devices=devices)
  return run, abstract_batch(run.data.train_batch(0), run.mesh, packed_layout(run))


@dataclasses.dataclass(frozen=True)
class StepMemory:
  """XLA's bytes per device of a run's compiled train step (train.metrics.compiled_memory's
  fields; None where the backend reports none), or, where XLA refused the step for want of
  memory, 'total' alone: what its error says the step needs (None where it says no figure)."""
  xla_bytes: dict | None
  refused: bool
  compile_seconds: float  # of the compile that made the figure, cached or not
  cached: bool  # read from the cache: nothing was compiled


def train_step_memory(settings: RunSettings, devices=None) -> StepMemory:
  """XLA's memory of the run's train step compiled for `devices` (a target's compile-only ones;
  default: this machine's), on the abstract batch compile_for compiles it with: read from the
  user's cache where the same step was compiled for the same devices by the same compiler
  before (_cache_key), else compiled and kept there."""
  devices = tuple(devices if devices is not None else jax.devices())
  path = pathlib.Path(files.user_cache('xla_memory')) / f'{_cache_key(settings, devices)}.json'
  if path.is_file():
    return StepMemory(**json.loads(path.read_text()), cached=True)
  log.info('Compiling the train step for %d %s devices to ask XLA its memory (once: its figure '
           'is cached; compile.xla_memory=False skips it).', len(devices), devices[0].platform)
  run, batch = _stand_in_run(settings, devices)
  start = time.perf_counter()
  try:
    compiled, _ = compiled_train_step(run, batch)
    figure = dict(xla_bytes=metrics.compiled_memory(compiled), refused=False)
  except jax.errors.JaxRuntimeError as error:  # XLA:TPU refuses a step that does not fit
    if 'RESOURCE_EXHAUSTED' not in str(error):
      raise
    sizes = _error_sizes(str(error))
    figure = dict(xla_bytes={'total': int(sizes[0] * 2**30) if sizes else None}, refused=True)
  figure['compile_seconds'] = time.perf_counter() - start
  try:
    path.parent.mkdir(parents=True, exist_ok=True)
    files.write_atomically(path, json.dumps(figure))
  except OSError as error:  # a read-only cache: the figure stands, it is compiled again next time
    log.warning('XLA\'s memory figure was not cached in %s: %s', path.parent, error)
  return StepMemory(**figure, cached=False)


# Bumped when what the cache holds, or how it is keyed, changes.
_CACHE_FORMAT = 1
# The packages that build the step, and those that compile it for each platform.
_PACKAGES = ('jax', 'jaxlib', 'flax', 'optax', 'numpy')
_COMPILERS = {'tpu': ('libtpu',), 'gpu': ('jax-cuda12-plugin', 'jax-cuda12-pjrt')}
# Config keys that never change the compiled train step: how often the loop logs, evaluates and
# saves, where it starts from, how it samples, what describe compares with and whether it asks.
# Any other key is part of the cache's key, even where it changes only a constant of the step.
_NOT_IN_THE_STEP = ('seed', 'eval', 'sample', 'init_from_hf', 'init_from_checkpoint',
                    'compile.xla_memory', 'training.device_memory_gb', 'training.log_every',
                    'training.eval_every', 'training.checkpoint_every',
                    'training.keep_checkpoints', 'training.profile_start',
                    'training.profile_steps', 'training.peak_flops_per_device')


def _cache_key(settings: RunSettings, devices: tuple) -> str:
  """A hash of what the train step compiled for `devices` is made of: the run's config (but
  _NOT_IN_THE_STEP), the platform its settings are resolved for, the devices (kind and place),
  the source that builds the step (this package's, and that of a family registered from
  outside it), the versions of the packages that build and compile it, and XLA's flags from the
  environment. Keyed by what makes the step, not by the lowered step itself: a lookup traces
  nothing (and JAX's first lowering of a Pallas kernel in a process hoists its constants
  otherwise than later ones, so equal steps can lower to different texts)."""
  def version(package):
    try:
      return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
      return None
  config = {key: value for key, value in config_lib.flatten(settings.config.to_dict()).items()
            if not any(key == k or key.startswith(f'{k}.') for k in _NOT_IN_THE_STEP)}
  platform = devices[0].platform
  about = json.dumps({
      'format': _CACHE_FORMAT, 'config': config, 'platform': settings.platform,
      'devices': [(d.platform, d.device_kind, getattr(d, 'coords', None)) for d in devices],
      'versions': {p: version(p) for p in _PACKAGES + _COMPILERS.get(platform, ())},
      'flags': {name: os.environ.get(name) for name in ('XLA_FLAGS', 'LIBTPU_INIT_ARGS')}},
      sort_keys=True, default=str)
  digest = hashlib.sha256(about.encode())
  for source in _sources(settings.family):
    digest.update(source.read_bytes())
  return digest.hexdigest()[:32]


def _sources(family) -> list[pathlib.Path]:
  """The files that build a family's train step: this package's sources and XLA GPU target
  configs, and the file of the family's module where it is registered from outside the
  package."""
  package = pathlib.Path(__file__).resolve().parent
  paths = sorted(p for p in package.rglob('*') if p.suffix in ('.py', '.txtpb'))
  own = getattr(sys.modules.get(getattr(family.module, '__module__', '')), '__file__', None)
  if own and package not in pathlib.Path(own).resolve().parents:
    paths.append(pathlib.Path(own))
  return paths


def compiled_stacked_step(runs) -> tuple:
  """(the compiled step of a vmapped sweep's group of `runs` (train.vmapped), the seconds it
  took) for the runs' devices, with abstract batches of the runs' shapes."""
  first = runs[0]
  batch = abstract_batch(first.data.train_batch(0), first.mesh, packed_layout(first))
  start = time.perf_counter()
  with without_compilation_cache():
    compiled = vmapped.lowered_step(runs, batch).compile(compile_options(first))
  return compiled, time.perf_counter() - start


def compile_options(run) -> dict | None:
  """XLA's options for the run's devices. Compiling for GPUs without one, XLA cannot choose the
  tiles of some Triton GEMM fusions ("Couldn't find output tile sizes", for every ViT's 1 +
  patches tokens): those GEMMs are compiled as cuBLAS calls instead."""
  if run.mesh.devices.flat[0].platform == 'gpu':
    return {'xla_gpu_enable_triton_gemm': False}
  return None


@contextlib.contextmanager
def without_compilation_cache():
  """Compile-only executables cannot be loaded back from JAX's persistent cache, and this mode
  writes nothing: the cache is off while it compiles (JAX decides once whether to use it, so
  the decision is reset on the way in and out)."""
  enabled = jax.config.jax_enable_compilation_cache
  jax.config.update('jax_enable_compilation_cache', False)
  compilation_cache.reset_cache()
  try:
    yield
  finally:
    jax.config.update('jax_enable_compilation_cache', enabled)
    compilation_cache.reset_cache()


def packed_layout(run) -> Callable[[dict], dict] | None:
  """The run's family's packed_shapes where its text is packed (data.packing): its batches
  carry the segment ids and positions that the generated stand-in's lack; else None."""
  return run.family.packed_shapes if run.settings.data.part(TextSettings).packing else None


def _planned(run) -> dict:
  """memory.plan of the run on its (the target's) mesh, in memory_analysis's fields."""
  plan = memory.plan(run.settings, dict(run.mesh.shape))
  state = plan.params + plan.optimizer
  return {'argument': state + plan.batch, 'output': state, 'alias': state,
          'temporary': plan.gradients + plan.gathered + plan.activations, 'code': 0,
          'buffers': plan.train_total, 'total': plan.train_total}


def _train_flops(run, batch) -> float:
  """The accounting's FLOPs of one train step (three times the forward pass)."""
  lengths = run.family.lengths(batch)  # read from the shapes
  forward = accounting.forward_flops(run.model_config, *lengths)['total']
  return 3 * forward * run.data.batch_size


def _error_sizes(message: str) -> list[float]:
  """The GiB figures of XLA's RESOURCE_EXHAUSTED, the step's need first, the device's last."""
  return [float(size) for size in re.findall(r'(\d+(?:\.\d+)?)G\b', message)]


def _does_not_fit(message: str, target) -> str:
  """XLA's RESOURCE_EXHAUSTED as what a user can act on."""
  sizes = _error_sizes(message)
  needs = (f'needs {sizes[0]:g} GiB per device of {sizes[-1]:g}' if len(sizes) >= 2 else
           f'needs more than the {target.chip.memory_bytes / 2**30:.2f} GiB of a device')
  return (f'does not fit: {needs} on {target.name} ({target.chip.name}); try a smaller '
          'data.batch_size (with training.grad_accum_steps to keep the global batch), '
          "model.remat_policy='full', rule_set='fsdp', or a target with more devices.")


def report_lines(report: CompileReport) -> list[str]:
  """The table of --mode=compile: XLA's bytes and the plan's per device, then the JSON line."""
  gib = lambda n: f'{n / 2**30:9.3f}'
  mesh = ' x '.join(f'{axis}={size}' for axis, size in report.mesh.items())
  lines = [f'Compiled for {report.target}: {report.devices} devices ({mesh}), '
           f'{report.memory_bytes / 2**30:.2f} GiB each, in {report.compile_seconds:.1f} s',
           f'  {"per device (GiB)":<18} {"XLA":>9} {"plan":>9}']
  for field in (*_FIELDS, 'buffers', 'total'):
    lines.append(f'  {field:<18} {gib(report.xla_bytes[field])} {gib(report.plan_bytes[field])}')
  total = report.xla_bytes['total']
  lines.append(f'  {"fits" if report.fits else "does NOT fit"}: {total / 2**30:.2f} of '
               f'{report.memory_bytes / 2**30:.2f} GiB ({total / report.memory_bytes:.0%}); the '
               f'plan says {report.plan_ratio:.2f}x XLA\'s buffers')
  planned = f'{report.planned_flops_per_device:.4e}'
  lines.append(f'  FLOPs per device per step: XLA {report.flops_per_device:.4e}, accounting '
               f'{planned}' if report.flops_per_device else
               f'  FLOPs per device per step: accounting {planned} (XLA reports none here)')
  return lines + [report.as_json()]
