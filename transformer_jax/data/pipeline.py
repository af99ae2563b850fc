"""make_data: the data settings and a task -> this process's share of every batch. A task is a
name in the registry of tasks (`register_task`), which a model family's registry entry names."""
import dataclasses
import logging
import sys
from typing import Any, Callable, Iterator

import grain
import numpy as np

from transformer_jax.errors import ConfigError
from transformer_jax.data import (imagefolder, images, preprocess, rng, seq2seq, sources,
                                  span_corruption_task, speech, text_data, text_to_text,
                                  translation)
from transformer_jax.data.settings import DataSettings

__all__ = ['chosen_task', 'Data', 'DataSettings', 'image_preprocessing', 'make_data',
           'register_task', 'Task', 'TASKS', 'tasks']

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Task:
  """A kind of batch a family trains on, and how to make it.

  make: (settings, seed, tokenizer_dir, **sizes) -> a task object (train_batch, eval_examples,
    num_eval_examples, info, vocab; see Data), where `sizes` are the model's (its family's
    `data_sizes`: image_size, num_classes, vocab_size, ...), which generated data takes and a
    source's defaults follow; a maker ignores those it does not read.
  sources: the data.name values of data made by this package for it ('synthetic', files...);
    any other name is a TFDS dataset, which `make` opens by name.
  layout: the task whose batches it makes, where another's: a family that trains on that task
    trains on this one when data.task names it. None: its own.
  """
  name: str
  make: Callable[..., Any]
  sources: tuple[str, ...] = ('synthetic',)
  layout: str | None = None


TASKS: dict[str, Task] = {}
TEXT_SOURCES = ('tiny_shakespeare', 'text_file', 'jsonl', 'synthetic')


def register_task(task: Task) -> Task:
  """Adds (or replaces) a task: a family whose entry names it trains on its data."""
  TASKS[task.name] = task
  return task


def tasks() -> list[str]:
  return sorted(TASKS)


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


def make_data(settings: 'DataSettings | Any', task: str, *, seed: int,
              process_index: int | None = None, process_count: int | None = None,
              tokenizer_dir: str | None = None, **sizes) -> Data:
  """The data of the data settings (DataSettings, or a ConfigDict or dict of config.data's
  keys) for `task` (a name of TASKS), as a model family's registry entry names it, or data.task
  where that names another task of its batches (chosen_task).

  Opens, and where needed prepares, the dataset now, so that missing data fails before any
  compile. process_index/process_count default to jax.process_index()/jax.process_count().
  sizes: the model's sizes that the data follows (image_size: the side the default
  preprocessing brings images to and generated images have; num_classes; vocab_size: a trained
  BPE's where data.vocab_size is unset). tokenizer_dir: where a run saved its tokenizer, used
  instead of data.tokenizer where it holds one.
  """
  settings = DataSettings.of(settings)
  if process_index is None or process_count is None:
    import jax  # only here: the data package itself needs no accelerator
    process_index, process_count = jax.process_index(), jax.process_count()
  batch_size = settings.batch_size
  eval_batch_size = settings.eval_batch_size or batch_size
  _check_shares(batch_size, eval_batch_size, process_index, process_count)  # before any reading
  task = chosen_task(task, settings.task)
  check_name(settings.name, task)
  made = TASKS[task].make(settings, seed, tokenizer_dir, **sizes)
  return Data(made, batch_size=batch_size,
              eval_batch_size=eval_batch_size, eval_steps=settings.eval_steps,
              process_index=process_index, process_count=process_count,
              read_options=grain.ReadOptions(num_threads=settings.num_threads,
                                             prefetch_buffer_size=settings.prefetch_buffer_size))


def chosen_task(family_task: str, chosen: str | None) -> str:
  """data.task `chosen` where set, else `family_task` (the family's); a chosen task must make
  the family's batches (its Task.layout)."""
  if not chosen or chosen == family_task:
    return family_task
  if chosen not in TASKS:
    raise ConfigError(f'Unknown data.task={chosen!r}: one of {tasks()}, or unset it (the model '
                      'family\'s own).')
  layout = TASKS[chosen].layout or chosen
  if layout != family_task:
    fitting = sorted(name for name, entry in TASKS.items()
                     if (entry.layout or name) == family_task)
    raise ConfigError(f'data.task={chosen!r} makes {layout!r} batches, but this model trains on '
                      f'{family_task!r} ones: set data.task to one of {fitting}, or unset it.')
  return chosen


def check_name(name, task: str) -> None:
  """data.name feeds `task`: a source of the package that feeds it, or a TFDS name (whose
  features the task checks)."""
  if task not in TASKS:
    raise ConfigError(f'Unknown data task {task!r}: one of {tasks()}, or register one '
                      '(transformer_jax.data.register_task).')
  ours = {source: [t for t in TASKS if source in TASKS[t].sources]
          for entry in TASKS.values() for source in entry.sources}
  if not name:
    raise ConfigError(f'data.name={name!r}: set it to one of {sorted(ours)} or a TFDS dataset.')
  if name in ours and task not in ours[name]:
    feeds = sorted(TASKS[task].sources)
    raise ConfigError(f'data.name={name!r} feeds {" and ".join(ours[name])} models, not '
                      f'{task!r} ones: set data.name to one of {feeds}.')


def _text_task(task: str):
  def make(settings: DataSettings, seed: int, tokenizer_dir, vocab_size=None, **unused):
    del unused
    return text_data.make_text_task(settings, task, seed, vocab_size=vocab_size,
                                     tokenizer_dir=tokenizer_dir)
  return make


def _seq2seq_task(settings: DataSettings, seed: int, tokenizer_dir, vocab_size=None, **unused):
  del unused
  if settings.name not in seq2seq.TASKS:
    return translation.make_translation_task(settings, seed, vocab_size=vocab_size,
                                             tokenizer_dir=tokenizer_dir)
  own, seq_len = settings.part(seq2seq.Seq2SeqSettings), settings.seq_len
  return seq2seq.Seq2SeqTask(
      settings.name, alphabet=settings.part(seq2seq.GeneratedSettings).alphabet,
      seq_len=seq_len, min_len=own.seq2seq_min_len, max_len=own.seq2seq_max_len or seq_len - 1,
      seed=seed, num_eval=settings.eval_examples, exact_match_examples=own.exact_match_examples)


# Generated images for a model that states no size of its own.
SYNTHETIC_IMAGE_SIZE, SYNTHETIC_CLASSES = 32, 10


def _image_task(settings: DataSettings, seed: int, tokenizer_dir=None, image_size=None,
                num_classes=None, num_channels=3, **unused) -> images.ImageTask:
  """Image classification: generated images of the model's size, classes and channels (other
  than 3: latents, of the model's size already, kept as they are by decode(num_channels)), an
  image folder (data.image_dir), or a TFDS dataset (CIFAR-10 prepared from its archive where
  needed), preprocessed to the model's size."""
  del tokenizer_dir, unused
  name, own = settings.name, settings.part(images.ImageSettings)
  image_size = image_size or SYNTHETIC_IMAGE_SIZE
  if name == 'synthetic':
    size, count = image_size, settings.eval_examples
    num_classes = num_classes or SYNTHETIC_CLASSES
    train, held_out = (
        images.synthetic_images(9 * count, size, num_classes, (rng.GENERATE,), num_channels),
        images.synthetic_images(count, size, num_classes, (rng.HELD_OUT,), num_channels))
    # In memory, generated images are standardized with their exact channel statistics.
    scale = 'normalize({}, {})'.format(*images.channel_stats(train.images))
    fit = None if num_channels == 3 else f'decode({num_channels})'
    pp_train, pp_eval = image_preprocessing(own, image_size, scale, fit)
    source, splits = name, ('generated', 'generated')
  else:
    pp_train, pp_eval = image_preprocessing(own, image_size)  # checked before reading
    if name == 'imagefolder':
      if not own.image_dir:
        raise ConfigError("data.name='imagefolder' reads data.image_dir: set it to the folder "
                          'holding train/<class>/<image> (and test/<class>/<image>).')
      dataset = imagefolder.open_folder(own.image_dir, train_split=settings.train_split,
                                        eval_split=settings.eval_split)
      own = dataclasses.replace(own, image_key='image', label_key='label')  # the folder's keys
    else:
      if name == 'cifar10':
        name = sources.prepare_cifar10(settings.tfds_data_dir, settings.manual_dir,
                                       settings.download)
      dataset = sources.open_image_dataset(
          name, data_dir=settings.tfds_data_dir, manual_dir=settings.manual_dir,
          train_split=settings.train_split, eval_split=settings.eval_split,
          image_key=own.image_key, label_key=own.label_key)
    train, held_out, num_classes = dataset.train, dataset.held_out, dataset.num_classes
    source, splits = name, dataset.splits
  task = images.ImageTask(train, held_out, num_classes=num_classes, seed=seed, pp_train=pp_train,
                          pp_eval=pp_eval, image_key=own.image_key,
                          label_key=own.label_key, mix=own.mixing)
  task.info.update(source=source, splits=splits)
  return task


def image_preprocessing(settings: images.ImageSettings, size: int,
                        scale: str = 'value_range(-1, 1)', fit: str | None = None):
  """The training and held-out preprocessing: data.pp_train / data.pp_eval, else the image
  brought to size x size (`fit`: the ops that do it, default decode, resize_small and
  central_crop) and scaled, with `augment` randomly cropped from a padded copy and flipped."""
  fit = fit or f'decode|resize_small({size})|central_crop({size})'
  augment = f'|random_crop({size}, pad={max(size // 8, 1)})|flip_lr' if settings.augment else ''
  train = settings.pp_train or f'{fit}{augment}|{scale}'
  held_out = settings.pp_eval or f'{fit}|{scale}'
  return (preprocess.build(train, key='data.pp_train'),
          preprocess.build(held_out, key='data.pp_eval'))


for _task in (Task('image', _image_task, ('cifar10', 'synthetic', 'imagefolder')),
              Task('next_token', _text_task('next_token'), TEXT_SOURCES),
              Task('masked', _text_task('masked'), TEXT_SOURCES),
              Task('seq2seq', _seq2seq_task, tuple(seq2seq.TASKS)),
              Task('audio', speech.make_audio_task, speech.SOURCES),
              Task('span_corruption', span_corruption_task.make_span_corruption_task,
                   span_corruption_task.SOURCES, layout='seq2seq'),
              Task('text_classification_as_text', text_to_text.make_classification_as_text, (),
                   layout='seq2seq')):
  register_task(_task)
