"""The platform kernels compiled for targets this machine does not have: splash attention for a
TPU (a Mosaic custom call in the compiled step), cuDNN's fused attention for GPUs, forward and
backward, and the decoding loop for both."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

from helpers import load_experiment
from train_helpers import small_config
from transformer_jax import decode, kernels, models, targets
from transformer_jax.train import setup, sharding

pytest.importorskip('libtpu', reason="compile-only TPU devices need pip install -e '.[compile]'")
pytest.importorskip('jax_plugins.xla_cuda12',
                    reason="compile-only GPU devices need pip install -e '.[compile]'")

pytestmark = pytest.mark.slow
decode_layout = load_experiment('decode_layout')  # once: it defines its flags
# A decoder whose attention each kernel takes: bfloat16, head width 64, 128 positions.
DECODER = {'data.seq_len': 128, 'model.dtype': 'bfloat16', 'model.width': 128,
           'model.num_heads': 2, 'model.d_ff': 256}
TENSOR_PARALLEL = {'mesh.axes': ('data', 'model'), 'mesh.shape': (2, 2), 'rule_set': 'tp'}


def _compiled_train_step(target, **overrides):
  config = small_config('decoder', **{**DECODER, **overrides})
  run = setup.build_run(config, devices=targets.target(target).devices)
  spec = sharding.batch_sharding(run.mesh)
  batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=spec)
           for k, v in run.data.train_batch(0).items()}
  return run, run.train_step.lower(run.abstract_state, batch).compile().as_text()


@pytest.mark.parametrize('overrides', [{}, TENSOR_PARALLEL], ids=['dp', 'tp'])
def test_the_train_step_for_a_tpu_runs_splash(overrides):
  _, hlo = _compiled_train_step('v5e:2x2', **overrides)
  assert hlo.count('tpu_custom_call') >= 3  # the forward, and dq and dkv of the backward


def test_the_shard_map_step_for_a_tpu_falls_back_to_xla():
  _, hlo = _compiled_train_step('v5e:2x2', parallelism='shard_map')
  assert 'tpu_custom_call' not in hlo


def test_the_train_step_for_gpus_runs_cudnn():
  _, hlo = _compiled_train_step('h100x4')
  assert '__cudnn$fmhaSoftmax"' in hlo and '__cudnn$fmhaSoftmaxBackward' in hlo


def test_gpus_train_cudnn_at_even_sequence_lengths_only_as_the_plan_says():
  """An odd sequence (a ViT's 1 + patches) runs cuDNN's forward, but jax refuses its backward:
  the train step falls back to XLA, which keeps the weights, as kernels.keeps_weights plans."""
  for seq_len, fused in ((127, False), (128, True)):
    _, hlo = _compiled_train_step('h100x4', **{'data.seq_len': seq_len})
    assert ('__cudnn$fmha' in hlo) == fused, seq_len
    q = jax.ShapeDtypeStruct((2, seq_len, 2, 64), jnp.bfloat16)
    assert kernels.keeps_weights('cudnn', q, q, q) == (not fused)


def test_a_float32_train_step_for_gpus_falls_back_to_xla():
  _, hlo = _compiled_train_step('h100x4', **{'model.dtype': 'float32'})
  assert '__cudnn$fmha' not in hlo


@pytest.mark.parametrize('target', ['v5e:1x1', 'h100x1'])
@pytest.mark.parametrize('window', [None, 8])
def test_the_decoding_loop_compiles_for_a_target(target, window):
  """generate's one jitted program (prefill, cache, token loop), with abstract parameters."""
  config = small_config('decoder', **DECODER).model
  device = targets.target(target).devices[0]
  on_device = jax.sharding.SingleDeviceSharding(device)
  platform = device.platform
  model = models.build(config, platform)
  params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=on_device),
                        nn.meta.unbox(models.abstract_variables(config)['params']))
  scalar = lambda dtype, shape=(): jax.ShapeDtypeStruct(shape, dtype, sharding=on_device)
  key = jax.eval_shape(lambda: jax.random.key(0))
  lowered = decode.generation._generate.lower(  # pylint: disable=protected-access
      model, params, scalar(jnp.int32, (4, 16)), scalar(jnp.int32, (4,)), None, None,
      jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=on_device), scalar(jnp.int32),
      scalar(jnp.int32), max_new_tokens=32, temperature=0.0, top_k=0, top_p=1.0, window=window,
      return_logits=False, token_limit=None)
  hlo = lowered.compile().as_text()
  assert 'while' in hlo


@pytest.mark.parametrize('target', ['v5e:1x1', 'h100x1'])
def test_the_decoding_loop_for_a_target_never_copies_a_whole_cache_layer(target):
  """Each step writes one slot in place and both products read the cache as it is stored: no
  layer's keys or values are copied or transposed whole in the loop (they are before it, where
  the prefill's cache enters the loop's state)."""
  config = small_config('decoder', **DECODER).model
  compiled = decode_layout.compiled_generate(config, decode_layout.device_of(target), 4, 16, 32)
  copies = decode_layout.whole_cache_copies(compiled.as_text(), decode_layout.cache_layer_dims(
      models.model_config(config), 4, 16 + 32 - 1))
  assert not [key for key in copies if key[0] == 'loop'], copies


def test_the_whole_cache_copies_found_are_those_of_a_layout_that_makes_them():
  """The check above can fail: on XLA:CPU a (B, S, kv_heads, head_dim) cache is copied and
  transposed whole at every step, for both products, in each of the 2 layers."""
  config = small_config('decoder', **{**DECODER, 'model.dtype': 'float32'}).model
  with decode_layout.cache_layout('slots_first'):
    compiled = decode_layout.compiled_generate(config, jax.devices('cpu')[0], 4, 16, 32)
  copies = decode_layout.whole_cache_copies(compiled.as_text(), decode_layout.cache_layer_dims(
      models.model_config(config), 4, 16 + 32 - 1))
  assert sum(n for key, n in copies.items() if key[0] == 'loop') >= 2 * 2, copies
