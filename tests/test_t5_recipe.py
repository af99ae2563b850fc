"""T5's recipe, step for step: a random-weight transformers T5ForConditionalGeneration, imported
through configs/from_hf.py, trains 20 steps here and in torch on the same batches with the same
Adafactor (transformers.optimization.Adafactor), T5's inverse square-root rate, T5X's z-loss and
a loss summed over the target tokens and divided by a fixed factor: the same losses and final
parameters. And configs/t5_small.py's recipe as T5X's gin files give it.

Where transformers' Adafactor and ours differ by design, and the settings under which both
compute the same update (train.optim.scale_by_adafactor says more):
- factoring: transformers factors every tensor of two axes or more over its last two (a torch
  kernel is the (out, in) matrix), whatever their sizes; ours, as T5X's, a block's kernel as the
  matrix of its input and output axes (a query's embed x (heads x head_dim): the same matrix)
  and only where both sides reach adafactor_min_dim_size_to_factor (128): set to 1 here;
- rate: transformers' relative_step is min(1e-2, 1 / sqrt(t)) from t = 1, T5X's and ours
  1 / sqrt(max(t, 10^4)) from t = 0, one step apart past 10^4 steps: relative_step=False here,
  torch's rate set at each step to ours (learning_rate / sqrt(max(step, warmup))), with a
  warmup of 4 so that it decays within the 20 steps;
- weight decay: transformers' times its parameter-scaled rate, T5X's unscaled, ours times the
  schedule's rate (as AdamW's): none here, as T5 trains;
- momentum (beta1): off in T5's recipe and here (ours offers none);
- the same: the second moments' decay 1 - t^-0.8 (t from 1), epsilon 1e-30 added to the squared
  gradients, updates clipped to an RMS of 1, scaled by max(RMS(param), 1e-3).
"""
import dataclasses
import math

import jax
import numpy as np
import pytest
import torch
import transformers

from helpers import ROOT, init, load_config
from transformer_jax import convert, models, train
from transformer_jax.train import checkpoint, optim, setup, sharding

VOCAB, BATCH, SOURCE, TARGET, STEPS = 40, 4, 12, 7, 20
RATE, WARMUP, Z_LOSS = 0.05, 4, 1e-4
NORMALIZER = float(BATCH * TARGET)  # Mesh TF's: batch size x target length


def t5_checkpoint(path):
  """A small T5 1.0 (ReLU, the head tied and scaled) of weights of order one (norm scales 1 +
  N(0, 0.2^2), the embedding N(0, 1), other matrices N(0, 1/width)), saved in `path`."""
  torch.manual_seed(0)
  model = transformers.T5ForConditionalGeneration(transformers.T5Config(
      vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_decoder_layers=2,
      num_heads=4, relative_attention_num_buckets=8, relative_attention_max_distance=16,
      dropout_rate=0.0, feed_forward_proj='relu', decoder_start_token_id=0, pad_token_id=0,
      eos_token_id=1))
  generator = torch.Generator().manual_seed(0)
  with torch.no_grad():
    for name, p in model.named_parameters():
      noise = torch.randn(p.shape, generator=generator)
      p.copy_(p + 0.2 * noise if p.ndim == 1 else
              noise * (1.0 if name == 'shared.weight' else 32 ** -0.5))
  model.save_pretrained(path, safe_serialization=True)


def batch(step):
  """Pairs of padded sources and targets of random lengths; the decoder's inputs start at 0."""
  rng = np.random.default_rng(step)
  valid = np.arange(SOURCE) < rng.integers(4, SOURCE + 1, (BATCH, 1))
  weights = np.arange(TARGET) < rng.integers(2, TARGET + 1, (BATCH, 1))
  inputs = np.where(valid, rng.integers(2, VOCAB, (BATCH, SOURCE)), 0).astype(np.int32)
  targets = np.where(weights, rng.integers(2, VOCAB, (BATCH, TARGET)), 0).astype(np.int32)
  return dict(inputs=inputs, input_valid=valid, targets=targets,
              decoder_inputs=np.pad(targets[:, :-1], ((0, 0), (1, 0))),
              weights=weights.astype(np.float32))


def train_ours(path, workdir):
  """(per-step mean cross-entropy and z-loss, final parameters) of the import trained here."""
  config = load_config(ROOT / 'configs' / 'from_hf.py', f'path={path}')
  config.data.update(name='synthetic', seq_len=SOURCE, batch_size=BATCH)
  config.mesh.shape = (1,)
  config.optimizer.update(name='adafactor', schedule='rsqrt', learning_rate=RATE,
                          warmup_steps=WARMUP, weight_decay=0.0, grad_clip_norm=0.0,
                          adafactor_min_dim_size_to_factor=1)
  config.training.update(steps=STEPS, z_loss=Z_LOSS, loss_normalizing_factor=NORMALIZER)
  run = setup.build_run(config)
  saved = checkpoint.Checkpoints(str(workdir), 1)
  state = setup.restore_or_init(run, saved, str(workdir))
  saved.close()
  # Every matrix factored, as transformers factors it: a query as (embed, heads x head_dim).
  adafactor = state.opt_state[0]  # then the weight decay's and the rate's
  query = adafactor.v_row['encoder']['block_0']['attn']['query']['kernel']
  assert query.shape == (32,) and optim.adafactor_factoring(state.params, 1)['encoder'][
      'block_0']['attn']['query']['kernel'].cols == (1, 2)
  losses = []
  for step in range(STEPS):
    state, metrics = run.train_step(state, sharding.global_batch(batch(step), run.mesh))
    metrics = jax.device_get(metrics)
    losses.append((metrics['loss'] / metrics['weight'], metrics['z_loss'] / metrics['weight']))
  return np.array(losses), jax.device_get(state.params)


def train_transformers(path, trained):
  """The same for transformers' model and Adafactor; the trained model saved in `trained`."""
  torch.set_num_threads(1)
  model = transformers.T5ForConditionalGeneration.from_pretrained(path).eval()
  adafactor = transformers.optimization.Adafactor(
      model.parameters(), lr=RATE, eps=(1e-30, 1e-3), clip_threshold=1.0, decay_rate=-0.8,
      beta1=None, weight_decay=0.0, scale_parameter=True, relative_step=False,
      warmup_init=False)
  losses = []
  for step in range(STEPS):
    for group in adafactor.param_groups:
      group['lr'] = RATE / math.sqrt(max(step, WARMUP))
    pairs = {key: torch.from_numpy(value) for key, value in batch(step).items()}
    logits = model(input_ids=pairs['inputs'].long(), attention_mask=pairs['input_valid'].long(),
                   decoder_input_ids=pairs['decoder_inputs'].long()).logits
    log_z = torch.logsumexp(logits, -1)
    cross_entropy = log_z - logits.gather(-1, pairs['targets'].long()[..., None])[..., 0]
    weights = pairs['weights']
    summed, z_loss = (cross_entropy * weights).sum(), (Z_LOSS * log_z ** 2 * weights).sum()
    ((summed + z_loss) / NORMALIZER).backward()
    adafactor.step()
    adafactor.zero_grad()
    losses.append((summed.item() / weights.sum().item(), z_loss.item() / weights.sum().item()))
  model.save_pretrained(trained, safe_serialization=True)
  return np.array(losses)


def test_twenty_adafactor_steps_of_an_imported_t5_are_transformers_steps(tmp_path):
  t5_checkpoint(tmp_path / 'hf')
  ours, params = train_ours(tmp_path / 'hf', tmp_path / 'ours')
  theirs = train_transformers(tmp_path / 'hf', tmp_path / 'trained')
  relative = np.abs(ours - theirs) / np.abs(theirs)
  assert relative.max() < 1e-4, relative.max(axis=0)
  fields = convert.load_model_config(tmp_path / 'hf')
  trained, start = (convert.load_params(tmp_path / name, fields) for name in ('trained', 'hf'))
  moved = jax.tree.map(lambda a, b: np.abs(a - b).max(), trained, start)
  assert min(jax.tree.leaves(moved)) > 1e-2  # every tensor moved, by Adafactor's relative steps
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=0, atol=1e-4), params, trained)


@pytest.mark.parametrize('arg,dropout,schedule,rate,normalizer,steps', [
    (None, 0.1, 'rsqrt', 1.0, 128 * 114, 2 ** 19),
    ('v1_1', 0.0, 'rsqrt', 1.0, 128 * 114, 2 ** 19),
    ('finetune', 0.1, 'constant', 1e-3, 2048 * 114, 2 ** 18),
    ('v1_1,finetune', 0.1, 'constant', 1e-3, 2048 * 114, 2 ** 18),
])
def test_t5_small_trains_with_t5s_recipe(arg, dropout, schedule, rate, normalizer, steps):
  """T5X's gin files: Adafactor (decay rate 0.8, clipping 1, parameter scale, epsilon 1e-30, no
  momentum), no weight decay or gradient clipping, the inverse square root of 10^4 steps at
  rate 1 to pre-train (pretrain.gin) or a constant 1e-3 to fine-tune (finetune.gin), a z-loss of
  1e-4 (t5_1_1/base.gin), dropout 0 to pre-train T5 1.1 (small_c4_pretrain.gin), batches of 128;
  every T5-small matrix factored, the relative bias tables and norms not, as T5X's rules have
  them."""
  settings = train.resolve(load_config(ROOT / 'configs' / 't5_small.py', arg), 'cpu')
  opt = settings.optimizer
  assert (opt.name, opt.schedule, opt.learning_rate) == ('adafactor', schedule, rate)
  assert (opt.warmup_steps, opt.weight_decay, opt.grad_clip_norm) == (
      10_000 if schedule == 'rsqrt' else 0, 0.0, 0.0)
  assert (opt.adafactor_decay_rate, opt.adafactor_clipping_threshold, opt.adafactor_eps,
          opt.adafactor_param_scale, opt.adafactor_min_param_scale,
          opt.adafactor_min_dim_size_to_factor) == (0.8, 1.0, 1e-30, True, 1e-3, 128)
  assert (settings.training.z_loss, settings.training.loss_normalizing_factor) == (
      1e-4, normalizer)
  assert (settings.model.dropout_rate, settings.data.batch_size, settings.training.steps) == (
      dropout, 128, steps)
  layout = setup.layout(settings, jax.sharding.AbstractMesh((1,), ('data',)))
  factoring = optim.adafactor_factoring(layout.abstract_state.params)
  paths = {jax.tree_util.keystr(path, simple=True, separator='/'): f
           for path, f in jax.tree_util.tree_leaves_with_path(
               factoring, is_leaf=lambda x: isinstance(x, optim.Factoring))}
  assert {path for path, f in paths.items() if not f.rows} == {
      path for path in paths if path.endswith(('scale', 'relative_attention_bias'))}


@pytest.mark.parametrize('feed_forward', ['relu', 'gated-gelu'])
def test_a_fresh_t5_starts_as_t5s_initialization(tmp_path, feed_forward):
  """Each tensor of a T5 initialized here has the mean and spread of the same tensor of a fresh
  transformers T5ForConditionalGeneration (whose _init_weights writes Mesh TensorFlow's: the
  embedding N(0, 1), the queries N(0, (d_model d_kv)^-1/2) with attention's 1/sqrt(d_kv) folded
  in, keys, values and wi N(0, d_model^-1/2), o and wo their fan-in's), within 4 standard
  errors; norms start at one. Where transformers departs from T5X, ours is T5X's: the relative
  bias tables variance-scaled (fan_avg, uniform: std sqrt(2 / (buckets + heads)); transformers
  d_model^-1/2) and T5 1.1's untied head LeCun normal (T5X's fan-in; transformers N(0, 1))."""
  torch.manual_seed(0)
  theirs = transformers.T5ForConditionalGeneration(transformers.T5Config(
      vocab_size=512, d_model=64, d_kv=16, d_ff=256, num_layers=2, num_decoder_layers=2,
      num_heads=4, relative_attention_num_buckets=32, feed_forward_proj=feed_forward,
      dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1))
  theirs.save_pretrained(tmp_path / 'theirs')
  cfg = models.model_config(convert.directory.load_model_config(tmp_path / 'theirs')).on('cpu')
  params = init(cfg, jax.random.key(0))
  convert.directory.save(tmp_path / 'ours', cfg, params)
  ours = convert.directory.read_tensors(tmp_path / 'ours')
  theirs = {name: tensor.numpy() for name, tensor in theirs.state_dict().items()}
  # transformers' state dict repeats the tied embedding as each stack's and the head's.
  assert set(ours) == set(theirs) - {'encoder.embed_tokens.weight', 'decoder.embed_tokens.weight',
                                     'lm_head.weight'}
  for name, tensor in ours.items():
    if name.endswith('layer_norm.weight'):
      np.testing.assert_array_equal(tensor, 1.0)
      continue
    rms = lambda x: np.sqrt(np.mean(np.square(x)))
    expected = (math.sqrt(2 / (32 + 4)) if 'relative_attention_bias' in name else
                rms(theirs[name]))
    error = 1 / math.sqrt(tensor.size)  # relative, of the spread of one side's draw
    assert abs(rms(tensor) / expected - 1) < 4 * error, name
    assert abs(np.mean(tensor)) < 5 * error * expected, name  # centred, as theirs
  untied = init(dataclasses.replace(cfg, tie_embeddings=False, scale_tied_head=False),
                jax.random.key(1))
  head = np.asarray(untied['head']['unembed']['kernel'])
  assert abs(np.std(head) / 64 ** -0.5 - 1) < 4 / math.sqrt(head.size)
