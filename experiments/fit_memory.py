"""Fits memory.ACTIVATION_COPIES of a platform to the compiler it plans for: compiles the real
train step of a grid of models for compile-only TPU or GPU devices (transformer_jax.targets),
and solves for the copies of each activation term that best match memory_analysis() (least
squares of the relative error, the counts non-negative).

  python experiments/fit_memory.py --target h100x4 --target v5e:2x2 --target v4-8 \
      --cache experiments/results/compile_targets/fit_compiles.json   # TPUs fitted together
  python experiments/fit_memory.py --target v4-8 --counts current   # the plan's own ratios
  python experiments/fit_memory.py --cases --target cpu --target v5e:2x2   # memory.OFF_BY
  python experiments/fit_memory.py --small --target v5e:2x2   # memory.SMALL_RANGE

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
from transformer_jax.models import styles  # noqa: E402
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
  kv_heads: int | None = None  # None: as many as the heads
  style: str | None = None  # a styles.STYLES name other than the family's test default


  def label(self) -> str:
    tokens = f'img{self.seq}/{self.patch}' if self.family == 'vit' else f'T{self.seq} V{self.vocab}'
    remat = f' remat {self.remat}' if self.remat != 'none' else ''
    return (f'{self.family} w{self.width} L{self.blocks} h{self.heads} {tokens} b{self.batch} '
            f'{self.dtype} {self.rule_set}{remat}' + (' scanned' if self.scan else '')
            + (f' kv{self.kv_heads}' if self.kv_heads else '')
            + (f' {self.style}' if self.style else ''))

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
    if self.kv_heads:
      overrides['model.num_kv_heads'] = self.kv_heads
    if self.style:
      overrides.update({f'model.{k}': v for k, v in styles.of(self.style, self.family).items()})
    return small_config(self.family, rule_set=self.rule_set, **overrides)


# Models of 0.3 to 6 GiB per device on four devices, the sizes at which a plan decides whether a
# run fits (XLA:TPU keeps up to about 100 MiB of a step in its on-chip memory and pads small
# arrays to its tiles, which a plan of a smaller model cannot follow: memory.caveats): each
# family, GPT-2's and LLaMA's blocks (grouped-query heads among them), float32 and bfloat16,
# sequences 512 to 4096, vocabularies 1,024 to 50,304, ViTs of 197 to 577 tokens, under DP, FSDP
# and TP: every term varies apart from the others.
GRID = [
    Model('decoder', 1024, 4, 8, 2048, vocab=32000, dtype='bfloat16'),
    Model('decoder', 2048, 2, 16, 1024, vocab=32000, dtype='bfloat16', rule_set='fsdp',
          kv_heads=4),
    Model('decoder', 1536, 3, 12, 2048, vocab=8192, dtype='bfloat16', rule_set='tp'),
    Model('decoder', 768, 4, 12, 1024, vocab=50304, dtype='bfloat16', style='gpt2'),
    Model('decoder', 768, 4, 12, 1024, vocab=50304, dtype='bfloat16', style='gpt2',
          rule_set='fsdp'),
    Model('decoder', 1024, 2, 16, 512, vocab=4096, style='gpt2', batch=64),
    Model('decoder', 4096, 2, 32, 512, vocab=1024, dtype='bfloat16', rule_set='tp', batch=64),
    Model('decoder', 512, 4, 8, 4096, vocab=16384, dtype='bfloat16', batch=16),
    Model('encoder', 1024, 3, 16, 512, vocab=30522, dtype='bfloat16', batch=64),
    Model('encoder', 768, 4, 12, 1024, vocab=4096, dtype='bfloat16', rule_set='fsdp'),
    Model('encoder_decoder', 1024, 2, 16, 512, vocab=32000, dtype='bfloat16'),
    Model('encoder_decoder', 512, 3, 8, 1024, vocab=8192, dtype='bfloat16', rule_set='tp'),
    Model('vit', 1024, 3, 16, 224, patch=14, dtype='bfloat16', batch=128),
    Model('vit', 768, 4, 12, 384, patch=16, dtype='bfloat16', batch=64, rule_set='fsdp'),
    Model('vit', 1280, 2, 16, 224, patch=16, batch=128, rule_set='tp'),
    Model('vit', 384, 4, 6, 224, patch=16, dtype='bfloat16', batch=256),
]


# Where the plan may not hold: a block recomputed in the backward pass, the blocks scanned, and
# the compute dtype a platform's grid does not have (bfloat16 on XLA:CPU, float32 on the
# accelerators); variants of a small decoder on XLA:CPU, of one of 3 GiB per device elsewhere,
# after the decoder itself.
_CASE_BASES = {'cpu': Model('decoder', 192, 4, 4, 256, rule_set='fsdp'),
               'accelerator': Model('decoder', 1024, 4, 8, 2048, vocab=32000,
                                    dtype='bfloat16', rule_set='fsdp')}


def cases(platform: str) -> list[Model]:
  base = _CASE_BASES['cpu' if platform == 'cpu' else 'accelerator']
  other_dtype = 'bfloat16' if base.dtype == 'float32' else 'float32'
  return [base, dataclasses.replace(base, remat='full'), dataclasses.replace(base, remat='dots'),
          dataclasses.replace(base, scan=True), dataclasses.replace(base, dtype=other_dtype)]


# Models of a few to a few hundred MiB per device, below the sizes the plan is fitted to: on
# XLA:TPU what the compiler keeps in its on-chip memory and its tiles' padding weigh there
# (memory.caveats); the reference character LM (4 blocks, width 128, batch 32 x 64) and small
# models of each family.
SMALL = [Model('decoder', 128, 4, 4, 64, vocab=65),
         Model('decoder', 192, 3, 6, 256, vocab=300, dtype='bfloat16'),
         Model('vit', 160, 3, 4, 96, patch=4),
         Model('encoder_decoder', 128, 3, 4, 512, vocab=200, dtype='bfloat16')]


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
                      help="e.g. v5e:2x2, h100x4; cpu: four devices of this machine's XLA:CPU; "
                      'the targets of one platform are fitted together')
  parser.add_argument('--counts', choices=('fit', 'current'), default='fit',
                      help="fit new counts, or report memory.ACTIVATION_COPIES' own ratios")
  parser.add_argument('--cases', action='store_true',
                      help='report the current counts on cases(platform): remat, scan, dtype')
  parser.add_argument('--small', action='store_true',
                      help='report the current counts on SMALL models')
  parser.add_argument('--cache', help='a JSON file of earlier compiles, read and extended')
  args = parser.parse_args()
  cache = read_cache(args.cache)
  measured = {}  # target -> (models, rows)
  for name in args.target:
    target = Devices.of(name)
    grid, rows = [], []
    for model in cases(target.platform) if args.cases else SMALL if args.small else GRID:
      row = measure(model, target, cache)
      write_cache(args.cache, cache)
      if row is None:
        print(f'{name}: XLA fails to compile {model.label()}: {cache_error(cache, name, model)}')
        continue
      grid.append(model)
      rows.append(row)
    measured[target] = grid, rows
  for platform in dict.fromkeys(target.platform for target in measured):
    of_platform = [target for target in measured if target.platform == platform]
    fitted = args.counts == 'fit' and not (args.cases or args.small)
    counts = (fit([row for target in of_platform for row in measured[target][1]]) if fitted
              else memory.ACTIVATION_COPIES[platform])
    for target in of_platform:
      report(f'{target.name} ({platform})', *measured[target], counts)


if __name__ == '__main__':
  main()
