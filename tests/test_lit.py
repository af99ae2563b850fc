"""LiT (Zhai et al. 2022): a dual encoder's tower started from a ViT run's checkpoint or a Hugging
Face ViT directory, and a locked tower: no gradient, no optimizer state, parameters unchanged."""
import pathlib

import jax
import numpy as np
import pytest

from helpers import init
from train_helpers import small_config, started
from transformer_jax import config_lib, convert, models, train
from transformer_jax.errors import ConfigError
from transformer_jax.train import losses, towers

ROOT = pathlib.Path(__file__).resolve().parent.parent
# The image tower of train_helpers' ViT: 8x8 images in patches of 4, width 32, 2 blocks.
VIT_TOWER = dict(width=32, num_layers=2, num_heads=4, image_size=8, patch_size=4, norm_eps=1e-6,
                 mlp='gelu', pre_norm=False, patch_bias=True, image_pool='cls')


def lit_config(**model):
  config = config_lib.from_file(ROOT / 'configs' / 'clip_reference.py', 'smoke')
  config.model.update(**VIT_TOWER, text_width=32, text_layers=1, text_heads=4, embed_dim=16)
  config.model.update(**model)
  config.optimizer.learning_rate = 1e-2
  return config


@pytest.fixture(scope='module')
def vit_run(tmp_path_factory):
  """(workdir, trained parameters) of a 2-step ViT run."""
  workdir = tmp_path_factory.mktemp('vit')
  trained = train.train(small_config('vit', steps=2), str(workdir))
  return str(workdir), jax.device_get(trained.params)


def float_sizes(tree) -> int:
  return sum(x.size for x in jax.tree.leaves(tree) if np.issubdtype(x.dtype, np.floating))


def test_a_locked_tower_has_no_gradient_no_optimizer_state_and_does_not_move(tmp_path):
  run_, state = started(lit_config(lock_image=True), tmp_path)
  params = jax.device_get(state.params)
  others = {name: tree for name, tree in params.items() if name != 'image'}
  # AdamW's two moments of every parameter outside the locked tower, none of it.
  assert float_sizes(state.opt_state) == 2 * float_sizes(others)
  _, unlocked = started(lit_config(), tmp_path / 'unlocked')
  assert float_sizes(unlocked.opt_state) == 2 * float_sizes(params)
  batch = jax.device_put(run_.data.train_batch(0))
  grads = jax.device_get(jax.grad(lambda p: losses.batch_sums(
      run_.model, run_.family, p, batch, jax.random.key(0), deterministic=True,
      label_smoothing=0.0)['loss'])(state.params))
  assert not any(np.any(g) for g in jax.tree.leaves(grads['image']))
  assert all(np.any(g) for g in jax.tree.leaves(grads['text']))
  for step in range(3):
    state, _ = run_.train_step(state, jax.device_put(run_.data.train_batch(step)))
  after = jax.device_get(state.params)
  jax.tree.map(np.testing.assert_array_equal, after['image'], params['image'])
  moved = [not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(after['text']),
                                                    jax.tree.leaves(params['text']))]
  assert all(moved) and not np.array_equal(after['image_projection']['kernel'],
                                           params['image_projection']['kernel'])


def without_head(params):
  return {name: tree for name, tree in params.items() if name != 'head'}


def test_the_image_tower_starts_from_a_vit_run_or_a_hf_vit(vit_run, tmp_path):
  workdir, trained = vit_run
  vit = small_config('vit').model
  convert.save(tmp_path / 'hf', {**vit, 'num_classes': 4}, trained)
  for source in (workdir, f'{workdir}:2', str(tmp_path / 'hf')):
    run_, state = started(lit_config(image_init=source, lock_image=True),
                          tmp_path / source.replace('/', '_'))
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(state.params['image']),
                 without_head(trained))
  # The rest is the run's own initialization, as without a start.
  _, fresh = started(lit_config(), tmp_path / 'fresh')
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(state.params['text']),
               jax.device_get(fresh.params['text']))


@pytest.mark.parametrize('model, fix', [
    ({'width': 48}, r'has cls_token of shape \(1, 32\) where the tower has \(1, 48\)'),
    ({'pre_norm': True}, 'lacks pre_norm/'),
    ({'mlp': 'quick_gelu'}, "has mlp='gelu' where the tower has 'quick_gelu': set model.mlp"),
    ({'image_pool': 'map'}, 'lacks map_head/'),
])
def test_a_tower_that_does_not_fit_its_source_is_one_line_naming_the_fix(vit_run, model, fix,
                                                                        tmp_path):
  with pytest.raises(ConfigError, match=fix) as error:
    started(lit_config(image_init=vit_run[0], **model), tmp_path)
  assert '\n' not in str(error.value)


def test_a_text_tower_starts_from_a_dual_encoder_with_longer_positions(tmp_path):
  """A SigLIP directory's text tower, its position table of 12 rows cut to the tower's 7 (the
  source itself runs 7-token captions on its first 7 rows)."""
  siglip = dict(family='clip', width=24, num_layers=1, num_heads=2, image_size=12, patch_size=6,
                image_pool='map', pre_norm=False, patch_bias=True, mlp='gelu_tanh',
                text_width=24, text_layers=1, text_heads=2, vocab_size=20, text_causal=False,
                text_pool='last', text_head=True, embed_dim=0, loss='sigmoid', dtype='float32')
  source = models.model_config({**siglip, 'max_len': 12})
  source_params = init(source, jax.random.key(1))
  convert.save(tmp_path / 'siglip', source, source_params)
  cfg = models.model_config({**siglip, 'max_len': 7})
  params = towers.started(init(cfg, jax.random.key(2)), {'text': str(tmp_path / 'siglip')}, cfg)
  theirs = source_params['text']
  expected = {**theirs, 'embed': {**theirs['embed'],
                                  'positions': theirs['embed']['positions'][:7]}}
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(params['text']), expected)
