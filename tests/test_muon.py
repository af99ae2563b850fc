"""optimizer.name='muon': which parameters Muon takes (the blocks' projection kernels, head axes
folded into the matrix), its update against an independent Newton-Schulz, AdamW's on the rest,
training with it, its settings' checks, and the memory plan of its state."""
import math
import subprocess
import sys

import flax.linen as nn
import jax
import numpy as np
import pytest

from helpers import ROOT
from process_env import process_env
from train_helpers import losses, small_config
from transformer_jax import config_lib, memory, models, train
from transformer_jax.errors import ConfigError
from transformer_jax.train import optim, setup, sharding

ATTENTION = ('query', 'key', 'value', 'out')


def abstract_params(config):
  cfg = models.model_config(config.model)
  inputs = models.registry.get(cfg.family).example_inputs(cfg)
  return nn.meta.unbox(jax.eval_shape(
      lambda: models.build(cfg).init(jax.random.key(0), *inputs))['params'])


def muon_leaves(params) -> dict:
  """{'a/b/kernel': (reduction axes, output axes)} of the leaves Muon takes."""
  rule = optim.muon_dimension_numbers(params)
  flat = jax.tree_util.tree_flatten_with_path(
      rule, is_leaf=lambda x: x is None or isinstance(x, optim.MuonDimensionNumbers))[0]
  return {'/'.join(k.key for k in path): (dims.reduction_axis, dims.output_axis)
          for path, dims in flat if dims is not None}


def block_kernels(stack, blocks, sublayers):
  """{'stack/block_i/sublayer/kernel': axes} for each block and (sublayer, axes)."""
  return {f'{stack}/block_{i}/{name}/kernel': dims for i in range(blocks)
          for name, dims in sublayers.items()}


def attention(module):
  return {f'{module}/{p}': ((0, 1), (2,)) if p == 'out' else ((0,), (1, 2)) for p in ATTENTION}


MLP = {'mlp/up': ((0,), (1,)), 'mlp/down': ((0,), (1,))}
LLAMA_BLOCK = {**attention('attn'), **MLP, 'mlp/gate': ((0,), (1,))}  # SwiGLU
EXPECTED = {
    # The tokens' embedding, the norms and the unembedding go to AdamW.
    'decoder': block_kernels('decoder', 2, LLAMA_BLOCK),
    # The patch embedding, class token, positions, biases, norms and classifier go to AdamW.
    'vit': block_kernels('encoder', 2, {**attention('attn'), **MLP}),
    'encoder_decoder': {
        **block_kernels('encoder', 2, {**attention('attn'), **MLP}),
        **block_kernels('decoder', 2, {**attention('attn'), **attention('cross_attn'), **MLP})},
}


@pytest.mark.parametrize('family', list(EXPECTED))
def test_muon_takes_exactly_the_blocks_projection_kernels(family):
  assert muon_leaves(abstract_params(small_config(family))) == EXPECTED[family]


def test_a_scanned_stacks_layer_axis_is_a_batch_of_matrices():
  params = abstract_params(small_config(**{'model.scan_layers': True}))
  shifted = lambda axes: tuple(a + 1 for a in axes)
  expected = {f'decoder/layers/{name}/kernel': (shifted(reduction), shifted(output))
              for name, (reduction, output) in LLAMA_BLOCK.items()}
  assert muon_leaves(params) == expected


def newton_schulz(g, steps=5):
  """Keller Jordan's quintic iteration, written out: X / |X|_F, then X <- aX + (bA + cA^2)X
  with A = XX^T, on the wide orientation of the matrix."""
  a, b, c = 3.4445, -4.7750, 2.0315
  wide = g.T if g.shape[0] > g.shape[1] else g
  x = wide / np.linalg.norm(wide)
  for _ in range(steps):
    gram = x @ x.T
    x = a * x + (b * gram + c * gram @ gram) @ x
  return x.T if g.shape[0] > g.shape[1] else x


def one_update(config, params, grads):
  tx, _ = optim.make_optimizer(config.optimizer, config.training.steps)
  updates, _ = jax.jit(tx.update)(grads, tx.init(params), params)
  return updates


# Block 0's matrix leaves as Muon sees them.
MATRICES = {
    'mlp/up': (32, 85),  # 2-D, its update scaled by sqrt(85 / 32) as Keller Jordan's is
    'mlp/down': (85, 32),
    'attn/query': (32, 4 * 8),  # (embed, heads, head_dim): one matrix, not one per head
    'attn/out': (4 * 8, 32),  # (heads, head_dim, embed)
}
SPREAD = 10  # the largest singular value of their gradients over the smallest


def block_0(tree, name):
  module, projection = name.split('/')
  return tree['decoder']['block_0'][module][projection]


def spread_matrix(shape, rng):
  """A random matrix whose singular values fall evenly (in log) from 1 to 1 / SPREAD."""
  k = min(shape)
  left, right = (np.linalg.qr(rng.normal(size=(n, k)))[0] for n in shape)
  return (left * np.geomspace(1, 1 / SPREAD, k)) @ right.T


@pytest.fixture(scope='module')
def first_update():
  """(config, gradients, Muon's first update, AdamW's) of a tiny decoder with random gradients
  (MATRICES' of a known spread), no clipping and a constant rate, Muon's 1."""
  config = small_config(**{'optimizer.warmup_steps': 0, 'optimizer.schedule': 'constant',
                           'optimizer.grad_clip_norm': 0.0, 'optimizer.name': 'muon',
                           'optimizer.muon_learning_rate': 1.0})
  leaves, tree = jax.tree.flatten(abstract_params(config))
  rng = np.random.default_rng(0)
  params, grads = (tree.unflatten([rng.normal(size=x.shape).astype(np.float32) for x in leaves])
                   for _ in range(2))
  for name, matrix in MATRICES.items():
    kernel = block_0(grads, name)
    kernel['kernel'] = spread_matrix(matrix, rng).reshape(kernel['kernel'].shape).astype(
        np.float32)
  muon = one_update(config, params, grads)
  config.optimizer.update(name='adamw', muon_learning_rate=0.02)
  return config, grads, muon, one_update(config, params, grads)


@pytest.mark.parametrize('name', list(MATRICES))
def test_a_matrix_update_is_the_orthogonalized_momentum_of_the_folded_matrix(first_update, name):
  _, grads, muon, _ = first_update
  matrix = MATRICES[name]
  grad, update = (np.asarray(block_0(tree, name)['kernel']).reshape(matrix)
                  for tree in (grads, muon))
  scale = math.sqrt(max(1, matrix[1] / matrix[0]))
  # The first momentum is a multiple of the gradient, which the Frobenius normalization removes.
  np.testing.assert_allclose(update, -scale * newton_schulz(grad), atol=2e-5)
  # Orthogonalized: the gradient's singular vectors, with singular values within the
  # iteration's band around 1, where the gradient's spread over a factor of SPREAD.
  u, _, vt = np.linalg.svd(grad, full_matrices=False)
  core = u.T @ (-update / scale) @ vt.T
  assert np.abs(core - np.diag(np.diag(core))).max() < 1e-4
  assert 0.65 < np.diag(core).min() and np.diag(core).max() < 1.2


def test_every_other_parameter_gets_the_adamw_update(first_update):
  config, _, muon, adamw = first_update
  params = abstract_params(config)
  taken = muon_leaves(params)
  flat = lambda tree: {'/'.join(k.key for k in path): np.asarray(x)
                       for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]}
  others = {k: v for k, v in flat(muon).items() if k not in taken}
  assert set(others) == {'embed/tokens', 'final_norm/scale', 'head/unembed/kernel',
                         *(f'decoder/block_{i}/{n}_norm/scale' for i in (0, 1)
                           for n in ('attn', 'mlp'))}
  for key, update in others.items():
    np.testing.assert_array_equal(update, flat(adamw)[key], err_msg=key)


def test_a_muon_step_changes_every_parameter_and_twenty_lower_the_loss(tmp_path):
  config = small_config(steps=20, **{'optimizer.name': 'muon'})
  run = setup.build_run(config)
  init = jax.jit(lambda rng: setup.initial_state(run.model, run.tx,
                                                 run.family.example_inputs(run.model_config),
                                                 rng), out_shardings=run.state_sharding)
  state = init(jax.random.key(0))
  before = jax.tree.map(np.asarray, state.params)
  after, _ = run.train_step(state, sharding.global_batch(run.data.train_batch(0), run.mesh))
  same = jax.tree.map(lambda old, new: np.array_equal(old, np.asarray(new)), before,
                      after.params)
  assert not [jax.tree_util.keystr(path)
              for path, unchanged in jax.tree_util.tree_flatten_with_path(same)[0] if unchanged]
  train.train(config, str(tmp_path))
  run_losses = list(losses(tmp_path).values())
  assert len(run_losses) == 20 and np.mean(run_losses[-5:]) < np.mean(run_losses[:5]) - 0.5


@pytest.mark.slow
def test_muon_on_weights_sharded_over_8_devices_equals_one_device(tmp_path):
  """FSDP shards the matrices Muon orthogonalizes: the step still orthogonalizes each whole."""
  results = {}
  for devices in (1, 8):
    config = small_config(steps=4, sharding_rules=(('embed', 'data'),),
                          **{'mesh.shape': (devices,), 'optimizer.name': 'muon'})
    train.train(config, str(tmp_path / str(devices)))
    results[devices] = list(losses(tmp_path / str(devices)).values())
  assert len(results[1]) == 4
  np.testing.assert_allclose(results[8], results[1], atol=1e-5)


@pytest.mark.parametrize('key,value,message', [
    ('optimizer.name', 'lamb', "optimizer.name='lamb' must be one of ['adamw', 'muon', "
                               "'adafactor', 'sgd']."),
    ('optimizer.muon_learning_rate', 0.0, 'optimizer.muon_learning_rate=0.0 must be a finite '
                                          'number > 0: for example '
                                          '--config.optimizer.muon_learning_rate=0.02.'),
    ('optimizer.muon_momentum', 1.0, 'optimizer.muon_momentum=1.0 must be a finite number >= 0 '
                                     'and < 1: for example --config.optimizer.muon_momentum=0.95.'),
    ('optimizer.muon_ns_steps', 0, 'optimizer.muon_ns_steps=0 must be a whole number >= 1: for '
                                   'example --config.optimizer.muon_ns_steps=5.'),
])
def test_muons_settings_are_checked_before_anything_is_built(key, value, message):
  with pytest.raises(ConfigError) as error:
    train.resolve(small_config(**{key: value}))
  assert str(error.value) == message


def test_make_optimizer_names_the_optimizers_there_are():
  with pytest.raises(ConfigError, match=r"optimizer.name='lamb' must be one of \['adamw', "
                                        r"'muon', 'adafactor', 'sgd'\]"):
    optim.make_optimizer(small_config(**{'optimizer.name': 'lamb'}).optimizer, 10)


@pytest.mark.slow
def test_the_launch_flag_trains_with_muon(tmp_path):
  env = process_env()
  result = subprocess.run(
      [sys.executable, str(ROOT / 'launch.py'), f'--config={ROOT / "tests" / "train_helpers.py"}'
       ':decoder', f'--workdir={tmp_path}', '--config.optimizer.name=muon',
       '--config.training.steps=2'], capture_output=True, text=True, cwd=ROOT, env=env,
      timeout=300)
  assert result.returncode == 0, result.stderr
  assert config_lib.saved_config(str(tmp_path))['optimizer']['name'] == 'muon'
  assert list(losses(tmp_path)) == [1, 2]


def test_the_memory_plan_counts_one_moment_for_muons_leaves_and_two_for_adamws():
  config = small_config(**{'optimizer.name': 'muon', 'mesh.shape': (1,)})
  params = abstract_params(config)
  taken = muon_leaves(params)
  sizes = {'/'.join(k.key for k in path): x.size
           for path, x in jax.tree_util.tree_flatten_with_path(params)[0]}
  # float32 moments; the scalars: clipping's none, AdamW's count and schedule count, Muon's
  # count, schedule count and its 3 Newton-Schulz coefficients.
  expected = 4 * sum(n if k in taken else 2 * n for k, n in sizes.items()) + 4 * (2 + 2 + 3)
  tx, _ = optim.make_optimizer(config.optimizer, config.training.steps)
  state = jax.eval_shape(tx.init, params)
  assert sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state)) == expected
  assert memory.plan(config, mesh={'data': 1}).optimizer == expected
