"""Training in-process on 8 simulated devices: loss goes down, 1 device = 8 devices for every
parallelism, checkpoints resume and fall back, non-finite steps stop the run before they are
saved, a resumed run makes up a missing evaluation, and the console shows progress."""
import glob
import json
import logging
import os
import subprocess
import sys
import types

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from process_env import TESTS_AND_PROJECT, process_env
from train_helpers import losses, small_config, training_rows
from transformer_jax import train
from transformer_jax.train import checkpoint, loop, metrics, optim, step as step_lib


# The ViT and the text encoders in the slow step: the fixtures' tests resume and train them in
# the default.
@pytest.mark.parametrize('family', ['decoder'] + [
    pytest.param(f, marks=pytest.mark.slow) for f in ('vit', 'encoder', 'encoder_decoder')])
def test_a_few_steps_lower_the_loss(tmp_path, family):
  config = small_config(family, steps=30, **{'optimizer.learning_rate': 1e-2})
  train.train(config, str(tmp_path))
  run = list(losses(tmp_path).values())
  assert np.mean(run[-5:]) < np.mean(run[:5]) - 0.1


@pytest.mark.parametrize('parallelism,rules,accum', [
    ('jit', (), 1), ('shard_map', (), 1),
    pytest.param('jit', (('embed', 'data'),), 1, marks=pytest.mark.slow),
    pytest.param('shard_map', (), 2, marks=pytest.mark.slow)],
                         ids=['jit', 'shard_map', 'fsdp', 'shard_map_accumulated'])
def test_one_device_equals_eight(tmp_path, parallelism, rules, accum):
  results = {}
  for devices in (1, 8):
    config = small_config(steps=5, parallelism=parallelism, sharding_rules=rules,
                          **{'mesh.shape': (devices,), 'training.grad_accum_steps': accum})
    train.train(config, str(tmp_path / str(devices)))
    results[devices] = losses(tmp_path / str(devices))
  assert list(results[1]) == [1, 2, 3, 4, 5]
  np.testing.assert_allclose(list(results[8].values()), list(results[1].values()), atol=1e-5)


@pytest.mark.slow
def test_the_cpu_runtime_settings_keep_the_losses(tmp_path):
  """cpu_runtime.configure() (inline execution, freed memory kept mapped) in a fresh process, as
  launch.py runs, gives the losses of the same run here without it."""
  script = ('import sys; from transformer_jax.train import cpu_runtime; cpu_runtime.configure(); '
            'import jax; assert not jax.config.read("jax_cpu_enable_async_dispatch"); '
            'from train_helpers import small_config; from transformer_jax import train; '
            'train.train(small_config(steps=3, **{"mesh.shape": (1,)}), sys.argv[1])')
  env = process_env(PYTHONPATH=TESTS_AND_PROJECT)
  subprocess.run([sys.executable, '-c', script, str(tmp_path / 'configured')], env=env,
                 check=True, capture_output=True)
  train.train(small_config(steps=3, **{'mesh.shape': (1,)}), str(tmp_path / 'default'))
  np.testing.assert_allclose(list(losses(tmp_path / 'configured').values()),
                             list(losses(tmp_path / 'default').values()), atol=1e-6)


def test_fsdp_rules_shard_the_parameters(tmp_path):
  config = small_config(steps=1, sharding_rules=(('embed', 'data'),))
  state = train.train(config, str(tmp_path))
  kernel = state.params['decoder']['block_0']['mlp']['up']['kernel']
  assert kernel.sharding.spec[0] == 'data'
  assert kernel.addressable_shards[0].data.shape == (32 // 8, kernel.shape[1])


def test_gradient_accumulation_matches_one_batch(tmp_path):
  whole = small_config(steps=3)
  accumulated = small_config(steps=3, **{'training.grad_accum_steps': 2})
  train.train(whole, str(tmp_path / 'whole'))
  train.train(accumulated, str(tmp_path / 'accumulated'))
  np.testing.assert_allclose(list(losses(tmp_path / 'accumulated').values()),
                             list(losses(tmp_path / 'whole').values()), atol=1e-5)


@pytest.mark.parametrize('optimizer', ['adamw', pytest.param('muon', marks=pytest.mark.slow)])
def test_resume_continues_exactly(tmp_path, optimizer):
  full = small_config(steps=6, **{'training.checkpoint_every': 3, 'optimizer.name': optimizer})
  train.train(full, str(tmp_path / 'full'))
  half = small_config(steps=3, **{'training.checkpoint_every': 3, 'optimizer.name': optimizer})
  train.train(half, str(tmp_path / 'resumed'))
  train.train(full, str(tmp_path / 'resumed'))  # the same command again: resumes from step 3
  assert losses(tmp_path / 'resumed') == losses(tmp_path / 'full')


def test_corrupt_latest_checkpoint_falls_back_to_the_previous(tmp_path, caplog):
  config = small_config(steps=4, **{'training.checkpoint_every': 2})
  train.train(config, str(tmp_path))
  for path in glob.glob(str(tmp_path / 'checkpoints' / '4' / '**' / '*'), recursive=True):
    if os.path.isfile(path):
      with open(path, 'wb') as f:
        f.write(b'corrupt')
  expected = losses(tmp_path)
  os.remove(tmp_path / 'metrics.jsonl')
  train.train(small_config(steps=4, **{'training.checkpoint_every': 2}), str(tmp_path))
  assert 'step 4' in caplog.text and 'cannot be restored' in caplog.text
  assert losses(tmp_path) == {3: expected[3], 4: expected[4]}


def test_non_finite_loss_names_the_step_and_last_checkpoint(tmp_path):
  config = small_config(steps=6, **{'optimizer.learning_rate': 1e30,
                                    'optimizer.grad_clip_norm': 0.0, 'optimizer.warmup_steps': 0,
                                    'training.checkpoint_every': 1})
  # The first step whose loss, gradient or update is not finite stops the run (here the gradient
  # of step 2, while its loss is still finite).
  with pytest.raises(FloatingPointError, match=r'Non-finite .* at step \d .* the last good '
                                               r'checkpoint \(finite parameters\) is step \d'):
    train.train(config, str(tmp_path))


def test_eval_mode_reads_the_latest_checkpoint(tmp_path):
  config = small_config(steps=2, **{'training.eval_every': 2})
  train.train(config, str(tmp_path))
  logged = [r for r in metrics.read_metrics(tmp_path) if 'eval_loss' in r][-1]
  result = train.evaluate(config, str(tmp_path))
  assert result['step'] == 2
  assert result['eval_loss'] == pytest.approx(logged['eval_loss'], abs=1e-6)


def test_metrics_and_config_are_written(tmp_path):
  train.train(small_config(steps=2), str(tmp_path))
  row = training_rows(tmp_path)[2]
  assert {'loss', 'accuracy', 'learning_rate', 'grad_norm', 'tokens_per_sec'} <= set(row)
  assert os.path.exists(tmp_path / 'config.json')
  assert glob.glob(str(tmp_path / 'tensorboard' / 'events.out.tfevents.*'))


TENSORBOARD_SCALARS = """
import struct, sys
from transformer_jax.train import metrics
writer = metrics.MetricWriter(sys.argv[1], total_steps=3)
writer.write(3, {'loss': 2.5, 'name': 'not a scalar'})
writer.tensorboard.close()
print('torch' in sys.modules)
from tensorboardX.proto import event_pb2
import glob
data = open(glob.glob(sys.argv[1] + '/tensorboard/events.out.tfevents.*')[0], 'rb').read()
while data:  # TFRecords: a length, its checksum, the record, its checksum
  (length,) = struct.unpack('<Q', data[:8])
  event = event_pb2.Event.FromString(data[12:12 + length])
  data = data[16 + length:]
  for value in event.summary.value:
    print(event.step, value.tag, value.simple_value)
"""


def test_tensorboard_gets_the_scalars_without_importing_torch(tmp_path):
  """tensorboardX imports torch where it is installed, seconds at each run's start."""
  done = subprocess.run([sys.executable, '-c', TENSORBOARD_SCALARS, str(tmp_path)], check=True,
                        capture_output=True, text=True, timeout=300)
  assert done.stdout.split('\n')[:2] == ['False', '3 loss 2.5']


def test_read_metrics_keeps_every_row_in_order_and_names_a_broken_line(tmp_path):
  rows = [{'step': 2, 'loss': 1.5}, {'step': 2, 'eval_loss': 1.25}, {'step': 2, 'loss': 1.0}]
  (tmp_path / 'metrics.jsonl').write_text(''.join(json.dumps(row) + '\n' for row in rows))
  assert metrics.read_metrics(tmp_path) == rows
  assert training_rows(tmp_path) == {2: {'step': 2, 'loss': 1.0}}  # the later row of a step wins
  with open(tmp_path / 'metrics.jsonl', 'a') as f:
    f.write('{"step": 3, "lo')  # a line cut short
  with pytest.raises(ValueError, match=r'metrics.jsonl, line 4, is not a JSON row'):
    metrics.read_metrics(tmp_path)


def eval_rows(workdir):
  return {r['step']: r['eval_loss'] for r in metrics.read_metrics(workdir) if 'eval_loss' in r}


def drop_eval_rows(workdir, step):
  """metrics.jsonl as a run killed before finishing its evaluation at `step` left it."""
  rows = [row for row in metrics.read_metrics(workdir)
          if not ('eval_loss' in row and row['step'] == step)]
  with open(os.path.join(workdir, metrics.METRICS_FILE), 'w') as f:
    f.writelines(json.dumps(row) + '\n' for row in rows)


def test_a_run_stopped_before_its_final_evaluation_evaluates_on_resume(tmp_path):
  config = small_config(steps=4, **{'training.checkpoint_every': 2, 'training.eval_every': 1000})
  train.train(config, str(tmp_path))
  final = eval_rows(tmp_path)
  assert list(final) == [4]
  drop_eval_rows(tmp_path, 4)
  train.train(config, str(tmp_path))
  assert eval_rows(tmp_path) == pytest.approx(final, abs=1e-6)


def test_an_evaluation_interrupted_mid_run_runs_first_on_resume(tmp_path):
  settings = {'training.checkpoint_every': 2, 'training.eval_every': 2}
  train.train(small_config(steps=4, **settings), str(tmp_path / 'whole'))
  train.train(small_config(steps=2, **settings), str(tmp_path / 'resumed'))
  drop_eval_rows(tmp_path / 'resumed', 2)
  train.train(small_config(steps=4, **settings), str(tmp_path / 'resumed'))
  assert eval_rows(tmp_path / 'resumed') == pytest.approx(eval_rows(tmp_path / 'whole'), abs=1e-6)


def test_non_finite_gradients_with_a_finite_loss_are_never_saved(tmp_path, monkeypatch):
  """From step 3 on the gradients turn NaN while the loss stays finite (as a bfloat16 overflow
  in the backward pass would): the run stops there, saves nothing after step 2, and the
  checkpoint it names holds finite parameters."""
  apply_update = step_lib._apply_update  # pylint: disable=protected-access

  def nan_gradients_from_step_3(tx, schedule, state, grads, sums, *rest):
    grads = jax.tree.map(lambda g: jnp.where(state.step >= 2, jnp.nan, g), grads)
    return apply_update(tx, schedule, state, grads, sums, *rest)

  monkeypatch.setattr(step_lib, '_apply_update', nan_gradients_from_step_3)
  config = small_config(steps=6, **{'training.checkpoint_every': 1})
  with pytest.raises(FloatingPointError, match=r'Non-finite gradient norm and parameters after '
                                               r'the update at step 3 \(loss \d.*checkpoint '
                                               r'\(finite parameters\) is step 2'):
    train.train(config, str(tmp_path))
  assert checkpoint.latest_step(str(tmp_path)) == 2
  run = loop.build_run(config)
  saved = checkpoint.Checkpoints(str(tmp_path / 'checkpoints'), read_only=True)
  params, step = saved.restore_latest(run.abstract_state, params_only=True)
  saved.close()
  assert step == 2 and all(np.isfinite(leaf).all() for leaf in jax.tree.leaves(params))


def test_warmup_takes_a_real_first_step():
  opt = ml_collections.ConfigDict(dict(learning_rate=1e-3, warmup_steps=4, schedule='cosine',
                                       min_lr_ratio=0.0))
  schedule = optim.learning_rate_schedule(opt, total_steps=10)
  rates = [float(schedule(step)) for step in range(6)]
  np.testing.assert_allclose(rates[:5], [2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3], rtol=1e-6)
  assert rates[5] == pytest.approx(1e-3 * 0.5 * (1 + np.cos(np.pi / 6)), rel=1e-6)


@pytest.mark.parametrize('floor', [0.0, 0.1])
def test_the_schedule_is_optax_warmup_cosine_one_step_ahead_in_the_warmup(floor):
  """optax's warmup spends step 0 at init_value (0: no update); ours takes optax's next value
  there, and from warmup_steps on is optax's cosine decay to the floor, traced or not (a vmapped
  sweep traces peak, warmup_steps and min_lr_ratio)."""
  peak, warmup, total = 3e-3, 7, 50
  opt = ml_collections.ConfigDict(dict(learning_rate=peak, warmup_steps=warmup,
                                       schedule='cosine', min_lr_ratio=floor))
  steps = np.arange(total + 5)  # past the last step, too: the floor
  ours = np.asarray(jax.vmap(optim.learning_rate_schedule(opt, total))(steps))
  optax_schedule = optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=peak, warmup_steps=warmup, decay_steps=total,
      end_value=floor * peak)
  expected = [float(optax_schedule(step + 1 if step < warmup else step)) for step in steps]
  np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-10)
  assert ours[-1] == pytest.approx(floor * peak, abs=1e-10)

  def traced(numbers):
    opt = types.SimpleNamespace(schedule='cosine', learning_rate=numbers[0],
                                warmup_steps=numbers[1], min_lr_ratio=numbers[2])
    return jax.vmap(optim.learning_rate_schedule(opt, total))(steps)
  np.testing.assert_allclose(jax.jit(traced)(jnp.array([peak, warmup, floor])), ours, rtol=1e-6)


def test_train_closes_what_it_opened_when_there_is_nothing_to_do(tmp_path, monkeypatch):
  config = small_config(steps=2)
  train.train(config, str(tmp_path))
  closed = []
  for cls in (checkpoint.Checkpoints, metrics.MetricWriter):
    close = cls.close
    monkeypatch.setattr(cls, 'close', lambda self, close=close, cls=cls: (closed.append(cls),
                                                                        close(self)))
  train.train(config, str(tmp_path))  # the checkpoint is at the last step
  assert sorted(c.__name__ for c in closed) == ['Checkpoints', 'MetricWriter']


def progress_steps(caplog):
  return [int(r.getMessage().split()[1].split('/')[0]) for r in caplog.records
          if r.getMessage().startswith('step ') and '/' in r.getMessage().split()[1]]


def test_the_console_shows_the_first_step_at_once_and_the_held_out_results(tmp_path, caplog):
  caplog.set_level(logging.INFO, logger='transformer_jax')
  config = small_config(steps=4, **{'training.log_every': 1000, 'training.eval_every': 4})
  train.train(config, str(tmp_path))
  assert progress_steps(caplog) == [1, 4]  # step 1 at once, then the last (logged) step
  assert list(training_rows(tmp_path)) == [4]  # the jsonl keeps to log_every
  assert 'step 4 | held-out loss' in caplog.text


def test_a_progress_line_comes_at_least_every_progress_period(tmp_path, caplog, monkeypatch):
  caplog.set_level(logging.INFO, logger='transformer_jax')
  monkeypatch.setattr(loop, 'PROGRESS_SECONDS', 0.0)
  train.train(small_config(steps=4, **{'training.log_every': 1000}), str(tmp_path))
  assert progress_steps(caplog) == [1, 2, 3, 4]


def test_the_mfu_source_is_logged_once_per_process(tmp_path, caplog):
  caplog.set_level(logging.INFO, logger='transformer_jax')
  loop._log_once.cache_clear()  # pylint: disable=protected-access
  for name in ('a', 'b'):
    train.train(small_config(steps=1), str(tmp_path / name))
  assert caplog.text.count('MFU: model FLOPs') == 1
