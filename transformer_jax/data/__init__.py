"""Data for every family: `make_data(config.data, task, seed=...)`, the task a family's
registry entry names (pipeline.TASKS; `register_task` adds one). The data section's settings are
the shared DataSettings and the part each source owns beside its code (`register_part` adds one:
images.ImageSettings, corpus.TextSettings, translation.TranslationSettings, seq2seq's).

sources.py opens any TFDS image-classification dataset prepared in the data dir, and finds or
prepares CIFAR-10 and TinyShakespeare (the project's own TF-free builders: builders.py), all read
with `tfds.data_source`; images (preprocess and randaugment per example, mixing per batch), text
and seq2seq turn them, or generated data, into numpy batches that are pure functions of (seed,
step); pipeline.py splits each global batch over the processes and iterates with grain. Text
corpora (corpus.py: files, JSONL, TFDS) are tokenized once (tokenizer.py: characters, a trained
BPE, a tokenizer.json) into memory-mapped token files (token_files.py), read as windows or as
packed rows of whole documents (packing.py, text.py; text_data.py puts these together);
image_text.py pairs images with tokenized captions for dual encoders.
"""
from transformer_jax.data import image_text, tokenizer
from transformer_jax.data.pipeline import TASKS, Data, make_data, register_task, Task
from transformer_jax.data.settings import DataPart, DataSettings, register_part
from transformer_jax.data.sources import DataNotFoundError
from transformer_jax.data.vocab import Vocab

__all__ = ['TASKS', 'Data', 'DataNotFoundError', 'DataPart', 'DataSettings', 'image_text',
           'make_data', 'register_part', 'register_task', 'Task', 'tokenizer', 'Vocab']
