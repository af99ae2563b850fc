"""The training loop and the eval mode: config -> model -> abstract state -> shardings ->
jitted step -> metrics and checkpoints."""
import dataclasses
import functools
import json
import os
import time

import logging
import flax.linen as nn
import jax
import numpy as np

from transformer_jax import accounting, convert, data, models
from transformer_jax.train import checkpoint, metrics as metrics_lib, optim, sharding, step as step_lib

log = logging.getLogger(__name__)


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
  checkpoints: checkpoint.Checkpoints


def build_run(config, workdir: str) -> Run:
  """Validates the config, finds the data and lays out the state; compiles nothing."""
  cfg = models.model_config(config.model)
  dataset = data.make_data(config.data, cfg.family, seed=config.seed)
  _check_data_fits_model(dataset.info, cfg)
  mesh = sharding.make_mesh(config.mesh)
  sharding.check_batch_divides(config.data.batch_size, mesh, config.training.grad_accum_steps)
  model = models.build(cfg)
  tx, schedule = optim.make_optimizer(config.optimizer, config.training.steps)

  def state_of(params):
    return step_lib.TrainState(step=jax.numpy.zeros((), jax.numpy.int32), params=params,
                               opt_state=tx.init(params))

  def init_state(rng, unbox=True):
    state = state_of(model.init(rng, *models.example_inputs(cfg))['params'])
    return nn.meta.unbox(state) if unbox else state

  abstract = jax.eval_shape(functools.partial(init_state, unbox=False), jax.random.key(0))
  state_sharding = sharding.state_shardings(abstract, mesh, config.sharding_rules)
  return Run(config, cfg, model, dataset, mesh, tx, schedule, init_state, state_of, state_sharding,
             checkpoint.Checkpoints(workdir, config.training.keep_checkpoints))


def _check_data_fits_model(info: dict, cfg) -> None:
  if cfg.family == 'vit':
    if info['num_classes'] != cfg.num_classes:
      raise ValueError(f'The data has {info["num_classes"]} classes but model.num_classes='
                       f'{cfg.num_classes}: set --config.model.num_classes={info["num_classes"]}.')
  elif info['vocab_size'] > cfg.vocab_size:
    raise ValueError(f'The data has {info["vocab_size"]} token ids but model.vocab_size='
                     f'{cfg.vocab_size}: set --config.model.vocab_size={info["vocab_size"]}.')


def restore_or_init(run: Run):
  """The latest readable checkpoint, else the Hugging Face weights of config.init_from_hf, else
  a fresh state; each placed directly with its shardings."""
  abstract = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                          jax.eval_shape(run.init_state, jax.random.key(0)), run.state_sharding)
  state, step = run.checkpoints.restore_latest(abstract)
  if state is not None:
    log.info('Resumed from the checkpoint at step %d.', step)
    return state
  if run.config.init_from_hf:
    log.info('Starting from the Hugging Face checkpoint %s.', run.config.init_from_hf)
    params = convert.load_params(run.config.init_from_hf, run.model_config)
    return jax.jit(run.state_of, out_shardings=run.state_sharding)(params)
  init_rng = jax.random.fold_in(jax.random.key(run.config.seed), 0)
  return jax.jit(run.init_state, out_shardings=run.state_sharding)(init_rng)


def train(config, workdir: str):
  """Trains for config.training.steps, resuming from the workdir's latest checkpoint."""
  run = build_run(config, workdir)
  _save_config(config, workdir)
  state = restore_or_init(run)
  start = int(state.step)
  total = config.training.steps
  writer = metrics_lib.MetricWriter(workdir, total)
  num_params = accounting.counted_params(run.model_config)['total']
  log.info('%s model, %s parameters, %d devices, mesh %s.', run.model_config.family,
               f'{num_params:,}', jax.device_count(), dict(run.mesh.shape))
  train_step = step_lib.make_train_step(run.model, run.model_config.family, run.tx, run.schedule,
                                        config, run.mesh, run.state_sharding)
  eval_step = step_lib.make_eval_step(run.model, run.model_config.family, run.mesh,
                                      run.state_sharding.params)
  if start >= total:
    log.info('Nothing to do: the checkpoint is at step %d of %d.', start, total)
    return state
  batches = run.data.train_iterator(start)
  first = sharding.global_batch(next(batches), run.mesh)
  compile_start = time.time()
  compiled = train_step.lower(state, first).compile()
  log.info('Compiled the train step in %.1f s.', time.time() - compile_start)
  throughput = _Throughput(run, first, config)
  preemption = checkpoint.PreemptionFlag()
  try:
    state = _loop(run, compiled, eval_step, state, first, batches, writer, throughput, preemption)
  finally:
    preemption.restore()
    run.checkpoints.close()
    writer.close()
  return state


def _loop(run, train_step, eval_step, state, batch, batches, writer, throughput, preemption):
  config = run.config.training
  start, total = int(state.step), run.config.training.steps
  window = _Window()
  pending = None
  for step in range(start, total):
    state, step_metrics = train_step(state, batch)
    if pending is not None:  # fetch step t-1's metrics after dispatching step t
      window.add(*pending, run.checkpoints)
    pending = (step + 1, step_metrics)
    done = step + 1
    stop = preemption.reached()
    boundary = done == total or any(done % every == 0 for every in (
        config.log_every, config.eval_every, config.checkpoint_every))
    if boundary or stop:
      window.add(*pending, run.checkpoints)
      pending = None
    logged = done % config.log_every == 0 or done == total
    if logged:
      summary = window.summary() | throughput.rates(window)
      writer.write(done, summary)
      writer.progress(done, start, summary)
    if done % config.checkpoint_every == 0 or done == total or stop:
      run.checkpoints.save(done, state)
    if done % config.eval_every == 0 or done == total:
      writer.write(done, evaluate_params(run, eval_step, state.params))
    if stop:
      run.checkpoints.wait()
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
    if not np.isfinite(values['loss']):
      latest = checkpoints.latest_step()
      where = (f'the last good checkpoint is step {latest} in {checkpoints.directory}'
               if latest is not None else 'no checkpoint was saved yet')
      raise FloatingPointError(f'Non-finite loss at step {step}; {where}.')
    for key in self.sums:
      self.sums[key] += float(values[key])
    self.last = {'grad_norm': float(values['grad_norm']),
                 'learning_rate': float(values['learning_rate'])}
    self.steps += 1

  def summary(self) -> dict:
    weight = max(self.sums['weight'], 1e-9)
    return {'loss': self.sums['loss'] / weight, 'accuracy': self.sums['correct'] / weight,
            **self.last}


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
    log.info('MFU: model FLOPs from the accounting module over the peak, %s.', source)

  def rates(self, window) -> dict:
    seconds = max(time.time() - window.start, 1e-9)
    examples = window.steps * self.examples / seconds
    out = {'examples_per_sec': examples, 'step_time': seconds / max(window.steps, 1)}
    if self.tokens:
      out['tokens_per_sec'] = examples * self.tokens
    if self.peak:
      out['mfu'] = examples * self.train_flops_per_example / (self.peak * jax.device_count())
    return out


def evaluate_params(run, eval_step, params) -> dict:
  sums = {'loss': 0.0, 'correct': 0.0, 'weight': 0.0}
  for batch in run.data.eval_batches():
    out = jax.device_get(eval_step(params, sharding.global_batch(batch, run.mesh)))
    for key in sums:
      sums[key] += float(out[key])
  weight = max(sums['weight'], 1e-9)
  return {'eval_loss': sums['loss'] / weight, 'eval_accuracy': sums['correct'] / weight}


def restore_trained(config, workdir: str) -> tuple[Run, object]:
  """The run and the state of the workdir's latest checkpoint; an error if there is none."""
  run = build_run(config, workdir)
  if run.checkpoints.latest_step() is None and not config.init_from_hf:
    raise FileNotFoundError(f'No checkpoint in {run.checkpoints.directory}: train first '
                            f'(python launch.py --config ... --workdir {workdir}).')
  return run, restore_or_init(run)


def evaluate(config, workdir: str) -> dict:
  """--mode=eval: the latest checkpoint of the workdir on the held-out split."""
  run, state = restore_trained(config, workdir)
  eval_step = step_lib.make_eval_step(run.model, run.model_config.family, run.mesh,
                                      run.state_sharding.params)
  results = evaluate_params(run, eval_step, state.params)
  run.checkpoints.close()
  log.info('Step %d: %s', int(state.step), results)
  return {'step': int(state.step), **results}


def _save_config(config, workdir: str) -> None:
  if jax.process_index() != 0:
    return
  os.makedirs(workdir, exist_ok=True)
  path = os.path.join(workdir, 'config.json')
  resolved = config.to_json_best_effort(indent=2, sort_keys=True)
  if os.path.exists(path):
    with open(path) as f:
      if json.load(f) != json.loads(resolved):
        log.warning('The config differs from the one saved in %s; the run resumes with the '
                        'new one and saves it.', path)
  with open(path, 'w') as f:
    f.write(resolved)
