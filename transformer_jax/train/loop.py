"""The training loop and the eval mode: a Run (train.setup) -> its starting state -> the jitted
step -> metrics and checkpoints."""
import functools
import os
import time

import logging
import math
import jax
from jax.experimental import multihost_utils
import numpy as np

from transformer_jax import accounting, decode, image_scores, layers
from transformer_jax.train import checkpoint, metrics as metrics_lib, setup, sharding, workdir_lock
from transformer_jax.settings import TrainingSettings
from transformer_jax.train.setup import Run, build_run, restore_trained

__all__ = ['check_finite', 'evaluate', 'evaluate_and_log', 'evaluate_params', 'evaluation_missing',
           'itstime', 'profile_dir', 'PROGRESS_SECONDS', 'start_run', 'step_memory', 'Throughput',
           'train', 'Window']

log = logging.getLogger(__name__)

# A progress line at least this often, whatever training.log_every says.
PROGRESS_SECONDS = 30.0


def itstime(step: int, every: int, total: int) -> bool:
  """Whether the step just done is a multiple of `every`, or the last."""
  return step % every == 0 or step == total


def train(config, workdir: str):
  """Trains for config.training.steps, resuming from the workdir's latest checkpoint. Refuses a
  workdir that another run trains in (workdir_lock)."""
  run = build_run(config, workdir)  # writes nothing: a config it refuses leaves no trace
  check_evaluation(run)
  with workdir_lock.held(workdir):
    return _train(run, workdir)


def _train(run: Run, workdir: str):
  checkpoints = checkpoint.Checkpoints(setup.checkpoint_dir(workdir),
                                       run.training.keep_checkpoints)
  writer = None
  try:
    state, writer = start_run(run, checkpoints, workdir, run.eval_step)
    if int(state.step) >= run.training.steps:
      log.info('Nothing to do: the checkpoint is at step %d of %d.', int(state.step),
               run.training.steps)
      return state
    return _train_from(run, state, run.eval_step, checkpoints, writer, workdir)
  finally:
    checkpoints.close()
    if writer is not None:
      writer.close()


def start_run(run: Run, checkpoints, workdir: str, eval_step):
  """(state, metric writer) of a run about to train: its checkpoint or initial state, its config
  and tokenizer saved, and the evaluation a stopped run still owes made up. The caller closes
  the writer."""
  state = setup.restore_or_init(run, checkpoints, workdir)
  setup.save_config(run.config, workdir)
  setup.save_tokenizer(run, workdir)
  writer = metrics_lib.MetricWriter(workdir, run.training.steps)
  try:
    log.info('%s model, %s parameters, %d devices, mesh %s.', run.family.name,
             f'{accounting.count_params(run.abstract_params)["total"]:,}', jax.device_count(),
             dict(run.mesh.shape))
    if run.lora.rank:
      log.info('LoRA: %s adapter parameters train, the rest is frozen.',
               f'{accounting.count_params(state.params)["total"]:,}')
    start = int(state.step)
    if evaluation_missing(run.training, start, workdir):
      log.info('The evaluation at step %d is missing from metrics.jsonl: running it first.', start)
      evaluate_and_log(run, eval_step, run.model_params(state), start, writer)
  except BaseException:
    writer.close()
    raise
  return state, writer


def step_memory(compiled, device) -> str:
  """What XLA says the step needs per device, and of how much where the device says. The device
  must be this process's own: other processes' devices have no memory stats here."""
  needs = metrics_lib.compiled_memory(compiled)
  if needs is None:
    return 'XLA reports no memory analysis here'
  limit = (device.memory_stats() or {}).get('bytes_limit')
  of = f' of {limit / 2**30:.2f}' if limit else ''
  return f'it needs {needs["total"] / 2**30:.2f}{of} GiB per device (XLA\'s memory analysis)'


def _train_from(run: Run, state, eval_step, checkpoints, writer, workdir: str):
  """Compiles the step on the first batch, then runs the loop under a SIGTERM handler (and the
  profiler, for the steps of training.profile_start)."""
  batches = run.data.train_iterator(int(state.step))
  first = sharding.global_batch(next(batches), run.mesh)
  compile_start = time.time()
  compiled = run.train_step.lower(state, first).compile()
  log.info('Compiled the train step in %.1f s; %s.', time.time() - compile_start,
           step_memory(compiled, run.mesh.local_devices[0]))
  preemption = checkpoint.PreemptionFlag()
  profile = _Profile(run.training, profile_dir(workdir))
  try:
    return _loop(run, compiled, eval_step, state, first, batches, checkpoints, writer,
                 Throughput(run, first), preemption, profile)
  finally:
    preemption.restore()
    profile.stop()


def evaluation_missing(training: TrainingSettings, step: int, workdir: str) -> bool:
  """Whether an evaluation was due at `step` (a resumed run's first step) and metrics.jsonl lacks
  it: the run was stopped between saving that checkpoint and finishing the evaluation. Process 0
  decides, for every process."""
  due = step > 0 and (step % training.eval_every == 0 or step >= training.steps)
  missing = due and step not in metrics_lib.logged_eval_steps(workdir)
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    missing = bool(multihost_utils.broadcast_one_to_all(np.array(missing)))
  return missing


def _loop(run, train_step, eval_step, state, batch, batches, checkpoints, writer, throughput,
          preemption, profile):
  """Steps until config.training.steps. Every step's metrics are checked (finite loss, gradient
  and parameters) before its state can be saved, one step behind the device except at the steps
  that log, save, evaluate or stop."""
  every = run.training
  start, total = int(state.step), run.training.steps
  window, pending = Window(), None
  last_progress = 0.0  # the first step prints at once
  for step in range(start, total):
    profile.before(step)
    state, step_metrics = train_step(state, batch)
    profile.after(step, (state, step_metrics))
    if pending is not None:  # fetch step t-1's metrics after dispatching step t
      window.add(*pending, checkpoints)
    pending = (step + 1, step_metrics)
    done, stop = step + 1, preemption.reached()
    logged = itstime(done, every.log_every, total)
    saved = itstime(done, every.checkpoint_every, total) or stop
    evaluated = itstime(done, every.eval_every, total)
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
      evaluate_and_log(run, eval_step, run.model_params(state), done, writer)
    if stop:
      checkpoints.wait()
      log.warning('SIGTERM: saved the checkpoint at step %d and stopped.', done)
      break
    if logged:  # after evaluation and saving, so that the next window times steps only
      window = Window()
    if done < total:
      batch = sharding.global_batch(next(batches), run.mesh)
  return state


def profile_dir(workdir: str) -> str:
  """Where this process writes its profile: WORKDIR/profile, or WORKDIR/profile/process_I
  when there are several processes (traces of one host's processes would share a name)."""
  directory = os.path.join(workdir, 'profile')
  if jax.process_count() > 1:
    directory = os.path.join(directory, f'process_{jax.process_index()}')
  return directory


class _Profile:
  """A jax.profiler trace of the training.profile_steps steps from step
  training.profile_start, numbered as the log numbers them (step 1 is the first), where the run
  runs that step: a run resumed past it traces nothing."""

  def __init__(self, training: TrainingSettings, directory: str):
    self.first = training.profile_start
    self.last = None if self.first is None else self.first + training.profile_steps - 1
    self.directory = directory
    self.tracing = False

  def before(self, step: int) -> None:
    """Starts the trace before the loop's `step` (0-based: it makes step + 1) where due."""
    if step + 1 == self.first:
      jax.profiler.start_trace(self.directory)
      self.tracing = True

  def after(self, step: int, outputs) -> None:
    if self.tracing and step + 1 == self.last:
      self.stop(outputs)

  def stop(self, outputs=None) -> None:
    """Ends the trace once the device has run what it holds (`outputs`: the last step's)."""
    if not self.tracing:
      return
    jax.block_until_ready(outputs)
    jax.profiler.stop_trace()
    self.tracing = False
    log.info('Wrote a profile of steps %d to %d to %s: open it with tensorboard --logdir %s '
             '(the profile plugin), or its *.trace.json.gz in ui.perfetto.dev.', self.first,
             self.last, self.directory, self.directory)


# Summed terms reported under another name, as a mean per unit of weight.
_MEAN_NAMES = {'correct': 'accuracy', 'correct_top5': 'top5_accuracy'}
_STEP_VALUES = ('grad_norm', 'learning_rate')  # of the last step, not summed
_NOT_REPORTED = ('weight', 'params_finite', 'bytes')


def means(sums: dict) -> dict:
  """Each summed term of a step or an evaluation (losses.batch_sums, a family's own loss) over
  the summed weight: 'loss', 'correct' as 'accuracy', a family's own terms by their names; a
  term NAME over a subset of the examples (DiT's loss by timestep quarter) over its own summed
  weight 'weight_NAME'."""
  weight_of = lambda key: max(sums.get(f'weight_{key}', sums['weight']), 1e-9)
  return {_MEAN_NAMES.get(key, key): value / weight_of(key) for key, value in sums.items()
          if key not in _NOT_REPORTED and not key.startswith('weight_')}


class Window:
  """Host-side sums of the metrics of the steps since the last log line."""

  def __init__(self):
    self.sums = {}
    self.last = {}
    self.steps = 0
    self.start = time.time()

  def add(self, step, device_metrics, checkpoints):
    values = jax.device_get(device_metrics)
    check_finite(step, values, checkpoints)
    for key, value in values.items():
      if key not in _STEP_VALUES:
        self.sums[key] = self.sums.get(key, 0.0) + float(value)
    self.last = {key: float(values[key]) for key in _STEP_VALUES}
    self.steps += 1

  def summary(self) -> dict:
    return {**means(self.sums), **self.last}


def check_finite(step: int, values: dict, checkpoints) -> None:
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


class Throughput:
  """Examples (and tokens) per second and MFU of a window of steps."""

  def __init__(self, run: Run, batch: dict):
    self.examples = run.data.batch_size
    flops = accounting.forward_flops(run.model_config, *run.family.lengths(batch))
    self.tokens = flops['tokens'] if run.family.per_token else 0
    self.train_flops_per_example = 3 * flops['total']
    self.peak, source = metrics_lib.peak_flops_per_device(run.training.peak_flops_per_device,
                                                          run.mesh.devices.flat[0])
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


def check_evaluation(run: Run) -> None:
  """Refuses, before anything compiles, evaluation settings the task cannot score (its
  check_evaluation: a dual encoder's zero-shot dataset, split and classes)."""
  check = getattr(run.data.task, 'check_evaluation', None)
  if check is not None:
    check(run.settings.eval)


def evaluate_params(run: Run, eval_step, params) -> dict:
  """eval_loss and eval_accuracy over the held-out batches; for a classifier
  eval_top5_accuracy, for text eval_bits_per_byte (the summed loss in bits over the UTF-8 bytes
  of the target tokens it scored); what a task measures of the model's decoding (its
  generation_metrics: an encoder-decoder's eval_exact_match, a translation's eval_bleu, speech's
  eval_wer, from greedy decoding or config.eval's beam search); what a task measures of the model's
  embeddings (its embedding_metrics: a dual encoder's retrieval recalls and zero-shot
  accuracy); what the family adds (Family.evaluate: a DiT's bound in bits per dimension and
  scores of its samples)."""
  sums = {}
  for batch in run.data.eval_batches():
    out = jax.device_get(eval_step(params, sharding.global_batch(batch, run.mesh)))
    for key, value in out.items():
      sums[key] = sums.get(key, 0.0) + float(value)
  results = {f'eval_{name}': value for name, value in means(sums).items()}
  if sums.get('bytes'):
    results['eval_bits_per_byte'] = sums['loss'] / math.log(2) / sums['bytes']
  if run.family.evaluate is not None:
    results.update(run.family.evaluate(run, params))
  if getattr(run.settings.eval, 'scores_samples', False):  # a generative family's settings
    results.update(image_scores.evaluate_samples(run, params, restore_trained))
  measure = getattr(run.data.task, 'generation_metrics', None)
  if measure is not None:
    results.update(measure(functools.partial(_decoded, run, params), run.data.eval_batch_size))
  embedded = getattr(run.data.task, 'embedding_metrics', None)  # a dual encoder's
  if embedded is not None:
    results.update(embedded(_embedder(run, params), run.data.eval_batch_size, run.settings.eval))
  return results


def _embedder(run: Run, params):
  """embed(method, inputs) -> float32 numpy (n, D): the model's `method` ('embed_images',
  'embed_texts') on n <= eval_batch_size rows, padded to that batch so that one compiled
  function serves every call. Every process reads the same rows, so the batch is made from a
  whole host copy and the embeddings gathered back to every process."""
  size = run.data.eval_batch_size
  batch_sharding = sharding.batch_sharding(run.mesh)

  @functools.partial(jax.jit, static_argnames='method')
  def apply(params, inputs, method):
    with sharding.activation_rules(run.mesh, run.step_settings.rules), layers.row_blocks():
      return run.model.apply({'params': params}, inputs, method=method)

  def embed(method: str, inputs: np.ndarray) -> np.ndarray:
    count = len(inputs)
    padded = np.concatenate([inputs, np.repeat(inputs[-1:], size - count, axis=0)])
    batch = jax.make_array_from_callback(padded.shape, batch_sharding, lambda i: padded[i])
    embedded = apply(params, batch, method=method)
    return np.asarray(multihost_utils.process_allgather(embedded, tiled=True))[:count]
  return embed


def _decoded(run: Run, params, **keywords) -> np.ndarray:
  """decode.generate's tokens (B, N) with `keywords`, greedy or, with config.eval.beam_size,
  the best beam of decode.beam_search."""
  settings = run.settings.eval
  if not settings.beam_size:
    return jax.device_get(decode.generate(run.model, params, **keywords).tokens)
  beams = decode.beam_search(run.model, params, beam_size=settings.beam_size,
                             length_penalty=settings.length_penalty, **keywords)
  return jax.device_get(beams.tokens[:, 0])


def evaluate_and_log(run: Run, eval_step, params, step: int, writer) -> None:
  results = evaluate_params(run, eval_step, params)
  writer.write(step, results)
  shown = {'eval_accuracy': 'accuracy {:.4f}', 'eval_top5_accuracy': 'top-5 {:.4f}',
           'eval_bits_per_byte': '{:.4f} bits per byte', 'eval_exact_match': 'exact match {:.4f}',
           'eval_bleu': 'BLEU {:.2f}', 'eval_wer': 'WER {:.4f}',
           'eval_zero_shot_accuracy': 'zero-shot {:.4f}', 'eval_zero_shot_top5': 'top-5 {:.4f}',
           'eval_retrieval_i2t_r1': 'image-to-text R@1 {:.4f}',
           'eval_retrieval_t2i_r1': 'text-to-image R@1 {:.4f}',
           'eval_bpd': '{:.4f} bits per dimension',
           'eval_sample_accuracy': 'sample accuracy {:.4f}', 'eval_sample_fd': 'sample FD {:.3f}'}
  extra = ''.join(f' | {form.format(results[key])}' for key, form in shown.items()
                  if key in results)
  log.info('step %d | held-out loss %.4f%s | of %s', step, results['eval_loss'], extra,
           setup.weights_in_use(run.training, step))


def evaluate(config, workdir: str | None) -> dict:
  """--mode=eval: the parameters of the workdir's latest checkpoint on the held-out split."""
  run, params, step = restore_trained(config, workdir)
  check_evaluation(run)
  results = evaluate_params(run, run.eval_step, params)
  log.info('Step %d: %s', step, results)
  return {'step': step, **results}
