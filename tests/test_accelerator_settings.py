"""What an accelerator user needs, checked on this CPU: the compute dtype 'auto' by platform, a
profiler trace of chosen steps, and each chip's peak for MFU by its device kind."""
import glob
import os
import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

from helpers import ROOT
from train_helpers import small_config
from transformer_jax import config_lib, describe, model_config, models, targets, train
from transformer_jax.errors import ConfigError
from transformer_jax.settings import TrainingSettings
from transformer_jax.train import loop, metrics, setup


@pytest.mark.parametrize('platform,dtype', [('cpu', 'float32'), ('tpu', 'bfloat16'),
                                            ('gpu', 'bfloat16')])
def test_auto_is_bfloat16_on_tpus_and_gpus_and_float32_on_a_cpu(platform, dtype):
  assert model_config.compute_dtype_of('auto', platform)[0] == dtype
  for explicit in ('float32', 'bfloat16'):
    assert model_config.compute_dtype_of(explicit, platform) == (explicit, 'chosen by name')


def test_auto_is_the_default_and_parameters_stay_float32():
  cfg = models.model_config(small_config().model)
  assert (cfg.dtype, cfg.param_dtype) == ('auto', 'float32')
  assert cfg.on('tpu').dtype == 'bfloat16' and cfg.on('cpu').dtype == 'float32'
  assert cfg.on('tpu').weight_dtype == jnp.float32
  with pytest.raises(ConfigError, match='model.param_dtype=.auto. is not a dtype'):
    models.model_config(dict(small_config().model, param_dtype='auto'))
  with pytest.raises(ConfigError, match='model.dtype=.float33. is not a dtype: use "auto"'):
    models.model_config(dict(small_config().model, dtype='float33'))


def abstract_params(module, inputs):
  return nn.meta.unbox(jax.eval_shape(module.init, jax.random.key(0), *inputs)['params'])


def activation_dtypes(module, params, inputs) -> set:
  """The dtypes of every floating output of every submodule's __call__ (nothing computed)."""
  apply = lambda params: module.apply({'params': params}, *inputs, capture_intermediates=True,
                                      mutable=['intermediates'])
  _, state = jax.eval_shape(apply, params)
  return {leaf.dtype.name for leaf in jax.tree.leaves(state['intermediates'])
          if jnp.issubdtype(leaf.dtype, jnp.floating)}


def test_a_run_built_for_a_cpu_computes_in_float32_and_a_tpu_model_in_bfloat16():
  run = setup.build_run(small_config())
  assert run.model_config.dtype == 'float32'
  inputs = run.family.example_inputs(run.model_config)
  params = abstract_params(run.model, inputs)
  assert activation_dtypes(run.model, params, inputs) == {'float32'}
  # The same config built for a TPU (run here on the CPU): its blocks compute in bfloat16, its
  # logits stay float32, its parameters float32.
  tpu_model = models.build(small_config().model, 'tpu')
  assert activation_dtypes(tpu_model, params, inputs) == {'bfloat16', 'float32'}
  assert {leaf.dtype.name for leaf in jax.tree.leaves(params)} == {'float32'}


def test_an_explicit_dtype_wins_on_every_platform():
  config = small_config(**{'model.dtype': 'bfloat16'})
  run = setup.build_run(config)
  assert run.model_config.dtype == 'bfloat16'
  inputs = run.family.example_inputs(run.model_config)
  params = abstract_params(run.model, inputs)
  assert activation_dtypes(run.model, params, inputs) == {'bfloat16', 'float32'}
  assert models.build(config.model, 'gpu').cfg.dtype == 'bfloat16'
  float32 = small_config(**{'model.dtype': 'float32'}).model
  assert models.build(float32, 'tpu').cfg.dtype == 'float32'
  # A named config leaves the dtype to the platform: GPT-2 small computes in float32 on a CPU.
  gpt2 = config_lib.from_file(ROOT / 'configs' / 'gpt2_small.py')
  assert gpt2.model.dtype == 'auto'
  assert train.resolve(gpt2, 'cpu').model.dtype == 'float32'
  assert train.resolve(gpt2, 'tpu').model.dtype == 'bfloat16'


def test_describe_states_the_resolved_compute_dtype():
  text = describe.describe(small_config(**{'compile.xla_memory': False}))
  assert ('Compute dtype: float32 (auto on cpu: bfloat16 products run slower than float32 ones '
          'on XLA:CPU); parameters in float32') in text
  assert 'KV cache per sequence of 16 tokens in float32' in text
  explicit = describe.describe(small_config(**{'model.dtype': 'bfloat16',
                                               'compile.xla_memory': False}))
  assert 'Compute dtype: bfloat16 (chosen by name); parameters in float32' in explicit


def test_a_saved_config_of_an_earlier_run_keeps_its_dtype(tmp_path):
  config = small_config(**{'model.dtype': 'float32'})
  setup.save_config(config, str(tmp_path))
  saved = config_lib.saved_config(str(tmp_path))
  assert models.model_config(saved['model']).on('tpu').dtype == 'float32'


@pytest.mark.slow
def test_a_profiled_run_writes_a_trace_of_its_steps_and_an_unprofiled_one_none(tmp_path):
  workdir = str(tmp_path)
  train.train(small_config(steps=3), workdir)
  assert 'metrics.jsonl' in os.listdir(workdir) and 'profile' not in os.listdir(workdir)
  # Resumed at step 3, before the traced step 4.
  train.train(small_config(steps=5, **{'training.profile_start': 4,
                                       'training.profile_steps': 1}), workdir)
  # TensorBoard's profile plugin reads plugins/profile/RUN/HOST.xplane.pb; Perfetto the
  # HOST.trace.json.gz beside it.
  for pattern in ('*.xplane.pb', '*.trace.json.gz'):
    (found,) = glob.glob(os.path.join(loop.profile_dir(workdir), 'plugins', 'profile', '*',
                                      pattern))
    assert os.path.getsize(found) > 0, found


def test_a_run_resumed_past_its_profiled_steps_traces_nothing(tmp_path):
  profile = loop._Profile(TrainingSettings(profile_start=2, profile_steps=2), str(tmp_path))
  for step in range(3, 8):  # resumed at step 3: the loop's steps 3, 4, ... make steps 4, 5, ...
    profile.before(step)
    assert not profile.tracing
  profile.stop()
  assert not os.listdir(tmp_path)


def test_a_profile_past_the_last_step_is_refused():
  with pytest.raises(ConfigError, match='training.profile_start=7 is past the last step'):
    train.resolve(small_config(steps=6, **{'training.profile_start': 7}))
  with pytest.raises(ConfigError, match='training.profile_steps=0 must be'):
    train.resolve(small_config(**{'training.profile_start': 2, 'training.profile_steps': 0}))


@pytest.mark.parametrize('kind,chip,peak', [
    ('TPU v2', 'v2', 45e12), ('TPU v3', 'v3', 123e12), ('TPU v4', 'v4', 275e12),
    ('TPU v5 lite', 'v5e', 197e12), ('TPU v5', 'v5p', 459e12), ('TPU v5p', 'v5p', 459e12),
    ('TPU v6 lite', 'v6e', 918e12),
    ('NVIDIA A10', 'a10', 125e12), ('NVIDIA A10G', 'a10', 125e12),
    ('NVIDIA A100-SXM4-40GB', 'a100_40gb', 312e12), ('NVIDIA A100-SXM4-80GB', 'a100', 312e12),
    ('NVIDIA A100 80GB PCIe', 'a100', 312e12), ('NVIDIA H100 80GB HBM3', 'h100', 989e12),
    ('NVIDIA H200', 'h200', 989e12), ('NVIDIA L4', 'l4', 121e12), ('Tesla T4', 't4', 65e12),
    ('Tesla V100-SXM2-16GB', 'v100', 125e12), ('Tesla V100-PCIE-32GB', 'v100', 125e12),
])
def test_each_device_kind_maps_to_its_chip_and_its_peak(kind, chip, peak):
  device = types.SimpleNamespace(device_kind=kind)
  assert targets.chip_of(device) is targets.CHIPS[chip]
  assert targets.CHIPS[chip].peak_flops == peak
  assert metrics.peak_flops_per_device(None, device)[0] == peak


@pytest.mark.parametrize('kind', ['cpu', 'NVIDIA L40S', 'NVIDIA A1000', 'TPU v7', 'TPU v5 litex'])
def test_an_unknown_device_kind_has_no_chip_and_mfu_needs_a_configured_peak(kind):
  device = types.SimpleNamespace(device_kind=kind)
  assert targets.chip_of(device) is None
  peak, source = metrics.peak_flops_per_device(None, device)
  assert peak is None and 'set config.training.peak_flops_per_device' in source
  assert metrics.peak_flops_per_device(3e12, device)[0] == 3e12


def test_the_gpu_targets_are_the_gpus_with_a_target_config_and_only_tpus_with_topologies():
  shipped = (ROOT / 'transformer_jax' / 'gpu_targets').glob('*.txtpb')
  assert sorted(targets.GPU_TARGETS) == sorted(path.stem for path in shipped)
  with pytest.raises(ConfigError, match="compile.target='v3-8' is not a target"):
    targets.target('v3-8')
