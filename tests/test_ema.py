"""The moving average of the weights (training.ema_decay): its decay warms up as diffusers'
EMAModel's, a few steps average by that formula, a short run's average evaluates near its raw
weights, and the log says which weights are evaluated."""
import jax
import numpy as np
import pytest

from transformer_jax import train
from transformer_jax.settings import TrainingSettings
from transformer_jax.train import checkpoint, loop, metrics, setup, sharding, step

from train_helpers import small_config, started


def diffusers_decay(optimization_step: int, decay: float) -> float:
  """diffusers' EMAModel.get_decay (src/diffusers/training_utils.py) with its defaults
  (update_after_step=0, use_ema_warmup=False, min_decay=0), optimization_step counting the
  updates from 1."""
  step = max(0, optimization_step - 0 - 1)
  if step <= 0:
    return 0.0
  return max(min((1 + step) / (10 + step), decay), 0.0)


@pytest.mark.parametrize('decay', [0.999, 0.9999])
def test_the_decay_warms_up_as_diffusers_ema_model(decay):
  """The update of the state at step t is diffusers' update number t + 1."""
  for t in (0, 1, 2, 9, 100, 599, 8_990, 8_991, 89_990, 89_991, 1_000_000):
    assert float(step.ema_decay_at(t, decay)) == pytest.approx(diffusers_decay(t + 1, decay),
                                                               rel=1e-6), t
  assert float(step.ema_decay_at(0, decay)) == 0.0
  assert float(step.ema_decay_at(1, decay)) == pytest.approx(2 / 11)
  assert float(step.ema_decay_at(599, decay)) == pytest.approx(600 / 609)
  assert step.ema_decay_at(5, decay, warmup=False) == decay


def test_a_few_steps_average_by_the_formula_and_a_short_run_near_its_raw_weights(tmp_path):
  """ema_1 = params_1 (decay 0 at the first update), then ema_t = d ema_{t-1} + (1 - d)
  params_t with d = (1 + t - 1) / (10 + t - 1); after 20 steps at ema_decay 0.9999 the average's
  held-out loss is near the raw weights' (a fixed 0.9999 would leave it at the initial
  weights')."""
  config = small_config(steps=20, **{'training.ema_decay': 0.9999,
                                     'optimizer.warmup_steps': 0})
  run, state = started(config, tmp_path)
  initial = jax.device_get(state.params)
  batches = run.data.train_iterator(0)
  raws, emas = [], []
  for _ in range(20):
    state, _ = run.train_step(state, sharding.global_batch(next(batches), run.mesh))
    raws.append(jax.device_get(state.params))
    emas.append(jax.device_get(state.ema))
  leaves = jax.tree.leaves
  for raw, ema in zip(leaves(raws[0]), leaves(emas[0])):
    np.testing.assert_array_equal(ema, raw)
  expected = leaves(raws[0])
  for t in (1, 2):
    d = (1 + t) / (10 + t)
    expected = [d * e + (1 - d) * p for e, p in zip(expected, leaves(raws[t]))]
    for want, got in zip(expected, leaves(emas[t])):
      np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
  loss = lambda params: loop.evaluate_params(run, run.eval_step, params)['eval_loss']
  at_init, raw, averaged = loss(initial), loss(raws[-1]), loss(emas[-1])
  assert at_init - raw > 0.5  # the run learned
  assert abs(averaged - raw) < 0.25 * (at_init - raw), (at_init, raw, averaged)
  assert setup.weights_in_use(run.training, 20) == (
      'the moving average of the weights (decay 0.6897 at step 20, warming up to 0.9999)')


def test_the_log_names_the_weights_evaluated():
  fixed = TrainingSettings(ema_decay=0.999, ema_warmup=False)
  assert setup.weights_in_use(fixed, 600) == (
      'the moving average of the weights (decay 0.999 at step 600)')
  assert setup.weights_in_use(TrainingSettings(), 600) == 'the trained weights'
  assert setup.weights_in_use(TrainingSettings(ema_decay=0.99), 10_000) == (
      'the moving average of the weights (decay 0.99 at step 10000)')


@pytest.mark.slow  # about 30 s on 2 shared cores: three runs
def test_a_resumed_run_averages_as_an_unbroken_one(tmp_path):
  """The decay is a function of the state's step: 2 steps, then 2 more from the checkpoint,
  evaluate (the average) and store the same average as 4 straight."""
  settings = {'training.ema_decay': 0.999, 'training.checkpoint_every': 2,
              'training.eval_every': 2}
  train.train(small_config(steps=4, **settings), str(tmp_path / 'whole'))
  train.train(small_config(steps=2, **settings), str(tmp_path / 'resumed'))
  train.train(small_config(steps=4, **settings), str(tmp_path / 'resumed'))
  rows = lambda name: {r['step']: r['eval_loss'] for r in metrics.read_metrics(tmp_path / name)
                       if 'eval_loss' in r}
  assert rows('resumed') == rows('whole') and list(rows('whole')) == [2, 4]
  run = setup.build_run(small_config(steps=4, **settings))
  averages = []
  for name in ('whole', 'resumed'):
    saved = checkpoint.Checkpoints(str(tmp_path / name / 'checkpoints'), read_only=True)
    averages.append(jax.device_get(saved.restore_latest(run.abstract_state)[0].ema))
    saved.close()
  for whole, resumed in zip(*map(jax.tree.leaves, averages)):
    np.testing.assert_array_equal(whole, resumed)
