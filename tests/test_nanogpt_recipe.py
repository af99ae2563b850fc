"""configs/gpt_shakespeare.py:recipe=nanogpt against the CPU run of nanoGPT's README
(karpathy/nanoGPT: train.py's defaults, config/train_shakespeare_char.py and the README's flags),
setting by setting; its parameter count from nanoGPT's module shapes; GPT-2's residual-scaled
initialization (model.scale_residual_init) against its formula; and the speedrun variant's
settings."""
import dataclasses
import math

import jax
import numpy as np
import pytest

from helpers import ROOT, load_config, model_of
from transformer_jax import accounting, models, train
from transformer_jax.models import styles
from transformer_jax.train import optim

CONFIG = ROOT / 'configs' / 'gpt_shakespeare.py'
# nanoGPT's run: `python train.py config/train_shakespeare_char.py --device=cpu --compile=False
# --eval_iters=20 --log_interval=1 --block_size=64 --batch_size=12 --n_layer=4 --n_head=4
# --n_embd=128 --max_iters=2000 --lr_decay_iters=2000 --dropout=0.0`, the rest from the config
# file and train.py's defaults; vocab_size from data/shakespeare_char/prepare.py (65 characters).
NANOGPT = dict(n_layer=4, n_head=4, n_embd=128, block_size=64, batch_size=12, bias=False,
               dropout=0.0, vocab_size=65, learning_rate=1e-3, min_lr=1e-4, warmup_iters=100,
               lr_decay_iters=2000, max_iters=2000, beta1=0.9, beta2=0.99, weight_decay=0.1,
               grad_clip=1.0, gradient_accumulation_steps=1, eval_interval=250)


def nanogpt_param_count(vocab_size, block_size, n_layer, n_embd, bias) -> int:
  """Every parameter of model.py's GPT: wte (which lm_head shares), wpe, and per Block ln_1,
  c_attn Linear(D, 3D), c_proj Linear(D, D), ln_2, c_fc Linear(D, 4D), c_proj Linear(4D, D);
  then ln_f. Biases of the Linears and LayerNorms only with bias=True."""
  layer_norm = n_embd * (2 if bias else 1)
  linear = lambda fan_in, fan_out: fan_in * fan_out + (fan_out if bias else 0)
  block = (2 * layer_norm + linear(n_embd, 3 * n_embd) + linear(n_embd, n_embd)
           + linear(n_embd, 4 * n_embd) + linear(4 * n_embd, n_embd))
  return vocab_size * n_embd + block_size * n_embd + n_layer * block + layer_norm


def nanogpt_lr(it: int) -> float:
  """train.py's get_lr."""
  n = NANOGPT
  if it < n['warmup_iters']:
    return n['learning_rate'] * (it + 1) / (n['warmup_iters'] + 1)
  if it > n['lr_decay_iters']:
    return n['min_lr']
  ratio = (it - n['warmup_iters']) / (n['lr_decay_iters'] - n['warmup_iters'])
  return n['min_lr'] + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (n['learning_rate']
                                                                  - n['min_lr'])


def test_the_recipe_is_nanogpts_cpu_run_point_by_point():
  config = load_config(CONFIG, 'recipe=nanogpt')
  settings = train.resolve(config, 'cpu')
  model, opt, data = settings.model, settings.optimizer, settings.data
  n = NANOGPT
  assert (model.num_layers, model.num_heads, model.width) == (n['n_layer'], n['n_head'],
                                                              n['n_embd'])
  assert (model.max_len, data.seq_len, data.batch_size) == (n['block_size'], n['block_size'],
                                                            n['batch_size'])
  assert settings.training.grad_accum_steps == n['gradient_accumulation_steps']
  assert model.vocab_size == n['vocab_size']
  # bias=False: no bias in any Linear or LayerNorm.
  assert (model.use_bias, model.norm_bias) == (n['bias'], n['bias'])
  # LayerNorm(eps 1e-5) before each sublayer and at the end; nn.GELU() (exact) in a 4D MLP.
  assert (model.norm, model.norm_eps, model.norm_position, model.final_norm) == (
      'layernorm', 1e-5, 'pre', True)
  assert (model.mlp, model.hidden_dim) == ('gelu', 4 * n['n_embd'])
  assert (model.positions, model.tie_embeddings) == ('learned', True)
  assert set(model.dropout_rates.values()) == {n['dropout']}
  # _init_weights: N(0, 0.02) for every Linear and Embedding, c_proj 0.02 / sqrt(2 n_layer).
  assert (model.init, model.init_std, model.embed_init_std, model.scale_residual_init) == (
      'normal', 0.02, 0.02, True)
  assert (model.dtype, model.param_dtype) == ('float32', 'float32')
  # torch.optim.AdamW((beta1, beta2)), eps at torch's default; clip_grad_norm_(1.0).
  assert (opt.name, opt.b1, opt.b2, opt.eps) == ('adamw', n['beta1'], n['beta2'], 1e-8)
  assert (opt.weight_decay, opt.grad_clip_norm) == (n['weight_decay'], n['grad_clip'])
  assert settings.training.steps == n['max_iters']
  assert settings.training.eval_every == n['eval_interval']
  assert data.name == 'tiny_shakespeare'


def test_it_has_nanogpts_parameter_count():
  expected = nanogpt_param_count(NANOGPT['vocab_size'], NANOGPT['block_size'],
                                 NANOGPT['n_layer'], NANOGPT['n_embd'], NANOGPT['bias'])
  assert expected == 804_096
  # What nanoGPT prints: get_num_params() leaves out the position table.
  printed = expected - NANOGPT['block_size'] * NANOGPT['n_embd']
  assert f'{printed / 1e6:.2f}M' == '0.80M'
  model = model_of(load_config(CONFIG, 'recipe=nanogpt'))
  params = models.init_params(model, jax.random.key(0))
  assert accounting.param_counts(model)['total'] == expected
  assert accounting.count_params(params)['total'] == expected


def test_the_learning_rates_are_nanogpts_past_the_warmup():
  """nanoGPT warms up as lr (it + 1) / (warmup + 1), ours as lr (step + 1) / warmup: the same
  after it, and 1% apart (101 / 100) during it."""
  opt = train.resolve(load_config(CONFIG, 'recipe=nanogpt'), 'cpu').optimizer
  schedule = optim.learning_rate_schedule(opt, NANOGPT['max_iters'])
  steps = np.arange(NANOGPT['max_iters'])
  ours = np.asarray(jax.vmap(schedule)(steps))
  theirs = np.array([nanogpt_lr(int(it)) for it in steps])
  warmup = NANOGPT['warmup_iters']
  np.testing.assert_allclose(ours[warmup:], theirs[warmup:], rtol=1e-5)
  np.testing.assert_allclose(ours[:warmup] / theirs[:warmup], (warmup + 1) / warmup, rtol=1e-5)


def test_weight_decay_falls_on_every_tensor_of_two_dimensions_or_more():
  """configure_optimizers decays the parameters with dim >= 2 (the embeddings too) and no
  other."""
  settings = train.resolve(load_config(CONFIG, 'recipe=nanogpt'), 'cpu')
  params = models.init_params(settings.model, jax.random.key(0))
  mask = optim.decay_mask(params, settings.optimizer)
  decays = jax.tree.leaves(jax.tree.map(lambda p, m: (p.ndim >= 2, m), params, mask),
                           is_leaf=lambda x: isinstance(x, tuple))
  assert all(rule == ours for rule, ours in decays)
  assert sum(rule for rule, _ in decays) > 0


def kernel_stds(params) -> dict[str, list[float]]:
  """{'out', 'down', 'other'}: the standard deviation of each kernel writing into the residual
  stream (attention outputs, MLP down projections) and of every other kernel and table."""
  stds = {'out': [], 'down': [], 'other': []}
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    names = [k.key for k in path]
    kind = names[-2] if names[-1] == 'kernel' and names[-2] in ('out', 'down') else 'other'
    if leaf.ndim >= 2:
      stds[kind].append(float(np.std(np.asarray(leaf))))
  return stds


def test_residual_kernels_start_at_gpt2s_scale():
  """GPT-2 (and nanoGPT's c_proj): N(0, 0.02 / sqrt(N)) for the N residual branches of a stack,
  2 a block; every other kernel N(0, 0.02). Measured on the drawn tensors (16,384 and 65,536
  entries: the standard deviation of an estimate is under 0.6% of it)."""
  model = model_of(load_config(CONFIG, 'recipe=nanogpt'))
  stds = kernel_stds(models.init_params(model, jax.random.key(0)))
  scaled = 0.02 / math.sqrt(2 * NANOGPT['n_layer'])
  np.testing.assert_allclose(stds['out'] + stds['down'], scaled, rtol=0.03)
  np.testing.assert_allclose(stds['other'], 0.02, rtol=0.03)
  plain = models.init_params(dataclasses.replace(model, scale_residual_init=False),
                             jax.random.key(0))
  np.testing.assert_allclose(sum(kernel_stds(plain).values(), []), 0.02, rtol=0.03)


def test_an_encoder_decoder_scales_each_stack_by_its_own_branches():
  """The encoder's blocks add 2 branches each, the decoder's 3 (cross-attention)."""
  cfg = models.model_config(dict(
      family='encoder_decoder', width=128, num_layers=3, num_decoder_layers=2, num_heads=4,
      vocab_size=40, max_len=16, scale_residual_init=True, dtype='float32'))
  params = models.init_params(cfg, jax.random.key(0))
  for stack, branches in (('encoder', 2 * 3), ('decoder', 3 * 2)):
    stds = kernel_stds(params[stack])
    np.testing.assert_allclose(stds['out'] + stds['down'], 0.02 / math.sqrt(branches),
                               rtol=0.03)


def test_gpt2_styles_scale_the_residual_kernels():
  assert styles.STYLES['gpt2']['scale_residual_init']
  assert not styles.STYLES['llama'].get('scale_residual_init', False)


def test_the_speedrun_keeps_nanogpts_data_and_evaluation():
  """The record is a held-out loss on the same split, characters and windows of 64."""
  nanogpt, speedrun = (train.resolve(load_config(CONFIG, f'recipe={recipe}'), 'cpu')
                       for recipe in ('nanogpt', 'speedrun'))
  for key in ('name', 'seq_len', 'eval_batch_size', 'eval_steps', 'train_split', 'eval_split'):
    assert getattr(speedrun.data, key) == getattr(nanogpt.data, key), key
  assert speedrun.model.vocab_size == nanogpt.model.vocab_size == 65


def test_an_unknown_recipe_is_refused():
  with pytest.raises(Exception, match="recipe='nanogtp'"):
    load_config(CONFIG, 'recipe=nanogtp')
