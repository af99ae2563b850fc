"""Training: mesh and shardings, the jitted and shard_map steps, checkpoints, metrics, loop."""
from transformer_jax.train.loop import evaluate, restore_trained, train
