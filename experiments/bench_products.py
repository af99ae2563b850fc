"""The reference LM's train step as matmuls alone: each product of its forward and backward pass
(dense layers, attention scores and values, the head) timed alone at its own shape, and their
sum, against the whole step and this machine's square-matmul peak.

  python experiments/bench_products.py                # the reference LM (width 128)
  python experiments/bench_products.py --width 512

A benchmark, not a test: it prints figures. The sum is what the step's matmuls cost one after
another at XLA's speed for their shapes; a step cannot run faster than that unless the products
overlap (two cores) or run faster inside the step than alone.
"""
import math
import os
import statistics
import time

from absl import app, flags
import jax
import jax.numpy as jnp

import bench_train
from transformer_jax import train
from transformer_jax.train import cpu_runtime, metrics

_WIDTH = flags.DEFINE_integer('width', 128, 'The reference LM at this width (heads of 32).')
_CALLS = flags.DEFINE_integer('calls', 200, 'Timed calls per product (the median is kept).')


def product_ms(spec: str, lhs_shape, rhs_shape) -> float:
  """Median milliseconds of one jitted einsum at these shapes."""
  lhs = jax.random.normal(jax.random.key(0), lhs_shape)
  rhs = jax.random.normal(jax.random.key(1), rhs_shape)
  product = jax.jit(lambda a, b: jnp.einsum(spec, a, b)).lower(lhs, rhs).compile()
  product(lhs, rhs).block_until_ready()
  times = []
  for _ in range(_CALLS.value):
    start = time.perf_counter()
    product(lhs, rhs).block_until_ready()
    times.append(time.perf_counter() - start)
  return statistics.median(times) * 1e3


def products(cfg, batch: int, seq_len: int):
  """(name, einsum, lhs shape, rhs shape, count per step, FLOPs of one) of every product."""
  n, d, f, layers = batch * seq_len, cfg.width, cfg.hidden_dim, cfg.num_layers
  kv = cfg.kv_heads * cfg.head_dim
  rows = []
  dense = [('query, out', d, d, 2 * layers), ('key, value', d, kv, 2 * layers),
           ('gate, up', d, f, 2 * layers), ('down', f, d, layers), ('head', d, cfg.vocab_size, 1)]
  for name, fan_in, fan_out, count in dense:  # y = x W; dx = dy W^T; dW = x^T dy
    flops = 2 * n * fan_in * fan_out
    rows += [(f'{name} forward', 'ni,io->no', (n, fan_in), (fan_in, fan_out), count, flops),
             (f'{name} dx', 'no,io->ni', (n, fan_out), (fan_in, fan_out), count, flops),
             (f'{name} dW', 'ni,no->io', (n, fan_in), (n, fan_out), count, flops)]
  heads = (batch, cfg.num_heads, seq_len, cfg.head_dim)
  scores = (batch, cfg.num_heads, seq_len, seq_len)
  flops = 2 * math.prod(scores) * cfg.head_dim
  rows += [('scores QK^T, dP', 'bhqd,bhkd->bhqk', heads, heads, 2 * layers, flops),
           ('PV, dQ', 'bhqk,bhkd->bhqd', scores, heads, 2 * layers, flops),
           ('dV, dK', 'bhqk,bhqd->bhkd', scores, heads, 2 * layers, flops)]
  return rows


def main(argv):
  del argv
  cpu_runtime.configure()
  config = bench_train.reference_lm_config(_WIDTH.value)
  cfg = train.resolve(config).model
  print(f'jax {jax.__version__}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}')
  peak = metrics.measured_matmul_flops()
  print(f'float32 matmul peak (best jitted square matmul): {peak / 1e9:.1f} GFLOP/s')
  total_ms = total_flops = 0.0
  for name, spec, lhs, rhs, count, flops in products(cfg, config.data.batch_size,
                                                     config.data.seq_len):
    ms = product_ms(spec, lhs, rhs) * count
    total_ms, total_flops = total_ms + ms, total_flops + flops * count
    print(f'  {name:<18} x{count:<3} {ms:7.2f} ms  {flops * count / ms / 1e6:6.1f} GFLOP/s')
  print(f'all products one after another: {total_ms:.1f} ms for {total_flops / 1e9:.2f} GFLOP '
        f'({total_flops / total_ms / 1e6:.1f} GFLOP/s); at the peak: '
        f'{total_flops / peak * 1e3:.1f} ms')
  step_ms = statistics.median(bench_train.jax_step_times(config, 30)) * 1e3
  print(f'the whole train step: {step_ms:.1f} ms (load average {os.getloadavg()[0]:.2f})')


if __name__ == '__main__':
  app.run(main)
