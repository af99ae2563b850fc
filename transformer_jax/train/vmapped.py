"""A sweep trained as one program: runs whose configs differ only in numbers that leave the
compiled program alone (VMAPPED_KEYS: seeds, learning rates, weight decay, warmup, Adam's
betas, clipping, initialization scales, dropout rates) are stacked on a leading axis and stepped
together by one jitted jax.vmap of the train step, which keeps a small model's sweep from
leaving most of an accelerator idle.

Each run stays what it would be alone: its own workdir, initialization, data order, dropout
stream, optimizer numbers, metrics.jsonl, checkpoints and evaluations, and it resumes from its
own latest checkpoint. Runs at different steps (a sweep killed between two runs' saves) train
together too: a run that is ahead waits, its state kept, while the others catch up, and a run
whose loss turns non-finite stops ('diverged') while the others go on.

`groups` splits a sweep's configs into the sets that can train together; `train_group` trains
one set; `lowered_step` lowers one set's step without running it (aot.compiled_stacked_step
compiles it for a target).
"""
import contextlib
import dataclasses
import json
import logging
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from transformer_jax import config_lib
from transformer_jax.errors import ConfigError
from transformer_jax.train import checkpoint, loop, optim, setup, workdir_lock
from transformer_jax.train.setup import Run
from transformer_jax.train.sharding import DATA_AXIS
from transformer_jax.train.step import dropout_root, make_stacked_train_step

__all__ = ['groups', 'lowered_step', 'train_group', 'VMAPPED_KEYS']

log = logging.getLogger(__name__)

# The optimizer's numbers each run traces its own value of.
# Every optimizer and schedule takes them traced (the schedules are written with jnp); the name,
# the schedule and the keys of Adafactor and SGD are the program's.
_OPTIMIZER_NUMBERS = ('learning_rate', 'muon_learning_rate', 'weight_decay', 'muon_weight_decay',
                      'warmup_steps', 'min_lr_ratio', 'decay_fraction', 'b1', 'b2',
                      'grad_clip_norm')
# Numbers that differ between runs of one group: the optimizer's and the dropout rate (traced),
# the seed (each run's initialization, data order and dropout key) and the initialization scales
# (each run is initialized alone). Whether a number is set still matters: a gradient clip of 0
# turns clipping off, a dropout rate of 0 dropout, an unset init_std picks another initializer.
VMAPPED_KEYS = ('seed', 'model.init_std', 'model.embed_init_std', 'model.dropout_rate',
                *(f'optimizer.{name}' for name in _OPTIMIZER_NUMBERS))
_SWITCHES = {'optimizer.grad_clip_norm': bool, 'model.init_std': lambda v: v is not None,
             'model.dropout_rate': bool}


def _program_key(config) -> str:
  """What must be equal for runs to train as one program: the config with the vmapped numbers
  left out (only whether each switch is on kept)."""
  flat = config_lib.flatten(json.loads(config.to_json_best_effort()))
  for key in VMAPPED_KEYS:
    flat[key] = _SWITCHES[key](flat.get(key)) if key in _SWITCHES else None
  for key in config_lib.LOCATION_KEYS:
    flat.pop(key, None)
  return json.dumps(flat, sort_keys=True)


def groups(configs) -> list[list[int]]:
  """The indices of `configs` in sets that can train as one program, in the order each set's
  first run comes."""
  sets = {}
  for index, config in enumerate(configs):
    sets.setdefault(_program_key(config), []).append(index)
  return list(sets.values())


def _numbers(run: Run, traced: tuple[str, ...]) -> dict:
  """The run's own numbers of the stacked step: its optimizer's and its dropout key's data."""
  opt = run.settings.optimizer
  return {**{name: np.float32(getattr(opt, name)) for name in traced},
          'dropout_root': np.asarray(jax.random.key_data(dropout_root(run.settings.seed))),
          # 1 - rate rounded once, as nn.Dropout's Python float is
          'dropout_keep': np.float32(1.0 - run.model_config.dropout_rate)}


@dataclasses.dataclass(frozen=True)
class _Program:
  """The stacked step of a group of runs, with the shardings and the per-run numbers it takes."""
  step: jax.stages.Wrapped
  state_sharding: object  # the runs' state shardings, with a leading unsharded run axis
  numbers: dict  # per-run numbers, stacked

  @classmethod
  def of(cls, runs: list[Run]) -> '_Program':
    first = runs[0]
    opt = first.settings.optimizer
    traced = tuple(name for name in _OPTIMIZER_NUMBERS
                   if not (f'optimizer.{name}' in _SWITCHES and not getattr(opt, name)))

    def make_optimizer(numbers):
      own = opt.with_traced(**{name: numbers[name] for name in traced})
      return optim.make_optimizer(own, first.training.steps,
                                  first.family.frozen(first.model_config))

    sharding = jax.tree.map(lambda s: NamedSharding(s.mesh, P(None, *s.spec)),
                            first.state_sharding)
    step = make_stacked_train_step(first.model, first.family, make_optimizer, first.mesh,
                                   sharding, first.step_settings)
    numbers = jax.tree.map(lambda *x: np.stack(x), *[_numbers(run, traced) for run in runs])
    return cls(step, sharding, numbers)

  def stack(self, states):
    return jax.jit(lambda *s: jax.tree.map(lambda *x: jnp.stack(x), *s),
                   out_shardings=self.state_sharding)(*states)


def _check_dropout(cfg) -> None:
  """The stacked step traces one number for dropout, model.dropout_rate, which every nn.Dropout
  takes: a model that also drops at a rate of its own (attention probabilities in the kernel, an
  MLP's activation, a stack's output) fails, naming it."""
  extra = [name for name, rate in cfg.dropout_rates.items() if name != 'dropout_rate' and rate]
  if extra:
    raise ConfigError(f'A vmapped sweep traces model.dropout_rate only, and model.{extra[0]} '
                      f'drops at {cfg.dropout_rates[extra[0]]}: set model.{extra[0]}=0, or train '
                      'the runs one after another (vmap=False).')


def _batch_of(batches: list[dict], mesh) -> dict:
  """The runs' batches (each this process's rows) as global arrays (runs, batch, ...), the batch
  axis split over the mesh's data axis."""
  sharding = NamedSharding(mesh, P(None, DATA_AXIS))
  return {key: jax.make_array_from_process_local_data(
      sharding, np.stack([np.asarray(b[key]) for b in batches])) for key in batches[0]}


def lowered_step(runs: list[Run], batch: dict):
  """The stacked step of `runs` (one group) lowered for the runs' devices (a target's
  compile-only devices where they were built on them, as aot.compiled_stacked_step does) on
  abstract states and numbers, `batch` giving one run's batch as ShapeDtypeStructs."""
  _check_dropout(runs[0].model_config)
  program = _Program.of(runs)
  stacked = lambda a, s: jax.ShapeDtypeStruct((len(runs), *a.shape), a.dtype, sharding=s)
  state = jax.tree.map(stacked, runs[0].abstract_state, program.state_sharding)
  batch_sharding = NamedSharding(runs[0].mesh, P(None, DATA_AXIS))
  batches = {key: stacked(value, batch_sharding) for key, value in batch.items()}
  active = jax.ShapeDtypeStruct((len(runs),), jnp.bool_)
  numbers = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), program.numbers)
  return program.step.lower(state, batches, numbers, active)


@dataclasses.dataclass
class _Member:
  """One run of a group: what it writes to, where it stands, and how it ended."""
  run: Run
  workdir: str
  checkpoints: checkpoint.Checkpoints
  eval_step: object  # the group's first run's: one compile serves every run
  writer: object = None
  start: int = 0  # the step it resumed at
  step: int = 0
  batches: object = None
  window: loop.Window | None = None
  throughput: loop.Throughput | None = None
  error: str | None = None  # why it stopped early: a non-finite step

  def active(self) -> bool:
    return self.error is None and self.step < self.run.training.steps


def train_group(configs, workdirs: list[str]) -> list[str | None]:
  """Trains the runs of `configs` (one of `groups`) in `workdirs` as one program, each to its
  training.steps; returns for each None (finished) or the message of the non-finite step that
  stopped it (as train.train would raise it)."""
  if len(groups(configs)) != 1:
    raise ValueError('These runs differ in more than the vmapped numbers '
                     f'({", ".join(VMAPPED_KEYS)}): split them with vmapped.groups.')
  runs = [setup.build_run(c, w) for c, w in zip(configs, workdirs)]
  _check_dropout(runs[0].model_config)
  with contextlib.ExitStack() as stack:
    for workdir in workdirs:
      stack.enter_context(workdir_lock.held(workdir))
    members = []
    for run, workdir in zip(runs, workdirs):
      saved = checkpoint.Checkpoints(setup.checkpoint_dir(workdir), run.training.keep_checkpoints)
      member = _Member(run, workdir, saved, runs[0].eval_step)
      stack.callback(member.checkpoints.close)
      state, member.writer = loop.start_run(run, member.checkpoints, workdir, runs[0].eval_step)
      stack.callback(member.writer.close)
      member.start = member.step = int(state.step)
      members.append((member, state))
    if any(member.active() for member, _ in members):
      _train(runs, [m for m, _ in members], [s for _, s in members])
    return [member.error for member, _ in members]


def _train(runs: list[Run], members: list[_Member], states) -> None:
  program = _Program.of(runs)
  stacked = program.stack(states)
  del states
  for member in members:
    member.batches = member.run.data.train_iterator(member.step)
  first = _next_batches(members)
  compile_start = time.time()
  active = np.array([m.active() for m in members])
  compiled = program.step.lower(stacked, first, program.numbers, active).compile()
  log.info('Compiled the step of %d runs stacked in %.1f s; %s.', len(members),
           time.time() - compile_start, loop.step_memory(compiled, runs[0].mesh.local_devices[0]))
  # Throughput reads a batch's shapes alone: one run's, without fetching the stacked batch.
  one_run = {key: jax.ShapeDtypeStruct(value.shape[1:], value.dtype)
             for key, value in first.items()}
  for member in members:
    member.window, member.throughput = loop.Window(), loop.Throughput(member.run, one_run)
  preemption = checkpoint.PreemptionFlag()
  try:
    _loop(program, compiled, members, stacked, first, preemption)
  finally:
    preemption.restore()


def _next_batches(members: list[_Member]) -> dict:
  """The next batch of each active run; a waiting run takes another's (its result is dropped)."""
  batches = [next(m.batches) if m.active() else None for m in members]
  filler = next(b for b in batches if b is not None)
  return _batch_of([filler if b is None else b for b in batches], members[0].run.mesh)


def _loop(program: _Program, compiled, members: list[_Member], stacked, batch, preemption):
  """Steps every active run until each reaches its training.steps (or diverges); each run logs,
  checks, saves and evaluates at its own steps as train.train would. As there, the host checks
  a step's metrics after dispatching the next one, except at the steps where a run logs, saves
  or evaluates, or the sweep stops."""
  unstack = jax.jit(lambda s, i: jax.tree.map(lambda x: x[i], s),
                    out_shardings=members[0].run.state_sharding)
  last_progress, pending = 0.0, None
  while True:
    stepped = [m for m in members if m.active()]
    active = np.array([m in stepped for m in members])
    stacked, step_metrics = compiled(stacked, batch, program.numbers, active)
    if pending is not None:  # the previous step's metrics, fetched after dispatching this one
      _record(*pending)
    for member in stepped:
      member.step += 1
    stop = preemption.reached()
    progress = time.time() - last_progress >= loop.PROGRESS_SECONDS
    pending = (members, active, step_metrics)
    if stop or progress or any(_due(m) for m in stepped):
      _record(*pending)
      pending = None
      for index in np.flatnonzero(active):
        if members[index].error is None:
          _after_step(members[index], lambda i=index, s=stacked: unstack(s, i), stop, progress)
      if progress:
        last_progress = time.time()
    if stop:
      for member in members:
        member.checkpoints.wait()
      log.warning('SIGTERM: saved the checkpoints of the runs and stopped.')
      return
    if not any(m.active() for m in members):
      return
    batch = _next_batches(members)


def _due(member: _Member) -> bool:
  """Whether the run logs, saves or evaluates at the step it just made."""
  every = member.run.training
  return any(loop.itstime(member.step, n, every.steps)
             for n in (every.log_every, every.checkpoint_every, every.eval_every))


def _record(members: list[_Member], active, step_metrics) -> None:
  """Adds each stepped run's metrics to its window, checking them first: a run whose step was
  not finite is stopped ('diverged'), with train.train's message."""
  values = jax.device_get(step_metrics)
  for index in np.flatnonzero(active):
    member = members[index]
    if member.error is not None:
      continue
    try:  # member.step is still the step of these metrics
      member.window.add(member.step, jax.tree.map(lambda x, i=index: x[i], values),
                        member.checkpoints)
    except FloatingPointError as error:
      member.error = str(error)
      log.warning('%s diverged: %s', member.workdir, error)


def _after_step(member: _Member, state_of, stop: bool, progress: bool) -> None:
  """The host's part of one run's step after its check: its logging, saving and evaluation
  where they are due."""
  done, every, total = member.step, member.run.training, member.run.training.steps
  logged = loop.itstime(done, every.log_every, total)
  if logged or progress:
    summary = member.window.summary() | member.throughput.rates(member.window)
    if logged:
      member.writer.write(done, summary)
    if progress:
      member.writer.progress(done, member.start, summary)
  if loop.itstime(done, every.checkpoint_every, total) or stop:
    member.checkpoints.save(done, state_of())
  if loop.itstime(done, every.eval_every, total):
    loop.evaluate_and_log(member.run, member.eval_step,
                          member.run.model_params(state_of()), done, member.writer)
  if logged:
    member.window = loop.Window()
