"""LoRA: adapters start as the base model, the merged kernels compute what the adapter path
x W + scale (x A) B computes, a step trains the adapters alone, the state saves and resumes
exactly, starts from another run's parameters, and the memory plan counts the adapters' optimizer
state."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

from helpers import init, tiny
from train_helpers import losses, small_config, started
from transformer_jax import convert, lora, memory, models, run, train
from transformer_jax.errors import ConfigError
from transformer_jax.layers.linear import Linear
from transformer_jax.train import losses as losses_lib, setup

FAMILIES = {'decoder': {}, 'scanned decoder': dict(scan_layers=True), 'encoder': {},
            'encoder_decoder': {}, 'vit': {}}


def family_config(name):
  return tiny(name.split()[-1], **FAMILIES[name])


def adapters_of(cfg, settings, randomize_b: bool = False):
  """(base params, adapters) of a tiny model; with `randomize_b`, B drawn at random too."""
  base = models.build(cfg).init(jax.random.key(0), *models.example_inputs(cfg, 2))['params']
  adapters = nn.meta.unbox(lora.init_adapters(base, settings, jax.random.key(1)))
  if randomize_b:
    flat = traverse_util.flatten_dict(adapters)
    flat = {path: (jax.random.normal(jax.random.fold_in(jax.random.key(2), i), x.shape)
                   if 'lora_b' in path else x) for i, (path, x) in enumerate(flat.items())}
    adapters = traverse_util.unflatten_dict(flat)
  return nn.meta.unbox(base), adapters


def logits(cfg, params, intercept=None):
  model, inputs = models.build(cfg), models.example_inputs(cfg, 2)
  if intercept is None:
    return model.apply({'params': params}, *inputs)
  with nn.intercept_methods(intercept):
    return model.apply({'params': params}, *inputs)


def adapter_path(adapters, settings):
  """An interceptor that adds scale * (x A) B to each adapted Linear's output, from x folded
  over the Linear's input axes: the adapter model computed without merging any kernel."""
  flat = traverse_util.flatten_dict(adapters)

  def intercept(call, args, kwargs, context):
    out = call(*args, **kwargs)
    module = context.module
    if not isinstance(module, Linear) or context.method_name != '__call__':
      return out
    a = flat.get((*module.path, 'lora_a', 'kernel'))
    if a is None:
      return out
    b, x = flat[(*module.path, 'lora_b', 'kernel')], args[0]
    folded = x.reshape(*x.shape[:x.ndim - len(module.in_axes)], -1)
    delta = settings.scale * (folded @ a) @ b
    return out + delta.reshape(out.shape)
  return intercept


def test_the_default_targets_are_the_query_and_value_kernels_of_every_attention():
  settings = lora.LoraSettings(rank=2)
  for name in FAMILIES:
    base = models.abstract_variables(family_config(name))['params']
    expected = [path for path in traverse_util.flatten_dict(base)
                if path[-1] == 'kernel' and path[-2] in ('query', 'value')]
    assert len(expected) >= 2, name
    assert sorted(lora.adapter_paths(base, settings)) == sorted(expected), name


@pytest.mark.parametrize('name', FAMILIES)
def test_at_initialization_the_adapted_model_is_the_base(name):
  cfg, settings = family_config(name), lora.LoraSettings(rank=3, alpha=6.0)
  base, adapters = adapters_of(cfg, settings)
  flat = traverse_util.flatten_dict(adapters)
  assert all(not np.any(x) for path, x in flat.items() if 'lora_b' in path)
  assert all(x.shape[-1] == 3 and np.std(x) > 0 for path, x in flat.items() if 'lora_a' in path)
  np.testing.assert_array_equal(logits(cfg, lora.merged(base, adapters, settings)),
                                logits(cfg, base))


@pytest.mark.parametrize('name', [name for name in FAMILIES if name != 'scanned decoder'])
def test_the_merged_model_computes_the_adapter_path(name):
  cfg = family_config(name)
  settings = lora.LoraSettings(rank=2, alpha=3.0, targets=r'(query|value|out|up|head)/kernel$')
  base, adapters = adapters_of(cfg, settings, randomize_b=True)
  merged = logits(cfg, lora.merged(base, adapters, settings))
  assert not np.allclose(merged, logits(cfg, base), atol=1e-3)
  np.testing.assert_allclose(merged, logits(cfg, base, adapter_path(adapters, settings)),
                             atol=1e-5, rtol=1e-5)


def lora_config(steps=6, **overrides):
  return small_config(steps=steps, **{'lora.rank': 4, 'lora.alpha': 8.0,
                                      'optimizer.learning_rate': 1e-2, **overrides})


def test_a_step_trains_the_adapters_alone(tmp_path):
  run_, state = started(lora_config(), tmp_path)
  base_shapes = {x.shape for x in jax.tree.leaves(state.base)}
  opt_shapes = {x.shape for x in jax.tree.leaves(state.opt_state)}
  assert not opt_shapes & base_shapes
  assert sum(x.size for x in jax.tree.leaves(state.opt_state)) < 3 * sum(
      x.size for x in jax.tree.leaves(state.params)) + 10
  before = jax.device_get(state)
  after, _ = run_.train_step(state, jax.device_put(run_.data.train_batch(0)))
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(after.base), before.base)
  changed = [not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(after.params),
                                                      jax.tree.leaves(before.params))]
  assert all(changed)  # A's by weight decay alone: test_a_gradient_reaches_a_once_b_has_moved


def adapter_gradients(run_, state, batch) -> dict:
  """{path: the gradient of the batch's summed loss} of each adapter matrix at `state`."""
  def loss(adapters):
    logits, targets, weights = losses_lib.logits_targets_weights(
        run_.model, run_.family, state.model_params(adapters), batch)
    return losses_lib.loss_sums(logits, targets, weights)['loss']
  return traverse_util.flatten_dict(jax.device_get(jax.grad(loss)(state.params)))


def test_a_gradient_reaches_a_once_b_has_moved(tmp_path):
  """B starts at zero, so the loss's gradient reaches B alone and the first step changes A by
  AdamW's weight decay only; after that step B is not zero, and A has a gradient."""
  run_, state = started(lora_config(), tmp_path)
  batch = jax.device_put(run_.data.train_batch(0))
  first = adapter_gradients(run_, state, batch)
  before = traverse_util.flatten_dict(jax.device_get(state.params))
  after, _ = run_.train_step(state, batch)
  moved = traverse_util.flatten_dict(jax.device_get(after.params))
  second = adapter_gradients(run_, after, batch)
  decay = float(run_.schedule(0)) * run_.config.optimizer.weight_decay
  a_paths = [path for path in first if 'lora_a' in path]
  assert len(a_paths) == len(first) // 2 >= 2
  for a in a_paths:
    b = (*a[:-2], 'lora_b', a[-1])
    assert not np.any(first[a]) and np.all(np.any(first[b], axis=-1))  # each of B's rows
    np.testing.assert_allclose(moved[a], before[a] * (1 - decay), rtol=1e-6)
    assert np.any(moved[b]) and np.abs(second[a]).max() > 1e-3 * np.abs(second[b]).max()


def test_training_with_lora_lowers_the_loss(tmp_path):
  train.train(lora_config(steps=30), str(tmp_path))
  logged = losses(tmp_path)
  assert logged[30] < logged[1] - 0.1, logged  # a random base adapted in q and v alone


def test_resume_continues_exactly(tmp_path):
  full = lora_config(steps=6, **{'training.checkpoint_every': 3})
  train.train(full, str(tmp_path / 'full'))
  half = lora_config(steps=3, **{'training.checkpoint_every': 3})
  train.train(half, str(tmp_path / 'resumed'))
  train.train(full, str(tmp_path / 'resumed'))
  assert losses(tmp_path / 'resumed') == losses(tmp_path / 'full')


def test_init_from_checkpoint_is_the_frozen_base_and_eval_runs_the_merged_model(tmp_path):
  source = tmp_path / 'source'
  trained = train.train(small_config(steps=3), str(source))
  config = lora_config(steps=3, init_from_checkpoint=str(source))
  _, state = started(config, tmp_path / 'start')
  jax.tree.map(np.testing.assert_array_equal, state.base, trained.params)
  assert int(state.step) == 0
  fine_tuned = train.train(config, str(tmp_path / 'tuned'))
  jax.tree.map(np.testing.assert_array_equal, fine_tuned.base, trained.params)
  _, params, step = setup.restore_trained(config, str(tmp_path / 'tuned'))
  assert step == 3
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), params,
               lora.merged(fine_tuned.base, fine_tuned.params, lora.LoraSettings.of(config.lora)))
  query = ('decoder', 'block_0', 'attn', 'query', 'kernel')
  get = lambda tree: traverse_util.flatten_dict(tree)[query]
  assert not np.allclose(get(params), get(trained.params))


def test_init_from_hf_is_the_frozen_base(tmp_path):
  config = lora_config()
  params = init(models.model_config(config.model), jax.random.key(3))
  convert.save(str(tmp_path / 'hf'), config.model, params)
  config.init_from_hf = str(tmp_path / 'hf')
  _, state = started(config, tmp_path / 'run')
  jax.tree.map(np.testing.assert_array_equal, state.base, params)
  assert all(not np.any(b) for path, b in traverse_util.flatten_dict(state.params).items()
             if 'lora_b' in path)


def test_targets_that_match_nothing_or_do_not_compile_fail_clearly():
  with pytest.raises(ConfigError, match=r"matches no parameter.*decoder/block_0/"):
    setup.build_run(lora_config(**{'lora.targets': 'nothing_is_called_this'}))
  with pytest.raises(ConfigError, match='not matrices.*norm/scale'):
    setup.build_run(lora_config(**{'lora.targets': 'norm/scale'}))
  with pytest.raises(ConfigError, match='not a regular expression'):
    train.resolve(lora_config(**{'lora.targets': '(query'}))


@pytest.mark.parametrize('key, value', [('lora.rank', -1), ('lora.alpha', -2.0),
                                        ('lora.alpha', 0.0)])
def test_rank_and_alpha_are_range_checked(key, value):
  with pytest.raises(ConfigError, match=key):
    train.resolve(lora_config(**{key: value}))


def test_the_memory_plan_counts_the_adapters_optimizer_state():
  config = lora_config()
  run_ = setup.build_run(config)
  opt_state = jax.eval_shape(run_.tx.init, run_.abstract_state.params)
  nbytes = lambda tree: sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))
  plan, full = memory.plan(config), memory.plan(small_config())
  assert plan.optimizer == nbytes(opt_state) < full.optimizer / 10
  assert plan.params == nbytes(run_.abstract_state.base) + nbytes(run_.abstract_state.params)
  assert plan.params > full.params and plan.gradients < full.gradients / 10


def stacked(tree, num_layers):
  """The decoder's block_0 .. block_{n-1} stacked as a scanned stack's 'layers'."""
  blocks = [tree['decoder'].pop(f'block_{i}') for i in range(num_layers)]
  tree['decoder']['layers'] = jax.tree.map(lambda *xs: jnp.stack(xs), *blocks)
  return tree


def test_a_scanned_stack_merges_each_blocks_adapters_as_the_unrolled_stack():
  cfg = family_config('decoder')
  settings = lora.LoraSettings(rank=2, alpha=3.0, targets=r'(query|out|down)/kernel$')
  base, adapters = adapters_of(cfg, settings, randomize_b=True)
  unrolled = logits(cfg, lora.merged(base, adapters, settings))
  scanned_cfg = family_config('scanned decoder')
  scanned = lora.merged(stacked(base, cfg.num_layers), stacked(adapters, cfg.num_layers), settings)
  np.testing.assert_allclose(logits(scanned_cfg, scanned), unrolled, atol=1e-5, rtol=1e-5)


def test_export_writes_the_merged_model_as_a_hugging_face_checkpoint(tmp_path):
  config = lora_config(steps=2)
  train.train(config, str(tmp_path))
  _, merged, _ = setup.restore_trained(config, str(tmp_path))
  path = run.run(config, str(tmp_path), 'export')
  jax.tree.map(np.testing.assert_array_equal, convert.load_params(path, config.model),
               jax.device_get(merged))

