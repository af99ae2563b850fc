"""What launch.py calls: one entry point per mode."""
import logging

from absl import logging as absl_logging

from transformer_jax import describe, train


def configure_logging(verbose_libraries: bool = False):
  """Our progress at INFO; JAX's and Orbax's INFO chatter only when asked for."""
  if not verbose_libraries:
    absl_logging.set_verbosity(absl_logging.WARNING)
  logging.getLogger('transformer_jax').setLevel(logging.INFO)


def run(config, workdir: str | None, mode: str):
  if mode == 'describe':
    print(describe.describe(config))
    return None
  if not workdir:
    raise ValueError(f'--mode={mode} needs --workdir (checkpoints, metrics and the config go there).')
  if mode == 'train':
    return train.train(config, workdir)
  if mode == 'eval':
    return train.evaluate(config, workdir)
  raise NotImplementedError(f'--mode={mode} is not built yet.')
