"""Checkpoints are never lost: a checkpoint that does not fit the config is refused with a message
and left where it is, eval and sample read parameters only and write nothing, a new run can start
from another run's parameters, and checkpoints written by earlier code still restore."""
import pathlib
import shutil

import jax
import numpy as np
import pytest

from train_helpers import losses, small_config
from transformer_jax import config_lib, run, train
from transformer_jax.errors import CheckpointMismatchError, ConfigError
from transformer_jax.train import checkpoint, metrics, setup, workdir_lock

FIXTURES = pathlib.Path(__file__).resolve().parent / 'fixtures' / 'checkpoints'


def snapshot(directory):
  """Every file under `directory` with its size and modification time, but the workdir's lock,
  which names the last run that trained there."""
  return {str(p.relative_to(directory)): (p.stat().st_size, p.stat().st_mtime_ns)
          for p in sorted(pathlib.Path(directory).rglob('*')) if p.name != workdir_lock.LOCK_FILE}


def logged_eval(workdir, step):
  return [r for r in metrics.read_metrics(workdir) if r['step'] == step and 'eval_loss' in r][-1]


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
  """A 2-block decoder trained 4 steps, checkpoints at 2 and 4, without gradient clipping."""
  workdir = tmp_path_factory.mktemp('trained')
  config = small_config(steps=4, **{'training.checkpoint_every': 2, 'training.eval_every': 4,
                                    'optimizer.grad_clip_norm': 0.0})
  state = train.train(config, str(workdir))
  return workdir, config, state


def test_a_changed_model_is_refused_and_nothing_on_disk_changes(trained):
  workdir, config, _ = trained
  before = snapshot(workdir)
  changed = small_config(steps=6, **{'training.checkpoint_every': 2, 'training.eval_every': 4,
                                     'optimizer.grad_clip_norm': 0.0, 'model.num_layers': 1})
  with pytest.raises(CheckpointMismatchError) as error:
    train.train(changed, str(workdir))
  message = str(error.value)
  assert 'params/decoder/block_1: in the checkpoint, not in the model' in message
  assert 'model.num_layers 2 -> 1' in message
  assert 'new --workdir' in message and 'init_from_checkpoint' not in message
  assert snapshot(workdir) == before


def test_changed_optimizer_state_is_refused_with_a_way_to_go_on(trained):
  workdir, config, _ = trained
  before = snapshot(workdir)
  clipped = config.copy_and_resolve_references()
  clipped.optimizer.grad_clip_norm = 0.5  # adds clipping's state to the optimizer's tree
  with pytest.raises(CheckpointMismatchError) as error:
    train.train(clipped, str(workdir))
  assert not error.value.params_differ
  assert 'opt_state/' in str(error.value)
  assert 'optimizer.grad_clip_norm 0.0 -> 0.5' in str(error.value)
  assert f'--config.init_from_checkpoint={workdir}' in str(error.value)
  assert snapshot(workdir) == before


def test_eval_and_sample_read_parameters_only_and_write_nothing(trained):
  workdir, config, _ = trained
  before = snapshot(workdir)
  other_optimizer = config.copy_and_resolve_references()
  other_optimizer.optimizer.grad_clip_norm = 0.5
  result = train.evaluate(other_optimizer, str(workdir))
  assert result['step'] == 4
  assert result['eval_loss'] == pytest.approx(logged_eval(workdir, 4)['eval_loss'], abs=1e-6)
  other_optimizer.sample.update(prompt='ab', max_new_tokens=4)
  assert len(run.sample(other_optimizer, str(workdir))) == 1
  other_optimizer.sample.prompt = 'ab!'  # the synthetic text has letters only
  with pytest.raises(ConfigError, match=r"sample.prompt='ab!': Characters outside"):
    run.sample(other_optimizer, str(workdir))
  assert snapshot(workdir) == before


def test_each_saved_checkpoints_parameters_are_read_by_step_and_nothing_is_written(trained):
  workdir, config, state = trained
  before = snapshot(workdir)
  run_, latest, step = train.restore_trained(config, str(workdir))
  assert (setup.saved_steps(str(workdir)), step) == ([2, 4], 4)
  at_4, step_4 = setup.saved_params(run_, str(workdir), 4)
  at_2, step_2 = setup.saved_params(run_, str(workdir), 2)
  assert (step_2, step_4) == (2, 4)
  same = lambda a, b: jax.tree.all(jax.tree.map(np.array_equal, a, b))
  assert same(at_4, latest) and same(at_4, state.params)
  assert not same(at_2, at_4)  # two steps of training apart
  assert snapshot(workdir) == before


def test_eval_refuses_a_changed_model_naming_the_saved_config(trained):
  workdir, config, _ = trained
  wider = config.copy_and_resolve_references()
  wider.model.width = 64
  with pytest.raises(CheckpointMismatchError, match=r'model.width 32 -> 64'):
    train.evaluate(wider, str(workdir))


def test_an_unreadable_checkpoint_is_skipped_and_left_in_place_by_eval(tmp_path, trained):
  workdir = tmp_path / 'copy'
  shutil.copytree(trained[0], workdir)
  for path in (workdir / 'checkpoints' / '4').rglob('*'):
    if path.is_file():
      path.write_bytes(b'corrupt')
  before = snapshot(workdir)
  result = train.evaluate(trained[1], str(workdir))
  assert result['step'] == 2
  assert snapshot(workdir) == before  # moving it aside is left to a training run


def test_init_from_checkpoint_starts_from_the_parameters_with_a_fresh_optimizer(tmp_path, trained):
  source, _, final = trained
  config = small_config(steps=3, **{'init_from_checkpoint': str(source),
                                    'optimizer.learning_rate': 1e-4})
  run_ = setup.build_run(config)
  checkpoints = checkpoint.Checkpoints(str(tmp_path / 'checkpoints'), 3)
  state = setup.restore_or_init(run_, checkpoints, str(tmp_path))
  checkpoints.close()
  assert int(state.step) == 0
  jax.tree.map(np.testing.assert_array_equal, state.params, final.params)
  assert all(not np.any(leaf) for leaf in jax.tree.leaves(state.opt_state))
  config.init_from_checkpoint = f'{source}:2'
  early = setup.starting_params(setup.build_run(config))
  assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(early),
                                                       jax.tree.leaves(final.params)))


def test_init_from_checkpoint_refuses_other_shapes_and_missing_runs(tmp_path, trained):
  source = trained[0]
  config = small_config(steps=3, **{'init_from_checkpoint': str(source), 'model.width': 64})
  with pytest.raises(CheckpointMismatchError, match=r'(?s)params/.*model.width 32 -> 64'):
    train.train(config, str(tmp_path / 'wider'))
  config = small_config(steps=3, **{'init_from_checkpoint': str(tmp_path / 'nothing')})
  with pytest.raises(ConfigError, match='holds no checkpoints/ folder'):
    train.train(config, str(tmp_path / 'none'))


def fixture_config(workdir):
  config = config_lib.base_config()
  assert not config_lib.assign(config, config_lib.saved_config(workdir))
  return config


@pytest.mark.parametrize('name', sorted(p.name for p in FIXTURES.iterdir() if p.is_dir()))
def test_checkpoints_written_by_earlier_code_still_restore(tmp_path, name):
  fixture = FIXTURES / name
  config = fixture_config(fixture)
  before = snapshot(fixture)
  result = train.evaluate(config, str(fixture))
  assert snapshot(fixture) == before
  assert result['step'] == 2
  # To float32's rounding (a few units in the last place): the logged loss came from code
  # compiled at another optimization level, which rounds transcendental functions differently.
  assert result['eval_loss'] == pytest.approx(logged_eval(fixture, 2)['eval_loss'], rel=1e-6)
  workdir = tmp_path / name
  shutil.copytree(fixture, workdir)
  config.training.steps = 3
  train.train(config, str(workdir))  # the whole state, optimizer included, resumes
  assert list(losses(workdir)) == [1, 2, 3]
