"""training.loss_normalizing_factor and training.z_loss in the train step: with SGD at rate 1 the
update is minus the gradient of (the global batch's summed cross-entropy and z-loss) / the
factor, which jax.grad computes here on the whole batch at once; so on one device, on eight, per
device under shard_map and over microbatches. Without a factor the divisor is the batch's weight.
The logged loss stays the cross-entropy's mean over that weight, the z-loss a metric of its own."""
import jax
import numpy as np
import pytest

from train_helpers import small_config
from transformer_jax.train import losses, setup, sharding

FACTOR, Z_LOSS = 1000.0, 1e-2


def sgd_config(**overrides):
  """A tiny decoder trained by plain SGD at rate 1: the update is minus the gradient."""
  return small_config(steps=2, **{
      'optimizer.name': 'sgd', 'optimizer.schedule': 'constant', 'optimizer.learning_rate': 1.0,
      'optimizer.warmup_steps': 0, 'optimizer.weight_decay': 0.0, 'optimizer.grad_clip_norm': 0.0,
      'optimizer.sgd_momentum': 0.0, 'training.z_loss': Z_LOSS,
      'training.loss_normalizing_factor': FACTOR, **overrides})


def initial(config):
  """(the Run of `config`, its initial state)."""
  run = setup.build_run(config)
  init = jax.jit(lambda rng: setup.initial_state(run.model, run.tx,
                                                 run.family.example_inputs(run.model_config),
                                                 rng), out_shardings=run.state_sharding)
  return run, init(jax.random.key(0))


@pytest.fixture(scope='module')
def direct():
  """(the initial parameters, the gradient of the summed objective of step 0's batch, its
  summed terms), by jax.grad of the whole batch on one device."""
  run, state = initial(sgd_config(**{'mesh.shape': (1,)}))
  params, batch = jax.device_get(state.params), run.data.train_batch(0)

  def objective(p):
    sums = losses.batch_sums(run.model, run.family, p, batch, jax.random.key(0), z_loss=Z_LOSS)
    return losses.objective(sums), sums
  grads, sums = jax.grad(objective, has_aux=True)(params)
  return params, batch, grads, jax.device_get(sums)


CASES = {
    'one device': {'mesh.shape': (1,)},
    'eight devices': {},
    'shard_map': {'parallelism': 'shard_map'},
    'microbatches': {'training.grad_accum_steps': 2},
    'shard_map microbatches': {'parallelism': 'shard_map', 'training.grad_accum_steps': 2},
    'the batch weight': {'training.loss_normalizing_factor': None},
}


@pytest.mark.parametrize('case', [
    pytest.param(c, marks=pytest.mark.slow) if c in ('one device', 'shard_map microbatches')
    else c for c in CASES])
def test_the_update_is_the_gradient_of_the_sum_over_the_normalizer(direct, case):
  params, batch, grads, sums = direct
  run, state = initial(sgd_config(**CASES[case]))
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(state.params), params)
  state, metrics = run.train_step(state, sharding.global_batch(batch, run.mesh))
  divisor = FACTOR if case != 'the batch weight' else float(sums['weight'])
  assert sums['weight'] != FACTOR  # the two divisors differ
  flat = lambda tree: np.concatenate([np.ravel(x) for x in jax.tree.leaves(tree)])
  expected = -flat(grads) / divisor
  np.testing.assert_allclose(flat(jax.device_get(state.params)) - flat(params), expected, rtol=0,
                             atol=1e-5 * np.abs(expected).max())
  for key in ('loss', 'z_loss', 'weight'):
    assert float(metrics[key]) == pytest.approx(float(sums[key]), rel=1e-5), key
  assert sums['z_loss'] > 0
