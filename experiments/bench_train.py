"""Training-step speed: step time, throughput, achieved FLOP/s and MFU against this machine's
measured float32 matmul peak, for the two reference models (the character LM of
configs/llama_shakespeare.py, and a wider one; the ViT of configs/vit_reference.py at batch 128),
beside PyTorch implementations of the same models when they are given.

  python experiments/bench_train.py                      # JAX only
  python experiments/bench_train.py --torch_python PYTHON_WITH_TORCH --torch_reference_dir DIR
  python experiments/bench_train.py --models lm128,vit   # a subset
A benchmark, not a test: it prints figures, each with the 1-minute load average beside it.
Timings on shared machines drift, so the script interleaves the JAX and PyTorch runs and reports
each `--repeats` times.

The PyTorch references are two scripts in --torch_reference_dir: torch_reference.py (the reference
LM) and torch_vit_reference.py (the reference ViT), PyTorch implementations of the same models
(the same blocks, initialization and optimizer) that take the flags passed in `benchmark` and
print a line `RESULT {"median_step_ms": ...}`. They are not part of this repository; without
them the PyTorch column is skipped. Measured figures: experiments/results/bench_train/README.md.
"""
import json
import os
import pathlib
import statistics
import subprocess

from absl import app, flags
import jax

import step_timing
from transformer_jax import accounting, config_lib, train
from transformer_jax.train import cpu_runtime, metrics

ROOT = pathlib.Path(__file__).resolve().parent.parent

_STEPS = flags.DEFINE_integer('steps', 30, 'Timed steps per measurement (after 3 warm-up steps).')
_MODELS = flags.DEFINE_list('models', ['lm128', 'lm512', 'vit'],
                            'lmWIDTH: the reference LM at that width (128 is the reference, '
                            'heads of 32); vit: the reference ViT at batch 128.')
_TORCH = flags.DEFINE_string('torch_python', None, 'Python of a venv with torch, to run the '
                             'PyTorch references beside the JAX step.')
_TORCH_DIR = flags.DEFINE_string('torch_reference_dir', None, 'The folder holding the PyTorch '
                                 'references torch_reference.py and torch_vit_reference.py.')
_REPEATS = flags.DEFINE_integer('repeats', 2, 'Interleaved JAX / PyTorch measurements.')


def reference_lm_config(width: int):
  config = config_lib.from_file(ROOT / 'configs' / 'llama_shakespeare.py')
  config.model.update(width=width, num_heads=width // 32)
  config.data.update(name='synthetic', alphabet=''.join(map(chr, range(33, 98))))
  return config


def reference_vit_config():
  config = config_lib.from_file(ROOT / 'configs' / 'vit_reference.py')
  # 512 divides the synthetic set's 1,024 held-out images (the bench never evaluates).
  config.data.update(name='synthetic', eval_batch_size=512)
  return config


def jax_step_times(config, steps: int) -> list[float]:
  """Seconds per train step of the library's own jitted step (synthetic batches, no I/O)."""
  return step_timing.step_seconds(config, steps, warmup=3)


def torch_step_ms(script: str, args: list[str]) -> float:
  command = [_TORCH.value, os.path.join(_TORCH_DIR.value, script), *args, '--threads', '2']
  out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
  result = json.loads(next(line for line in out.splitlines() if line.startswith('RESULT '))[7:])
  return result['median_step_ms']


def benchmark(name: str):
  """(config, the PyTorch reference's script and arguments, what a step processes, its unit)."""
  steps = str(_STEPS.value + 10)
  if name == 'vit':
    config = reference_vit_config()
    torch_args = ['--batch_size', str(config.data.batch_size), '--steps', steps]
    return config, 'torch_vit_reference.py', torch_args, config.data.batch_size, 'images'
  if not name.startswith('lm'):
    raise app.UsageError(f'Unknown model {name!r}: use lmWIDTH (lm128, lm512) or vit.')
  width = int(name[2:])
  config = reference_lm_config(width)
  torch_args = ['--dim', str(width), '--n_heads', str(width // 32), '--steps', steps,
                '--eval_at', '']
  tokens = config.data.batch_size * config.data.seq_len
  return config, 'torch_reference.py', torch_args, tokens, 'tokens'


def report(name: str, seconds: float, flops_per_step: float, items: int, unit: str, peak: float):
  achieved = flops_per_step / seconds
  print(f'  {name:<8} step {seconds * 1e3:7.1f} ms  {items / seconds:9,.0f} {unit}/s  '
        f'{achieved / 1e9:6.1f} GFLOP/s  MFU {achieved / peak:5.1%}  '
        f'(load average {os.getloadavg()[0]:.2f})', flush=True)


def main(argv):
  del argv
  cpu_runtime.configure()  # as launch.py runs a step
  print(f'jax {jax.__version__}, {jax.devices()[0].device_kind}, {os.cpu_count()} CPUs, '
        f'load average {os.getloadavg()[0]:.2f}')
  with_torch = bool(_TORCH.value and _TORCH_DIR.value)
  if not with_torch:
    print('No PyTorch column: it needs --torch_python and --torch_reference_dir (see the '
          'docstring).')
  peak = metrics.measured_matmul_flops()
  print(f'float32 matmul peak (best jitted square matmul): {peak / 1e9:.1f} GFLOP/s')
  for name in _MODELS.value:
    config, script, torch_args, items, unit = benchmark(name)
    # A text example is a window of seq_len tokens; a ViT's length is its patch count.
    seq_len = config.data.seq_len if unit == 'tokens' else None
    model = train.resolve(config).model  # its vocabulary as its data states it
    flops_per_step = 3 * accounting.forward_flops(model, seq_len)['total']
    flops_per_step *= config.data.batch_size
    params = accounting.param_counts(model)['total']
    print(f'{name}: {params:,} parameters, batch {config.data.batch_size}, {items:,} {unit} per '
          f'step, {flops_per_step / 1e9:.2f} GFLOP per step (accounting)', flush=True)
    for _ in range(_REPEATS.value):
      report('jax', statistics.median(jax_step_times(config, _STEPS.value)), flops_per_step,
             items, unit, peak)
      if with_torch:
        report('pytorch', torch_step_ms(script, torch_args) / 1e3, flops_per_step, items, unit,
               peak)
  print(f'load average at the end {os.getloadavg()[0]:.2f}')


if __name__ == '__main__':
  app.run(main)
