"""Train, evaluate, sample from or describe a model: python launch.py --config configs/X.py."""
from absl import app, flags
import jax
from ml_collections import config_flags

from transformer_jax import run

_CONFIG = config_flags.DEFINE_config_file(
    'config', None, 'A config file, optionally with an argument: configs/vit_cifar.py:variant=S/4.',
    lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Checkpoints, metrics and the resolved config.')
_MODE = flags.DEFINE_enum('mode', 'train', ['train', 'eval', 'sample', 'describe'], 'What to do.')
flags.mark_flag_as_required('config')


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  run.run(_CONFIG.value, _WORKDIR.value, _MODE.value)


if __name__ == '__main__':
  app.run(main)
