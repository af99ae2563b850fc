"""Decoding speed: the cached loop against naive recomputation and the memory-bandwidth bound.

  python experiments/bench_decode.py --quick     # seconds: reference LM, 32 new tokens
  python experiments/bench_decode.py --torch_python PYTHON_WITH_TORCH --torch_reference_dir DIR
                                                   # the full table (about 40 minutes on 2 cores)
  python experiments/bench_decode.py --models reference_lm --batches 1 --new_tokens 1024,4096 \
      --no_naive                                   # some rows only: the flags select them

Cached: `transformer_jax.decode.generate` (greedy), one compiled program: the prefill, then a
`lax.while_loop` of one token per step, over the whole context or (`--windows`) a sliding window
whose ring of W slots makes every step cost the same however many tokens came before.
Naive: what a JAX user without a cache writes: per new token, one jitted forward pass over a
fixed buffer of prompt + N tokens (the causal mask keeps its unwritten tail out of the logits
read). One compile, but every step pays for the whole buffer: about twice the work of a loop over
the growing sequence when the prompt is short, a loop that would instead recompile at every
length. Its steps all cost the same, so it is timed over a few steps and scaled to N.
Bounds per step, from figures measured here: the bytes one step must read (every parameter,
plus the keys and values cached so far, averaged over the run) over the copy bandwidth; and the
step's model FLOPs (2 per weight per token, plus the attention over the cached keys) over the
float32 matmul rate. At batch 1 the bytes bind; at batch 32 the FLOPs do.
Models: the reference character LM (configs/llama_shakespeare.py) and GPT-2 small
(configs/gpt2_small.py), random weights, float32 compute (--dtype), max_len raised to prompt + N
where that is larger.
Timings exclude compilation. Other processes share the cores: the load average is printed.
The PyTorch reference, torch_reference.py in --torch_reference_dir, is a PyTorch implementation of
the reference LM (not part of this repository) whose `--gen` mode prints a line
`RESULT {"generation": ...}` with its naive generation's tokens/s; without it that row is skipped.
Measured figures: experiments/results/bench_decode/README.md.
"""
import json
import os
import pathlib
import subprocess
import time

from absl import app, flags
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax import accounting, config_lib, decode, models
from transformer_jax.train import metrics

ROOT = pathlib.Path(__file__).resolve().parent.parent
CONFIGS = {'reference_lm': 'llama_shakespeare.py', 'gpt2_small': 'gpt2_small.py'}

_MODELS = flags.DEFINE_list('models', ['reference_lm', 'gpt2_small'],
                            f'Models to time, of {sorted(CONFIGS)}; empty: only the PyTorch row.')
_NEW_TOKENS = flags.DEFINE_list('new_tokens', ['256', '1024'], 'New tokens per row.')
_BATCHES = flags.DEFINE_list('batches', ['1', '32'], 'Batch sizes.')
_WINDOWS = flags.DEFINE_list('windows', ['0', '64'], 'Cache windows to time, 0: the whole context.')
_NO_NAIVE = flags.DEFINE_bool('no_naive', False, 'Skip naive recomputation (its buffer of prompt + '
                              'N tokens does not fit in memory at batch 32 and 4,096 tokens).')
_PROMPT_LEN = flags.DEFINE_integer('prompt_len', 6, "6: 'ROMEO:', as the reference.")
_NAIVE_BUDGET_S = flags.DEFINE_float('naive_budget_s', 20.0, 'Time the naive loop for about this '
                                     'long per row, then scale.')
_REPEATS = flags.DEFINE_integer('repeats', 2, 'Cached runs per row, the best kept (no repeat after '
                                '20 s).')
_DTYPE = flags.DEFINE_string('dtype', 'float32', "Compute dtype; '' keeps the config's (GPT-2 "
                             'small says bfloat16, which a CPU runs through conversions).')
_TORCH = flags.DEFINE_string('torch_python', None, 'A Python with torch, to time the PyTorch '
                             'reference of the reference LM.')
_TORCH_DIR = flags.DEFINE_string('torch_reference_dir', None, 'The folder holding the PyTorch '
                                 'reference torch_reference.py.')
_TORCH_THREADS = flags.DEFINE_integer('torch_threads', 1, 'Its threads: 2 threads collapse (to '
                                      'about 2% of the speed) while other processes hold a core; '
                                      '1 does not.')
_JSON_OUT = flags.DEFINE_string('json_out', None, 'Also write the rows here as JSON.')
_QUICK = flags.DEFINE_bool('quick', False, 'Reference LM, 32 new tokens, batches 1 and 4: a check '
                           'that it runs.')


def model_config(name: str, max_len: int, dtype: str | None):
  model = config_lib.from_file(ROOT / 'configs' / CONFIGS[name]).model
  model.max_len = max(model.max_len, max_len)
  model.dtype = dtype or model.dtype
  return models.model_config(model)


def load_average() -> str:
  return ' '.join(pathlib.Path('/proc/loadavg').read_text().split()[:3])


def best_seconds(fn, repeats: int, budget_s: float = float('inf')) -> float:
  """The fastest of `repeats` runs, stopping early once `budget_s` is spent."""
  times = []
  while len(times) < repeats and sum(times) < budget_s:
    start = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  return min(times)


def copy_bandwidth(num_bytes: int = 1 << 29) -> dict[str, float]:
  """Bytes per second of a large array copy (read + write, as STREAM counts), numpy and XLA."""
  src = np.ones(num_bytes // 4, np.float32)
  dst = np.empty_like(src)
  numpy_s = best_seconds(lambda: np.copyto(dst, src), 5)
  # In place (donated), so that neither copy pays for faulting in fresh pages.
  add_one = jax.jit(lambda x: x + 1, donate_argnums=0)
  state = {'x': add_one(jnp.asarray(src))}

  def xla_copy():
    state['x'] = add_one(state['x'])  # one read and one write per element
    return state['x']

  xla_s = best_seconds(xla_copy, 5)
  return {'numpy': 2 * num_bytes / numpy_s, 'xla': 2 * num_bytes / xla_s}


def cached_seconds(model, params, prompt, new_tokens: int, repeats: int,
                   window: int | None) -> float:
  run = jax.jit(lambda params, prompt: decode.generate(
      model, params, prompt, max_new_tokens=new_tokens, window=window).tokens).lower(
          params, prompt).compile()
  return best_seconds(lambda: run(params, prompt), repeats, budget_s=20.0)


def naive_seconds(model, params, prompt, new_tokens: int, budget_s: float) -> tuple[float, int]:
  """Seconds for `new_tokens` tokens by full recomputation, from the mean of the steps that fit
  in `budget_s` (at least one), and the number of steps timed."""
  batch, prompt_len = prompt.shape

  def step(buffer, slot):
    logits = model.apply({'params': params}, buffer)
    token = jnp.argmax(jax.lax.dynamic_index_in_dim(logits, slot - 1, 1, keepdims=False), -1)
    return jax.lax.dynamic_update_slice(buffer, token[:, None].astype(buffer.dtype), (0, slot))

  buffer = jnp.zeros((batch, prompt_len + new_tokens), jnp.int32).at[:, :prompt_len].set(prompt)
  step = jax.jit(step, donate_argnums=0).lower(buffer, prompt_len).compile()
  start, steps = time.perf_counter(), 0
  while steps < new_tokens and (steps == 0 or time.perf_counter() - start < budget_s):
    buffer = jax.block_until_ready(step(buffer, prompt_len + steps))
    steps += 1
  return (time.perf_counter() - start) / steps * new_tokens, steps


def bounds_per_step(cfg, params, batch: int, prompt_len: int, new_tokens: int,
                    bandwidth: float, flops: float, window: int | None) -> tuple[float, float]:
  """Seconds per step to read what a step needs, and to compute it, over the average context
  (at most the window)."""
  context = prompt_len + new_tokens // 2
  weights = sum(leaf.nbytes for leaf in jax.tree.leaves(params))
  cache = accounting.kv_cache_bytes(cfg, context, batch, window=window)
  step_flops = batch * accounting.flops_per_token(cfg, min(context, window or context))['forward']
  return (weights + cache) / bandwidth, step_flops / flops


def torch_reference(python: str, script: str, new_tokens: int, threads: int) -> dict:
  """The PyTorch reference's naive generation (batch 1, after 11 training steps), tokens/s:
  the whole growing context per token, and the context cropped to its 64 training tokens."""
  out = subprocess.run([python, script, '--steps', '11', '--eval_at', '',
                        '--gen', '--gen_tokens', str(new_tokens), '--threads', str(threads)],
                       capture_output=True, text=True, check=True)
  result = json.loads(next(line for line in out.stdout.splitlines()
                           if line.startswith('RESULT '))[len('RESULT '):])
  return {key: value['tokens_per_s'] for key, value in result['generation'].items()}


def time_row(name: str, model, params, prompt, new_tokens: int, window: int | None,
             naive_budget_s: float | None, bandwidth: float, flops: float) -> dict:
  """One row of the table: the cached loop (whole context or a window), naive recomputation of
  the whole context for about `naive_budget_s` (None: skipped), and the bounds."""
  batch, prompt_len = prompt.shape
  cached = cached_seconds(model, params, prompt, new_tokens, _REPEATS.value, window)
  read, compute = bounds_per_step(model.cfg, params, batch, prompt_len, new_tokens, bandwidth,
                                  flops, window)
  row = dict(model=name, dtype=model.cfg.dtype, batch=batch, new_tokens=new_tokens,
             window=window, cached_tokens_per_s=batch * new_tokens / cached,
             cached_ms_per_step=1e3 * cached / new_tokens, bytes_bound_ms_per_step=1e3 * read,
             flops_bound_ms_per_step=1e3 * compute,
             times_bound=cached / new_tokens / max(read, compute))
  if window is None and naive_budget_s is not None:
    naive, steps = naive_seconds(model, params, prompt, new_tokens, naive_budget_s)
    row.update(naive_tokens_per_s=batch * new_tokens / naive, speedup=naive / cached,
               naive_steps_timed=steps)
  return row


def format_row(row: dict) -> str:
  cache = 'whole' if row['window'] is None else f'window {row["window"]}'
  naive = f'{"-":>11} {"-":>8}'
  if 'speedup' in row:
    naive = f'{row["naive_tokens_per_s"]:>11,.1f} {row["speedup"]:>7,.0f}x'
  return (f'{row["model"]:<12} {row["batch"]:>5} {row["new_tokens"]:>5} {cache:>9} '
          f'{row["cached_tokens_per_s"]:>12,.0f} {naive} {row["cached_ms_per_step"]:>8.2f} '
          f'{row["bytes_bound_ms_per_step"]:>8.2f} {row["flops_bound_ms_per_step"]:>8.2f} '
          f'{row["times_bound"]:>6.1f}x  {row.get("naive_steps_timed", "-")}')


def main(argv):
  del argv
  names, token_counts, batches = _MODELS.value, _NEW_TOKENS.value, _BATCHES.value
  naive_budget_s = None if _NO_NAIVE.value else _NAIVE_BUDGET_S.value
  if _QUICK.value:
    names, token_counts, batches, naive_budget_s = ['reference_lm'], ['32'], ['1', '4'], 2.0
  token_counts, batches = [int(n) for n in token_counts], [int(b) for b in batches]
  windows = [int(w) or None for w in _WINDOWS.value]
  with_torch = bool(_TORCH.value and _TORCH_DIR.value)
  if not with_torch:
    print('No PyTorch row: it needs --torch_python and --torch_reference_dir (see the docstring).')
  print(f'load average before: {load_average()} ({os.cpu_count()} cores), jax {jax.__version__} '
        f'on {jax.devices()[0].platform}')
  bandwidth = copy_bandwidth()
  print('copy bandwidth: ' + ', '.join(f'{k} {v / 1e9:.1f} GB/s' for k, v in bandwidth.items()))
  bandwidth, flops = max(bandwidth.values()), metrics.measured_matmul_flops()
  print(f'float32 matmul: {flops / 1e9:.0f} GFLOP/s')
  rows = []
  print(f'{"model":<12} {"batch":>5} {"new":>5} {"cache":>9} {"cached tok/s":>12} '
        f'{"naive tok/s":>11} {"speed-up":>8} {"ms/step":>8} {"bytes ms":>8} {"FLOPs ms":>8} '
        f'{"x bound":>7}  naive steps timed')
  for name in names:
    cfg = model_config(name, _PROMPT_LEN.value + max(token_counts), _DTYPE.value)
    model = models.build(cfg)
    example = models.example_inputs(cfg)
    params = nn.meta.unbox(jax.jit(model.init)(jax.random.key(0), *example)['params'])
    for batch in batches:
      for new_tokens in token_counts:
        prompt = jnp.asarray(np.random.default_rng(batch).integers(
            0, cfg.vocab_size, (batch, _PROMPT_LEN.value)), jnp.int32)
        for window in windows:
          rows.append(time_row(name, model, params, prompt, new_tokens, window,
                               naive_budget_s, bandwidth, flops))
          print(format_row(rows[-1]), flush=True)
  if with_torch:
    script = os.path.join(_TORCH_DIR.value, 'torch_reference.py')
    for new_tokens in token_counts:
      rates = torch_reference(_TORCH.value, script, new_tokens, _TORCH_THREADS.value)
      rows.append(dict(model='reference_lm', reference='pytorch', threads=_TORCH_THREADS.value,
                       batch=1, new_tokens=new_tokens, **rates))
      print(f'PyTorch reference ({_TORCH_THREADS.value} threads), reference LM, batch 1, '
            f'{new_tokens} new tokens: naive {rates["full_context_no_crop"]:.1f} tok/s over the '
            f'whole context, {rates["crop_ctx_to_block_size"]:.1f} tok/s cropped to 64 tokens',
            flush=True)
  print(f'load average after: {load_average()}')
  if _JSON_OUT.value:
    pathlib.Path(_JSON_OUT.value).write_text(json.dumps(rows, indent=2))


if __name__ == '__main__':
  app.run(main)
