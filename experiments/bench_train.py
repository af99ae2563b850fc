"""Training-step speed: step time, tokens per second, achieved FLOP/s and MFU against this
machine's measured float32 matmul peak, for the reference character LM
(configs/llama_shakespeare.py) and a wider model, beside the PyTorch reference of the same model
when its interpreter is given.

  python experiments/bench_train.py                      # JAX only
  python experiments/bench_train.py --torch_python /path/to/venv/bin/python
A benchmark, not a test: it prints figures. Timings on shared machines drift, so the script
interleaves the JAX and PyTorch runs and reports each twice.
"""
import functools
import json
import os
import pathlib
import statistics
import subprocess
import time

from absl import app, flags
import jax

from transformer_jax import accounting, config_lib
from transformer_jax.train import metrics, setup, sharding, step as step_lib

ROOT = pathlib.Path(__file__).resolve().parent.parent
REFERENCE = ROOT.parent / 'shared' / 'baselines' / 'torch_reference.py'

_STEPS = flags.DEFINE_integer('steps', 30, 'Timed steps per measurement (after 3 warm-up steps).')
_WIDTHS = flags.DEFINE_list('widths', ['128', '512'], 'Model widths: 128 is the reference LM.')
_TORCH = flags.DEFINE_string('torch_python', None, 'Python of a venv with torch, to run the '
                             'PyTorch reference (torch_reference.py) beside the JAX step.')
_REPEATS = flags.DEFINE_integer('repeats', 2, 'Interleaved JAX / PyTorch measurements.')


def reference_lm_config(width: int):
  config = config_lib.from_file(ROOT / 'configs' / 'llama_shakespeare.py')
  config.model.update(width=width, num_heads=width // 32)
  config.data.update(name='synthetic', alphabet=''.join(map(chr, range(33, 98))))
  return config


def jax_step_times(config, steps: int) -> list[float]:
  """Seconds per train step of the library's own jitted step (synthetic batches, no I/O)."""
  run = setup.build_run(config)
  init = functools.partial(setup.initial_state, run.model, run.tx,
                           run.family.example_inputs(run.model_config))
  state = jax.jit(init, out_shardings=run.state_sharding)(jax.random.key(0))
  train_step = step_lib.make_train_step(run.model, run.family, run.tx, run.schedule, run.mesh,
                                        run.state_sharding, run.step_settings)
  batches = [sharding.global_batch(run.data.train_batch(i), run.mesh) for i in range(4)]
  compiled = train_step.lower(state, batches[0]).compile()
  times = []
  for i in range(steps + 3):
    start = time.perf_counter()
    state, metrics = compiled(state, batches[i % 4])
    jax.block_until_ready(metrics)
    times.append(time.perf_counter() - start)
  return times[3:]


def torch_step_ms(width: int, steps: int) -> float:
  command = [_TORCH.value, str(REFERENCE), '--dim', str(width), '--n_heads', str(width // 32),
             '--steps', str(steps + 10), '--eval_at', '', '--threads', '2']
  out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
  result = json.loads(next(line for line in out.splitlines() if line.startswith('RESULT '))[7:])
  return result['median_step_ms']


def report(name: str, seconds: float, flops_per_step: float, tokens: int, peak: float):
  achieved = flops_per_step / seconds
  print(f'  {name:<8} step {seconds * 1e3:7.1f} ms  {tokens / seconds:9,.0f} tokens/s  '
        f'{achieved / 1e9:6.1f} GFLOP/s  MFU {achieved / peak:5.1%}')


def main(argv):
  del argv
  print(f'jax {jax.__version__}, {jax.devices()[0].device_kind}, {os.cpu_count()} CPUs, '
        f'load average {os.getloadavg()[0]:.2f}')
  peak = metrics.measured_matmul_flops()
  print(f'float32 matmul peak (best jitted square matmul): {peak / 1e9:.1f} GFLOP/s')
  for width in map(int, _WIDTHS.value):
    config = reference_lm_config(width)
    tokens = config.data.batch_size * config.data.seq_len
    flops = 3 * accounting.forward_flops(config.model, config.data.seq_len)['total']
    flops_per_step = flops * config.data.batch_size
    params = accounting.param_counts(config.model)['total']
    print(f'width {width}: {params:,} parameters, batch {config.data.batch_size} x '
          f'{config.data.seq_len}, {flops_per_step / 1e9:.2f} GFLOP per step (accounting)')
    for _ in range(_REPEATS.value):
      report('jax', statistics.median(jax_step_times(config, _STEPS.value)), flops_per_step,
             tokens, peak)
      if _TORCH.value:
        report('pytorch', torch_step_ms(width, _STEPS.value) / 1e3, flops_per_step, tokens, peak)
  print(f'load average at the end {os.getloadavg()[0]:.2f}')


if __name__ == '__main__':
  app.run(main)
