"""The memory plan against XLA for three real models on TPU and GPU targets: GPT-2 small (batch
32 x 1024, bfloat16), ViT-B/16 (batch 128 at 224x224) and the reference character LM
(configs/llama_shakespeare.py: 4 blocks, width 128, batch 32 x 64), each train step compiled
for compile-only devices under DP, FSDP and TP; prints a Markdown table of XLA's bytes per
device (arguments + outputs - aliases + temporaries), the plan's, their ratio and the compile
time, in MiB.

  python experiments/compile_targets.py --cache /tmp/compile_targets.json

Needs the optional packages of pip install -e '.[compile]'.
"""
import argparse
import os
import sys

import fit_memory  # sets JAX_PLATFORMS=cpu before jax is imported
import jax
from transformer_jax import aot, config_lib, memory, targets, train
from transformer_jax.errors import ConfigError

ROOT = os.path.join(os.path.dirname(__file__), '..')
MODELS = {'reference LM': ('llama_shakespeare', {}),
          'ViT-B/16': ('vit_b16', {'data.batch_size': 128}), 'GPT-2 small': ('gpt2_small', {})}
TARGETS = ('v5e:2x2', 'v4-8', 'h100x4')


def config_of(name: str, rule_set: str, platform: str):
  """The config file's run under `rule_set` on `platform`, its data generated in the same
  shapes (what --mode=compile compiles)."""
  module, overrides = MODELS[name]
  config = config_lib.from_file(os.path.join(ROOT, 'configs', f'{module}.py'))
  shape, mesh_axes = fit_memory.RULE_MESHES[rule_set]
  config.rule_set, config.mesh.shape, config.mesh.axes = rule_set, shape, mesh_axes
  for key, value in overrides.items():
    section, _, field = key.partition('.')
    config[section][field] = value
  return aot.stand_in(train.run_settings.resolve(config, platform))


def measure(name: str, rule_set: str, target: targets.Target, cache: dict,
            compile_: bool) -> dict | None:
  """XLA's and the plan's bytes per device; None where `cache` lacks it and not `compile_`."""
  key = f'{target.name} {name} {rule_set}'
  config = config_of(name, rule_set, target.platform)
  if key not in cache:
    if not compile_:
      return None
    try:
      buffers, seconds = fit_memory.compile_train_step(config, target.devices)
      cache[key] = {'xla': buffers, 'seconds': seconds}
    except ConfigError as error:  # the first dimension that does not divide
      cache[key] = {'error': 'does not divide: ' + str(error).splitlines()[1].strip()}
    except jax.errors.JaxRuntimeError as error:
      cache[key] = {'error': 'XLA fails to compile it: ' + str(error).splitlines()[0][:160]}
    print(f'  {key}: {cache[key]}', file=sys.stderr, flush=True)
  if 'error' in cache[key]:
    return cache[key]
  plan = memory.plan(config, fit_memory.mesh_of(config, target.devices),
                     platform=target.platform)
  return {**cache[key], 'plan': plan.train_total}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--cache', help='a JSON file of earlier compiles, read and extended')
  parser.add_argument('--model', action='append', choices=list(MODELS),
                      help='compile only these (default: all); the others come from the cache')
  parser.add_argument('--no-compile', action='store_true',
                      help='print the table of what the cache holds, compiling nothing')
  parser.add_argument('--target', action='append', choices=TARGETS,
                      help='compile only for these targets (default: all)')
  parser.add_argument('--rule-set', action='append', choices=list(fit_memory.RULE_MESHES),
                      help='compile only these rule sets (default: all)')
  args = parser.parse_args()
  cache = fit_memory.read_cache(args.cache)
  print('| model | target | rule set | XLA MiB | plan MiB | plan / XLA | compile s |')
  print('|---|---|---|---:|---:|---:|---:|')
  for rule_set in fit_memory.RULE_MESHES:
    for name in MODELS:
      for target_name in TARGETS:
        target = targets.target(target_name)
        chosen = (not args.no_compile and name in (args.model or MODELS)
                  and target_name in (args.target or TARGETS)
                  and rule_set in (args.rule_set or fit_memory.RULE_MESHES))
        row = measure(name, rule_set, target, cache, chosen)
        fit_memory.write_cache(args.cache, cache)
        if row is None:
          print(f'| {name} | {target_name} | {rule_set} | not compiled | | | |')
          continue
        if 'error' in row:
          print(f'| {name} | {target_name} | {rule_set} | {row["error"]} | | | |')
          continue
        print(f'| {name} | {target_name} | {rule_set} | {row["xla"] / 2**20:,.1f} | '
              f'{row["plan"] / 2**20:,.1f} | {row["plan"] / row["xla"]:.2f} | '
              f'{row["seconds"]:.0f} |', flush=True)


if __name__ == '__main__':
  main()
