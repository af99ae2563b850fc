"""The families: causality, scanned vs unrolled stacks, the cache hooks, config errors."""
import importlib

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import CONFIG_FILES, init, load_config, tiny
from train_helpers import losses, small_config
from transformer_jax import accounting, decode, describe, models, train
from transformer_jax.layers import causal_mask
from transformer_jax.model_config import ModelConfig
from transformer_jax.models import styles

TOKENS = jnp.array([[3, 7, 1, 9, 4, 2, 8, 5], [6, 1, 1, 2, 3, 9, 9, 4]], jnp.int32)


def changed_later_token(tokens, index=5):
  return tokens.at[:, index].set((tokens[:, index] + 1) % 40)


@pytest.mark.parametrize('style', ['gpt2', 'llama'])
def test_decoder_is_causal(rng, style):
  cfg = tiny('decoder', **styles.STYLES[style])
  model, params = models.build(cfg), init(cfg, rng)
  before = model.apply({'params': params}, TOKENS)
  after = model.apply({'params': params}, changed_later_token(TOKENS))
  np.testing.assert_array_equal(before[:, :5], after[:, :5])
  assert np.abs(before[:, 5:] - after[:, 5:]).min(axis=-1).max() > 0


def test_encoder_is_bidirectional(rng):
  cfg = tiny('encoder', norm_position='post', embed_norm=True)
  model, params = models.build(cfg), init(cfg, rng)
  before = model.apply({'params': params}, TOKENS)
  after = model.apply({'params': params}, changed_later_token(TOKENS))
  assert np.abs(before[:, :5] - after[:, :5]).max(axis=-1).min() > 1e-6


def test_encoder_never_attends_to_padding(rng):
  cfg = tiny('encoder')
  model, params = models.build(cfg), init(cfg, rng)
  valid = jnp.arange(8)[None] < jnp.array([[6], [8]])
  before = model.apply({'params': params}, TOKENS, valid=valid)
  after = model.apply({'params': params}, TOKENS.at[0, 6:].set(0), valid=valid)
  np.testing.assert_allclose(before[0, :6], after[0, :6], atol=1e-6)


def test_encoder_decoder_masks(rng):
  cfg = tiny('encoder_decoder')
  model, params = models.build(cfg), init(cfg, rng)
  logits = model.apply({'params': params}, TOKENS, TOKENS)
  later_target = model.apply({'params': params}, TOKENS, changed_later_token(TOKENS))
  np.testing.assert_array_equal(logits[:, :5], later_target[:, :5])
  later_input = model.apply({'params': params}, changed_later_token(TOKENS), TOKENS)
  assert np.abs(logits[:, :5] - later_input[:, :5]).max(axis=-1).min() > 1e-6


FAMILY_OPTIONS = {
    'decoder': dict(mlp='swiglu', positions='rope', num_kv_heads=2, norm='rmsnorm'),
    'encoder': dict(norm_position='post', embed_norm=True, type_vocab_size=2),
    'encoder_decoder': dict(positions='sinusoidal', mlp='relu'),
    'vit': dict(pool='mean'),
}


@pytest.mark.parametrize('family', list(FAMILY_OPTIONS))
@pytest.mark.parametrize('remat', ['none', 'full'])
def test_scanned_stack_equals_unrolled(rng, family, remat):
  unrolled = tiny(family, num_layers=3, **FAMILY_OPTIONS[family])
  scanned = tiny(family, num_layers=3, scan_layers=True, remat_policy=remat,
                 **FAMILY_OPTIONS[family])
  params = init(unrolled, rng)
  inputs = models.example_inputs(unrolled, 2)
  if family != 'vit':
    inputs = tuple(TOKENS for _ in inputs)
  expected = models.build(unrolled).apply({'params': params}, *inputs)
  stacked = models.stack_layers(params)
  assert 'layers' in stacked[next(k for k in stacked if k in ('decoder', 'encoder'))]
  got = models.build(scanned).apply({'params': stacked}, *inputs)
  np.testing.assert_allclose(got, expected, atol=2e-5, rtol=1e-5)
  assert jax.tree.all(jax.tree.map(np.array_equal, models.unstack_layers(stacked), params))


def axis_names(boxed):
  return jax.tree.map(lambda box: box.names, boxed,
                      is_leaf=lambda leaf: isinstance(leaf, nn.Partitioned))


@pytest.mark.parametrize('family', ['decoder', 'vit'])
@pytest.mark.parametrize('from_scanned', [True, False])
def test_stack_and_unstack_the_boxed_params_init_returns(rng, family, from_scanned):
  # Boxed as init returns them, the parameters keep axis names that match the other stack's
  # init: a scanned stack's have a leading 'layers' axis, an unrolled stack's not.
  configs = [tiny(family, num_layers=3, scan_layers=scan, **FAMILY_OPTIONS[family])
             for scan in (from_scanned, not from_scanned)]
  source, target = [models.build(cfg) for cfg in configs]
  inputs = (TOKENS,) if family == 'decoder' else models.example_inputs(configs[0], 2)
  params = source.init(rng, *inputs)['params']
  move, move_back = ((models.unstack_layers, models.stack_layers) if from_scanned
                     else (models.stack_layers, models.unstack_layers))
  moved = move(params)
  assert axis_names(moved) == axis_names(models.abstract_variables(configs[1])['params'])
  np.testing.assert_allclose(target.apply({'params': moved}, *inputs),
                             source.apply({'params': params}, *inputs), rtol=1e-6, atol=1e-6)
  back = move_back(moved)
  assert axis_names(back) == axis_names(params)
  assert jax.tree.all(jax.tree.map(np.array_equal, back, params))


def test_scanned_params_carry_a_layers_axis(rng):
  cfg = tiny('decoder', num_layers=3, scan_layers=True)
  boxed = models.build(cfg).init(rng, TOKENS)['params']
  spec = nn.get_partition_spec(boxed)
  assert spec['decoder']['layers']['attn']['query']['kernel'] == jax.sharding.PartitionSpec(
      'layers', 'embed', 'heads', 'head_dim')


@pytest.mark.parametrize('scan', [False, True])
def test_cache_hooks_reproduce_the_full_forward_pass(rng, scan):
  # Prefill 5 tokens into an 8-slot cache, then feed the rest one at a time.
  cfg = tiny('decoder', positions='rope', num_kv_heads=2, scan_layers=scan)
  model, params = models.build(cfg), init(cfg, rng)
  full = model.apply({'params': params}, TOKENS)
  cache = jax.eval_shape(lambda: model.init(rng, TOKENS, cache_index=0,
                                            attention_mask=causal_mask(jnp.arange(8),
                                                                       jnp.zeros((2, 8), int), 8)))
  cache = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), cache['cache'])
  steps = [(0, 5), (5, 6), (6, 7), (7, 8)]
  for start, stop in steps:
    positions = jnp.broadcast_to(jnp.arange(start, stop), (2, stop - start))
    mask = causal_mask(jnp.arange(start, stop), positions, 8)
    logits, state = model.apply({'params': params, 'cache': cache}, TOKENS[:, start:stop],
                                positions, attention_mask=mask, cache_index=start,
                                mutable=['cache'])
    cache = state['cache']
    np.testing.assert_allclose(logits, full[:, start:stop], atol=1e-5)


def test_cross_attention_keys_are_cached_once(rng):
  cfg = tiny('encoder_decoder')
  model, params = models.build(cfg), init(cfg, rng)
  full = model.apply({'params': params}, TOKENS, TOKENS)
  encoded = model.apply({'params': params}, TOKENS, method='encode')
  variables = jax.eval_shape(lambda: model.init(
      rng, TOKENS, TOKENS, method=lambda m, i, t: m.decode(
          t, m.encode(i), attention_mask=causal_mask(jnp.arange(8), jnp.zeros((2, 8), int), 8),
          cache_index=0)))
  cache = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), variables['cache'])
  for start in range(8):
    positions = jnp.full((2, 1), start)
    mask = causal_mask(jnp.arange(start, start + 1), positions, 8)
    logits, state = model.apply(
        {'params': params, 'cache': cache}, TOKENS[:, start:start + 1],
        encoded if start == 0 else None, None, positions, attention_mask=mask, cache_index=start,
        method='decode', mutable=['cache'])
    cache = state['cache']
    np.testing.assert_allclose(logits[:, 0], full[:, start], atol=1e-5)


def test_vit_mean_and_cls_pooling(rng):
  images = jax.random.normal(rng, (2, 8, 8, 3))
  for pool, tokens in (('cls', 5), ('mean', 4)):
    cfg = tiny('vit', pool=pool)
    params = init(cfg, rng)
    assert params['pos_embed'].shape == (tokens, 32)
    assert models.build(cfg).apply({'params': params}, images).shape == (2, 5)


def test_vit_runs_at_a_new_resolution_with_resized_positions(rng):
  from transformer_jax.models import vit
  cfg = tiny('vit')
  params = init(cfg, rng)
  bigger = models.model_config(dict(cfg.__dict__, image_size=16))
  with pytest.raises(ValueError, match='resize'):
    models.build(cfg).apply({'params': params}, jnp.zeros((1, 16, 16, 3)))
  resized = vit.resize_positions(params, 16, cfg)
  assert resized['pos_embed'].shape == (17, 32)
  assert models.build(bigger).apply({'params': resized}, jnp.zeros((1, 16, 16, 3))).shape == (1, 5)


@pytest.mark.parametrize('overrides,message', [
    (dict(width=30, num_heads=4), 'num_heads=4 does not divide model.width=30'),
    (dict(num_kv_heads=3), 'num_kv_heads=3 does not divide model.num_heads=4'),
    (dict(family='vit', image_size=30, patch_size=4),
     'patch_size=4 does not divide model.image_size=30'),
    (dict(family='gpt'), "Unknown family 'gpt'"),
    (dict(family='vit', pool='max'), "Unknown pool 'max'"),
    (dict(norm='batchnorm'), "Unknown norm 'batchnorm'"),
    (dict(mlp='geglu'), "Unknown mlp 'geglu'"),
    (dict(positions='alibi'), "Unknown positions 'alibi'"),
    (dict(num_heads=32, positions='rope', width=96), 'RoPE rotates pairs'),
    (dict(vocab_size=0), 'model.vocab_size is unset and no data has stated it'),
    (dict(family='vit', num_classes=0), 'model.num_classes is unset'),
    (dict(hidden=3), "Unknown model config key"),
    (dict(family='vit', vocab_size=10),  # a setting of the text families, not at its default
     r"Unknown model config key\(s\) \['vocab_size'\] for family 'vit'"),
])
def test_bad_configs_fail_at_build_time_naming_the_fix(overrides, message):
  cfg = dict(family='decoder', width=32, num_heads=4)
  cfg.update(overrides if overrides.get('family') == 'vit' else {'vocab_size': 10, **overrides})
  with pytest.raises(ValueError, match=message):
    models.build(cfg)


@pytest.mark.parametrize('path', CONFIG_FILES, ids=lambda p: p.stem)
def test_every_config_builds_and_describes(path):
  config = load_config(path)
  config.compile.xla_memory = False  # full-sized models: their plan, no compile
  text = describe.describe(config)
  assert f'{models.model_config(config.model).family} model:' in text
  assert 'FLOPs per' in text


def test_vit_cifar_variant_names_width_depth_heads_and_patch():
  model = load_config(CONFIG_FILES[0].parent / 'vit_cifar.py', 'variant=S/8').model
  assert (model.width, model.num_layers, model.num_heads, model.patch_size) == (384, 12, 6, 8)
  with pytest.raises(ValueError, match='NAME/PATCH'):
    load_config(CONFIG_FILES[0].parent / 'vit_cifar.py', 'variant=Q/4')


def test_a_family_of_your_own_joins_with_one_entry_and_trains(tmp_path):
  conv_family = importlib.import_module('conv_family')  # registers 'conv_lm'
  config = small_config('decoder', steps=2)
  config.model.family = 'conv_lm'
  state = train.train(config, str(tmp_path))
  assert int(state.step) == 2
  assert all(np.isfinite(loss) for loss in losses(tmp_path).values())
  assert models.registry.get('conv_lm') is conv_family.FAMILY
  # The accounting counts its initialized tree (no formula describes it) and asks XLA its FLOPs.
  counts = accounting.param_counts(config.model)
  assert counts == accounting.count_params(state.params)
  assert counts['attention'] > 0 and counts['other'] == 0  # the convolutions fill the attn slot
  assert accounting.forward_flops(config.model, seq_len=16)['total'] > 0
  config.compile.xla_memory = False
  assert 'conv_lm model' in describe.describe(config)
  with pytest.raises(ValueError, match="'conv_lm' model cannot decode"):
    decode.generate(models.build(config.model), state.params, np.zeros((1, 2), np.int32),
                    max_new_tokens=2)


def test_an_unvalidated_config_never_rounds_the_head_width():
  with pytest.raises(ValueError, match='num_heads=3 does not divide model.width=100'):
    _ = ModelConfig(width=100, num_heads=3).head_dim
  assert ModelConfig(width=96, num_heads=3).head_dim == 32
