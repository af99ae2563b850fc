"""The training loop and the eval mode: config -> model -> abstract state -> shardings ->
jitted step -> metrics and checkpoints."""
import dataclasses
import functools
import os
import time

import logging
import flax.linen as nn
import jax
import numpy as np

from transformer_jax import accounting, config_lib, convert, data, models
from transformer_jax.errors import CheckpointMismatchError, ConfigError, UserError
from transformer_jax.train import checkpoint, metrics as metrics_lib, optim, sharding
from transformer_jax.train import step as step_lib

log = logging.getLogger(__name__)

# A progress line at least this often, whatever training.log_every says.
PROGRESS_SECONDS = 30.0


@dataclasses.dataclass
class Run:
  """Everything built from the config before the first compile."""
  config: object
  model_config: object
  model: nn.Module
  data: object
  mesh: jax.sharding.Mesh
  tx: object
  schedule: object
  init_state: object  # rng -> unboxed TrainState
  state_of: object  # params -> TrainState at step 0
  state_sharding: object
  abstract_state: object  # the TrainState's ShapeDtypeStructs, with their shardings


def build_run(config) -> Run:
  """Validates the config, finds the data and lays out the state; compiles nothing."""
  config_lib.validate(config)
  cfg = models.model_config(config.model)
  dataset = data.make_data(config.data, cfg.family, seed=config.seed)
  _check_data_fits_model(dataset.info, cfg)
  mesh = sharding.make_mesh(config.mesh)
  sharding.check_batches_divide(config.data.batch_size, dataset.eval_batch_size, mesh,
                                config.training.grad_accum_steps)
  model = models.build(cfg)
  tx, schedule = optim.make_optimizer(config.optimizer, config.training.steps)

  def state_of(params):
    return step_lib.TrainState(step=jax.numpy.zeros((), jax.numpy.int32), params=params,
                               opt_state=tx.init(params))

  def init_state(rng, unbox=True):
    state = state_of(model.init(rng, *models.example_inputs(cfg))['params'])
    return nn.meta.unbox(state) if unbox else state

  boxed = jax.eval_shape(functools.partial(init_state, unbox=False), jax.random.key(0))
  state_sharding = sharding.state_shardings(boxed, mesh, config.sharding_rules)
  abstract = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                          nn.meta.unbox(boxed), state_sharding)
  return Run(config, cfg, model, dataset, mesh, tx, schedule, init_state, state_of,
             state_sharding, abstract)


def _check_data_fits_model(info: dict, cfg) -> None:
  if cfg.family == 'vit':
    if info['num_classes'] != cfg.num_classes:
      raise ConfigError(f'The data has {info["num_classes"]} classes but model.num_classes='
                        f'{cfg.num_classes}: set --config.model.num_classes={info["num_classes"]}.')
    height, width, channels = info['image_shape']
    if (height, width, channels) != (cfg.image_size, cfg.image_size, cfg.num_channels):
      raise ConfigError(f'The images are {height}x{width}x{channels} but the model takes '
                        f'model.image_size={cfg.image_size}, model.num_channels='
                        f'{cfg.num_channels}: set --config.model.image_size={height}.')
  elif info['vocab_size'] > cfg.vocab_size:
    raise ConfigError(f'The data has {info["vocab_size"]} token ids but model.vocab_size='
                      f'{cfg.vocab_size}: set --config.model.vocab_size={info["vocab_size"]}.')


def checkpoint_dir(workdir: str) -> str:
  return os.path.join(workdir, 'checkpoints')


def restore_or_init(run: Run, checkpoints: checkpoint.Checkpoints, workdir: str):
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
  if params is not None:
    return jax.jit(run.state_of, out_shardings=run.state_sharding)(params)
  init_rng = jax.random.fold_in(jax.random.key(run.config.seed), 0)
  return jax.jit(run.init_state, out_shardings=run.state_sharding)(init_rng)


def starting_params(run: Run):
  """The parameters of config.init_from_checkpoint or config.init_from_hf; None for neither."""
  config = run.config
  if config.init_from_checkpoint:
    workdir, _, step = config.init_from_checkpoint.rpartition(':')
    if not workdir or not step.isdigit():
      workdir, step = config.init_from_checkpoint, None
    params, found = _params_of_run(run, workdir, int(step) if step else None)
    log.info('Starting from the parameters of %s at step %d, with a fresh optimizer.', workdir,
             found)
    return params
  if config.init_from_hf:
    log.info('Starting from the Hugging Face checkpoint %s.', config.init_from_hf)
    return convert.load_params(config.init_from_hf, run.model_config)
  return None


def _params_of_run(run: Run, workdir: str, step: int | None):
  """The parameters of another run's checkpoint (its latest readable one, or `step`), read-only."""
  if not os.path.isdir(checkpoint_dir(workdir)):
    raise ConfigError(f'init_from_checkpoint={run.config.init_from_checkpoint}: {workdir} holds no '
                      'checkpoints/ folder; give the workdir of a trained run, optionally with '
                      ':STEP.')
  source = checkpoint.Checkpoints(checkpoint_dir(workdir), read_only=True)
  try:
    params, found = source.restore_latest(run.abstract_state, params_only=True, step=step)
    steps = source.all_steps()
  except CheckpointMismatchError as error:
    advice = _start_advice(run.config, workdir)
    raise CheckpointMismatchError(f'{error}\n{advice}', error.params_differ) from None
  finally:
    source.close()
  if params is None:
    raise ConfigError(f'init_from_checkpoint={run.config.init_from_checkpoint}: no readable '
                      f'checkpoint{"" if step is None else f" at step {step}"} in {workdir} '
                      f'(steps there: {steps}).')
  return params, found


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


def train(config, workdir: str):
  """Trains for config.training.steps, resuming from the workdir's latest checkpoint."""
  run = build_run(config)
  checkpoints = checkpoint.Checkpoints(checkpoint_dir(workdir), config.training.keep_checkpoints)
  writer = None
  try:
    state = restore_or_init(run, checkpoints, workdir)
    _save_config(config, workdir)
    writer = metrics_lib.MetricWriter(workdir, config.training.steps)
    num_params = accounting.counted_params(run.model_config)['total']
    log.info('%s model, %s parameters, %d devices, mesh %s.', run.model_config.family,
             f'{num_params:,}', jax.device_count(), dict(run.mesh.shape))
    eval_step = step_lib.make_eval_step(run.model, run.model_config.family, run.mesh,
                                        run.state_sharding.params)
    start = int(state.step)
    if _evaluation_missing(config, start, workdir):
      log.info('The evaluation at step %d is missing from metrics.jsonl: running it first.', start)
      _evaluate(run, eval_step, state.params, start, writer)
    if start >= config.training.steps:
      log.info('Nothing to do: the checkpoint is at step %d of %d.', start, config.training.steps)
      return state
    return _train_from(run, state, eval_step, checkpoints, writer)
  finally:
    checkpoints.close()
    if writer is not None:
      writer.close()


def _train_from(run, state, eval_step, checkpoints, writer):
  config = run.config
  train_step = step_lib.make_train_step(run.model, run.model_config.family, run.tx, run.schedule,
                                        config, run.mesh, run.state_sharding)
  batches = run.data.train_iterator(int(state.step))
  first = sharding.global_batch(next(batches), run.mesh)
  compile_start = time.time()
  compiled = train_step.lower(state, first).compile()
  log.info('Compiled the train step in %.1f s.', time.time() - compile_start)
  throughput = _Throughput(run, first, config)
  preemption = checkpoint.PreemptionFlag()
  try:
    return _loop(run, compiled, eval_step, state, first, batches, checkpoints, writer, throughput,
                 preemption)
  finally:
    preemption.restore()


def _evaluation_missing(config, step: int, workdir: str) -> bool:
  """Whether an evaluation was due at `step` (a resumed run's first step) and metrics.jsonl lacks
  it: the run was stopped between saving that checkpoint and finishing the evaluation. Process 0
  decides, for every process."""
  due = step > 0 and (step % config.training.eval_every == 0 or step >= config.training.steps)
  missing = due and step not in metrics_lib.logged_eval_steps(workdir)
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    missing = bool(multihost_utils.broadcast_one_to_all(np.array(missing)))
  return missing


def _loop(run, train_step, eval_step, state, batch, batches, checkpoints, writer, throughput,
          preemption):
  """Steps until config.training.steps. Every step's metrics are checked (finite loss, gradient
  and parameters) before its state can be saved, one step behind the device except at the steps
  that log, save, evaluate or stop."""
  config = run.config.training
  start, total = int(state.step), run.config.training.steps
  window = _Window()
  pending = None
  last_progress = 0.0  # the first step prints at once
  for step in range(start, total):
    state, step_metrics = train_step(state, batch)
    if pending is not None:  # fetch step t-1's metrics after dispatching step t
      window.add(*pending, checkpoints)
    pending = (step + 1, step_metrics)
    done = step + 1
    stop = preemption.reached()
    logged = done % config.log_every == 0 or done == total
    saved = done % config.checkpoint_every == 0 or done == total or stop
    evaluated = done % config.eval_every == 0 or done == total
    progress = time.time() - last_progress >= PROGRESS_SECONDS
    if logged or saved or evaluated or stop or progress:
      window.add(*pending, checkpoints)
      pending = None
    if logged or progress:
      summary = window.summary() | throughput.rates(window)
      if logged:
        writer.write(done, summary)
      writer.progress(done, start, summary)
      last_progress = time.time()
    if saved:
      checkpoints.save(done, state)
    if evaluated:
      _evaluate(run, eval_step, state.params, done, writer)
    if stop:
      checkpoints.wait()
      log.warning('SIGTERM: saved the checkpoint at step %d and stopped.', done)
      break
    if logged:  # after evaluation and saving, so that the next window times steps only
      window = _Window()
    if done < total:
      batch = sharding.global_batch(next(batches), run.mesh)
  return state


class _Window:
  """Host-side sums of the metrics of the steps since the last log line."""

  def __init__(self):
    self.sums = {'loss': 0.0, 'correct': 0.0, 'weight': 0.0}
    self.last = {}
    self.steps = 0
    self.start = time.time()

  def add(self, step, device_metrics, checkpoints):
    values = jax.device_get(device_metrics)
    _check_finite(step, values, checkpoints)
    for key in self.sums:
      self.sums[key] += float(values[key])
    self.last = {'grad_norm': float(values['grad_norm']),
                 'learning_rate': float(values['learning_rate'])}
    self.steps += 1

  def summary(self) -> dict:
    weight = max(self.sums['weight'], 1e-9)
    return {'loss': self.sums['loss'] / weight, 'accuracy': self.sums['correct'] / weight,
            **self.last}


def _check_finite(step: int, values: dict, checkpoints) -> None:
  """Raises FloatingPointError when a step's loss, gradient or updated parameters are not all
  finite. The loop checks every step before it saves, so the checkpoint it names holds finite
  parameters."""
  problems = [name for name, finite in (
      ('loss', np.isfinite(values['loss'])), ('gradient norm', np.isfinite(values['grad_norm'])),
      ('parameters after the update', values['params_finite'])) if not finite]
  if not problems:
    return
  checkpoints.wait()  # a save still being written is not yet a checkpoint to name
  latest = checkpoints.latest_step()
  where = (f'the last good checkpoint (finite parameters) is step {latest} in '
           f'{checkpoints.directory}' if latest is not None else 'no checkpoint was saved yet')
  raise FloatingPointError(f'Non-finite {" and ".join(problems)} at step {step} (loss '
                           f'{float(values["loss"]):.4g}, gradient norm '
                           f'{float(values["grad_norm"]):.4g}); this state was not saved, and '
                           f'{where}.')


class _Throughput:
  """Examples and tokens per second and MFU of a window of steps."""

  def __init__(self, run, batch, config):
    cfg = run.model_config
    self.examples = config.data.batch_size
    if cfg.family == 'vit':
      self.tokens, flops = 0, accounting.forward_flops(cfg)
    elif cfg.family == 'encoder_decoder':
      self.tokens = batch['decoder_inputs'].shape[1]
      flops = accounting.forward_flops(cfg, batch['inputs'].shape[1], self.tokens)
    else:
      self.tokens = batch['inputs'].shape[1]
      flops = accounting.forward_flops(cfg, self.tokens)
    self.train_flops_per_example = 3 * flops['total']
    self.peak, source = metrics_lib.peak_flops_per_device(config.training.peak_flops_per_device)
    _log_once(f'MFU: model FLOPs from the accounting module over the peak, {source}.')

  def rates(self, window) -> dict:
    seconds = max(time.time() - window.start, 1e-9)
    examples = window.steps * self.examples / seconds
    out = {'examples_per_sec': examples, 'step_time': seconds / max(window.steps, 1)}
    if self.tokens:
      out['tokens_per_sec'] = examples * self.tokens
    if self.peak:
      out['mfu'] = examples * self.train_flops_per_example / (self.peak * jax.device_count())
    return out


@functools.cache
def _log_once(message: str) -> None:
  """Once per process: a sweep trains many runs and the message is the same for each."""
  log.info(message)


def evaluate_params(run, eval_step, params) -> dict:
  sums = {'loss': 0.0, 'correct': 0.0, 'weight': 0.0}
  for batch in run.data.eval_batches():
    out = jax.device_get(eval_step(params, sharding.global_batch(batch, run.mesh)))
    for key in sums:
      sums[key] += float(out[key])
  weight = max(sums['weight'], 1e-9)
  return {'eval_loss': sums['loss'] / weight, 'eval_accuracy': sums['correct'] / weight}


def _evaluate(run, eval_step, params, step: int, writer) -> None:
  results = evaluate_params(run, eval_step, params)
  writer.write(step, results)
  log.info('step %d | held-out loss %.4f | accuracy %.4f', step, results['eval_loss'],
           results['eval_accuracy'])


def restore_trained(config, workdir: str | None) -> tuple[Run, dict, int]:
  """(run, params, step) to evaluate or sample: the parameters alone of the workdir's latest
  readable checkpoint, else those a run would start from at step 0 (config.init_from_checkpoint
  or init_from_hf)."""
  # Read-only: nothing in the workdir is written, renamed or deleted.
  run = build_run(config)
  if workdir and checkpoint.latest_step(workdir) is not None:
    checkpoints = checkpoint.Checkpoints(checkpoint_dir(workdir), read_only=True)
    try:
      params, step = checkpoints.restore_latest(run.abstract_state, params_only=True)
    except CheckpointMismatchError as error:
      advice = (f'{_saved_differences(config, workdir)}\nUse the run\'s saved config: omit the '
                'flags that change the model.')
      raise CheckpointMismatchError(f'{error}\n{advice}', error.params_differ) from None
    finally:
      checkpoints.close()
    if params is not None:
      return run, params, step
  params = starting_params(run)
  if params is None:
    raise UserError(f'No readable checkpoint in {checkpoint_dir(workdir or "WORKDIR")}: train '
                    f'first (python launch.py --config ... --workdir {workdir}).')
  return run, jax.device_put(params, run.state_sharding.params), 0


def evaluate(config, workdir: str | None) -> dict:
  """--mode=eval: the parameters of the workdir's latest checkpoint on the held-out split."""
  run, params, step = restore_trained(config, workdir)
  eval_step = step_lib.make_eval_step(run.model, run.model_config.family, run.mesh,
                                      run.state_sharding.params)
  results = evaluate_params(run, eval_step, params)
  log.info('Step %d: %s', step, results)
  return {'step': step, **results}


def _save_config(config, workdir: str) -> None:
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
