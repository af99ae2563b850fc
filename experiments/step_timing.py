"""The benchmarks' timing of the library's own jitted train step (bench_train, bench_input,
bench_parallel, bench_products, bench_systems): a state of a config's run, its train step
compiled once, then each step timed to its metrics' completion."""
import functools
import os
import time

import jax

from transformer_jax.train import profiling, setup, sharding

# Batches made ahead of the timed steps, fed in turn (none is read while a step is timed).
READY_BATCHES = 4


def step_seconds(config, steps: int, warmup: int, from_pipeline: bool = False) -> list[float]:
  """Seconds of each of `steps` train steps of `config`'s run after `warmup` untimed ones (the
  batches as timed_step feeds them)."""
  step = timed_step(config, from_pipeline)
  return [step(i) for i in range(warmup + steps)][warmup:]


class TimedStep:
  """step(i) -> the seconds of the i-th train step of `config`'s run, its step compiled once,
  from `params` with a fresh optimizer (default: the parameters the config starts from, its
  init_from_hf, else a fresh initialization): fed `batches` (host batches; default
  READY_BATCHES of the run's own, made ahead) in turn or, from_pipeline, the run's input
  pipeline one batch per step, as the training loop feeds it. Steps of several runs may be
  timed in turn, so that a shared machine's changing load falls on each. `metrics` holds the
  latest step's, on the host; `run` and `batches` what it was built from."""

  def __init__(self, config, from_pipeline: bool = False, batches: list | None = None,
               params=None):
    self.run = run = setup.build_run(config)
    params = setup.starting_params(run) if params is None else params
    ema = run.training.ema_decay > 0
    if params is None:
      init = functools.partial(setup.initial_state, run.model, run.tx,
                               run.family.example_inputs(run.model_config), ema=ema)
      self._state = jax.jit(init, out_shardings=run.state_sharding)(jax.random.key(0))
    else:
      start = functools.partial(setup.state_of, run.tx, ema=ema)
      self._state = jax.jit(start, out_shardings=run.state_sharding)(params)
    self.batches = batches or [run.data.train_batch(i) for i in range(READY_BATCHES)]
    self._ready = [sharding.global_batch(batch, run.mesh) for batch in self.batches]
    self._compiled = run.train_step.lower(self._state, self._ready[0]).compile()
    self._iterator = run.data.train_iterator(0) if from_pipeline else None  # no threads else
    self.metrics = None

  def __call__(self, i: int) -> float:
    start = time.perf_counter()
    batch = (sharding.global_batch(next(self._iterator), self.run.mesh) if self._iterator
             else self._ready[i % len(self._ready)])
    self._state, metrics = self._compiled(self._state, batch)
    jax.block_until_ready(metrics)
    seconds = time.perf_counter() - start
    self.metrics = jax.device_get(metrics)
    return seconds

  def profile(self, directory: str, first: int, steps: int) -> profiling.Summary:
    """Where the time of steps first, ..., first + steps - 1 goes: a jax.profiler trace of them
    in `directory` (for TensorBoard's profile plugin or Perfetto) beside the step's optimized
    HLO (hlo.txt, which names the trace's ops), and its profiling.Summary."""
    hlo_text = self._compiled.as_text()
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, 'hlo.txt'), 'w') as file:
      file.write(hlo_text)
    with jax.profiler.trace(directory):
      for i in range(first, first + steps):
        self(i)
    return profiling.summarize(directory, hlo_text, steps)


def timed_step(config, from_pipeline: bool = False, batches: list | None = None,
               params=None) -> TimedStep:
  """The TimedStep of `config`'s run (see TimedStep)."""
  return TimedStep(config, from_pipeline, batches, params)
