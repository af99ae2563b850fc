"""Train, evaluate, sample from, export, describe or compile a model: launch.py --config X.py."""
from absl import app, flags
import jax
from ml_collections import config_flags

from transformer_jax import config_lib, run
from transformer_jax.train import cpu_runtime

_CONFIG = config_flags.DEFINE_config_file(
    'config', None, 'A config file, optionally with an argument: configs/vit_cifar.py:variant=S/4.',
    lock_config=True)
# Checks every --config.KEY flag against the file, naming the flag of a key that is not there.
flags.FLAGS[_CONFIG.name].parser = config_lib.CheckedConfigFile(flags.FLAGS[_CONFIG.name])
_WORKDIR = flags.DEFINE_string('workdir', None, 'Checkpoints, metrics and the resolved config.')
_MODE = flags.DEFINE_enum('mode', 'train',
                          ['train', 'eval', 'sample', 'export', 'describe', 'compile'],
                          'What to do.')
_COORDINATOR = flags.DEFINE_string('coordinator_address', None,
                                   'host:port of process 0, for a multi-process run.')
_NUM_PROCESSES = flags.DEFINE_integer('num_processes', None, 'Processes of a multi-process run.')
_PROCESS_ID = flags.DEFINE_integer('process_id', None, 'This process, 0 .. num_processes - 1.')
_DISTRIBUTED = flags.DEFINE_bool('distributed', False, 'Initialize jax.distributed from the '
                                 'environment (Cloud TPU pods, SLURM).')
_VERBOSE = flags.DEFINE_bool('verbose_libraries', False, "Show JAX's and Orbax's INFO logs.")
_TRACEBACK = flags.DEFINE_bool('traceback', False, 'Show the traceback of an error in the config, '
                               'the data or a checkpoint, not just its message.')
flags.mark_flag_as_required('config')


def parse_flags(argv):
  try:
    return flags.FLAGS(argv)
  except Exception as error:  # pylint: disable=broad-except  (any failure to parse the command)
    if '--traceback' in argv:
      raise
    run.exit_with(run.flag_error_message(error))


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  run.configure_logging(_VERBOSE.value)
  on_target = _MODE.value == 'compile' or (_MODE.value == 'describe'
                                            and _CONFIG.value.compile.target)
  if on_target:  # compile-only devices: this machine's accelerator stays unused
    jax.config.update('jax_platforms', 'cpu')
  if _COORDINATOR.value:
    jax.distributed.initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
  elif _DISTRIBUTED.value:
    jax.distributed.initialize()
  cpu_runtime.configure()  # before anything starts the backend: it reads the dispatch setting
  with run.errors_as_messages(_TRACEBACK.value):
    overrides = config_flags.get_override_values(flags.FLAGS['config'])
    config = run.resolve_config(_CONFIG.value, overrides, _WORKDIR.value)
    run.run(config, _WORKDIR.value, _MODE.value)


if __name__ == '__main__':
  app.run(main, flags_parser=parse_flags)
