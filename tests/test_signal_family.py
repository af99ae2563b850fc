"""A family registered from one file of its own (tests/signal_family.py), whose inputs are a 1-D
signal of floats with a data task and settings of its own, gets what a built-in family gets:
describe, the memory plan, training through launch.py (and --mode=compile, in
tests/test_compile_mode.py): the library asks its registry entry, not its name."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

from process_env import process_env
import signal_family
from transformer_jax import aot, describe, memory, run, train
from transformer_jax.errors import ConfigError
from transformer_jax.train import metrics

ROOT = pathlib.Path(__file__).resolve().parent.parent
FAMILY_FILE = ROOT / 'tests' / 'signal_family.py'


def small(steps=4, **data):
  config = signal_family.get_config(f'steps={steps}')
  config.data.update(**data)
  return config


def test_describe_reads_the_family_from_its_entry():
  text = describe.describe(small())
  assert text.startswith('signal model: 2 blocks, width 32, 4 heads, MLP gelu 128, signals of '
                         '256 samples in frames of 16\n')
  assert 'FLOPs per signal: forward ' in text and 'KV cache: none' in text
  assert "rule set 'dp'), batch 16, remat none, as XLA:CPU compiles it:" in text


def test_the_memory_plan_counts_its_batch_and_blocks_from_its_entry():
  config = small()
  plan = memory.plan(config, {'data': 1}, platform='cpu')
  assert plan.batch == 16 * 256 * 4 + 16 * 4  # the float32 signals and int32 labels
  settings = train.resolve(config, 'cpu')
  one = memory.activation_terms(settings, lambda name: 1, 'cpu')
  # Each block keeps copies of its 16 frames of width 32 per example; no logits term.
  assert one['width'] == 2 * 16 * 16 * 32 * 4 and one['logits'] == 0
  # Against XLA's memory of the real step on this machine's devices.
  run_ = train.build_run(config)
  batch = run_.family.batch_shapes(run_.model_config, 16, 0)
  compiled = run_.train_step.lower(run_.abstract_state, batch).compile()
  planned = memory.plan(config, dict(run_.mesh.shape), platform='cpu').train_total
  xla = metrics.compiled_memory(compiled)['buffers']
  assert 0.5 < planned / xla < 2, (planned, xla)


def test_its_data_settings_are_its_own_and_checked():
  with pytest.raises(ConfigError, match=r'data.signal_noise=-1.0 must be'):
    train.resolve(small(signal_noise=-1.0))
  run_ = train.build_run(small(signal_noise=0.0))
  batch = run_.data.train_batch(0)
  assert batch['signal'].shape == (16, 256) and batch['label'].shape == (16,)
  assert abs(batch['signal']).max() <= 1.0  # noiseless sines


def test_data_packing_leaves_its_batches_as_they_are():
  """Its entry packs nothing (packed_shapes None), so --mode=compile's abstract batch is its
  batch as it is where text would take segment ids and positions."""
  run_ = train.build_run(small(packing=True))
  assert aot.packed_layout(run_) is None
  batch = aot.abstract_batch(run_.data.train_batch(0), run_.mesh, aot.packed_layout(run_))
  assert {key: value.shape for key, value in batch.items()} == {'signal': (16, 256),
                                                                 'label': (16,)}


def test_it_trains_and_evaluates_through_the_run(tmp_path):
  workdir = str(tmp_path / 'run')
  run.run(small(steps=4), workdir, 'train')
  rows = [json.loads(line) for line in open(os.path.join(workdir, 'metrics.jsonl'))]
  assert [row['step'] for row in rows if 'loss' in row][-1] == 4
  assert 'eval_accuracy' in rows[-1]


@pytest.mark.slow
def test_launch_trains_it_from_its_own_file(tmp_path):
  env = process_env(PYTHONPATH=str(ROOT / 'tests'))
  done = subprocess.run([sys.executable, str(ROOT / 'launch.py'), f'--config={FAMILY_FILE}',
                         f'--workdir={tmp_path / "run"}', '--config.training.steps=30',
                         '--config.training.eval_every=30'],
                        capture_output=True, text=True, env=env, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  lines = (tmp_path / 'run' / 'metrics.jsonl').read_text().splitlines()
  rows = [json.loads(line) for line in lines]
  losses = [row['loss'] for row in rows if 'loss' in row]
  assert losses[-1] < losses[0]
  assert rows[-1]['eval_accuracy'] > 0.25  # four classes: better than chance
