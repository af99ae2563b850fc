"""The optimizers and schedules the originals train with: each schedule against its closed form
and transformers' own at several steps (and traced, as a vmapped sweep traces its numbers);
Adafactor against optax's transformations on the matrices it factors (a block's kernel as the
matrix of its input and output axes, each block of a scanned stack alone); SGD with momentum
against torch.optim.SGD; the locked-tower and LoRA paths with each; and the settings that would
silently do nothing, or break the schedule, refused in one line before anything is built."""
import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
import torch
import transformers

from helpers import ROOT
from train_helpers import small_config, started
from transformer_jax import config_lib, train
from transformer_jax.errors import ConfigError
from transformer_jax.settings import OptimizerSettings
from transformer_jax.train import optim

PEAK, WARMUP, TOTAL = 3e-3, 7, 50
STEPS = np.arange(TOTAL + 5)  # past the last step, too


def schedule(steps=STEPS, **settings):
  opt = ml_collections.ConfigDict(dict(dict(learning_rate=PEAK, warmup_steps=WARMUP,
                                            min_lr_ratio=0.0, decay_fraction=0.2), **settings))
  return np.asarray(jax.vmap(optim.learning_rate_schedule(opt, TOTAL))(steps))


def warmup(step):
  """Ours: one step ahead of a warmup from 0, so that the first update is a real one."""
  return PEAK * (step + 1) / WARMUP


def transformers_rates(make, **kwargs) -> np.ndarray:
  """The rates of one of transformers' schedules (`make`, a get_*_schedule) at STEPS."""
  parameter = torch.nn.Parameter(torch.zeros(1))
  scheduler = make(torch.optim.SGD([parameter], lr=PEAK), **kwargs)
  return np.array([PEAK * scheduler.lr_lambdas[0](int(step)) for step in STEPS])


@pytest.mark.parametrize('floor', [0.0, 0.1])
def test_linear_decay_is_transformers_linear_schedule_after_the_warmup(floor):
  """BERT's and Whisper's: to the floor at TOTAL, from the peak at the end of the warmup."""
  ours = schedule(schedule='linear', min_lr_ratio=floor)
  np.testing.assert_allclose(ours[:WARMUP], warmup(STEPS[:WARMUP]), rtol=1e-6)
  after = STEPS[WARMUP:]
  expected = PEAK * (floor + (1 - floor) * np.clip((TOTAL - after) / (TOTAL - WARMUP), 0, 1))
  np.testing.assert_allclose(ours[WARMUP:], expected, rtol=1e-5, atol=1e-10)
  if floor == 0.0:
    hf = transformers_rates(transformers.get_linear_schedule_with_warmup,
                            num_warmup_steps=WARMUP, num_training_steps=TOTAL)
    np.testing.assert_allclose(ours[WARMUP:], hf[WARMUP:], rtol=1e-5, atol=1e-10)
  assert ours[WARMUP] == pytest.approx(PEAK) and ours[TOTAL] == pytest.approx(floor * PEAK)


@pytest.mark.parametrize('floor', [0.0, 0.1])
def test_warmup_stable_decay_holds_the_peak_then_decays_as_one_minus_sqrt(floor):
  """Hagele et al. 2024's cooldown over the last 20% (10 of 50 steps), as transformers'
  get_wsd_schedule(decay_type='1-sqrt') computes it after the warmup."""
  ours = schedule(schedule='wsd', min_lr_ratio=floor)
  np.testing.assert_allclose(ours[:WARMUP], warmup(STEPS[:WARMUP]), rtol=1e-6)
  np.testing.assert_allclose(ours[WARMUP:40], PEAK, rtol=1e-6)
  for step, done in [(40, 0.0), (42, 0.2), (45, 0.5), (49, 0.9), (50, 1.0), (54, 1.0)]:
    assert ours[step] == pytest.approx(PEAK * (floor + (1 - floor) * (1 - math.sqrt(done))),
                                       rel=1e-5)
  hf = transformers_rates(transformers.get_wsd_schedule, num_warmup_steps=WARMUP,
                          num_decay_steps=10, num_training_steps=TOTAL, decay_type='1-sqrt',
                          min_lr_ratio=floor)
  np.testing.assert_allclose(ours[WARMUP:], hf[WARMUP:], rtol=1e-5)


def test_inverse_square_root_is_t5s_one_over_sqrt_max_step_warmup():
  """T5 (Raffel et al. 2020): 1 / sqrt(max(n, 10^4)), a plateau of 0.01 for the first 10^4
  steps from step 0, then 1 / sqrt(n); learning_rate is T5X's constant factor."""
  steps = np.array([0, 1, 5000, 9999, 10000, 40000, 250000])
  for factor in (1.0, 2.5):
    rates = schedule(steps, schedule='rsqrt', learning_rate=factor, warmup_steps=10_000)
    np.testing.assert_allclose(rates, factor * np.array([0.01] * 5 + [0.005, 0.002]), rtol=1e-6)


def test_constant_holds_the_peak_after_the_warmup():
  ours = schedule(schedule='constant')
  np.testing.assert_allclose(ours, np.where(STEPS < WARMUP, warmup(STEPS), PEAK), rtol=1e-6)


@pytest.mark.parametrize('name', ['linear', 'wsd', 'rsqrt', 'constant'])
def test_every_schedule_takes_its_numbers_traced(name):
  """A vmapped sweep traces the peak, the warmup, the floor and the decay's share."""
  numbers = jnp.array([PEAK, WARMUP, 0.1, 0.3])

  def traced(numbers):
    opt = OptimizerSettings(schedule=name, min_lr_ratio=0.1 if name in ('linear', 'wsd') else 0,
                            decay_fraction=0.3 if name == 'wsd' else 0.2, warmup_steps=WARMUP)
    names = ('learning_rate', 'warmup_steps', 'min_lr_ratio', 'decay_fraction')
    opt = opt.with_traced(**dict(zip(names, numbers)))
    return jax.vmap(optim.learning_rate_schedule(opt, TOTAL))(STEPS)
  settings = dict(min_lr_ratio=0.1, decay_fraction=0.3) if name in ('linear', 'wsd') else {}
  np.testing.assert_allclose(jax.jit(traced)(numbers), schedule(schedule=name, **settings),
                             rtol=1e-6)


def optax_adafactor(min_dim_size_to_factor=128):
  """optax's Adafactor without its learning rate and sign: the factored second moments, the
  clipping of each array's update to an RMS of 1 and the scaling by the parameter's RMS."""
  return optax.chain(
      optax.scale_by_factored_rms(decay_rate=0.8, epsilon=1e-30,
                                  min_dim_size_to_factor=min_dim_size_to_factor),
      optax.clip_by_block_rms(1.0), optax.scale_by_param_block_rms(1e-3))


def run_updates(tx, params, steps=4, seed=0):
  """The updates of `tx` over `steps` steps of random gradients of several scales, the
  parameters moved by 0.05 times each update."""
  rng = np.random.default_rng(seed)
  state, out = tx.init(params), []
  for step in range(steps):
    scale = 10.0 ** (step - 2)
    grads = jax.tree.map(lambda p, scale=scale: jnp.asarray(rng.normal(size=p.shape) * scale,
                                                            jnp.float32), params)
    updates, state = jax.jit(tx.update)(grads, state, params)
    params = jax.tree.map(lambda p, u: p - 0.05 * u, params, updates)
    out.append(updates)
  return out


def random_tree(shapes, seed=1):
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda s: jnp.asarray(rng.normal(size=s), jnp.float32), shapes,
                      is_leaf=lambda s: isinstance(s, tuple))


def test_adafactor_outside_the_blocks_is_optax_adafactor():
  """Embeddings, heads and norms: the two largest axes factored where both reach 128 (optax's
  rule and T5X's for arrays of two axes), clipping and parameter scale over the whole array."""
  params = random_tree({'embed': {'tokens': (160, 144)}, 'final_norm': {'scale': (144,)},
                        'head': {'unembed': {'kernel': (144, 130)}},
                        'position_bias': {'table': (32, 8)}})
  factoring = optim.adafactor_factoring(params)
  assert factoring['embed']['tokens'].rows and not factoring['position_bias']['table'].rows
  ours, theirs = (run_updates(tx, params) for tx in (optim.scale_by_adafactor(),
                                                     optax_adafactor()))
  for step, (a, b) in enumerate(zip(ours, theirs)):
    jax.tree.map(lambda x, y, step=step: np.testing.assert_allclose(
        x, y, rtol=2e-5, atol=1e-7, err_msg=f'step {step}'), a, b)


# A block's kernels as the matrices T5X factors (embed against heads x head_dim), and the same
# kernels of a scanned stack: 3 layers, each its own matrix.
BLOCK_SHAPES = {'query': ((144, 4, 40), (144, 160)), 'out': ((4, 40, 144), (160, 144)),
                'up': ((144, 130), (144, 130)), 'small': ((16, 24), (16, 24))}


def block_params(shapes):
  return {'decoder': {'block_0': {'attn': {'query': {'kernel': shapes['query']},
                                           'out': {'kernel': shapes['out']}},
                                  'mlp': {'up': {'kernel': shapes['up']},
                                          'down': {'kernel': shapes['small']}}}},
          'encoder': {'layers': {'attn': {'query': {'kernel': (3, *shapes['query'])}},
                                 'mlp_norm': {'scale': (3, 144)}}}}


def test_adafactor_factors_each_block_kernel_as_its_matrix_and_each_scanned_layer_alone():
  """A query (embed, heads, head_dim) is factored as the (embed, heads * head_dim) matrix, a
  small kernel not at all, and a scanned stack's layers each as its own array: optax's
  Adafactor on those matrices, one array per layer, computes the same updates."""
  params = random_tree(block_params({k: v[0] for k, v in BLOCK_SHAPES.items()}))
  factoring = optim.adafactor_factoring(params)
  assert factoring['decoder']['block_0']['attn']['query']['kernel'] == ((), (0,), (1, 2))
  assert factoring['encoder']['layers']['attn']['query']['kernel'] == ((0,), (1,), (2, 3))
  assert not factoring['decoder']['block_0']['mlp']['down']['kernel'].rows

  def to_matrices(tree):
    """{name: matrix} of a tree of block_params: each kernel as its matrix, each layer of the
    scanned stack an array of its own."""
    b, s = tree['decoder']['block_0'], tree['encoder']['layers']
    kernels = {'query': b['attn']['query']['kernel'], 'out': b['attn']['out']['kernel'],
               'up': b['mlp']['up']['kernel'], 'small': b['mlp']['down']['kernel'],
               **{f'layer_{i}': s['attn']['query']['kernel'][i] for i in range(3)}}
    return {**{name: x.reshape(BLOCK_SHAPES.get(name, BLOCK_SHAPES['query'])[1])
               for name, x in kernels.items()},
            **{f'norm_{i}': s['mlp_norm']['scale'][i] for i in range(3)}}
  # The same random gradients for both, each matrix's a reshaped slice of the tree's.
  grads = [random_tree(jax.tree.map(lambda x: x.shape, params), seed=step) for step in range(3)]

  def steps_of(tx, tree, to_tree):
    state, out = tx.init(tree), []
    for grad in grads:
      updates, state = jax.jit(tx.update)(to_tree(grad), state, tree)
      tree = jax.tree.map(lambda p, u: p - 0.05 * u, tree, updates)
      out.append(updates)
    return out
  ours = steps_of(optim.scale_by_adafactor(), params, lambda g: g)
  theirs = steps_of(optax_adafactor(), to_matrices(params), to_matrices)
  for a, b in zip(ours, theirs):
    for name, update in to_matrices(a).items():
      np.testing.assert_allclose(update, b[name], rtol=2e-5, atol=1e-7, err_msg=name)


@pytest.mark.parametrize('nesterov', [False, True])
def test_sgd_with_momentum_is_torch_sgd(nesterov):
  """buffer = 0.9 buffer + gradient, the update -rate * buffer (Nesterov's: -rate * (gradient +
  0.9 buffer)), at the schedule's rate of each step."""
  params = random_tree({'mlp': {'kernel': (5, 3)}, 'norm': {'scale': (3,)}})
  opt = OptimizerSettings(name='sgd', schedule='linear', learning_rate=0.1, warmup_steps=2,
                          weight_decay=0.0, grad_clip_norm=0.0, sgd_nesterov=nesterov)
  tx, rate = optim.make_optimizer(opt, 6)
  torch_params = {k: torch.nn.Parameter(torch.tensor(np.asarray(v)))
                  for k, v in jax.tree_util.tree_leaves_with_path(params)}  # in leaf order
  sgd = torch.optim.SGD(list(torch_params.values()), lr=0.1, momentum=0.9, nesterov=nesterov)
  state = tx.init(params)
  rng = np.random.default_rng(0)
  for step in range(6):
    grads = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), jnp.float32), params)
    updates, state = tx.update(grads, state, params)
    params = optax.apply_updates(params, updates)
    for grad, parameter in zip(jax.tree.leaves(grads), torch_params.values()):
      parameter.grad = torch.tensor(np.asarray(grad))
    sgd.param_groups[0]['lr'] = float(rate(step))
    sgd.step()
  for ours, theirs in zip(jax.tree.leaves(params), torch_params.values()):
    np.testing.assert_allclose(ours, theirs.detach().numpy(), rtol=1e-6, atol=1e-7)


def test_sgd_decays_the_masked_weights_as_torch_sgds_weight_decay_without_momentum():
  """Without momentum decoupled decay is torch's: p - rate * (gradient + decay * p), on the
  kernels alone (optimizer.decay_norms_and_biases=False)."""
  params = random_tree({'mlp': {'kernel': (4, 3)}, 'norm': {'scale': (3,)}})
  grads = random_tree({'mlp': {'kernel': (4, 3)}, 'norm': {'scale': (3,)}}, seed=2)
  opt = OptimizerSettings(name='sgd', schedule='constant', learning_rate=0.5,
                          weight_decay=0.1, grad_clip_norm=0.0, sgd_momentum=0.0)
  tx, _ = optim.make_optimizer(opt, 3)
  updates, _ = tx.update(grads, tx.init(params), params)
  kernel = torch.nn.Parameter(torch.tensor(np.asarray(params['mlp']['kernel'])))
  scale = torch.nn.Parameter(torch.tensor(np.asarray(params['norm']['scale'])))
  sgd = torch.optim.SGD([{'params': [kernel], 'weight_decay': 0.1},
                         {'params': [scale], 'weight_decay': 0.0}], lr=0.5)
  kernel.grad, scale.grad = (torch.tensor(np.asarray(g)) for g in
                             (grads['mlp']['kernel'], grads['norm']['scale']))
  sgd.step()
  new = optax.apply_updates(params, updates)
  np.testing.assert_allclose(new['mlp']['kernel'], kernel.detach().numpy(), rtol=1e-6)
  np.testing.assert_allclose(new['norm']['scale'], scale.detach().numpy(), rtol=1e-6)


OPTIMIZERS = {
    'adafactor': {'optimizer.name': 'adafactor', 'optimizer.schedule': 'rsqrt',
                  'optimizer.learning_rate': 0.1, 'optimizer.warmup_steps': 2,
                  'optimizer.weight_decay': 0.0},
    'sgd': {'optimizer.name': 'sgd', 'optimizer.schedule': 'wsd',
            'optimizer.learning_rate': 0.3},
}


@pytest.mark.parametrize('name', list(OPTIMIZERS))
def test_a_frozen_subtree_gets_no_update_and_no_state(name):
  """A locked tower (a family's frozen subtrees) with Adafactor and SGD as with AdamW."""
  config = small_config(**OPTIMIZERS[name])
  params = random_tree({'image': {'kernel': (4, 3)}, 'text': {'kernel': (4, 3),
                                                              'norm': {'scale': (3,)}}})
  tx, _ = optim.make_optimizer(config.optimizer, 6, frozen=('image',))
  state = tx.init(params)
  assert not any('image' in jax.tree_util.keystr(path)
                 for path, _ in jax.tree_util.tree_leaves_with_path(state))
  updates, _ = tx.update(random_tree(jax.tree.map(lambda x: x.shape, params), seed=3), state,
                         params)
  assert not np.any(updates['image']['kernel'])
  assert all(np.all(u != 0) for u in jax.tree.leaves(updates['text']))


@pytest.mark.parametrize('name', ['adafactor', pytest.param('sgd', marks=pytest.mark.slow)])
def test_lora_trains_the_adapters_alone_with_adafactor_and_sgd(name, tmp_path):
  config = small_config(steps=3, **{'lora.rank': 4, 'lora.alpha': 8.0, **OPTIMIZERS[name]})
  run_, state = started(config, tmp_path)
  before = jax.device_get(state)
  for step in range(2):
    state, metrics = run_.train_step(state, jax.device_put(run_.data.train_batch(step)))
  after = jax.device_get(state)
  jax.tree.map(np.testing.assert_array_equal, after.base, before.base)
  assert np.isfinite(float(metrics['loss']))
  # B starts at zero and moves at the first step; A moves once B has.
  assert all(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(after.params),
                                                      jax.tree.leaves(before.params)))


@pytest.mark.parametrize('settings,message', [
    ({'optimizer.name': 'muon', 'optimizer.adafactor_decay_rate': 0.5},
     "optimizer.adafactor_decay_rate=0.5 is read by optimizer.name='adafactor', not by 'muon': "
     "leave it at 0.8, or set --config.optimizer.name=adafactor."),
    ({'optimizer.name': 'adafactor', 'optimizer.b2': 0.98},
     "optimizer.b2=0.98 is read by optimizer.name='adamw' or 'muon', not by 'adafactor': leave "
     "it at 0.95, or set --config.optimizer.name=adamw."),
    ({'optimizer.name': 'adafactor', 'optimizer.muon_learning_rate': 0.05},
     "optimizer.muon_learning_rate=0.05 is read by optimizer.name='muon', not by 'adafactor'"),
    ({'optimizer.sgd_nesterov': True},
     "optimizer.sgd_nesterov=True is read by optimizer.name='sgd', not by 'adamw'"),
    ({'optimizer.schedule': 'rsqrt', 'optimizer.min_lr_ratio': 0.1},
     "optimizer.min_lr_ratio=0.1 is read by optimizer.schedule='cosine' or 'linear' or 'wsd', "
     "not by 'rsqrt'"),
    ({'optimizer.decay_fraction': 0.1},
     "optimizer.decay_fraction=0.1 is read by optimizer.schedule='wsd', not by 'cosine'"),
    ({'optimizer.warmup_steps': 7},
     'optimizer.warmup_steps=7 is past the end of the run (training.steps=6), whose schedule '
     'would never leave its warmup: for example --config.optimizer.warmup_steps=0.'),
    ({'optimizer.schedule': 'wsd', 'optimizer.warmup_steps': 3, 'optimizer.decay_fraction': 0.6},
     'optimizer.warmup_steps=3 and the decay over the last optimizer.decay_fraction=0.6 of '
     'training.steps=6 (3.6 steps) overlap: shorten one of them.'),
    ({'optimizer.schedule': 'rsqrt', 'optimizer.warmup_steps': 0},
     "optimizer.schedule='rsqrt' is learning_rate / sqrt(max(step, warmup_steps)), infinite at "
     "step 0 with optimizer.warmup_steps=0"),
    ({'training.z_loss': -1e-4}, 'training.z_loss=-0.0001 must be a finite number >= 0'),
    ({'training.loss_normalizing_factor': 0.0},
     'training.loss_normalizing_factor=0.0 must be a finite number > 0 (or None): for example '
     '--config.training.loss_normalizing_factor=233472.'),
    ({'optimizer.adafactor_min_dim_size_to_factor': 0, 'optimizer.name': 'adafactor'},
     'optimizer.adafactor_min_dim_size_to_factor=0 must be a whole number >= 1'),
])
def test_settings_that_would_do_nothing_or_break_the_schedule_fail_before_anything_is_built(
    settings, message):
  with pytest.raises(ConfigError) as error:
    train.resolve(small_config(steps=6, **settings), 'cpu')
  assert str(error.value).startswith(message) and '\n' not in str(error.value)


def test_the_library_refuses_a_warmup_past_the_run_too():
  with pytest.raises(ConfigError, match='optimizer.warmup_steps=20 is past the end of the run '
                                        r'\(training.steps=10\)'):
    optim.make_optimizer(OptimizerSettings(warmup_steps=20), 10)


@pytest.mark.parametrize('config', ['clip_reference.py', 'dit_reference.py'])
def test_a_z_loss_is_refused_for_a_family_whose_loss_is_its_own(config):
  settings = config_lib.from_file(ROOT / 'configs' / config, 'smoke')
  settings.training.z_loss = 1e-4
  with pytest.raises(ConfigError, match=r'training.z_loss=0.0001 penalises the log-normalizer of '
                                        r"a cross-entropy over logits, and a '(clip|dit)' model's "
                                        r'loss is its own: set --config.training.z_loss=0.'):
    train.resolve(settings, 'cpu')
