"""--mode=compile: a run's steps compiled for TPUs and GPUs this machine does not have, with
XLA's memory per device beside the plan. Needs the optional extra (pip install -e '.[compile]');
CI runs these in its slow step, with the extra installed."""
import json
import math
import os
import re
import subprocess
import sys

import jax
import numpy as np
import pytest

pytest.importorskip('libtpu', reason="compile-only TPU devices need pip install -e '.[compile]'")

from helpers import load_experiment  # noqa: E402
from train_helpers import small_config  # noqa: E402
from transformer_jax import (accounting, aot, config_lib, describe, memory, models,  # noqa: E402
                             targets, train)
from transformer_jax.errors import UserError  # noqa: E402

pytestmark = pytest.mark.slow
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# Sizes that fill XLA:TPU's (8, 128) tiles, which pad smaller dimensions.
TILED = {'model.width': 256, 'model.num_heads': 2, 'model.d_ff': 512, 'model.dtype': 'bfloat16'}


def compiled(family='decoder', target='v5e:2x2', **overrides):
  config = small_config(family, **{**TILED, **overrides})
  config.compile.target = target
  return aot.compile_for(config)


@pytest.mark.parametrize('family', ['decoder', 'encoder', 'encoder_decoder', 'vit'])
def test_each_family_compiles_for_a_tpu_with_xlas_bytes_beside_the_plans(family):
  images = {'model.image_size': 32} if family == 'vit' else {}
  report = compiled(family, **images)
  xla, plan = report.xla_bytes, report.plan_bytes
  assert (report.devices, report.mesh) == (4, {'data': 4})
  assert report.memory_bytes == targets.CHIPS['v5e'].memory_bytes
  assert xla['total'] == (xla['argument'] + xla['output'] - xla['alias'] + xla['temporary']
                          + xla['code'])
  # The state and the batch are planned by their shapes; XLA:TPU pads the few arrays smaller
  # than its tiles (biases, the classifier of 4 classes).
  assert abs(plan['argument'] / xla['argument'] - 1) < 0.02
  assert abs(plan['alias'] / xla['alias'] - 1) < 0.02
  assert report.fits and report.compile_seconds > 0
  # XLA:TPU counts the step's FLOPs as the accounting does, within what the accounting leaves
  # out (norms, softmax, the optimizer).
  assert report.flops_per_device == pytest.approx(report.planned_flops_per_device, rel=0.25)


def test_a_latent_dit_compiles_on_generated_latents_of_its_channels():
  """A DiT of 4-channel latents (DiT-XL/2's kind): the stand-in generates (B, 8, 8, 4) arrays,
  which the compiled steps take."""
  config = config_lib.base_config('dit')
  config.model.update(image_size=8, patch_size=4, num_channels=4, num_classes=4, num_layers=2,
                      width=256, num_heads=2, dtype='bfloat16')
  config.data.update(name='synthetic', batch_size=16, eval_batch_size=16)
  config.compile.target = 'v5e:2x2'
  report = aot.compile_for(config)
  assert report.fits and report.devices == 4
  assert abs(report.plan_bytes['argument'] / report.xla_bytes['argument'] - 1) < 0.02


def test_the_plan_stores_each_array_as_xla_tpu_lays_it_out():
  """The bytes of an array in the plan against those of the layout XLA:TPU picks for it (its
  minor dimensions padded to its first tiling), for vectors, small and odd shapes and random
  ones up to rank 4, in 32- and 16-bit types."""
  rng = np.random.default_rng(0)
  shapes = [(3,), (200,), (512,), (768,), (50257,), (1, 256), (2, 256), (3, 256), (5, 7),
            (256, 3), (2, 3, 256), (4, 4, 3, 256), (4, 32, 32, 3), (12, 64), (256, 2, 128)]
  for _ in range(40):
    rank = int(rng.integers(1, 5))
    shapes.append(tuple(int(n) for n in rng.integers(1, [300, 300, 40, 20][:rank])))
  replicated = jax.sharding.NamedSharding(
      jax.sharding.Mesh(np.array(targets.target('v5e:1x1').devices), ('x',)),
      jax.sharding.PartitionSpec())
  for dtype in (np.float32, jax.numpy.bfloat16):
    args = [jax.ShapeDtypeStruct(shape, dtype, sharding=replicated) for shape in shapes]
    compiled_copy = jax.jit(lambda *xs: [x + 1 for x in xs]).lower(*args).compile()
    for shape, form in zip(shapes, compiled_copy.input_formats[0]):
      dims = [shape[d] for d in form.layout.major_to_minor]
      tile = form.layout.tiling[0]
      padded = dims[:-len(tile)] + [-(-d // t) * t for d, t in zip(dims[-len(tile):], tile)]
      itemsize = np.dtype(dtype).itemsize
      xla = max(math.prod(padded) * itemsize, 512)
      assert memory._array_bytes(shape, itemsize, 'tpu') == xla, (shape, dtype, form.layout)


def test_the_mesh_and_rules_come_from_the_targets_devices():
  report = compiled(target='v5e:2x4', rule_set='tp', **{'mesh.axes': ('data', 'model'),
                                                        'mesh.shape': (-1, 2)})
  assert (report.devices, report.mesh) == (8, {'data': 4, 'model': 2})
  fsdp = compiled(target='v5e:2x4', rule_set='fsdp')
  replicated = compiled(target='v5e:2x4')
  assert fsdp.mesh == {'data': 8}
  # FSDP keeps an eighth of the state per device.
  assert fsdp.xla_bytes['alias'] < replicated.xla_bytes['alias'] / 4


def test_cloud_tpu_types_name_their_topologies():
  assert targets.target('v5litepod-4').topology == 'v5e:2x2'
  v4 = targets.target('v4-8')  # 8 TensorCores: 4 megacore chips
  assert (v4.topology, len(v4.devices), v4.chip.name) == ('v4:2x2x1', 4, 'TPU v4')
  assert targets.target('v6e-1').topology == 'v6e:1x1'
  assert targets.chip_of(targets.target('v5p-8').devices[0]).name == 'TPU v5p'


def test_the_flops_per_device_are_the_accountings_share():
  config = small_config('decoder', **TILED)
  report = compiled()
  cfg = models.model_config(config.model)
  step = 3 * accounting.forward_flops(cfg, config.data.seq_len)['total'] * config.data.batch_size
  assert report.planned_flops_per_device == pytest.approx(step / 4)


def test_a_step_that_does_not_fit_says_by_how_much():
  with pytest.raises(UserError, match=r'^does not fit: needs [\d.]+ GiB per device of 15.75 '
                                      r'on v5e:1x1 \(TPU v5e\); try a smaller data.batch_size'):
    compiled(target='v5e:1x1', **{'model.width': 1024, 'model.num_heads': 8,
                                  'data.batch_size': 1024, 'data.eval_batch_size': 8,
                                  'data.seq_len': 512, 'model.max_len': 512})


def test_gpus_compile_from_their_target_config():
  pytest.importorskip('jax_plugins.xla_cuda12', reason="GPU targets need pip install -e "
                      "'.[compile]'")
  report = compiled(target='h100x4')
  assert (report.devices, report.memory_bytes) == (4, targets.CHIPS['h100'].memory_bytes)
  assert report.flops_per_device is None  # XLA:GPU's compile-only cost analysis is empty
  assert abs(report.plan_bytes['alias'] / report.xla_bytes['alias'] - 1) < 0.01


def test_every_run_of_the_colab_notebook_fits_one_chip_of_a_v5e_1_runtime():
  """The notebook's experiments at full size, each compiled for Colab's one-chip TPU runtime
  (runs that differ in their seed alone compile alike)."""
  compiled_runs = {}
  for name in ('patch_sweep', 'ablations'):
    experiment = load_experiment(name)
    for spec in experiment.sweep_runs(quick=False):
      config = experiment.run_config(spec)
      config.compile.target = 'v5e:1x1'
      shape = tuple((k, v) for k, v in spec.overrides if k != 'seed')
      if (name, shape) not in compiled_runs:
        compiled_runs[name, shape] = aot.compile_for(config)
  assert len(compiled_runs) >= 4 + 6
  for run_name, report in compiled_runs.items():
    assert report.devices == 1 and report.fits, (run_name, report.xla_bytes)


def test_describe_fits_gpt2_small_at_batch_128_on_a_v5e_2x2_by_xlas_figure(tmp_path,
                                                                          monkeypatch):
  """Where the plan misses at the limit: GPT-2 small at batch 128 x 1024 on four v5e chips, its
  loss over the whole logits (training.logits_chunk=0), is planned at 18.29 GiB a device, which
  would not fit their 15.75; XLA:TPU compiles it in 14.91 (--mode=compile's figure,
  16,014,115,840 bytes with libtpu 0.0.42.1), and describe's verdict is XLA's. Describing it
  again reads the figure from the cache."""
  monkeypatch.setenv('TRANSFORMER_JAX_CACHE', str(tmp_path))
  config = config_lib.from_file(os.path.join(ROOT, 'configs', 'gpt2_small.py'))
  config.data.batch_size = 128
  config.training.logits_chunk = 0
  config.compile.target = 'v5e:2x2'
  text = describe.describe(config)
  assert re.search(r"\n  train step total +18.29 GiB \(the plan: 1.23x XLA's buffers\)\n"
                   r'  compiled by XLA:TPU +14.91 GiB: fits in 15.75 GiB \(95%\)\n', text), text
  assert re.search(r'\n  Compiled in [\d.]+ s and cached', text)
  again = describe.describe(config)
  assert again.splitlines()[:-1] == text.splitlines()[:-1]
  assert again.splitlines()[-1].startswith('  From the cache (compiled in ')
  settings = train.resolve(config, 'tpu')
  cached = aot.train_step_memory(settings, targets.target('v5e:2x2').devices)
  assert cached.cached and cached.xla_bytes['total'] == 16_014_115_840
  config.compile.xla_memory = False
  assert re.search(r'\n  train step total +18.29 GiB: does NOT fit in 15.75 GiB \(116%\), by the '
                   r'plan\n', describe.describe(config))


def test_launch_compiles_writes_nothing_and_ends_with_one_json_line(tmp_path):
  cache = tmp_path / 'cache'
  cache.mkdir()
  env = dict(os.environ, TRANSFORMER_JAX_CACHE=str(cache), PYTHONPATH=ROOT)
  command = [sys.executable, os.path.join(ROOT, 'launch.py'),
             '--config', os.path.join(ROOT, 'tests', 'train_helpers.py:vit'),
             '--mode=compile', '--config.compile.target=v5e:1x1']
  done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True,
                        timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  result = json.loads(done.stdout.strip().splitlines()[-1])
  assert result['target'] == 'v5e:1x1' and result['devices'] == 1 and result['fits']
  assert set(result['xla_bytes_per_device']) == set(result['plan_bytes_per_device'])
  assert 'Traceback' not in done.stderr
  assert sorted(os.listdir(tmp_path)) == ['cache'] and not os.listdir(cache)

  too_big = command + ['--config.data.batch_size=65536', '--config.model.image_size=64']
  done = subprocess.run(too_big, cwd=tmp_path, env=env, capture_output=True, text=True,
                        timeout=600)
  assert done.returncode == 1
  assert done.stderr.strip().splitlines()[-1].startswith('does not fit: needs ')
  assert 'Traceback' not in done.stderr


def test_a_vmapped_sweeps_step_compiles_for_one_tpu_chip_holding_every_runs_state():
  """Three runs of one group stacked: XLA's arguments (the states, batches and numbers) are
  three times one run's alone."""
  from transformer_jax.train import metrics, setup, vmapped  # pylint: disable=g-import-not-at-top
  configs = [small_config(**{**TILED, 'seed': seed, 'optimizer.learning_rate': rate})
             for seed, rate in ((0, 1e-3), (1, 3e-3), (2, 1e-2))]
  assert vmapped.groups(configs) == [[0, 1, 2]]
  devices = targets.target('v5e:1x1').devices
  runs = [setup.build_run(c, devices=devices) for c in configs]
  stacked, _ = aot.compiled_stacked_step(runs)
  alone, _ = aot.compiled_train_step(runs[0])
  ratio = metrics.compiled_memory(stacked)['argument'] / metrics.compiled_memory(alone)['argument']
  assert 2.9 < ratio < 3.2


def test_a_family_of_ones_own_compiles_from_its_own_file(tmp_path):
  """tests/signal_family.py's 1-D signals: the stand-in batch, the plan and the report come from
  its registry entry and its data task; its entry packs nothing, so data.packing leaves its
  batch as it is (text's packed layout would need token ids)."""
  env = dict(os.environ, PYTHONPATH=ROOT)
  done = subprocess.run([sys.executable, os.path.join(ROOT, 'launch.py'), '--config',
                         os.path.join(ROOT, 'tests', 'signal_family.py'), '--mode=compile',
                         '--config.compile.target=v5e:1x1', '--config.data.packing=True'],
                        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  result = json.loads(done.stdout.strip().splitlines()[-1])
  assert result['target'] == 'v5e:1x1' and result['fits']
  assert result['plan_bytes_per_device']['argument'] > 16 * 256 * 4  # the signals' batch
