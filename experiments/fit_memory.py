"""Fits memory.ACTIVATION_COPIES of each compiler to the fit set of experiments/memory_sets.py,
then reports the test set with the fitted counts (docs/memory_plan.md): compiles the real train
step of each model for compile-only TPU or GPU devices (transformer_jax.targets) or this
machine's XLA:CPU, and solves for the copies of each activation term that best match
memory_analysis() (least squares of the relative error, the counts non-negative).

  python experiments/fit_memory.py --platform tpu --platform gpu --platform cpu --write

Prints each fit model's plan / XLA in the fit and left out of it, each test model's, and the
range of the test's plan / XLA over each kind of model (memory.kind); --write records the
counts and those ranges in transformer_jax/memory_fit.json, which the plan and describe's
cautions read. The compiles are recorded in experiments/results/compile_targets/ (a missing one
is compiled and added). TPU and GPU targets need pip install -e '.[compile]'.
"""
import argparse
import json
import os
import sys

os.environ.setdefault('JAX_PLATFORMS', 'cpu')  # jax runs on the CPU; the targets only compile
os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '')
                           + ' --xla_force_host_platform_device_count=8').strip()

import jax  # noqa: E402
import numpy as np  # noqa: E402
import scipy.optimize  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))  # memory_sets, where this is loaded by path
import memory_sets  # noqa: E402
from transformer_jax import aot, memory, models, targets  # noqa: E402
from transformer_jax.errors import ConfigError  # noqa: E402
from transformer_jax.settings import MeshSettings  # noqa: E402
from transformer_jax.train import metrics, setup, sharding  # noqa: E402

RESULTS = os.path.join(os.path.dirname(__file__), 'results', 'compile_targets')
CACHES = {'fit': os.path.join(RESULTS, 'fit_compiles.json'),
          'test': os.path.join(RESULTS, 'test_compiles.json')}
COMMAND = 'python experiments/fit_memory.py --platform tpu --platform gpu --platform cpu --write'


def platform_of(target: str) -> str:
  return 'cpu' if target.startswith('cpu:') else targets.target(target).platform


def num_devices(target: str) -> int:
  return int(target[4:]) if target.startswith('cpu:') else targets.target(target).num_devices


def devices_of(target: str) -> tuple:
  if target.startswith('cpu:'):
    return tuple(jax.devices('cpu')[:num_devices(target)])
  return targets.target(target).devices


def compile_train_step(config, devices):
  """(XLA's buffers per device, seconds) of the run's train step compiled for `devices`, its
  batch abstract."""
  compiled, seconds = aot.compiled_train_step(setup.build_run(config, devices=devices))
  return metrics.compiled_memory(compiled)['buffers'], seconds


def plan_of(case, target: str) -> memory.Plan:
  """The plan of `case` (a memory_sets model) on `target`'s devices; needs no devices."""
  config = case.config()
  sizes = sharding.mesh_sizes(MeshSettings.of(config.mesh), num_devices(target))
  return memory.plan(config, sizes, platform=platform_of(target))


def kind_of(case, target: str, plan: memory.Plan) -> str:
  cfg = models.model_config(case.config().model)
  return memory.kind(cfg, platform_of(target), plan.train_total)


def compiled(case, target: str, cache: dict, path: str | None) -> dict | None:
  """{'xla': bytes per device, 'seconds'} of `case`'s train step on `target` from `cache` (a
  record of earlier compiles), or compiled and recorded in `cache` and the JSON file `path`;
  {'error'} where the step does not compile; None where `cache` lacks it and `path` is None."""
  key = f'{target} {case.label()}'
  if key not in cache:
    if path is None:
      return None
    try:
      buffers, seconds = compile_train_step(case.config(), devices_of(target))
      cache[key] = {'xla': buffers, 'seconds': round(seconds, 1)}
    except ConfigError as error:  # the first dimension that does not divide
      cache[key] = {'error': 'does not divide: ' + str(error).splitlines()[1].strip()}
    except jax.errors.JaxRuntimeError as error:
      cache[key] = {'error': 'XLA fails to compile it: ' + str(error).splitlines()[0][:160]}
    print(f'  {key}: {cache[key]}', file=sys.stderr, flush=True)
    write_json(path, cache)  # after each compile, so that a stopped run keeps its compiles
  return cache[key]


BAND = 0.05  # how far a recorded miss's plan / XLA may move before it is recorded again


def holds_its_record(case, target: str) -> tuple[bool, float, float]:
  """(whether, plan / XLA compiled now, plan / XLA of the record) for a test model compiled
  again: within memory.WITHIN of 1, or, where the record missed, within BAND of the record."""
  plan = plan_of(case, target).train_total
  measured = plan / compile_train_step(case.config(), devices_of(target))[0]
  recorded = plan / read_json(CACHES['test'])[f'{target} {case.label()}']['xla']
  if abs(recorded - 1) > memory.WITHIN:
    return abs(measured - recorded) <= BAND, measured, recorded
  return abs(measured - 1) <= memory.WITHIN, measured, recorded


def read_json(path: str) -> dict:
  if not os.path.exists(path):
    return {}
  with open(path) as f:
    return json.load(f)


def write_json(path: str, value: dict) -> None:
  with open(path, 'w') as f:
    json.dump(value, f, indent=1)
    f.write('\n')


def measured_rows(platform: str, which: str, cache: dict, compile_missing: bool) -> list[dict]:
  """A row per model and target of the `which` ('fit', 'test') set of `platform` that compiles:
  its label, target, XLA's bytes, the plan's state (params + optimizer + batch) and terms."""
  sets = {'fit': (memory_sets.FIT, memory_sets.FIT_TARGETS),
          'test': (memory_sets.TEST, memory_sets.TEST_TARGETS)}[which]
  rows = []
  for case in memory_sets.set_of(sets[0], platform):
    for target in memory_sets.targets_of(case, platform, sets[1]):
      record = compiled(case, target, cache, CACHES[which] if compile_missing else None)
      if record is None or 'error' in record:
        print(f'{target} {case.label()}: {record and record["error"] or "not compiled"}')
        continue
      plan = plan_of(case, target)
      rows.append({'case': case, 'target': target, 'xla': record['xla'],
                   'seconds': record['seconds'], 'terms': plan.terms,
                   'state': plan.params + plan.optimizer + plan.batch})
  return rows


# XLA:CPU keeps the gradient tree whole beside the parameters (tests/test_memory.py checks the
# plan's gradients against the shards); the small models of its fit cannot tell it apart from
# the activations, which scale with it.
FIXED = {'cpu': {'gradients': 1.0}, 'tpu': {}, 'gpu': {}}


def fit(rows: list[dict], platform: str) -> dict[str, float]:
  """The counts minimizing the squared relative error of state + terms . counts (of the terms
  `rows` have, less those FIXED; the others keep memory's): non-negative, and at most one copy
  of the gradients and of the gathered weights."""
  fixed = FIXED[platform]
  used = [t for t in memory.TERMS if any(r['terms'][t] for r in rows) and t not in fixed]
  a = np.array([[r['terms'][t] / r['xla'] for t in used] for r in rows])
  b = np.array([1 - (r['state'] + sum(c * r['terms'][t] for t, c in fixed.items())) / r['xla']
                for r in rows])
  upper = [1 if t in ('gradients', 'gathered') else np.inf for t in used]
  counts = scipy.optimize.lsq_linear(a, b, bounds=(0, upper)).x
  return {t: fixed[t] if t in fixed else round(float(counts[used.index(t)]), 2) if t in used
          else memory.ACTIVATION_COPIES[platform][t] for t in memory.TERMS}


def planned(row: dict, counts: dict[str, float]) -> float:
  return row['state'] + sum(counts[t] * row['terms'][t] for t in memory.TERMS)


def leave_one_out(rows: list[dict], platform: str) -> list[float]:
  """Each row's plan / XLA with the counts fitted to the other models (all their targets)."""
  return [planned(row, fit([r for r in rows if r['case'] != row['case']], platform))
          / row['xla'] for row in rows]


def test_ratios(rows: list[dict]) -> list[tuple[float, str]]:
  """(plan / XLA, memory.kind) of each test row, by memory.plan with memory's counts."""
  out = []
  for row in rows:
    plan = plan_of(row['case'], row['target'])
    out.append((plan.train_total / row['xla'], kind_of(row['case'], row['target'], plan)))
  return out


def kind_ranges(ratios: list[tuple[float, str]]) -> dict[str, list]:
  """{kind: [lowest, highest plan / XLA, cases]} over the test's rows of each kind."""
  by_kind = {}
  for ratio, kind in ratios:
    by_kind.setdefault(kind, []).append(ratio)
  return {kind: [round(min(r), 2), round(max(r), 2), len(r)] for kind, r in sorted(by_kind.items())}


def outside(ratios) -> int:
  return sum(abs(r - 1) > memory.WITHIN for r in ratios)


def report_fit(platform: str, rows: list[dict], counts: dict[str, float]) -> None:
  print(f'\n### {platform}: fit set\n\nACTIVATION_COPIES {counts}\n')
  print('| model | target | XLA MiB | plan / XLA | left out |\n|---|---|---:|---:|---:|')
  held_out = leave_one_out(rows, platform)
  fitted = [planned(row, counts) / row['xla'] for row in rows]
  for row, ratio, loo in zip(rows, fitted, held_out):
    print(f'| {row["case"].label()} | {row["target"]} | {row["xla"] / 2**20:,.1f} | '
          f'{ratio:.2f} | {loo:.2f} |')
  print(f'\nIn the fit {min(fitted):.2f}-{max(fitted):.2f}x, {outside(fitted)} of {len(rows)} '
        f'outside 15%; left out {min(held_out):.2f}-{max(held_out):.2f}x, '
        f'{outside(held_out)} of {len(rows)} outside 15%.')


def report_test(platform: str, rows: list[dict], ratios: list[tuple[float, str]]) -> None:
  print(f'\n### {platform}: test set\n')
  print('| model | target | kind | XLA MiB | plan MiB | plan / XLA |\n|---|---|---|---:|---:|---:|')
  for row, (ratio, kind) in zip(rows, ratios):
    print(f'| {row["case"].label()} | {row["target"]} | {kind} | {row["xla"] / 2**20:,.1f} | '
          f'{ratio * row["xla"] / 2**20:,.1f} | {ratio:.2f} |')
  only = [r for r, _ in ratios]
  print(f'\n{len(only) - outside(only)} of {len(only)} within 15%; by kind (lowest, highest, '
        f'cases): {kind_ranges(ratios)}')


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--platform', action='append', required=True, choices=('tpu', 'gpu', 'cpu'))
  parser.add_argument('--write', action='store_true',
                      help='record the counts and the test ranges in memory_fit.json')
  parser.add_argument('--no-compile', action='store_true',
                      help='report what the recorded compiles hold, compiling nothing')
  args = parser.parse_args()
  caches = {which: read_json(path) for which, path in CACHES.items()}
  data = memory.read_fit()
  for platform in args.platform:
    rows = measured_rows(platform, 'fit', caches['fit'], not args.no_compile)
    counts = fit(rows, platform)
    report_fit(platform, rows, counts)
    memory.ACTIVATION_COPIES[platform].update(counts)  # the test is planned with them
    rows = measured_rows(platform, 'test', caches['test'], not args.no_compile)
    ratios = test_ratios(rows)
    report_test(platform, rows, ratios)
    data['copies'][platform] = counts
    data['test'][platform] = kind_ranges(ratios)
  if args.write:
    write_json(memory.FIT_PATH, {**data, 'command': COMMAND})


if __name__ == '__main__':
  main()
