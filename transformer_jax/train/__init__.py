"""Training: mesh and shardings, the jitted and shard_map steps, checkpoints, metrics, loop."""
from transformer_jax.train.loop import evaluate, train
from transformer_jax.settings import MeshSettings, TrainingSettings
from transformer_jax.train.setup import Run, build_run, restore_trained

__all__ = ['build_run', 'evaluate', 'MeshSettings', 'restore_trained', 'Run', 'train',
           'TrainingSettings']
