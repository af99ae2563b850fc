"""The CPU attention kernel's two paths, timed side by side at the systems' shapes: the batched
products over every (batch, head) at once, and the loop over each (batch, key-value head) that
recomputes its probabilities in the backward pass (`transformer_jax.kernels.cpu`).

  python experiments/bench_attention.py            # the shapes below, 2 + 4 interleaved rounds
  python experiments/bench_attention.py --quick    # tiny shapes, a check that it runs

A benchmark, not a test: it prints each path's forward and forward+backward milliseconds (the
median of the rounds), their ratio, the largest difference of their outputs and gradients, and
the path the kernel's threshold picks at that shape.
"""
import statistics
import time

from absl import app, flags
import jax
import jax.numpy as jnp

from transformer_jax.kernels import cpu
from transformer_jax.train import cpu_runtime, metrics

_QUICK = flags.DEFINE_bool('quick', False, 'Tiny shapes, one round: checks that it runs.')
_ROUNDS = flags.DEFINE_integer('rounds', 4, 'Timed rounds, each path in turn (after 2 warm-up).')
_KEEP_FREED_MEMORY = flags.DEFINE_bool(
    'keep_freed_memory', True, 'Keep the memory a computation frees mapped for the next, as '
    'launch.py runs (train.cpu_runtime); --nokeep_freed_memory as the PyTorch comparisons run.')

# name: (batch, queries, keys, query heads, key-value heads, head width, causal)
SHAPES = {
    'reference LM, T 64, batch 32': (32, 64, 64, 4, 4, 32, True),
    'DiT-S/2 on 32x32 latents, batch 32': (32, 256, 256, 6, 6, 64, False),
    'grouped queries, 4 heads a key, T 256, batch 8': (8, 256, 256, 8, 2, 64, True),
    'T 320, batch 16': (16, 320, 320, 6, 6, 64, False),
    'whisper-tiny decoder, 448 tokens, batch 8': (8, 448, 448, 6, 6, 64, True),
    'whisper-tiny cross-attention, 448 by 1500, batch 8': (8, 448, 1500, 6, 6, 64, False),
    'causal LM, T 1024, batch 4': (4, 1024, 1024, 8, 8, 64, True),
    'whisper-tiny encoder, 1500 frames, batch 8': (8, 1500, 1500, 6, 6, 64, False),
}
QUICK_SHAPES = {'tiny': (2, 24, 24, 4, 2, 8, True)}


def compiled(threshold: float, args, mask, width: int, d_out):
  """(forward, forward+backward) compiled with the kernel's threshold at `threshold`, which is
  read when the attention is traced (each call here traces a function of its own: jax caches
  a function's trace)."""
  attend = lambda q, k, v: cpu.attention(q, k, v, mask, scale=width ** -0.5)
  both = lambda q, k, v: jax.vjp(attend, q, k, v)[1](d_out)
  original, cpu._PER_HEAD_FROM = cpu._PER_HEAD_FROM, threshold
  try:
    return tuple(jax.jit(fn).lower(*args).compile() for fn in (attend, both))
  finally:
    cpu._PER_HEAD_FROM = original


def paths(shape):
  """Each path's (forward, forward+backward), and the inputs."""
  batch, queries, key_count, heads, kv_heads, width, causal = shape
  keys = jax.random.split(jax.random.key(0), 4)
  q, d_out = (jax.random.normal(key, (batch, queries, heads, width)) for key in keys[:2])
  k, v = (jax.random.normal(key, (batch, key_count, kv_heads, width)) for key in keys[2:])
  mask = jnp.tril(jnp.ones((queries, key_count), bool))[None, None] if causal else None
  args = (q, k, v)
  return {'batched': compiled(float('inf'), args, mask, width, d_out),
          'per head': compiled(0, args, mask, width, d_out)}, args


def seconds(fn, args) -> float:
  start = time.perf_counter()
  jax.block_until_ready(fn(*args))
  return time.perf_counter() - start


def row(name: str, shape) -> None:
  functions, args = paths(shape)
  results = {path: [fn(*args) for fn in fns] for path, fns in functions.items()}
  difference = max(float(jnp.max(jnp.abs(a - b))) for a, b in
                   zip(jax.tree.leaves(results['batched']), jax.tree.leaves(results['per head'])))
  times = {(path, part): [] for path in functions for part in (0, 1)}
  for round_ in range(2 + (1 if _QUICK.value else _ROUNDS.value)):
    for path, fns in functions.items():
      for part, fn in enumerate(fns):
        spent = seconds(fn, args)
        if round_ >= 2:
          times[path, part].append(spent)
  ms = {key: 1e3 * statistics.median(value) for key, value in times.items()}
  _, queries, keys, heads, kv_heads = shape[:5]
  rows = heads // kv_heads * queries
  picked = 'per head' if cpu._loops_over_heads(rows, keys) else 'batched'
  print(f'{name}: scores of {rows:,} x {keys:,} per (batch, key-value head), the kernel '
        f'picks {picked}', flush=True)
  for part, label in enumerate(('forward', 'forward+backward')):
    batched, per_head = ms['batched', part], ms['per head', part]
    print(f'  {label:<17} batched {batched:9.1f} ms   per head {per_head:9.1f} ms   per head '
          f'{batched / per_head:.2f}x as fast', flush=True)
  print(f'  largest difference of the outputs and gradients: {difference:.1e}', flush=True)


def main(argv):
  del argv
  cpu_runtime.configure(keep_freed_memory=_KEEP_FREED_MEMORY.value)
  print(f'jax {jax.__version__}, {jax.devices()[0].platform}, {jax.local_device_count()} '
        f'device(s), {metrics.cpu_model()}, freed memory kept mapped: '
        f'{_KEEP_FREED_MEMORY.value}', flush=True)
  for name, shape in (QUICK_SHAPES if _QUICK.value else SHAPES).items():
    row(name, shape)


if __name__ == '__main__':
  app.run(main)
