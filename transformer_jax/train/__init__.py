"""Training: the run's settings resolved once (run_settings), mesh and shardings, the jitted and
shard_map steps, checkpoints, metrics, loop."""
from transformer_jax.settings import MeshSettings, TrainingSettings
from transformer_jax.train import run_settings
from transformer_jax.train.loop import evaluate, train
from transformer_jax.train.run_settings import RunSettings, resolve
from transformer_jax.train.setup import Run, build_run, restore_trained

__all__ = ['build_run', 'evaluate', 'MeshSettings', 'resolve', 'restore_trained', 'Run',
           'run_settings', 'RunSettings', 'train', 'TrainingSettings']
