"""The systems' training steps against their PyTorch originals, and their input pipelines' rates
beside the steps': T5, CLIP, SigLIP, Whisper and DiT, each at two shapes (system_peers.py).

  python experiments/bench_systems.py --quick      # every row at the tiny shapes, a minute
  python experiments/bench_systems.py              # the full table (see its README for the time)
  python experiments/bench_systems.py --systems t5,dit --shapes small --parts train

--parts train: our jitted train step (step_timing, the run's own step and optimizer) against
the same model, loss and optimizer in the peer library (transformers' T5ForConditionalGeneration,
CLIPModel, SiglipModel, WhisperForConditionalGeneration; diffusers' DiTTransformer2DModel), both
in float32 on the CPU, torch on --torch_threads threads (XLA:CPU on the machine's cores, as the
other benchmarks run it), the same weights (the peer's random ones, imported by
transformer_jax.convert) and the same batches. Step 0 of each side is on the same batch (and
for DiT the same timesteps, noise and dropped labels): their losses must agree to
--loss_rtol, or the row fails, before anything is timed. Then --warmup steps each, then
--repeats interleaved measurements of --steps steps each (ours, then the peer's), each reported
as its median step with the 1-minute load average, MFU beside it: the accounting's model FLOPs
of a step (3 x the family's forward_flops per example) over this machine's float32 matmul peak
(train.metrics.measured_matmul_flops, measured in the same sitting).
--parts input: each system's input pipeline (grain's threads, as training reads it) at the
'small' shape, in examples per second beside our step's rate measured in the same sitting:
image-text pairs (JPEG files decoded, CLIP's random-resized crop or SigLIP's resize, captions
tokenized by a BPE), T5's span corruption with packing of a text file (--text; generated words
without it) tokenized by a BPE of T5's 32,128 ids, whisper-tiny's audio (WAV files of tones
resampled and padded to 30 s windows; the log-Mel features made in the pipeline, 'host', or in
the step, 'device'), DiT's images (CIFAR-10 from --tfds_data_dir as configs/dit_reference.py
reads it, else generated images).

A benchmark, not a test: the figures drift with the machine's load, printed beside each. With
--json_out the rows are also written as JSON. Without torch, transformers and diffusers (the
`bench` extra), the peers' columns are skipped with a line saying so. Measured figures:
experiments/results/bench_systems/README.md.
"""
import json
import os
import pathlib
import statistics
import tempfile

from absl import app, flags
import jax

import step_timing
from transformer_jax import accounting
from transformer_jax.train import cpu_runtime, metrics

ROOT = pathlib.Path(__file__).resolve().parent.parent
SYSTEMS = ('t5', 'clip', 'siglip', 'whisper', 'dit')
PARTS = ('train', 'input')

_SYSTEMS = flags.DEFINE_list('systems', list(SYSTEMS), f'Of {SYSTEMS}.')
_SHAPES = flags.DEFINE_list('shapes', ['tiny', 'small'], "'tiny' (seconds) and 'small' (near "
                            'the smallest published size; system_peers.py).')
_PARTS = flags.DEFINE_list('parts', list(PARTS), f'Of {PARTS}.')
_STEPS = flags.DEFINE_integer('steps', 10, 'Timed steps per measurement.')
_WARMUP = flags.DEFINE_integer('warmup', 2, 'Untimed steps per side first (step 0 among them).')
_REPEATS = flags.DEFINE_integer('repeats', 2, 'Interleaved measurements per side.')
_TORCH_THREADS = flags.DEFINE_integer('torch_threads', 2, 'torch.set_num_threads.')
_TORCH_ADAMW = flags.DEFINE_enum('torch_adamw', 'fused', ['default', 'foreach', 'fused'],
                                 "torch.optim.AdamW's implementation (fused: its fastest on "
                                 'the CPU).')
_LOSS_RTOL = flags.DEFINE_float('loss_rtol', 1e-4, 'Step 0 losses must agree to this.')
_BATCHES = flags.DEFINE_integer('batches', 20, 'Timed batches per input pipeline.')
_TEXT = flags.DEFINE_string('text', None, "A text file for T5's span corruption (generated "
                            'words without it).')
_TFDS_DATA_DIR = flags.DEFINE_string('tfds_data_dir', None, 'TFDS data dir holding CIFAR-10 '
                                     "(prepared), for DiT's pipeline; generated images without.")
_JSON_OUT = flags.DEFINE_string('json_out', None, 'Also write the rows here as JSON.')
_QUICK = flags.DEFINE_bool('quick', False, 'Every row at the tiny shapes, 2 timed steps, one '
                           'measurement each: a check that it runs and that both sides agree.')


def load_average() -> str:
  return f'load {os.getloadavg()[0]:.2f}'


def peers_or_none():
  """The system_peers module, or None (said once) where torch or a peer library is missing."""
  try:
    import system_peers
  except ImportError as error:
    print(f'No PyTorch columns: {error.name} is not installed (pip install -e \'.[bench]\').')
    return None
  return system_peers


def step_flops(run, batch: dict) -> float:
  """Model FLOPs of one train step of `batch`, as the training loop counts them (3 x the
  family's forward FLOPs of an example, times the batch)."""
  size = len(next(iter(batch.values())))
  forward = accounting.forward_flops(run.model_config, *run.family.lengths(batch))['total']
  return 3 * forward * size


def report(side: str, seconds: float, flops: float, peak: float, examples: int) -> dict:
  row = {'side': side, 'step_ms': 1e3 * seconds, 'examples_per_s': examples / seconds,
         'mfu': flops / seconds / peak, 'load': os.getloadavg()[0]}
  print(f'    {side:<10} {row["step_ms"]:9.1f} ms  {row["examples_per_s"]:8.1f} examples/s  '
        f'MFU {row["mfu"]:6.1%}  ({load_average()})', flush=True)
  return row


def train_row(peers, name: str, shape: str, peak: float, steps: int, warmup: int,
              repeats: int) -> dict:
  """One system at one shape: the step-0 check, then interleaved measurements."""
  peer = peers.PEERS[name](shape)
  with tempfile.TemporaryDirectory() as directory:
    model = peer.build(directory)
    config = peer.config(directory)
    batches = [peer.batch(i) for i in range(step_timing.READY_BATCHES)]
    ours = step_timing.timed_step(config, batches=batches, params=peer.params(model, config))
  run = ours.run
  theirs = peers.TorchStep(peer, model, batches, run.settings.optimizer,
                           peer.first_draws(run, batches[0]))
  flops = step_flops(run, batches[0])
  params = accounting.count_params(run.abstract_params)['total']
  print(f'{name} ({shape}): {params:,} parameters, batch {peer.batch_size}, '
        f'{flops / 1e9:.1f} GFLOP per step (accounting)', flush=True)
  ours(0)
  theirs(0)
  loss = float(ours.metrics['loss'] / ours.metrics['weight'])
  difference = abs(loss / theirs.loss - 1)
  print(f'  step 0 on the same batch: loss {loss:.6f} (ours), {theirs.loss:.6f} (peer), '
        f'relative difference {difference:.1e}', flush=True)
  if not difference <= _LOSS_RTOL.value:
    raise RuntimeError(f'{name} ({shape}): the step 0 losses differ by {difference:.1e}, more '
                       f'than {_LOSS_RTOL.value:g}: the two sides do not compute the same thing.')
  for i in range(1, warmup):
    ours(i)
    theirs(i)
  row = dict(system=name, shape=shape, params=params, batch_size=peer.batch_size,
             gflop_per_step=flops / 1e9, loss_ours=loss, loss_peer=theirs.loss,
             loss_rel_difference=difference, ours=[], peer=[])
  for _ in range(repeats):
    for side, step in (('ours', ours), ('peer', theirs)):
      seconds = statistics.median(step(i) for i in range(warmup, warmup + steps))
      row[side].append(report(side, seconds, flops, peak, peer.batch_size))
  median = lambda side: statistics.median(r['step_ms'] for r in row[side])
  row['speedup'] = median('peer') / median('ours')
  print(f'  ours {row["speedup"]:.2f}x the peer\'s speed (medians of the measurements)',
        flush=True)
  return row


def main(argv):
  del argv
  jax.config.update('jax_platforms', 'cpu')  # both sides on the CPU, whatever else is here
  cpu_runtime.configure()  # as launch.py runs a step
  quick = _QUICK.value
  shapes = ['tiny'] if quick else _SHAPES.value
  steps, warmup, repeats = (2, 2, 1) if quick else (_STEPS.value, _WARMUP.value, _REPEATS.value)
  peers = peers_or_none()
  if peers is not None:
    import torch
    import transformers
    torch.set_num_threads(_TORCH_THREADS.value)
    transformers.logging.set_verbosity_error()
    peers.Peer.adamw = _TORCH_ADAMW.value
  print(f'jax {jax.__version__}, {os.cpu_count()} CPUs, {load_average()}')
  peak = metrics.measured_matmul_flops()
  print(f'float32 matmul peak (best jitted square matmul): {peak / 1e9:.1f} GFLOP/s')
  rows = []
  if 'train' in _PARTS.value and peers is not None:
    for name in _SYSTEMS.value:
      for shape in shapes:
        rows.append(train_row(peers, name, shape, peak, steps, warmup, repeats))
  print(f'{load_average()} at the end')
  if _JSON_OUT.value:
    pathlib.Path(_JSON_OUT.value).write_text(json.dumps(
        {'peak_flops': peak, 'cpus': os.cpu_count(), 'rows': rows}, indent=2))


if __name__ == '__main__':
  app.run(main)
