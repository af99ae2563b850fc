"""Fits memory.ACTIVATION_COPIES of a platform to the compiler it plans for: compiles the real
train step of a grid of models for compile-only TPU or GPU devices (transformer_jax.targets),
and solves for the copies of each activation term that best match memory_analysis() (least
squares of the relative error, the counts non-negative).

  python experiments/fit_memory.py --target v5e:2x2 --target h100x4
  python experiments/fit_memory.py --target v4-8 --counts current   # the plan's own ratios

Needs the optional packages of pip install -e '.[compile]'. Prints each config's XLA bytes per
device, the plan's with the fitted counts, their ratio, and the counts.
"""
import argparse
import dataclasses
import json
import os
import sys

os.environ.setdefault('JAX_PLATFORMS', 'cpu')  # jax runs on the CPU; the targets only compile
# Four CPU devices, for the target 'cpu' (XLA:CPU, which the plan was first fitted to).
os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '')
                           + ' --xla_force_host_platform_device_count=4').strip()

import jax  # noqa: E402
import numpy as np  # noqa: E402
import scipy.optimize  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..', 'tests'))
from train_helpers import small_config  # noqa: E402
from transformer_jax import aot, memory, targets  # noqa: E402
from transformer_jax.settings import MeshSettings  # noqa: E402
from transformer_jax.train import metrics, setup, sharding  # noqa: E402

RULE_MESHES = {'dp': ((-1,), ('data',)), 'fsdp': ((-1,), ('data',)),
               'tp': ((-1, 2), ('data', 'model'))}


@dataclasses.dataclass(frozen=True)
class Model:
  """One point of the grid: a family at a width, blocks, heads, sequence (or image and patch:
  image // patch squared tokens), vocabulary, compute dtype and rule set."""
  family: str
  width: int
  blocks: int
  heads: int
  seq: int
  vocab: int = 64
  dtype: str = 'float32'
  rule_set: str = 'dp'
  patch: int = 8
  batch: int = 32
  remat: str = 'none'
  scan: bool = False

  def label(self) -> str:
    tokens = f'img{self.seq}/{self.patch}' if self.family == 'vit' else f'T{self.seq} V{self.vocab}'
    remat = f' remat {self.remat}' if self.remat != 'none' else ''
    return (f'{self.family} w{self.width} L{self.blocks} h{self.heads} {tokens} b{self.batch} '
            f'{self.dtype} {self.rule_set}{remat}' + (' scanned' if self.scan else ''))

  def config(self):
    shape, mesh_axes = RULE_MESHES[self.rule_set]
    overrides = {'model.width': self.width, 'model.num_layers': self.blocks,
                 'model.num_heads': self.heads, 'model.dtype': self.dtype,
                 'model.remat_policy': self.remat, 'model.scan_layers': self.scan,
                 'data.batch_size': self.batch, 'data.eval_batch_size': self.batch,
                 'data.eval_examples': self.batch, 'data.eval_steps': 1,
                 'mesh.shape': shape, 'mesh.axes': mesh_axes}
    if self.family == 'vit':
      overrides.update({'data.image_size': self.seq, 'model.image_size': self.seq,
                        'model.patch_size': self.patch})
    else:
      overrides.update({'data.seq_len': self.seq, 'model.max_len': self.seq,
                        'model.vocab_size': self.vocab})
    if self.family == 'encoder_decoder':
      overrides['model.num_decoder_layers'] = self.blocks
    return small_config(self.family, rule_set=self.rule_set, **overrides)


# Widths 64-512, sequences 128-1024 (ViT: 256 patches), vocabularies 64-16384, float32 and
# bfloat16, under DP, FSDP and TP: every term varies apart from the others.
GRID = [
    Model('decoder', 128, 2, 4, 256, vocab=256),
    Model('decoder', 256, 2, 4, 512, dtype='bfloat16'),
    Model('decoder', 512, 2, 8, 128, vocab=1024, dtype='bfloat16', rule_set='fsdp'),
    Model('decoder', 64, 3, 2, 1024, rule_set='tp'),
    Model('decoder', 256, 2, 8, 1024, vocab=512, dtype='bfloat16', rule_set='tp'),
    Model('decoder', 384, 2, 6, 256, vocab=4096, rule_set='fsdp'),
    Model('decoder', 128, 2, 4, 256, vocab=16384, dtype='bfloat16'),
    Model('encoder', 128, 2, 4, 512),
    Model('encoder', 512, 2, 8, 128, vocab=128, dtype='bfloat16', rule_set='fsdp'),
    Model('encoder_decoder', 128, 2, 4, 256),
    Model('encoder_decoder', 64, 2, 2, 128, vocab=512, rule_set='tp'),
    Model('vit', 128, 2, 4, 64, patch=4),
    Model('vit', 256, 2, 4, 128, dtype='bfloat16', rule_set='tp'),
    # Sizes of real models (ViT-S's width at 224 / 16, GPT-2's width and context) and a small
    # one whose arrays are not whole multiples of XLA:TPU's tiles.
    Model('vit', 384, 2, 6, 224, patch=16),
    Model('decoder', 768, 2, 12, 1024, vocab=8192, dtype='bfloat16'),
    Model('encoder', 384, 2, 6, 512, vocab=1024, dtype='bfloat16', rule_set='tp'),
    Model('decoder', 128, 3, 4, 64, vocab=65),
]


# Where the plan may not hold: a block recomputed in the backward pass, the blocks scanned, and
# XLA:CPU in bfloat16 (CASES[-1]).
CASES = [Model('decoder', 192, 4, 4, 256, rule_set='fsdp', remat='full'),
         Model('decoder', 192, 4, 4, 256, rule_set='fsdp', remat='dots'),
         Model('decoder', 192, 4, 4, 256, rule_set='fsdp', scan=True),
         Model('decoder', 192, 4, 4, 256, rule_set='fsdp', dtype='bfloat16')]


@dataclasses.dataclass(frozen=True)
class Devices:
  """A target's name, platform and (compile-only) devices; 'cpu': four of this machine's."""
  name: str
  platform: str
  devices: tuple

  @classmethod
  def of(cls, name: str) -> 'Devices':
    if name == 'cpu':
      return cls(name, 'cpu', tuple(jax.devices('cpu')[:4]))
    target = targets.target(name)
    return cls(name, target.platform, target.devices)


def compile_train_step(config, devices):
  """(XLA's buffers per device, seconds) of the run's train step compiled for `devices`, its
  batch abstract."""
  compiled, seconds = aot.compiled_train_step(setup.build_run(config, devices=devices))
  return metrics.compiled_memory(compiled)['buffers'], seconds


def mesh_of(config, devices) -> dict[str, int]:
  return sharding.mesh_sizes(MeshSettings.of(config.mesh), len(devices))


def measure(model: Model, target: Devices, cache: dict) -> dict | None:
  """XLA's bytes per device of `model`'s train step on `target` (from `cache`, a record of
  earlier compiles, where it has them), and the plan's state and terms; None where XLA fails
  to compile it."""
  config = model.config()
  key = f'{target.name} {model.label()}'
  if key not in cache:
    try:
      buffers, seconds = compile_train_step(config, target.devices)
      cache[key] = {'xla': buffers, 'seconds': seconds}
    except jax.errors.JaxRuntimeError as error:  # XLA:GPU fails on some ViTs (see README)
      cache[key] = {'error': str(error).splitlines()[0][:200]}
    print(f'  {key}: {cache[key]}', file=sys.stderr, flush=True)
  if 'error' in cache[key]:
    return None
  plan = memory.plan(config, mesh_of(config, target.devices), platform=target.platform)
  return {**cache[key], 'state': plan.params + plan.optimizer + plan.batch, 'terms': plan.terms}


def read_cache(path: str | None) -> dict:
  """The compiles recorded in the JSON file `path` (none where it is unset or absent)."""
  if not path or not os.path.exists(path):
    return {}
  with open(path) as f:
    return json.load(f)


def write_cache(path: str | None, cache: dict) -> None:
  """Records `cache` in `path` (after each compile, so that a stopped run keeps its compiles)."""
  if path:
    with open(path, 'w') as f:
      json.dump(cache, f, indent=1)


def cache_error(cache: dict, name: str, model: Model) -> str:
  return cache[f'{name} {model.label()}']['error']


def fit(rows: list[dict]) -> dict[str, float]:
  """The counts minimizing the squared relative error of state + terms . counts (of the terms
  `rows` have; the others keep their CPU counts): non-negative, and at most one copy of the
  gradients and of the gathered weights, which small models' grids cannot tell apart."""
  used = [t for t in memory.TERMS if any(r['terms'][t] for r in rows)]
  a = np.array([[r['terms'][t] / r['xla'] for t in used] for r in rows])
  b = np.array([1 - r['state'] / r['xla'] for r in rows])
  upper = [1 if t in ('gradients', 'gathered') else np.inf for t in used]
  counts = scipy.optimize.lsq_linear(a, b, bounds=(0, upper)).x
  return {t: round(float(counts[used.index(t)]), 2) if t in used
          else memory.ACTIVATION_COPIES['cpu'][t] for t in memory.TERMS}


def planned(row: dict, counts: dict[str, float]) -> float:
  return row['state'] + sum(counts[t] * row['terms'][t] for t in memory.TERMS)


def report(name: str, models_: list[Model], rows: list[dict], counts: dict[str, float]) -> None:
  print(f'\n{name}: ACTIVATION_COPIES {counts}')
  print(f'  {"model":<62} {"XLA MiB":>9} {"plan MiB":>9} {"ratio":>6} {"compile":>8}')
  for model, row in zip(models_, rows):
    plan = planned(row, counts)
    print(f'  {model.label():<62} {row["xla"] / 2**20:>9.1f} {plan / 2**20:>9.1f} '
          f'{plan / row["xla"]:>6.2f} {row["seconds"]:>7.1f}s')
  ratios = [planned(r, counts) / r['xla'] for r in rows]
  print(f'  worst ratio {min(ratios):.2f} .. {max(ratios):.2f}')


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--target', action='append', required=True,
                      help="e.g. v5e:2x2, h100x4; cpu: four devices of this machine's XLA:CPU")
  parser.add_argument('--counts', choices=('fit', 'current'), default='fit',
                      help="fit new counts, or report memory.ACTIVATION_COPIES' own ratios")
  parser.add_argument('--cases', action='store_true',
                      help='report the current counts on CASES (remat, scan, bfloat16)')
  parser.add_argument('--cache', help='a JSON file of earlier compiles, read and extended')
  args = parser.parse_args()
  cache = read_cache(args.cache)
  for name in args.target:
    target = Devices.of(name)
    grid, rows = [], []
    for model in CASES if args.cases else GRID:
      row = measure(model, target, cache)
      write_cache(args.cache, cache)
      if row is None:
        print(f'{name}: XLA fails to compile {model.label()}: {cache_error(cache, name, model)}')
        continue
      grid.append(model)
      rows.append(row)
    fitted = args.counts == 'fit' and not args.cases
    counts = fit(rows) if fitted else memory.ACTIVATION_COPIES[target.platform]
    report(f'{name} ({target.platform})', grid, rows, counts)


if __name__ == '__main__':
  main()
