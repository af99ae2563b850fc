"""The head and loss computed a chunk of positions at a time (train.chunked_loss,
training.logits_chunk) against the whole logits and losses.loss_sums: the sums, and the
gradients for any cotangents of the loss and the z-loss, of the function alone, of every family
that chunks, and of the train step on one device, on eight and per device under shard_map; XLA
leaves the whole logits out, and reduces the matrix's gradient across devices once."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import tiny
from train_helpers import small_config
from transformer_jax import aot, memory, models, targets
from transformer_jax.errors import ConfigError
from transformer_jax.kernels.contraction import contract
from transformer_jax.train import chunked_loss, losses, setup, sharding

B, T, D, V = 2, 7, 8, 11


def head_example(dtype=jnp.float32):
  """Features, an unembedding, targets (half of them each row's argmax, so that some count as
  correct) and weights with zeros."""
  rng = np.random.default_rng(0)
  features = jnp.asarray(rng.standard_normal((B, T, D)), dtype)
  unembedding = jnp.asarray(rng.standard_normal((D, V)), dtype)
  logits = np.asarray(contract(features, unembedding, 1, jnp.float32))
  targets = np.where(rng.random((B, T)) < 0.5, logits.argmax(-1), rng.integers(0, V, (B, T)))
  weights = (rng.random((B, T)) < 0.8).astype(np.float32)
  return features, unembedding, jnp.asarray(targets, jnp.int32), jnp.asarray(weights)


def whole(features, unembedding, targets, weights, **kw):
  return losses.loss_sums(contract(features, unembedding, 1, jnp.float32), targets, weights,
                          **kw)


def loss_and_z(sums_of, *args, **kw):
  """(loss, z-loss) of sums_of's sums: what the cotangents are given to."""
  sums = sums_of(*args, **kw)
  return sums['loss'], sums.get('z_loss', jnp.float32(0))


@pytest.mark.parametrize('chunk', [1, 3, 7, 10])
@pytest.mark.parametrize('smoothing,z_loss', [(0.0, 0.0), (0.1, 0.0), (0.0, 0.1), (0.2, 0.05)])
def test_the_chunked_sums_and_gradients_are_the_whole_logits(chunk, smoothing, z_loss):
  features, unembedding, targets, weights = head_example()
  kw = dict(label_smoothing=smoothing, z_loss=z_loss)
  expected = whole(features, unembedding, targets, weights, **kw)
  sums = chunked_loss.head_loss_sums(features, unembedding, targets, weights, chunk=chunk, **kw)
  assert sums.keys() == expected.keys() and float(expected['correct']) > 0
  for key in sums:
    np.testing.assert_allclose(sums[key], expected[key], rtol=2e-6, err_msg=key)
  # Cotangents of the loss and the z-loss that differ: each factor of the softmax kept apart.
  for cotangents in [(jnp.float32(1.0), jnp.float32(0.0)), (jnp.float32(0.7), jnp.float32(-2.0))]:
    _, whole_vjp = jax.vjp(lambda x, u: loss_and_z(whole, x, u, targets, weights, **kw),
                           features, unembedding)
    _, chunked_vjp = jax.vjp(lambda x, u: loss_and_z(
        chunked_loss.head_loss_sums, x, u, targets, weights, chunk=chunk, **kw),
        features, unembedding)
    for name, got, want in zip(('features', 'unembedding'), chunked_vjp(cotangents),
                               whole_vjp(cotangents)):
      np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=name)


def test_bfloat16_chunks_compute_in_bfloat16_as_the_whole_head():
  features, unembedding, targets, weights = head_example(jnp.bfloat16)
  expected = whole(features, unembedding, targets, weights, z_loss=0.01)
  sums = chunked_loss.head_loss_sums(features, unembedding, targets, weights, chunk=3,
                                     z_loss=0.01)
  for key in sums:
    np.testing.assert_allclose(sums[key], expected[key], rtol=1e-5, err_msg=key)
  grads = jax.grad(lambda x: losses.objective(chunked_loss.head_loss_sums(
      x, unembedding, targets, weights, chunk=3, z_loss=0.01)))(features)
  want = jax.grad(lambda x: losses.objective(whole(x, unembedding, targets, weights,
                                                   z_loss=0.01)))(features)
  assert grads.dtype == jnp.bfloat16
  # Within a bfloat16 rounding (2^-8) of the gradient's largest entry.
  np.testing.assert_allclose(np.float32(grads), np.float32(want),
                             atol=2 ** -8 * float(jnp.abs(want).max()))
  with pytest.raises(ValueError, match='compute dtype'):
    chunked_loss.head_loss_sums(features, unembedding.astype(jnp.float32), targets, weights,
                                chunk=3)


def text_batch(family, rng):
  tokens = lambda: jnp.asarray(rng.integers(0, 40, (3, 9)), jnp.int32)
  batch = {'targets': tokens(), 'weights': jnp.asarray(rng.random((3, 9)) < 0.8, jnp.float32)}
  if family == 'decoder':
    return {**batch, 'inputs': tokens()}
  batch['decoder_inputs'] = tokens()
  if family == 'whisper':
    return {**batch, 'features': jnp.asarray(rng.standard_normal((3, 12, 6)), jnp.float32)}
  return {**batch, 'inputs': tokens(), 'input_valid': jnp.ones((3, 9), bool)}


FAMILIES = {
    'decoder, tied': ('decoder', {}),
    'decoder, untied': ('decoder', {'tie_embeddings': False}),
    'T5 1.0 (scaled tied head, relative positions)': ('encoder_decoder', dict(
        positions='relative', scale_tied_head=True, norm='rmsnorm', use_bias=False)),
    'whisper': ('whisper', dict(num_mels=6, num_frames=12, max_len=9)),
}


@pytest.mark.parametrize('name', FAMILIES)
def test_every_chunking_familys_loss_and_gradients_are_its_whole_logits(name):
  family_name, overrides = FAMILIES[name]
  cfg = tiny(family_name, dtype='float32', **overrides)
  family, model = models.registry.get(family_name), models.build(cfg)
  params = models.init_params(cfg, jax.random.key(0))
  batch = text_batch(family_name, np.random.default_rng(1))

  def objective(p, chunk):
    sums = losses.batch_sums(model, family, p, batch, jax.random.key(0), z_loss=0.01,
                             label_smoothing=0.1, logits_chunk=chunk)
    return losses.objective(sums), sums

  (grads, sums), (want_grads, want) = [jax.grad(objective, has_aux=True)(params, chunk)
                                       for chunk in (4, 0)]
  for key in want:
    np.testing.assert_allclose(sums[key], want[key], rtol=2e-6, err_msg=key)
  scale = max(float(jnp.abs(g).max()) for g in jax.tree.leaves(want_grads))
  for got, expected in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads)):
    np.testing.assert_allclose(got, expected, atol=2e-6 * scale)


def chunked_step_config(**overrides):
  """A tiny decoder of 512 ids trained by plain SGD at rate 1: the update is minus the
  gradient."""
  return small_config(**{
      'model.vocab_size': 512, 'training.logits_chunk': 5, 'optimizer.name': 'sgd',
      'optimizer.schedule': 'constant', 'optimizer.learning_rate': 1.0,
      'optimizer.warmup_steps': 0, 'optimizer.weight_decay': 0.0,
      'optimizer.grad_clip_norm': 0.0, 'optimizer.sgd_momentum': 0.0, **overrides})


def first_step(config):
  """(the parameters, the metrics) of step 0 of `config`'s run, from its initial state."""
  run = setup.build_run(config)
  state = jax.jit(lambda rng: setup.initial_state(
      run.model, run.tx, run.family.example_inputs(run.model_config), rng),
      out_shardings=run.state_sharding)(jax.random.key(0))
  state, step_metrics = run.train_step(state, sharding.global_batch(run.data.train_batch(0),
                                                                    run.mesh))
  return jax.device_get(state.params), jax.device_get(step_metrics)


@pytest.mark.parametrize('parallelism', ['jit', 'shard_map'])
def test_the_step_over_eight_devices_updates_as_the_whole_logits_on_one(parallelism):
  assert len(jax.devices()) == 8
  params, step_metrics = first_step(chunked_step_config(parallelism=parallelism))
  want_params, want_metrics = first_step(chunked_step_config(
      **{'training.logits_chunk': 0, 'mesh.shape': (1,)}))
  np.testing.assert_allclose(step_metrics['loss'], want_metrics['loss'], rtol=1e-6)
  for got, expected in zip(jax.tree.leaves(params), jax.tree.leaves(want_params)):
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)


LARGE_LOGITS = {'data.seq_len': 64, 'model.max_len': 64, 'model.vocab_size': 4096,
                'mesh.shape': (1,)}
LOGITS_BYTES = 16 * 64 * 4096 * 4  # of a batch of 16 x 64 positions


def test_evaluation_sums_the_chunks_as_the_whole_logits_without_them():
  sums, temp_bytes = {}, {}
  for chunk in (0, 8):
    run = setup.build_run(chunked_step_config(**LARGE_LOGITS, **{'training.logits_chunk': chunk}))
    params = jax.jit(lambda rng, run=run: setup.initial_state(
        run.model, run.tx, run.family.example_inputs(run.model_config), rng).params,
        out_shardings=run.param_sharding)(jax.random.key(0))
    batch = sharding.global_batch(run.data.train_batch(0), run.mesh)
    sums[chunk] = jax.device_get(run.eval_step(params, batch))
    temp_bytes[chunk] = run.eval_step.lower(params, batch).compile().memory_analysis(
        ).temp_size_in_bytes
  assert sums[0].keys() == sums[8].keys()
  for key in sums[0]:
    np.testing.assert_allclose(sums[8][key], sums[0][key], rtol=2e-6, err_msg=key)
  assert temp_bytes[8] < temp_bytes[0] - LOGITS_BYTES / 2, temp_bytes


def compiled_step(config):
  return aot.compiled_train_step(setup.build_run(config, devices=jax.devices()[:1]))[0]


def test_xla_leaves_the_whole_logits_out_of_the_step():
  whole_bytes, chunked_bytes = [
      compiled_step(chunked_step_config(**{**LARGE_LOGITS, 'training.logits_chunk': chunk}))
      .memory_analysis().temp_size_in_bytes for chunk in (0, 8)]
  assert chunked_bytes < whole_bytes - LOGITS_BYTES, (whole_bytes, chunked_bytes)


def collectives_in_loops(compiled) -> list[str]:
  """The shapes that the compiled step's loops gather or reduce across devices."""
  text = compiled.as_text()
  bodies = [re.search(rf'\n{re.escape(name)} .*?\n}}', text, re.S).group()
            for name in set(re.findall(r'body=(%[\w.-]+)', text))]
  assert bodies
  return [shape for body in bodies for shape in re.findall(
      r'(?:all-reduce|reduce-scatter|all-gather)(?:-start)?[.\d]* = \(?(\S+)', body)]


@pytest.mark.parametrize('rule_set', ['dp', 'fsdp'])
def test_across_devices_the_chunks_gather_and_reduce_only_scalars(rule_set):
  """The matrix's gradient is summed across the 8 devices once, after the chunks' loop, and the
  matrix (split over the devices by FSDP) is gathered once before it."""
  run = setup.build_run(chunked_step_config(rule_set=rule_set))
  shapes = collectives_in_loops(aot.compiled_train_step(run)[0])
  assert all(re.fullmatch(r'\(?f32\[\],?', shape) for shape in shapes), shapes


def test_on_tpu_under_fsdp_the_chunks_gather_and_reduce_nothing():
  """Compiled for TPU v5e 2x2: without the constraint on the unembedding, XLA:TPU gathered it
  again in every chunk."""
  pytest.importorskip('libtpu', reason="compile-only TPU devices need pip install -e '.[compile]'")
  run = setup.build_run(chunked_step_config(rule_set='fsdp'),
                        devices=targets.target('v5e:2x2').devices)
  assert collectives_in_loops(aot.compiled_train_step(run)[0]) == []


def test_a_family_without_a_language_model_head_refuses_a_chunk():
  with pytest.raises(ConfigError, match='logits_chunk=0'):
    setup.build_run(small_config('vit', **{'training.logits_chunk': 8}))


def test_the_memory_plan_counts_one_chunk_of_logits():
  terms = {chunk: memory.plan(small_config(**{'training.logits_chunk': chunk}), {'data': 1},
                              platform='cpu').terms['logits'] for chunk in (0, 4)}
  assert terms[4] == terms[0] * 4 / 16 > 0

