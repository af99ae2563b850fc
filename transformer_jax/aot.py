"""`--mode=compile`: the run's train and eval steps compiled ahead of time for a target
(`compile.target`: a TPU topology, a Cloud TPU type or GPUs; see `targets`) that this machine
need not have, with XLA's memory per device beside the project's plan and, on TPUs, XLA's FLOPs
beside the accounting's. Nothing is read from the dataset and nothing is written.

The batch is abstract: the shapes and dtypes of the config's batch, taken from a generated
stand-in of the same family, sizes and preprocessing (data.name='synthetic'), laid out as the
family's packed batches are where data.packing is on (its registry entry's packed_shapes).
"""
import contextlib
import dataclasses
import json
import re
import time
import types
from typing import Callable

import jax
from jax.experimental.compilation_cache import compilation_cache
import ml_collections

from transformer_jax import accounting, memory, targets
from transformer_jax.data.corpus import TextSettings
from transformer_jax.errors import UserError
from transformer_jax.train import metrics, run_settings, setup, sharding, vmapped
from transformer_jax.train.run_settings import RunSettings

__all__ = ['abstract_batch', 'compile_for', 'compile_options', 'compiled_stacked_step',
           'compiled_train_step', 'CompileReport', 'packed_layout', 'report_lines', 'stand_in',
           'without_compilation_cache']

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
  target = targets.target(config.compile_target if isinstance(config, RunSettings)
                          else config.compile.target)
  settings = run_settings.resolve(config, target.platform)
  run = setup.build_run(stand_in(settings), devices=target.devices)
  packed = packed_layout(run)
  batch = abstract_batch(run.data.train_batch(0), run.mesh, packed)
  eval_batch = abstract_batch(next(iter(run.data.eval_batches())), run.mesh, packed)
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


def _does_not_fit(message: str, target) -> str:
  """XLA's RESOURCE_EXHAUSTED as what a user can act on."""
  sizes = re.findall(r'(\d+(?:\.\d+)?)G\b', message)
  needs = (f'needs {sizes[0]} GiB per device of {sizes[-1]}' if len(sizes) >= 2 else
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
