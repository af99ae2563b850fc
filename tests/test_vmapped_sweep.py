"""A sweep trained as one vmapped program (train.vmapped, sweep.run_all(vmap=True)) against the
same runs trained alone: every run's training and held-out losses, its checkpoints, a stop
and resume, runs resumed at different steps, a diverging run, and how runs are grouped."""
import json
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from process_env import TESTS_AND_PROJECT, process_env
from train_helpers import losses, small_config
from transformer_jax import errors, sweep, train
from transformer_jax.train import checkpoint, metrics, vmapped

# Five runs that differ in every kind of vmapped number, the seed first: each its own
# initialization, data order and dropout key.
VARIANTS = {
    'base': {},
    'seed=1,lr=1e-2': {'seed': 1, 'optimizer.learning_rate': 1e-2},
    'seed=2,no warmup,wd': {'seed': 2, 'optimizer.warmup_steps': 0,
                            'optimizer.weight_decay': 0.3},
    'seed=3,init,betas,dropout': {'seed': 3, 'model.init_std': 0.05,
                                  'model.embed_init_std': 0.1, 'optimizer.b1': 0.8,
                                  'optimizer.b2': 0.9, 'model.dropout_rate': 0.3},
    'seed=4,clip,cosine floor': {'seed': 4, 'optimizer.grad_clip_norm': 0.5,
                                 'optimizer.min_lr_ratio': 0.5},
}
# Logging every 2 steps, the host checks the odd steps' metrics after dispatching the next step.
STEPS = {'training.checkpoint_every': 3, 'training.eval_every': 3, 'training.log_every': 2,
         'optimizer.schedule': 'cosine'}
# The killed sweep's: one device, as its subprocess has; a log row at each checkpoint (a resumed
# run's first row averages the steps since its checkpoint only).
KILLED = {'training.checkpoint_every': 5, 'training.log_every': 5, 'training.eval_every': 10,
          'mesh.shape': (1,)}


def make_config(run, steps=6, **extra):
  return small_config(steps=steps, **{**STEPS, 'model.dropout_rate': 0.1, **extra,
                                      **dict(run.overrides)})


def eval_losses(workdir):
  return {r['step']: r['eval_loss'] for r in metrics.read_metrics(workdir) if 'eval_loss' in r}


def assert_as_alone(tmp_path, runs, vmapped_dir, steps=6, **extra):
  """Each run's training and held-out losses equal those of the same run trained alone."""
  for run in runs:
    alone = tmp_path / 'alone' / run.dirname
    train.train(make_config(run, steps, **extra), str(alone))
    together = vmapped_dir / run.dirname
    assert list(losses(together)) == list(losses(alone))
    np.testing.assert_allclose(list(losses(together).values()), list(losses(alone).values()),
                               atol=1e-5)
    np.testing.assert_allclose(list(eval_losses(together).values()),
                               list(eval_losses(alone).values()), atol=1e-5)


def test_every_run_of_a_vmapped_sweep_trains_as_it_would_alone(tmp_path):
  runs = sweep.named(VARIANTS)
  assert vmapped.groups([make_config(r) for r in runs]) == [[0, 1, 2, 3, 4]]
  results = sweep.run_all(runs, make_config, str(tmp_path / 'sweep'), vmap=True)
  assert [r['status'] for r in results] == ['finished'] * 5
  assert all(r['group_size'] == 5 for r in results)
  assert sweep.machine_seconds(results) == pytest.approx(results[0]['group_seconds'])
  assert_as_alone(tmp_path, runs, tmp_path / 'sweep')
  # Each run's checkpoints are its own, readable as a run trained alone reads them.
  for run in runs:
    saved = checkpoint.Checkpoints(str(tmp_path / 'sweep' / run.dirname / 'checkpoints'),
                                   read_only=True)
    assert saved.all_steps() == [3, 6]
    saved.close()
    assert train.evaluate(make_config(run), str(tmp_path / 'sweep' / run.dirname))[
        'eval_loss'] == pytest.approx(eval_losses(tmp_path / 'sweep' / run.dirname)[6], abs=1e-6)


# The originals' optimizers and schedules, two runs of each that differ in traced numbers:
# Adafactor under T5's inverse square root with a z-loss and a fixed normalizer, SGD under
# warmup-stable-decay.
ADAFACTOR = {'optimizer.name': 'adafactor', 'optimizer.schedule': 'rsqrt',
             'optimizer.weight_decay': 0.0, 'training.z_loss': 1e-3,
             'training.loss_normalizing_factor': 300.0}
SGD = {'optimizer.name': 'sgd', 'optimizer.schedule': 'wsd', 'optimizer.learning_rate': 0.3}
RECIPES = {
    'adafactor': {
        'adafactor': {**ADAFACTOR, 'optimizer.learning_rate': 0.1},
        'adafactor,seed=1,lr,warmup': {**ADAFACTOR, 'seed': 1, 'optimizer.learning_rate': 0.05,
                                       'optimizer.warmup_steps': 3}},
    'sgd': {
        'sgd': {**SGD, 'optimizer.decay_fraction': 0.5},
        'sgd,seed=1,decay,floor': {**SGD, 'seed': 1, 'optimizer.decay_fraction': 0.25,
                                   'optimizer.min_lr_ratio': 0.1}},
}


@pytest.mark.parametrize('recipe', ['adafactor', pytest.param('sgd', marks=pytest.mark.slow)])
def test_the_originals_optimizers_and_schedules_train_vmapped_as_alone(tmp_path, recipe):
  runs = sweep.named(RECIPES[recipe])
  make = lambda run: make_config(run, steps=4)
  assert vmapped.groups([make(r) for r in runs]) == [[0, 1]]
  results = sweep.run_all(runs, make, str(tmp_path / 'sweep'), vmap=True)
  assert [(r['status'], r['group_size']) for r in results] == [('finished', 2)] * 2
  assert_as_alone(tmp_path, runs, tmp_path / 'sweep', steps=4)


def stop_after(monkeypatch, calls: int):
  """SIGTERM, as checkpoint.PreemptionFlag sees it, from the `calls`-th step on."""
  seen = []

  def reached(self):
    seen.append(None)
    return len(seen) >= calls
  monkeypatch.setattr(checkpoint.PreemptionFlag, 'reached', reached)


@pytest.mark.slow
def test_a_stopped_vmapped_sweep_resumes_exactly(tmp_path, monkeypatch):
  runs = sweep.named(dict(list(VARIANTS.items())[:3]))
  with monkeypatch.context() as patch:
    stop_after(patch, 2)
    with pytest.raises(errors.UserError, match='stopped .* run the same command again'):
      sweep.run_all(runs, make_config, str(tmp_path / 'sweep'), vmap=True)
  for run in runs:
    assert checkpoint.latest_step(str(tmp_path / 'sweep' / run.dirname)) == 2
    assert not (tmp_path / 'sweep' / run.dirname / sweep.STATUS_FILE).exists()
  results = sweep.run_all(runs, make_config, str(tmp_path / 'sweep'), vmap=True)
  assert [r['steps'] for r in results] == [6, 6, 6]
  assert_as_alone(tmp_path, runs, tmp_path / 'sweep')


@pytest.mark.slow
def test_runs_at_different_steps_train_together_and_each_ends_at_its_last(tmp_path, monkeypatch):
  """A sweep killed between two runs' saves: one run resumes at step 4, another from scratch;
  a third had finished and is read back."""
  runs = sweep.named(dict(list(VARIANTS.items())[:3]))
  ahead, finished = (tmp_path / 'sweep' / runs[0].dirname), runs[2]
  with monkeypatch.context() as patch:
    stop_after(patch, 4)
    train.train(make_config(runs[0]), str(ahead))
  assert checkpoint.latest_step(str(ahead)) == 4
  sweep.run_all([finished], make_config, str(tmp_path / 'sweep'))
  results = sweep.run_all(runs, make_config, str(tmp_path / 'sweep'), vmap=True)
  assert [r['status'] for r in results] == ['finished'] * 3
  assert 'group_size' not in results[2] and results[0]['group_size'] == 2
  assert_as_alone(tmp_path, runs, tmp_path / 'sweep')


@pytest.mark.slow
def test_a_diverging_run_stops_alone_while_the_others_finish(tmp_path):
  """The diverging run's first non-finite step (step 2, checked after step 3 was dispatched)
  ends it with the message it would end with alone."""
  runs = sweep.named({'fine': {}, 'huge lr': {'optimizer.learning_rate': 1e30},
                      'fine too': {'seed': 1}})
  settings = {'optimizer.grad_clip_norm': 0.0, 'optimizer.warmup_steps': 0,
              'training.log_every': 3}
  results = sweep.run_all(runs, lambda r: make_config(r, **settings), str(tmp_path / 'sweep'),
                          vmap=True)
  assert [r['status'] for r in results] == ['finished', 'diverged', 'finished']
  assert results[1]['eval_loss'] is None
  (alone,) = sweep.run_all(runs[1:2], lambda r: make_config(r, **settings),
                           str(tmp_path / 'alone'))
  assert results[1]['error'] == alone['error'].replace('alone', 'sweep')
  assert 'Non-finite gradient norm and parameters after the update at step 2' in alone['error']
  status = json.loads((tmp_path / 'sweep' / runs[1].dirname / sweep.STATUS_FILE).read_text())
  assert status['status'] == 'diverged'
  assert_as_alone(tmp_path, [runs[0], runs[2]], tmp_path / 'sweep', **settings)


def test_runs_whose_program_differs_train_in_separate_groups():
  configs = [make_config(r) for r in sweep.named({
      'a': {}, 'b': {'seed': 1, 'optimizer.learning_rate': 1e-2},
      'wider': {'model.width': 64}, 'more dropout': {'model.dropout_rate': 0.2},
      'no clip': {'optimizer.grad_clip_norm': 0.0}, 'clip 2': {'optimizer.grad_clip_norm': 2.0},
      'default init': {'model.init_std': None}, 'longer': {'training.steps': 7},
      'no dropout': {'model.dropout_rate': 0.0}})]
  assert vmapped.groups(configs) == [[0, 1, 3, 5], [2], [4], [6], [7], [8]]
  with pytest.raises(ValueError, match='differ in more than the vmapped numbers'):
    vmapped.train_group(configs[:3], ['unused'] * 3)


@pytest.mark.slow
def test_a_killed_vmapped_sweep_resumes_exactly(tmp_path):
  """SIGKILL once every run has a checkpoint (the runs' newest may differ), then the same sweep
  again: every run's losses are those of the run alone."""
  runs = sweep.named(dict(list(VARIANTS.items())[:3]))
  script = ('import sys, test_vmapped_sweep as t; from transformer_jax import sweep; '
            'sweep.run_all(sweep.named(dict(list(t.VARIANTS.items())[:3])), '
            'lambda r: t.make_config(r, steps=30, **t.KILLED), sys.argv[1], vmap=True)')
  env = process_env(PYTHONPATH=TESTS_AND_PROJECT)
  process = subprocess.Popen([sys.executable, '-c', script, str(tmp_path / 'sweep')], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  dirs = [tmp_path / 'sweep' / run.dirname for run in runs]
  start = time.time()
  while not all(checkpoint.latest_step(str(d)) for d in dirs):
    assert process.poll() is None, process.stdout.read()
    assert time.time() - start < 600, 'no checkpoints after 600 s'
    time.sleep(0.2)
  process.send_signal(signal.SIGKILL)
  process.wait()
  killed_at = [checkpoint.latest_step(str(d)) for d in dirs]
  assert max(killed_at) < 30
  results = sweep.run_all(runs, lambda r: make_config(r, steps=30, **KILLED),
                          str(tmp_path / 'sweep'), vmap=True)
  assert [r['steps'] for r in results] == [30] * 3
  assert_as_alone(tmp_path, runs, tmp_path / 'sweep', steps=30, **KILLED)


def test_a_model_that_drops_at_a_rate_of_its_own_trains_alone_not_vmapped(tmp_path):
  """The stacked step traces model.dropout_rate only, which every nn.Dropout takes: an MLP's
  own rate would be overridden by it, and attention probabilities are dropped in the kernel."""
  configs = [make_config(r, **{'model.mlp_dropout': 0.2})
             for r in sweep.named({'a': {}, 'b': {'seed': 1}})]
  with pytest.raises(errors.ConfigError, match='A vmapped sweep traces model.dropout_rate only, '
                     r'and model.mlp_dropout drops at 0.2: set model.mlp_dropout=0, or train the '
                     r'runs one after another \(vmap=False\).'):
    vmapped.train_group(configs, [str(tmp_path / 'a'), str(tmp_path / 'b')])
