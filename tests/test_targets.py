"""Target names and the errors of --mode=compile that need no compile-only devices; the
compiles themselves are in test_compile_mode.py (with the optional extra)."""
import importlib.util

import jax
import numpy as np
import pytest

from train_helpers import small_config
from transformer_jax import aot, data, describe, memory, models, run, targets
from transformer_jax.errors import ConfigError


@pytest.mark.parametrize('name', ['v7:2x2', 'v5e:2x2x1', 'v4:2x2', 'v5litepod-3', 'b200x8',
                                  'tpu', ''])
def test_a_name_that_is_no_target_says_what_targets_look_like(name):
  with pytest.raises(ConfigError, match=r"is not a target: use a TPU topology \(v5e:2x2"):
    targets.target(name)


def test_more_gpus_than_one_host_holds_are_refused():
  with pytest.raises(ConfigError, match='one host of 1 to 8 GPUs'):
    targets.target('h100x16')


@pytest.mark.parametrize('name, package', [('v5e:2x2', 'libtpu'), ('v4-8', 'libtpu'),
                                           ('h100x4', 'CUDA plugin')])
def test_a_target_without_the_extra_names_the_install(monkeypatch, name, package):
  monkeypatch.setattr(importlib.util, 'find_spec', lambda module: None)
  targets._tpu_devices.cache_clear()
  target = targets.target(name)  # its name, chip and size need nothing installed
  assert target.num_devices == 4
  with pytest.raises(ConfigError, match=rf"needs .*{package}.*pip install -e '.\[compile\]'"):
    assert target.devices


@pytest.mark.parametrize('name, platform, devices, hbm', [
    ('v5e:2x2', 'tpu', 4, '15.75 GiB'), ('v4-8', 'tpu', 4, '30.75 GiB'),
    ('h100x8', 'gpu', 8, '79.11 GiB')])
def test_describe_plans_for_a_target_without_its_devices(monkeypatch, name, platform, devices,
                                                          hbm):
  monkeypatch.setattr(importlib.util, 'find_spec', lambda module: None)  # no extra needed
  config = small_config('decoder', **{'data.batch_size': 32})
  config.compile.target = name
  text = describe.describe(config)
  assert f'Memory per device on {devices} devices (data={devices}' in text
  assert f'as XLA:{platform.upper()} compiles it' in text
  assert f'fits in {hbm}' in text and ', by the plan' in text
  assert f'Compute dtype: bfloat16 (auto on {platform}' in text
  package = ('libtpu (compile-only TPU devices)' if platform == 'tpu' else
             'the CUDA plugin (jax-cuda12-plugin)')
  assert (f'\n  No XLA:{platform.upper()} figure: {package} is not installed (pip install -e '
          "'.[compile]'); the plan is an estimate.\n") in text
  low, high, count = memory.read_fit()['test'][platform]['under 1 GiB']  # a few MiB's plan
  assert (f'Caution: for models under 1 GiB per device the plan was {low:.2f}-{high:.2f}x what '
          f'XLA:{platform.upper()} needed over the {count} of its test set') in text
  kernel = 'splash' if platform == 'tpu' else 'cudnn'
  assert f'Attention kernel: {kernel} (auto on {platform}' in text


def test_compile_mode_needs_a_target():
  with pytest.raises(ConfigError, match='--mode=compile needs --config.compile.target'):
    run.run(small_config(), None, 'compile')


def _layout(batch):
  return {key: (tuple(value.shape), np.dtype(value.dtype)) for key, value in batch.items()}


@pytest.mark.parametrize('name', ['decoder', 'encoder'])
def test_the_abstract_batch_of_packed_text_is_the_packed_tasks_layout(tmp_path, name):
  family = models.registry.get(name)
  task = family.task
  documents = [f'document {i}: ' + 'words ' * (i % 7 + 1) for i in range(200)]
  path = tmp_path / 'c.jsonl'
  path.write_text(''.join(f'{{"text": "{d}"}}\n' for d in documents))
  options = dict(batch_size=4, eval_batch_size=1, seq_len=32, packing=True)
  packed = data.make_data(dict(options, name='jsonl', path=str(path), tokenizer='bpe',
                               vocab_size=300), task, seed=0).train_batch(0)
  stand_in = data.make_data(dict(options, name='synthetic'), task, seed=0).train_batch(0)
  mesh = jax.make_mesh((1,), ('data',), axis_types=(jax.sharding.AxisType.Auto,),
                       devices=jax.devices()[:1])
  assert _layout(aot.abstract_batch(stand_in, mesh, family.packed_shapes)) == _layout(packed)
