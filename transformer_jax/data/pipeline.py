"""make_data: config.data and a task -> this process's share of every batch."""
import logging
import sys
from typing import Iterator

import grain
import numpy as np

from transformer_jax.errors import ConfigError
from transformer_jax.data import images, preprocess, rng, seq2seq, sources, text_data, translation
from transformer_jax.data.settings import DATA_DEFAULTS, DATA_TYPES, DataSettings

__all__ = ['Data', 'DATA_DEFAULTS', 'DATA_TYPES', 'DATASETS', 'DataSettings', 'make_data', 'TASKS',
           'TEXT']

log = logging.getLogger(__name__)

# The tasks a model family trains on (its registry entry names one), and the datasets that feed
# each: images with labels; text windows for next-token prediction or masked-token prediction;
# source and target strings. Any other name is a TFDS dataset: image classification for an
# image model, text for a text model, translation pairs for an encoder-decoder.
TASKS = ('image', 'next_token', 'masked', 'seq2seq')
TEXT = ('next_token', 'masked')
DATASETS = {'cifar10': ('image',), 'tiny_shakespeare': TEXT, 'text_file': TEXT, 'jsonl': TEXT,
            'seq2seq_reverse': ('seq2seq',), 'seq2seq_sort': ('seq2seq',), 'synthetic': TASKS}



class Data:
  """This process's share of a task's batches: rows [p * b, (p + 1) * b) of each global batch,
  b = global batch / process count, so the shares of processes 0..P-1 concatenate to the
  1-process batch. A training batch is a pure function of (seed, step)."""

  def __init__(self, task, *, batch_size: int, eval_batch_size: int, eval_steps: int | None,
               process_index: int, process_count: int, read_options: grain.ReadOptions):
    _check_shares(batch_size, eval_batch_size, process_index, process_count)
    self.task, self.vocab = task, task.vocab
    self.token_bytes = getattr(task, 'token_bytes', None)  # text: for bits per byte
    self.batch_size, self.eval_batch_size = batch_size, eval_batch_size
    self.process_index, self.process_count = process_index, process_count
    self.read_options = read_options
    if hasattr(task, 'check_batch'):
      task.check_batch(batch_size, self._rows(batch_size))
    self.eval_steps = _eval_steps(eval_steps, task.num_eval_examples, eval_batch_size)
    self.info = {**task.info, 'num_eval_examples': self.eval_steps * eval_batch_size}

  def _rows(self, size: int) -> slice:
    share = size // self.process_count
    return slice(self.process_index * share, (self.process_index + 1) * share)

  def train_batch(self, step: int) -> dict[str, np.ndarray]:
    return self.task.train_batch(step, self.batch_size, self._rows(self.batch_size))

  def train_iterator(self, start_step: int = 0) -> Iterator[dict[str, np.ndarray]]:
    """train_batch of start_step, start_step + 1, ..., assembled by grain's threads while the
    device runs the current step."""
    steps = grain.MapDataset.range(start_step, sys.maxsize)
    return iter(steps.map(self.train_batch).to_iter_dataset(self.read_options))

  def eval_batches(self) -> Iterator[dict[str, np.ndarray]]:
    """The same eval_steps batches of the held-out split at every call, assembled by grain's
    threads."""
    share = np.arange(self.eval_batch_size)[self._rows(self.eval_batch_size)]
    indices = np.arange(self.eval_steps)[:, None] * self.eval_batch_size + share
    batches = grain.MapDataset.source(list(indices)).map(self.task.eval_examples)
    return iter(batches.to_iter_dataset(self.read_options))


def _check_shares(batch_size: int, eval_batch_size: int, process_index: int,
                  process_count: int) -> None:
  for key, size in (('batch_size', batch_size), ('eval_batch_size', eval_batch_size)):
    if size <= 0 or size % process_count:
      raise ConfigError(f'data.{key}={size} (global) must be a positive multiple of the '
                        f'{process_count} processes: each reads an equal share of the rows.')
  if not 0 <= process_index < process_count:
    raise ValueError(f'process_index={process_index} is not in 0..{process_count - 1}.')


def _eval_steps(requested: int | None, num_examples: int, batch_size: int) -> int:
  available = num_examples // batch_size
  if available == 0:
    raise ConfigError(f'The held-out split has {num_examples} examples, fewer than one eval batch '
                      f'of data.eval_batch_size={batch_size}: lower it.')
  if requested is None or requested < 0:
    if num_examples % batch_size:
      log.warning('Eval covers %d of the %d held-out examples (full batches of %d only); an '
                  'eval_batch_size dividing %d covers them all.', available * batch_size,
                  num_examples, batch_size, num_examples)
    return available
  if requested > available:
    raise ConfigError(f'data.eval_steps={requested}, but the held-out split has {available} '
                      f'batches of data.eval_batch_size={batch_size} ({num_examples} examples).')
  return requested


def make_data(config, task: str, *, seed: int, process_index: int | None = None,
              process_count: int | None = None, image_size: int | None = None,
              vocab_size: int | None = None, tokenizer_dir: str | None = None) -> Data:
  """The data of config.data (DataSettings, or a ConfigDict or dict of its keys) for a
  `task` (one of TASKS), as a model family's registry entry names it.

  Opens, and where needed prepares, the dataset now, so that missing data fails before any
  compile. process_index/process_count default to jax.process_index()/jax.process_count().
  image_size: the side of the model's images, which the default preprocessing brings images
  to (default: data.image_size). vocab_size: the model's, the size of a trained BPE where
  data.vocab_size is unset. tokenizer_dir: where a run saved its tokenizer, used instead of
  data.tokenizer where it holds one.
  """
  settings = DataSettings.of(config)
  if process_index is None or process_count is None:
    import jax  # only here: the data package itself needs no accelerator
    process_index, process_count = jax.process_index(), jax.process_count()
  batch_size = settings.batch_size
  eval_batch_size = settings.eval_batch_size or batch_size
  _check_shares(batch_size, eval_batch_size, process_index, process_count)  # before any reading
  check_name(settings.name, task)
  if task in TEXT:
    made = text_data.make_text_task(settings, task, seed, vocab_size=vocab_size,
                                    tokenizer_dir=tokenizer_dir)
  elif task == 'seq2seq' and settings.name not in DATASETS:
    made = translation.make_translation_task(settings, seed, vocab_size=vocab_size,
                                             tokenizer_dir=tokenizer_dir)
  else:
    made = _make_task(settings, task, seed, image_size)
  return Data(made, batch_size=batch_size,
              eval_batch_size=eval_batch_size, eval_steps=settings.eval_steps,
              process_index=process_index, process_count=process_count,
              read_options=grain.ReadOptions(num_threads=settings.num_threads,
                                             prefetch_buffer_size=settings.prefetch_buffer_size))


def check_name(name, task: str) -> None:
  """data.name feeds `task`: a name of DATASETS that feeds it, or a TFDS name (whose features
  the task checks)."""
  if not name:
    raise ConfigError(f'data.name={name!r} is not one of {sorted(DATASETS)}.')
  if name in DATASETS and task not in DATASETS[name]:
    feeds = [n for n, tasks in DATASETS.items() if task in tasks]
    raise ConfigError(f'data.name={name!r} feeds {" and ".join(DATASETS[name])} models, not '
                      f'{task!r} ones: set data.name to one of {feeds}.')


def _make_task(settings: DataSettings, task: str, seed: int, image_size: int | None):
  name = settings.name
  if task == 'image':
    return _image_task(settings, name, seed, image_size or settings.image_size)
  seq_len = settings.seq_len
  return seq2seq.Seq2SeqTask(
      name, alphabet=settings.alphabet, seq_len=seq_len, min_len=settings.seq2seq_min_len,
      max_len=settings.seq2seq_max_len or seq_len - 1, seed=seed,
      num_eval=settings.eval_examples, exact_match_examples=settings.exact_match_examples)


def _image_task(settings: DataSettings, name: str, seed: int, image_size: int) -> images.ImageTask:
  mix = images.Mixing(settings.mixup_alpha, settings.cutmix_alpha, settings.cutmix_prob)
  if name == 'synthetic':
    size, count = settings.image_size, settings.eval_examples
    train, held_out, num_classes = (
        images.synthetic_images(9 * count, size, settings.num_classes, (rng.GENERATE,)),
        images.synthetic_images(count, size, settings.num_classes, (rng.HELD_OUT,)),
        settings.num_classes)
    # In memory, generated images are standardized with their exact channel statistics.
    scale = 'normalize({}, {})'.format(*images.channel_stats(train.images))
    pp_train, pp_eval = _preprocessing(settings, image_size, scale)
    source, splits = name, ('generated', 'generated')
  else:
    pp_train, pp_eval = _preprocessing(settings, image_size)  # checked before reading
    if name == 'cifar10':
      name = sources.prepare_cifar10(settings.tfds_data_dir, settings.manual_dir,
                                     settings.download)
    dataset = sources.open_image_dataset(
        name, data_dir=settings.tfds_data_dir, manual_dir=settings.manual_dir,
        train_split=settings.train_split, eval_split=settings.eval_split,
        image_key=settings.image_key, label_key=settings.label_key)
    train, held_out, num_classes = dataset.train, dataset.held_out, dataset.num_classes
    source, splits = name, dataset.splits
  task = images.ImageTask(train, held_out, num_classes=num_classes, seed=seed, pp_train=pp_train,
                          pp_eval=pp_eval, image_key=settings.image_key,
                          label_key=settings.label_key, mix=mix)
  task.info.update(source=source, splits=splits)
  return task


def _preprocessing(settings: DataSettings, size: int, scale: str = 'value_range(-1, 1)'):
  """The training and held-out preprocessing: data.pp_train / data.pp_eval, else the image
  brought to size x size and scaled, with `augment` randomly cropped from a padded copy and
  flipped."""
  fit = f'decode|resize_small({size})|central_crop({size})'
  augment = f'|random_crop({size}, pad={max(size // 8, 1)})|flip_lr' if settings.augment else ''
  train = settings.pp_train or f'{fit}{augment}|{scale}'
  held_out = settings.pp_eval or f'{fit}|{scale}'
  return (preprocess.build(train, key='data.pp_train'),
          preprocess.build(held_out, key='data.pp_eval'))
