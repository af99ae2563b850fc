"""Tensor and fully-sharded parallelism by rules: every family trains on 8 simulated devices as on
one, the compiled step holds the collectives tensor parallelism implies and gathers no weight the
rules split, and a mesh that does not divide a dimension is refused before compiling."""
import math
import re

import jax
import numpy as np
import pytest

from helpers import ROOT, load_config
from train_helpers import losses, small_config
from transformer_jax import train
from transformer_jax.errors import ConfigError
from transformer_jax.train import setup, sharding

# (mesh shape over ('data', 'model'), rule set); d_ff=96 so that 2 and 4 divide the MLP.
MESHES = {'8x1 dp': ((8, 1), 'dp'), '4x2 tp': ((4, 2), 'tp'), '2x4 tp': ((2, 4), 'tp'),
          '4x2 fsdp_tp': ((4, 2), 'fsdp_tp')}


def mesh_config(family, shape, rule_set, **overrides):
  return small_config(family, steps=5, rule_set=rule_set, **{
      'mesh.axes': ('data', 'model'), 'mesh.shape': shape, 'model.d_ff': 96, **overrides})


@pytest.fixture(scope='module')
def one_device_losses(tmp_path_factory):
  """family -> its losses on one device, each trained once, when first asked for."""
  runs = {}

  def of(family):
    if family not in runs:
      workdir = tmp_path_factory.mktemp(family)
      train.train(mesh_config(family, (1, 1), 'dp'), str(workdir))
      runs[family] = losses(workdir)
    return runs[family]
  return of


# The decoder by DP and by TP in the default suite, by the other two meshes in the slow step;
# the other families by the two meshes that hold what their rules add (FSDP with TP, TP over four
# devices), in the slow step: data parallelism and TP over two are the decoder's cases again.
CASES = [pytest.param(family, mesh, marks=() if family == 'decoder' and mesh in ('8x1 dp', '4x2 tp')
                      else pytest.mark.slow)
         for family in ('decoder', 'encoder', 'encoder_decoder', 'vit') for mesh in MESHES
         if family == 'decoder' or mesh in ('2x4 tp', '4x2 fsdp_tp')]


@pytest.mark.parametrize('family,mesh', CASES)
def test_eight_devices_by_rules_give_the_losses_of_one(tmp_path, one_device_losses, family, mesh):
  shape, rule_set = MESHES[mesh]
  train.train(mesh_config(family, shape, rule_set), str(tmp_path))
  expected = one_device_losses(family)
  assert list(losses(tmp_path)) == list(expected) == [1, 2, 3, 4, 5]
  np.testing.assert_allclose(list(losses(tmp_path).values()), list(expected.values()), atol=1e-5)


def compiled_collectives(config):
  """[(collective, element count of its result)] of the compiled train step, and the run."""
  run = setup.build_run(config)
  step = run.train_step
  batch = sharding.global_batch(run.data.train_batch(0), run.mesh)
  text = step.lower(run.abstract_state, batch).compile().as_text()
  found = re.findall(r'= \w+\[([\d,]*)\]\S* (all-reduce|all-gather|reduce-scatter)\(', text)
  return [(op, math.prod(int(d) for d in dims.split(',') if d)) for dims, op in found], run


@pytest.mark.parametrize('rule_set', ['tp', 'fsdp_tp'])
def test_tensor_parallel_steps_reduce_activations_and_never_gather_a_split_weight(rule_set):
  # A vocabulary of 40 gives the embedding tables (which FSDP gathers whole: 'tp' leaves them
  # unsplit over 'model') an element count no weight split over 'model' has, so that a gathered
  # weight is known by its size: 1280 against 1024 (attention) and 3072 (MLP).
  collectives, run = compiled_collectives(mesh_config('decoder', (4, 2), rule_set,
                                                      **{'model.vocab_size': 40}))
  split_weights = {math.prod(leaf.shape) for leaf, s in zip(
      jax.tree.leaves(run.abstract_state.params), jax.tree.leaves(run.state_sharding.params))
      if 'model' in jax.tree.leaves(tuple(s.spec))}
  assert split_weights  # the rules split the heads and the MLP over 'model'
  gathered = {size for op, size in collectives if op == 'all-gather'}
  assert not gathered & split_weights, 'a weight the rules split over model was gathered whole'
  if rule_set == 'tp':
    # Per block, the attention output and the MLP down projection each sum their partial
    # products over 'model': (tokens per data shard) x width, forward.
    tokens = run.settings.data.batch_size // 4 * run.settings.data.seq_len
    reduced = [op for op, size in collectives if size == tokens * run.model_config.width]
    assert len(reduced) >= 2 * run.model_config.num_layers


def test_a_dimension_the_mesh_does_not_divide_is_refused_before_compiling(tmp_path):
  config = load_config(ROOT / 'configs' / 'llama_shakespeare.py')  # SwiGLU hidden 341
  config.update(rule_set='tp')
  config.mesh.update(axes=('data', 'model'), shape=(4, 2))
  config.data.update(name='synthetic', alphabet=''.join(map(chr, range(33, 98))))
  with pytest.raises(ConfigError) as error:
    train.train(config, str(tmp_path))
  message = str(error.value)
  assert "decoder/block_0/mlp/gate/kernel (128, 341): dimension 1 ('mlp', 341) over mesh axis " \
         "model of size 2 (rule ('mlp', 'model'))" in message
  assert 'model.d_ff' in message and 'config.rule_set' in message
  assert not (tmp_path / 'checkpoints').exists()


def test_a_rule_set_needs_its_mesh_axis():
  config = small_config(rule_set='tp')  # the mesh has only 'data'
  with pytest.raises(ConfigError, match=r"rule_set='tp' splits over the mesh axis 'model'"):
    train.resolve(config)


def test_explicit_rules_come_before_the_rule_set():
  config = small_config(rule_set='tp', sharding_rules=(('mlp', None),))
  rules = sharding.rules_of(config.rule_set, config.sharding_rules)
  assert rules[0] == ('mlp', None) and ('mlp', 'model') in rules
  assert sharding.rules_of('fsdp')[1] == ('embed', 'data')
