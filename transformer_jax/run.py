"""What launch.py calls: one entry point per mode."""
from transformer_jax import describe


def run(config, workdir: str | None, mode: str):
  if mode == 'describe':
    print(describe.describe(config))
    return
  raise NotImplementedError(f'--mode={mode} is not built yet.')
