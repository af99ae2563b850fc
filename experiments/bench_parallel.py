"""Train-step time of one model under each rule set on 8 simulated CPU devices: the GPT-2 style
character model (configs/gpt_shakespeare.py: 6 blocks, width 192, batch 64 x 256).

  python experiments/bench_parallel.py

The 8 devices are XLA's host-platform simulation (--xla_force_host_platform_device_count=8): they
share this machine's cores, and their collectives are memory copies. So the times say what each
layout costs in extra work and copies on one machine, not how it would scale on 8 accelerators,
where the collectives cross links and each device computes in parallel. The load average is
printed beside them.
"""
import os

os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '')
                           + ' --xla_force_host_platform_device_count=8').strip()

import pathlib  # noqa: E402
import statistics  # noqa: E402

from absl import app, flags  # noqa: E402
import jax  # noqa: E402

import step_timing  # noqa: E402
from transformer_jax import config_lib, memory  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
LAYOUTS = {'DP': (('data',), (8,), 'dp'), 'FSDP': (('data',), (8,), 'fsdp'),
           'TP': (('data', 'model'), (4, 2), 'tp'),
           'FSDP+TP': (('data', 'model'), (4, 2), 'fsdp_tp')}

_STEPS = flags.DEFINE_integer('steps', 20, 'Timed steps per layout (after 2 warm-up steps).')


def main(argv):
  del argv
  print(f'{jax.device_count()} devices; load average {os.getloadavg()[0]:.2f} at the start')
  print('| layout | mesh | median ms per step | planned memory per device |')
  print('|---|---|---|---|')
  for name, (axes, shape, rule_set) in LAYOUTS.items():
    config = config_lib.from_file(ROOT / 'configs' / 'gpt_shakespeare.py')
    config.data.update(name='synthetic', alphabet=''.join(map(chr, range(33, 98))))
    config.update(rule_set=rule_set)
    config.mesh.update(axes=axes, shape=shape)
    times = step_timing.step_seconds(config, _STEPS.value, warmup=2)
    planned = memory.plan(config).train_total
    print(f'| {name} | {"x".join(map(str, shape))} | {1e3 * statistics.median(times):.1f} | '
          f'{planned / 2**20:.1f} MiB |')
  print(f'load average {os.getloadavg()[0]:.2f} at the end')


if __name__ == '__main__':
  app.run(main)
