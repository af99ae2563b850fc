"""The systems' benchmarks against their PyTorch peers (experiments/bench_systems.py,
bench_inference.py, system_peers.py): the peers hold our weights and compute our outputs, and
every row of the scripts' --quick runs with both sides doing the same work. The scripts run
in processes of their own (their absl flags would clash with other experiments')."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from helpers import ROOT
from transformer_jax import accounting, convert, models

torch = pytest.importorskip('torch')
pytest.importorskip('transformers')
pytest.importorskip('diffusers')
sys.path.insert(0, str(ROOT / 'experiments'))
import system_peers  # noqa: E402 (after the importorskips and the path)

SYSTEMS = ['t5', 'clip', 'siglip', 'whisper', 'dit']


@pytest.fixture(autouse=True)
def one_torch_thread():
  threads = torch.get_num_threads()
  torch.set_num_threads(1)
  yield
  torch.set_num_threads(threads)


def test_our_dit_of_diffusers_weights_computes_diffusers_output():
  """The table of system_peers.dit_params: our DiT (learned sigma) of a random diffusers
  DiTTransformer2DModel's weights gives its output, every block's conditioning included."""
  peer = system_peers.DiT('tiny')
  torch.manual_seed(0)
  theirs = peer.make_model(learn_sigma=True).eval()
  cfg = models.model_config(peer.model_fields(learn_sigma=True))
  params = system_peers.dit_params(theirs, cfg)
  rng = np.random.default_rng(0)
  x = rng.standard_normal((3, 8, 8, 4)).astype(np.float32)
  t, y = np.array([0, 500, 999]), np.array([3, 9, 10])  # 10: the null class
  ours = models.build(cfg).apply({'params': params}, x, t, y)
  with torch.inference_mode():
    expected = theirs(torch.from_numpy(x.transpose(0, 3, 1, 2).copy()),
                      timestep=torch.from_numpy(t), class_labels=torch.from_numpy(y))
  expected = expected.sample.numpy().transpose(0, 2, 3, 1)
  assert np.abs(expected).max() > 0.5  # not the zero output of an adaLN-Zero initialization
  np.testing.assert_allclose(ours, expected, atol=1e-5)


def test_openai_whisper_of_a_transformers_checkpoint_computes_its_logits(tmp_path):
  pytest.importorskip('whisper')
  hf = system_peers.whisper_checkpoint('micro', tmp_path)
  openai = system_peers.openai_whisper(hf)
  mel = torch.from_numpy(np.random.default_rng(0).uniform(-1, 1, (2, 80, 100)).astype(
      np.float32))
  tokens = torch.tensor([list(system_peers.WHISPER_PROMPT) + [11, 12]] * 2)
  with torch.inference_mode():
    expected = hf(input_features=mel, decoder_input_ids=tokens).logits.numpy()
    ours = openai(mel, tokens).numpy()
  np.testing.assert_allclose(ours, expected, atol=1e-4 * np.abs(expected).max())


def test_the_t5_peer_is_t5_1_1_small_with_its_own_head(tmp_path):
  """transformers 5 ties T5's head whatever the config says; the peer unties it as T5 1.1's
  checkpoints do: 76,961,152 parameters on both sides (configs/t5_small.py:v1_1's count)."""
  model = system_peers.T5('small').build(str(tmp_path))
  assert model.lm_head.weight.data_ptr() != model.shared.weight.data_ptr()
  assert sum(p.numel() for p in model.parameters()) == 76_961_152
  assert accounting.param_counts(convert.load_model_config(tmp_path))['total'] == 76_961_152


def quick(script: str, tmp_path, *args) -> dict:
  """The script's --quick run (its rows as --json_out writes them)."""
  out = tmp_path / f'{script}.json'
  # On the machine's one CPU device, as a user runs it: not the suite's 8 simulated ones.
  env = {name: value for name, value in os.environ.items() if name != 'XLA_FLAGS'}
  subprocess.run([sys.executable, f'experiments/{script}.py', '--quick', '--json_out', str(out),
                  *args], cwd=ROOT, check=True, capture_output=True, text=True,
                 env={**env, 'PYTHONPATH': str(ROOT)})
  return json.loads(out.read_text())


@pytest.mark.slow
def test_every_training_row_starts_from_the_peers_loss_and_is_profiled(tmp_path):
  rows = quick('bench_systems', tmp_path, '--parts', 'train', '--profile_dir',
               str(tmp_path / 'profiles'))['train']
  assert [(row['system'], row['shape']) for row in rows] == [(s, 'tiny') for s in SYSTEMS]
  for row in rows:
    assert row['loss_rel_difference'] <= 1e-4, row
    assert len(row['ours']) == len(row['peer']) == 1 and row['speedup'] > 0
    # Where our step's time goes: matrix products in the model's forward and backward passes.
    profile = row['profile']
    assert profile['by_kind_ms']['matrix products'] > 0
    assert any(part.startswith('backward ') for part in profile['by_part_ms'])
    assert sum(profile['by_kind_ms'].values()) == pytest.approx(profile['op_ms'])


@pytest.mark.slow
def test_every_input_pipeline_is_timed_beside_its_step(tmp_path):
  rows = quick('bench_systems', tmp_path, '--parts', 'input')['input']
  assert [row['system'] for row in rows] == ['t5', 'clip', 'siglip', 'whisper', 'whisper', 'dit']
  assert all(row['pipeline_examples_per_s'] > 0 and row['step_examples_per_s'] > 0
             for row in rows)


@pytest.mark.slow
def test_every_inference_row_does_the_same_work_on_every_side(tmp_path):
  """The script checks each row before timing it (equal token counts, equal DDIM latents and
  embeddings); greedy decoding writes the same tokens on every float32 side."""
  rows = quick('bench_inference', tmp_path)['rows']
  assert {row['system'] for row in rows} == set(SYSTEMS)
  whisper = [row for row in rows if row['system'] == 'whisper']
  assert len(whisper) == 4 and all(len(row['sides']) == 6 for row in whisper)
  assert all(side['ours_int8_speedup'] > 0 for row in whisper for side in row['sides'].values())
  for row in whisper + [row for row in rows if row['system'] == 't5']:
    if 'greedy' in row['row']:
      peers = [side for side in row['sides'] if 'int8' not in side and side != 'ours']
      assert all(f'{side} identical' in row['check'] for side in peers), row['check']
  assert all(side['seconds'] > 0 for row in rows for side in row['sides'].values())
