"""Metrics: a progress line with ETA, metrics.jsonl, TensorBoard events, and MFU."""
import json
import os
import platform
import sys
import time

import logging
import jax

from transformer_jax import targets

__all__ = [
    'compiled_memory', 'cpu_model', 'logged_eval_steps', 'measured_matmul_flops', 'METRICS_FILE',
    'MetricWriter', 'peak_flops_per_device', 'read_metrics']

log = logging.getLogger(__name__)

METRICS_FILE = 'metrics.jsonl'


def cpu_model() -> str:
  """The processor's model name (Linux's /proc/cpuinfo, else platform's): CPU timings and their
  ratios hold for the CPU they were measured on."""
  try:
    with open('/proc/cpuinfo', encoding='utf-8') as f:
      names = [line.split(':', 1)[1].strip() for line in f if line.startswith('model name')]
  except OSError:
    names = []
  return names[0] if names else platform.processor() or 'unknown'


def measured_matmul_flops(sizes=(512, 1024, 2048), repeats: int = 5) -> float:
  """The best float32 FLOP/s of a jitted square matmul over `sizes`: a device's peak where the
  table has none (a CPU), for config.training.peak_flops_per_device and the benchmarks."""
  best = 0.0
  for n in sizes:
    a = jax.numpy.ones((n, n), jax.numpy.float32)
    matmul = jax.jit(jax.numpy.dot).lower(a, a).compile()
    matmul(a, a).block_until_ready()
    for _ in range(repeats):
      start = time.perf_counter()
      matmul(a, a).block_until_ready()
      best = max(best, 2 * n ** 3 / (time.perf_counter() - start))
  return best


def peak_flops_per_device(configured: float | None, device=None) -> tuple[float | None, str]:
  """The peak of `device` (default: this process's first) and where it came from: the config,
  the chip of its device kind (targets.CHIPS, dense bfloat16 peaks; float32 compute on a GPU
  peaks far lower), or neither."""
  if configured:
    return configured, f'config.training.peak_flops_per_device ({configured:.3g} FLOP/s)'
  kind = (device or jax.devices()[0]).device_kind
  chip = targets.chip_of_kind(kind)
  if chip is not None:
    return chip.peak_flops, f'the {chip.name} peak for {kind!r} ({chip.peak_flops:.3g} FLOP/s)'
  return None, (f'unknown for {kind!r}: set config.training.peak_flops_per_device '
                '(experiments/bench_train.py measures it) to report MFU')


def compiled_memory(compiled) -> dict[str, int] | None:
  """Bytes per device of a compiled step by XLA's memory analysis: arguments, outputs, aliases
  (outputs written over donated arguments), temporaries and generated code; the 'buffers' the
  step holds at its peak (arguments + outputs - aliases + temporaries), and the 'total' with the
  code. None where the backend reports none."""
  stats = compiled.memory_analysis()
  if stats is None:
    return None
  fields = {'argument': stats.argument_size_in_bytes, 'output': stats.output_size_in_bytes,
            'alias': stats.alias_size_in_bytes, 'temporary': stats.temp_size_in_bytes,
            'code': stats.generated_code_size_in_bytes}
  fields['buffers'] = (fields['argument'] + fields['output'] - fields['alias']
                       + fields['temporary'])
  return dict(fields, total=fields['buffers'] + fields['code'])


def read_metrics(workdir) -> list[dict]:
  """Every row of workdir/metrics.jsonl, in the order written: training rows (with 'loss') and
  held-out rows (with 'eval_loss'). The file is appended to, so a resumed run repeats the steps
  after its checkpoint; a line that is not JSON raises, naming the file and the line."""
  path = os.path.join(workdir, METRICS_FILE)
  rows = []
  with open(path) as f:
    for number, line in enumerate(f, 1):
      try:
        rows.append(json.loads(line))
      except json.JSONDecodeError as error:
        raise ValueError(f'{path}, line {number}, is not a JSON row ({error}): '
                         'fix or delete that line.') from error
  return rows


def logged_eval_steps(workdir: str) -> set[int]:
  """The steps with a held-out result in workdir/metrics.jsonl."""
  if not os.path.exists(os.path.join(workdir, METRICS_FILE)):
    return set()
  return {row['step'] for row in read_metrics(workdir) if 'eval_loss' in row}


def _duration(seconds: float) -> str:
  minutes, secs = divmod(int(seconds), 60)
  hours, minutes = divmod(minutes, 60)
  return f'{hours}h{minutes:02d}m' if hours else f'{minutes}m{secs:02d}s'


def _summary_writer_class():
  """tensorboardX's SummaryWriter, imported without torch: tensorboardX imports torch where it is
  installed (seconds at every run's start) only to accept torch tensors, which are never passed
  here."""
  hide_torch = 'torch' not in sys.modules
  if hide_torch:
    sys.modules['torch'] = None  # `import torch` raises ImportError, which tensorboardX expects
  try:
    from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
  finally:
    if hide_torch:
      del sys.modules['torch']
  return SummaryWriter


class MetricWriter:
  """Writes on process 0 only: workdir/metrics.jsonl, workdir/tensorboard/ and the console."""

  def __init__(self, workdir: str, total_steps: int):
    self.enabled = jax.process_index() == 0
    self.total_steps = total_steps
    self.start = time.time()
    if self.enabled:
      os.makedirs(workdir, exist_ok=True)
      self.jsonl = open(os.path.join(workdir, METRICS_FILE), 'a')
      self.tensorboard = _summary_writer_class()(os.path.join(workdir, 'tensorboard'))

  def write(self, step: int, metrics: dict) -> None:
    if not self.enabled:
      return
    self.jsonl.write(json.dumps({'step': step, **metrics}) + '\n')
    self.jsonl.flush()
    for name, value in metrics.items():
      if isinstance(value, (int, float)):
        self.tensorboard.add_scalar(name, value, step)

  def progress(self, step: int, first_step: int, metrics: dict) -> None:
    if not self.enabled:
      return
    elapsed = time.time() - self.start
    remaining = elapsed / max(step - first_step, 1) * (self.total_steps - step)
    shown = ' | '.join(f'{k} {_format(v)}' for k, v in metrics.items())
    log.info('step %d/%d | %s | ETA %s', step, self.total_steps, shown, _duration(remaining))

  def close(self) -> None:
    if self.enabled:
      self.jsonl.close()
      self.tensorboard.close()


def _format(value) -> str:
  if isinstance(value, float):
    return f'{value:.4g}' if abs(value) < 1e4 else f'{value:,.0f}'
  return str(value)
