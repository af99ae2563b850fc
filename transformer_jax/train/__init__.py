"""Training: mesh and shardings, the jitted and shard_map steps, checkpoints, metrics, loop."""
from transformer_jax.train.loop import evaluate, train
from transformer_jax.train.setup import Run, build_run, restore_trained

__all__ = ['Run', 'build_run', 'evaluate', 'restore_trained', 'train']
