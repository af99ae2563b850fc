"""Everything a run builds before its first compile, in the order data flows (config -> model ->
data -> mesh -> optimizer -> abstract state -> shardings), and the state it starts from: its own
checkpoint, another run's parameters, Hugging Face weights, or a fresh initialization."""
import dataclasses
import functools
import os

import logging
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import optax

from transformer_jax import config_lib, convert, data, lora, models
from transformer_jax.errors import CheckpointMismatchError, ConfigError, UserError
from transformer_jax.train import checkpoint, optim, sharding, towers
from transformer_jax.train.run_settings import RunSettings, resolve
from transformer_jax.train.step import (LoraState, StepSettings, TrainState, ema_decay_at,
                                        make_eval_step, make_train_step)

__all__ = [
    'boxed_abstract_state', 'build_run', 'checkpoint_dir', 'initial_state', 'layout', 'Layout',
    'restore_or_init', 'restore_trained', 'Run', 'saved_params', 'saved_steps', 'save_config',
    'save_tokenizer', 'starting_params', 'state_of', 'tokenizer_dir', 'weights_in_use']

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Layout:
  """The model, the optimizer and the train state's shapes and shardings on a mesh: what the
  run builds and the memory plan counts (on an abstract mesh), before anything compiles."""
  model: nn.Module
  tx: optax.GradientTransformation
  schedule: optax.Schedule
  state_sharding: TrainState  # a NamedSharding per leaf
  abstract_state: TrainState  # ShapeDtypeStructs, with those shardings


def layout(settings: RunSettings, mesh) -> Layout:
  """The Layout of resolved settings on `mesh` (a Mesh, or an AbstractMesh to plan on)."""
  model = models.build(settings.model)
  tx, schedule = optim.make_optimizer(settings.optimizer, settings.training.steps,
                                      settings.family.frozen(settings.model))
  boxed = boxed_abstract_state(model, tx, settings.family.example_inputs(settings.model),
                               settings.lora, ema=settings.training.ema_decay > 0)
  state_sharding = sharding.state_shardings(boxed, mesh, settings.rules)
  abstract = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                          nn.meta.unbox(boxed), state_sharding)
  return Layout(model, tx, schedule, state_sharding, abstract)


@dataclasses.dataclass(frozen=True)
class Run:
  """What a config builds before anything compiles."""
  settings: RunSettings
  data: data.Data
  mesh: jax.sharding.Mesh
  layout: Layout
  step_settings: StepSettings

  config = property(lambda self: self.settings.config)  # to save and compare, not to read
  model_config = property(lambda self: self.settings.model)
  family = property(lambda self: self.settings.family)
  training = property(lambda self: self.settings.training)
  lora = property(lambda self: self.settings.lora)
  model = property(lambda self: self.layout.model)
  tx = property(lambda self: self.layout.tx)
  schedule = property(lambda self: self.layout.schedule)
  state_sharding = property(lambda self: self.layout.state_sharding)
  abstract_state = property(lambda self: self.layout.abstract_state)

  @functools.cached_property
  def train_step(self):
    """The jitted step(state, batch) -> (state, metrics), the state donated (make_train_step),
    built once from the run's model, optimizer, mesh, shardings and step settings."""
    return make_train_step(self.model, self.family, self.tx, self.schedule, self.mesh,
                           self.state_sharding, self.step_settings)

  @functools.cached_property
  def eval_step(self):
    """The jitted eval(params, batch) -> summed loss terms (make_eval_step), on the run's
    mesh, parameter shardings and rules."""
    return make_eval_step(self.model, self.family, self.mesh, self.param_sharding,
                          self.step_settings.rules, self.data.token_bytes,
                          self.step_settings.logits_chunk)

  @property
  def param_sharding(self):
    """The shardings of the model's parameters (with LoRA, of the frozen base's)."""
    return getattr(self.state_sharding, 'base', self.state_sharding.params)

  @property
  def abstract_params(self):
    """The model's parameters as ShapeDtypeStructs (with LoRA, the frozen base's)."""
    return getattr(self.abstract_state, 'base', self.abstract_state.params)

  def model_params(self, state: TrainState):
    """The parameters the model runs with (evaluation, sampling), laid out as param_sharding:
    the moving average where the state keeps one, else the trained parameters; with LoRA, the
    base with those adapters merged in (a new tree)."""
    trained = state.params if state.ema is None else state.ema
    if not isinstance(state, LoraState):
      return trained
    return jax.jit(LoraState.model_params, out_shardings=self.param_sharding)(state, trained)


def weights_in_use(training, step: int) -> str:
  """Which weights evaluation and sampling run after `step` updates (Run.model_params): the
  moving average, with the decay of its last update (training.ema_decay warmed up:
  step.ema_decay_at), or the trained weights."""
  if not training.ema_decay:
    return 'the trained weights'
  if step == 0:
    return 'the moving average of the weights (at step 0, the initial weights)'
  decay = float(ema_decay_at(step - 1, training.ema_decay, training.ema_warmup))
  warming = (f', warming up to {training.ema_decay:g}'
             if training.ema_warmup and decay < training.ema_decay else '')
  return f'the moving average of the weights (decay {decay:.4g} at step {step}{warming})'


def build_run(config: 'ml_collections.ConfigDict | RunSettings', workdir: str | None = None,
              devices=None) -> Run:
  """Finds the data and lays out the state of a run (its RunSettings, or a config resolved here)
  on `devices` (default: all; a target's compile-only devices for --mode=compile); compiles
  nothing. A text run reads the tokenizer `workdir` saved, if any; the model's sizes that the
  data states (a tokenizer's ids, a dataset's classes) fill those left unset."""
  devices = devices if devices is not None else jax.devices()
  settings = resolve(config, devices[0].platform)
  family = settings.family
  dataset = data.make_data(settings.data, family.task, seed=settings.seed,
                           tokenizer_dir=workdir and tokenizer_dir(workdir),
                           **family.data_sizes(settings.model))
  cfg = family.follow_data(settings.model, dataset.info, 'The data')
  family.check_data(dataset.info, cfg)
  settings = settings.with_model(cfg)
  mesh = sharding.make_mesh(settings.mesh, devices)
  sharding.check_batches_divide(settings.data.batch_size, dataset.eval_batch_size, mesh,
                                settings.training.grad_accum_steps)
  log.info('Attention kernel: %s (%s).', settings.kernel.name, settings.kernel.reason)
  return Run(settings, dataset, mesh, layout(settings, mesh), StepSettings.of(settings))


def state_of(tx: optax.GradientTransformation, params, ema: bool = False) -> TrainState:
  """Step 0 of `params`, with a fresh optimizer state (and with `ema` their moving average, a
  copy of them)."""
  return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                    ema=_copy(params) if ema else None)


def _copy(params):
  # A buffer of its own: the step donates the state, and a leaf held twice cannot be donated.
  return jax.tree.map(lambda p: jnp.array(p, copy=True), params)


def initial_state(model: nn.Module, tx, inputs: tuple, rng, unbox: bool = True,
                  adapters: lora.LoraSettings | None = None, ema: bool = False) -> TrainState:
  """A freshly initialized state (boxed with logical axis names unless `unbox`); with
  `adapters` of a rank, a LoraState: fresh adapters (of the key fold_in(rng, 1)) trained over the
  initialized parameters, frozen; with `ema`, the moving average of what it trains."""
  params = model.init(rng, *inputs)['params']
  if adapters and adapters.rank:
    trained = lora.init_adapters(params, adapters, jax.random.fold_in(rng, 1))
    state = LoraState(step=jnp.zeros((), jnp.int32), params=trained, opt_state=tx.init(trained),
                      ema=_copy(trained) if ema else None, base=params, lora=adapters)
  else:
    state = state_of(tx, params, ema)
  return nn.meta.unbox(state) if unbox else state


def boxed_abstract_state(model: nn.Module, tx, inputs: tuple,
                         adapters: lora.LoraSettings | None = None,
                         ema: bool = False) -> TrainState:
  """The initial state's shapes and dtypes, boxed with their logical axis names; nothing is
  computed or allocated."""
  return jax.eval_shape(functools.partial(initial_state, model, tx, inputs, unbox=False,
                                          adapters=adapters, ema=ema), jax.random.key(0))


def checkpoint_dir(workdir: str) -> str:
  return os.path.join(workdir, 'checkpoints')


def tokenizer_dir(workdir: str) -> str:
  return os.path.join(workdir, 'tokenizer')


def save_tokenizer(run: Run, workdir: str) -> None:
  """The text run's tokenizer, in workdir/tokenizer, once (resumes and other modes read it)."""
  directory = tokenizer_dir(workdir)
  if (jax.process_index() == 0 and run.data.vocab is not None
      and data.tokenizer.saved(directory) is None):
    data.tokenizer.save(run.data.vocab, directory)


def restore_or_init(run: Run, checkpoints: checkpoint.Checkpoints, workdir: str) -> TrainState:
  """The train state to start from, placed directly with its shardings: the run's own latest
  readable checkpoint, else the parameters of config.init_from_checkpoint or
  config.init_from_hf with a fresh optimizer, else a fresh initialization."""
  try:
    state, step = checkpoints.restore_latest(run.abstract_state)
  except CheckpointMismatchError as error:
    advice = _resume_advice(run.config, workdir, error)
    raise CheckpointMismatchError(f'{error}\n{advice}', error.params_differ) from None
  if state is not None:
    log.info('Resumed from the checkpoint at step %d.', step)
    return state
  params = starting_params(run)
  init_rng = jax.random.fold_in(jax.random.key(run.settings.seed), 0)
  ema = run.training.ema_decay > 0
  init = functools.partial(initial_state, run.model, run.tx,
                           run.family.example_inputs(run.model_config), adapters=run.lora, ema=ema)
  if params is None:
    return jax.jit(init, out_shardings=run.state_sharding)(init_rng)
  if not run.lora.rank:
    return jax.jit(functools.partial(state_of, run.tx, ema=ema),
                   out_shardings=run.state_sharding)(params)
  # The adapters of a random init of the same seed over the starting params (XLA drops the
  # unused initialization of the base).
  start = lambda params, rng: init(rng).replace(base=params)
  return jax.jit(start, out_shardings=run.state_sharding)(params, init_rng)


def starting_params(run: Run):
  """The parameters of config.init_from_checkpoint or config.init_from_hf, with the parts the
  family starts from elsewhere (a dual encoder's towers: train.towers) taken from there; None
  for none of these."""
  params = _whole_model_start(run)
  parts = run.family.starts(run.model_config)
  if not parts:
    return params
  if params is None:  # a fresh initialization, as restore_or_init's, around the parts
    init_rng = jax.random.fold_in(jax.random.key(run.settings.seed), 0)
    inputs = run.family.example_inputs(run.model_config)
    fresh = lambda rng: nn.meta.unbox(run.model.init(rng, *inputs)['params'])
    params = jax.jit(fresh, out_shardings=run.param_sharding)(init_rng)
  log.info('Starting %s from %s.', ', '.join(parts), ', '.join(parts.values()))
  return towers.started(params, parts, run.model_config)


def _whole_model_start(run: Run):
  settings = run.settings
  if settings.init_from_checkpoint:
    workdir, _, step = settings.init_from_checkpoint.rpartition(':')
    if not workdir or not step.isdigit():
      workdir, step = settings.init_from_checkpoint, None
    params, found = _params_of_run(run, workdir, int(step) if step else None)
    log.info('Starting from the parameters of %s at step %d, with a fresh optimizer.', workdir,
             found)
    return params
  if settings.init_from_hf:
    log.info('Starting from the Hugging Face checkpoint %s.', settings.init_from_hf)
    return convert.load_params(settings.init_from_hf, run.model_config)
  return None


def _params_of_run(run: Run, workdir: str, step: int | None):
  """The parameters of another run's checkpoint (its latest readable one, or `step`), read-only."""
  if not os.path.isdir(checkpoint_dir(workdir)):
    raise ConfigError(f'init_from_checkpoint={run.settings.init_from_checkpoint}: {workdir} '
                      'holds no checkpoints/ folder; give the workdir of a trained run, optionally '
                      'with :STEP.')
  source = checkpoint.Checkpoints(checkpoint_dir(workdir), read_only=True)
  # With LoRA, the other run's parameters are the base: the state of a run without adapters.
  wanted = TrainState(step=run.abstract_state.step, params=run.abstract_params, opt_state=None,
                      ema=None)
  try:
    params, found = source.restore_latest(wanted, params_only=True, step=step)
    steps = source.all_steps()
  except CheckpointMismatchError as error:
    advice = _start_advice(run.config, workdir)
    raise CheckpointMismatchError(f'{error}\n{advice}', error.params_differ) from None
  finally:
    source.close()
  if params is None:
    raise ConfigError(f'init_from_checkpoint={run.settings.init_from_checkpoint}: no readable '
                      f'checkpoint{"" if step is None else f" at step {step}"} in {workdir} '
                      f'(steps there: {steps}).')
  return params, found


def restore_trained(config, workdir: str | None) -> tuple[Run, dict, int]:
  """(run, params, step) to evaluate or sample: the parameters alone of the workdir's latest
  readable checkpoint, else those a run would start from at step 0 (config.init_from_checkpoint
  or init_from_hf)."""
  run = build_run(config, workdir)
  if workdir and checkpoint.latest_step(workdir) is not None:
    params, step = saved_params(run, workdir)
    if params is not None:
      return run, params, step
  params = starting_params(run)
  if params is None:
    raise UserError(f'No readable checkpoint in {checkpoint_dir(workdir or "WORKDIR")}: train '
                    f'first (python launch.py --config ... --workdir {workdir}).')
  return run, jax.device_put(params, run.param_sharding), 0


def saved_params(run: Run, workdir: str,
                 step: int | None = None) -> tuple[dict | None, int | None]:
  """(params, step) that `run`'s model runs with (the moving average where the run keeps one)
  from the workdir's checkpoint of `step` (default: the latest readable one); (None, None) where
  there is none. Read-only: nothing in the workdir is written, renamed or deleted."""
  checkpoints = checkpoint.Checkpoints(checkpoint_dir(workdir), read_only=True)
  try:
    params, step = checkpoints.restore_latest(run.abstract_state, params_only=True, step=step)
  except CheckpointMismatchError as error:
    advice = (f'{_saved_differences(run.config, workdir)}\nUse the run\'s saved config: omit the '
              'flags that change the model.')
    raise CheckpointMismatchError(f'{error}\n{advice}', error.params_differ) from None
  finally:
    checkpoints.close()
  if params is None:
    return None, None
  log.info('Restored step %d: %s.', step, weights_in_use(run.training, step))
  return jax.device_put(params, run.param_sharding), step


def saved_steps(workdir: str) -> list[int]:
  """The steps of the workdir's checkpoints, oldest first (read-only)."""
  checkpoints = checkpoint.Checkpoints(checkpoint_dir(workdir), read_only=True)
  try:
    return checkpoints.all_steps()
  finally:
    checkpoints.close()


def _saved_differences(config, workdir: str) -> str:
  saved = config_lib.saved_config(workdir)
  if saved is None:
    return f'{workdir} holds no saved config to compare with.'
  shown = config_lib.differences(saved, config)
  if not shown:
    return f'The config saved with it ({workdir}/config.json) is the same as this one.'
  more = f' and {len(shown) - 8} more' if len(shown) > 8 else ''
  return (f'The config saved with it ({workdir}/config.json) differs in: '
          f'{"; ".join(shown[:8])}{more}.')


def _resume_advice(config, workdir: str, error: CheckpointMismatchError) -> str:
  lines = [_saved_differences(config, workdir),
           'To train the changed model, choose a new --workdir; to resume this run, run it with '
           'its saved config.']
  if not error.params_differ:
    lines.append('To go on from these parameters with the new optimizer settings, start a new run '
                 f'from them: --workdir NEW --config.init_from_checkpoint={workdir}')
  return '\n'.join(lines)


def _start_advice(config, workdir: str) -> str:
  return (f'{_saved_differences(config, workdir)}\nA run can start only from parameters of the '
          'shapes its model has: set the model keys as that run had them.')


def save_config(config, workdir: str) -> None:
  """Writes the resolved config as workdir/config.json, naming what changed since the saved one."""
  if jax.process_index() != 0:
    return
  saved = config_lib.saved_config(workdir)
  changed = config_lib.differences(saved, config) if saved else []
  if changed:
    log.warning('The config differs from the one saved in %s/config.json (%s); the run goes on '
                'with the new one and saves it.', workdir, '; '.join(changed))
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, config_lib.SAVED_CONFIG), 'w') as f:
    f.write(config.to_json_best_effort(indent=2, sort_keys=True))
