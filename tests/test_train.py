"""Training in-process on 8 simulated devices: loss goes down, 1 device = 8 devices for every
parallelism, checkpoints resume and fall back, non-finite losses stop the run."""
import glob
import json
import os

import jax
import numpy as np
import pytest

from train_helpers import losses, read_metrics, small_config
from transformer_jax import train


@pytest.mark.parametrize('family', ['decoder', 'encoder', 'encoder_decoder', 'vit'])
def test_a_few_steps_lower_the_loss(tmp_path, family):
  config = small_config(family, steps=30, **{'optimizer.learning_rate': 1e-2})
  train.train(config, str(tmp_path))
  run = list(losses(tmp_path).values())
  assert np.mean(run[-5:]) < np.mean(run[:5]) - 0.1


@pytest.mark.parametrize('parallelism,rules', [('jit', ()), ('shard_map', ()),
                                               ('jit', (('embed', 'data'),))],
                         ids=['jit', 'shard_map', 'fsdp'])
def test_one_device_equals_eight(tmp_path, parallelism, rules):
  results = {}
  for devices in (1, 8):
    config = small_config(steps=5, parallelism=parallelism, sharding_rules=rules,
                          **{'mesh.shape': (devices,)})
    train.train(config, str(tmp_path / str(devices)))
    results[devices] = losses(tmp_path / str(devices))
  assert list(results[1]) == [1, 2, 3, 4, 5]
  np.testing.assert_allclose(list(results[8].values()), list(results[1].values()), atol=1e-5)


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


def test_resume_continues_exactly(tmp_path):
  full = small_config(steps=6, **{'training.checkpoint_every': 3})
  train.train(full, str(tmp_path / 'full'))
  half = small_config(steps=3, **{'training.checkpoint_every': 3})
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
  config = small_config(steps=6, **{'optimizer.learning_rate': 1e30, 'optimizer.grad_clip_norm': 0.0,
                                    'optimizer.warmup_steps': 0, 'training.checkpoint_every': 1})
  with pytest.raises(FloatingPointError, match=r'Non-finite loss at step \d; the last good '
                                               r'checkpoint is step \d'):
    train.train(config, str(tmp_path))


def test_eval_mode_reads_the_latest_checkpoint(tmp_path):
  config = small_config(steps=2, **{'training.eval_every': 2})
  train.train(config, str(tmp_path))
  logged = [json.loads(r) for r in open(tmp_path / 'metrics.jsonl') if 'eval_loss' in r][-1]
  result = train.evaluate(config, str(tmp_path))
  assert result['step'] == 2
  assert result['eval_loss'] == pytest.approx(logged['eval_loss'], abs=1e-6)


def test_metrics_and_config_are_written(tmp_path):
  train.train(small_config(steps=2), str(tmp_path))
  row = read_metrics(tmp_path)[2]
  assert {'loss', 'accuracy', 'learning_rate', 'grad_norm', 'tokens_per_sec'} <= set(row)
  assert os.path.exists(tmp_path / 'config.json')
  assert glob.glob(str(tmp_path / 'tensorboard' / 'events.out.tfevents.*'))
