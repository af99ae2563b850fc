"""The benchmarks' timing of the library's own jitted train step (bench_train, bench_input,
bench_parallel, bench_products): a fresh state of a config's run, its train step compiled once,
then each step timed to its metrics' completion."""
import functools
import time

import jax

from transformer_jax.train import setup, sharding

# Batches made ahead of the timed steps, fed in turn (none is read while a step is timed).
READY_BATCHES = 4


def step_seconds(config, steps: int, warmup: int, from_pipeline: bool = False) -> list[float]:
  """Seconds of each of `steps` train steps of `config`'s run after `warmup` untimed ones (the
  batches as timed_step feeds them)."""
  step = timed_step(config, from_pipeline)
  return [step(i) for i in range(warmup + steps)][warmup:]


def timed_step(config, from_pipeline: bool = False):
  """step(i) -> the seconds of the i-th train step of `config`'s run, from a fresh state, its step
  compiled once: fed READY_BATCHES batches made ahead in turn or, from_pipeline, the run's input
  pipeline one batch per step, as the training loop feeds it. Steps of several runs may be timed
  in turn, so that a shared machine's changing load falls on each."""
  run = setup.build_run(config)
  init = functools.partial(setup.initial_state, run.model, run.tx,
                           run.family.example_inputs(run.model_config))
  state = [jax.jit(init, out_shardings=run.state_sharding)(jax.random.key(0))]
  ready = [sharding.global_batch(run.data.train_batch(i), run.mesh)
           for i in range(READY_BATCHES)]
  compiled = run.train_step.lower(state[0], ready[0]).compile()
  iterator = run.data.train_iterator(0) if from_pipeline else None  # no threads otherwise

  def step(i: int) -> float:
    start = time.perf_counter()
    batch = (sharding.global_batch(next(iterator), run.mesh) if from_pipeline
             else ready[i % READY_BATCHES])
    state[0], metrics = compiled(state[0], batch)
    jax.block_until_ready(metrics)
    return time.perf_counter() - start

  return step
