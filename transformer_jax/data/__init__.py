"""Data for every family: `make_data(config.data, task, seed=...)`, the task a family's
registry entry names (pipeline.TASKS).

TFDS builders of the project's own (builders.py) prepare CIFAR-10 and TinyShakespeare without
TensorFlow; sources.py finds, prepares and reads them with `tfds.data_source`; images, text and
seq2seq turn them, or generated data, into numpy batches that are pure functions of (seed, step);
pipeline.py splits each global batch over the processes and iterates with grain.
"""
from transformer_jax.data.pipeline import TASKS, Data, make_data
from transformer_jax.data.sources import DataNotFoundError
from transformer_jax.data.vocab import Vocab

__all__ = ['TASKS', 'Data', 'DataNotFoundError', 'Vocab', 'make_data']
