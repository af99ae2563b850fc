"""Image-text pairs for dual encoders (models.clip): {'image': float32 (b, H, W, C), 'text': int32
(b, T) caption ids, 'label': int32 (b,)}.

Sources: a JSONL file of {"image": path, "text": caption} records (paths relative to the file;
the keys are data.image_key and data.text_key), or generated pairs ('synthetic': the generated
images of the image task, each captioned by one of several templates naming its class). Images
go through the image task's preprocessing (data.pp_train / data.pp_eval, or the default to
model.image_size); captions through the text data's tokenizers (data.tokenizer: 'chars', 'bpe'
trained on the training captions, or a tokenizer.json), each as [BOS] ids EOS, padded to the
text tower's positions. Every caption is tokenized when the data is made, so that one too long
fails before anything compiles.
"""
import dataclasses
import json
import os
import pathlib

import numpy as np

from transformer_jax.data import images, rng
from transformer_jax.data import tokenizer as tokenizer_lib
from transformer_jax.data.corpus import TextSettings
from transformer_jax.data.pipeline import Task, image_preprocessing, register_task
from transformer_jax.data.settings import DataPart, DataSettings, register_part
from transformer_jax.data.vocab import Vocab
from transformer_jax.errors import ConfigError
from transformer_jax.ranges import COUNT

__all__ = ['CLASS_NAMES', 'encode_captions', 'ImageTextSettings', 'ImageTextTask', 'TEMPLATES']

# The classes and caption templates of generated pairs.
CLASS_NAMES = ('apple', 'boat', 'cloud', 'desk', 'eagle', 'fern', 'goat', 'harp', 'igloo',
               'jelly', 'kite', 'lamp', 'moth', 'nest', 'owl', 'pear')
TEMPLATES = ('a photo of a {}.', 'a {} in the picture.', 'this is a {}', 'my {}.',
             'a blurry photo of the {}.')
_SYNTHETIC_SIZE = 32  # the side of generated images for a model that states none


@register_part
@dataclasses.dataclass(frozen=True)
class ImageTextSettings(DataPart):
  """The keys of config.data that image-text pairs read (beside the image and text parts')."""
  PART = 'image_text'
  # A caption longer than the text tower's positions is cut to them (keeping its EOS); False:
  # refused, naming the caption.
  truncate_captions: bool = True
  caption_classes: int = 10  # synthetic: the classes of the generated pairs

  RANGES = {'caption_classes': COUNT}

  def check(self) -> None:
    super().check()
    if self.caption_classes > len(CLASS_NAMES):
      raise ConfigError(f'data.caption_classes={self.caption_classes}: generated pairs have at '
                        f'most {len(CLASS_NAMES)} classes; lower it.')


class ImageTextTask:
  """Training batches of shuffled pairs, a pure function of (seed, step), and held-out pairs by
  index; `captions` holds every pair's ids (N, T) and `sources` each split's images and labels,
  read like a TFDS source."""

  def __init__(self, sources: tuple, captions: tuple, *, seed: int, pp_train, pp_eval,
               tokenizer, info: dict):
    self.train, self.held_out = sources
    self.train_captions, self.held_out_captions = captions
    self.seed, self.pp_train, self.pp_eval = seed, pp_train, pp_eval
    self.vocab = tokenizer
    self.num_eval_examples = len(self.held_out)
    self.info = info

  def train_batch(self, step: int, batch_size: int, rows: slice) -> dict:
    ks = [step * batch_size + row for row in range(batch_size)[rows]]
    records = rng.shuffled(self.seed, step, batch_size, rows, len(self.train))
    return self._pairs(self.train, self.train_captions, records, self.pp_train,
                       [(rng.AUGMENT, self.seed, k) for k in ks])

  def eval_examples(self, indices: np.ndarray) -> dict:
    indices = [int(index) for index in indices]
    return self._pairs(self.held_out, self.held_out_captions, indices, self.pp_eval,
                       [(rng.HELD_OUT, index) for index in indices])

  @staticmethod
  def _pairs(source, captions, indices: list[int], pp, keys) -> dict:
    records = source.__getitems__(indices)
    pictures = [pp(record['image'], rng.generator(*key) if pp.is_random else None)
                for record, key in zip(records, keys)]
    return {'image': np.stack(pictures), 'text': captions[indices],
            'label': np.array([record['label'] for record in records], np.int32)}


class _ImageFiles:
  """The encoded bytes of image files, by index, label -1 (a caption names no class)."""

  def __init__(self, paths: list[str]):
    self.paths = paths

  def __len__(self) -> int:
    return len(self.paths)

  def __getitems__(self, indices: list[int]) -> list[dict]:
    return [{'image': pathlib.Path(self.paths[i]).read_bytes(), 'label': -1} for i in indices]


def encode_captions(captions: list[str], tokenizer, length: int, truncate: bool) -> np.ndarray:
  """int32 (N, length): each caption as [BOS] ids EOS (a tokenizer whose post-processor adds
  them adds them once), then the pad id (EOS where the tokenizer has none). A caption longer than
  `length` is cut to length - 1 ids and its EOS, or with `truncate` off refused."""
  eos, bos = tokenizer.eos_id, tokenizer.bos_id
  pad = eos if tokenizer.pad_id is None else tokenizer.pad_id
  out = np.full((len(captions), length), pad, np.int32)
  for row, caption in enumerate(captions):
    ids = tokenizer.encode(caption)
    ids = ([bos] if bos is not None and ids[:1] != [bos] else []) + ids
    ids = ids + ([eos] if ids[-1:] != [eos] else [])
    if len(ids) > length:
      if not truncate:
        raise ConfigError(f'Caption {row} ({caption[:40]!r}...) is {len(ids)} tokens, more than '
                          f'the text tower\'s model.max_len={length} positions: set '
                          'data.truncate_captions=True or raise model.max_len.')
      ids = ids[:length - 1] + [eos]
    out[row, :len(ids)] = ids
  return out


def _tokenizer(settings: DataSettings, captions: list[str], tokenizer_dir, vocab_size):
  """The run's saved tokenizer, else data.tokenizer's: the captions' characters with PAD, BOS
  and EOS, a BPE trained on them, or a tokenizer.json; it must have an EOS token."""
  saved = tokenizer_lib.saved(tokenizer_dir) if tokenizer_dir else None
  text = settings.part(TextSettings)
  if saved is not None:
    tokenizer = saved
  elif text.tokenizer == 'chars':
    tokenizer = Vocab.seq2seq(''.join(sorted(set(''.join(captions)))))
  elif text.tokenizer == 'bpe':
    size = text.vocab_size or vocab_size
    if not size:
      raise ConfigError("data.tokenizer='bpe' trains a vocabulary of data.vocab_size ids: set "
                        '--config.data.vocab_size (or model.vocab_size).')
    tokenizer = tokenizer_lib.train_bpe(captions, size)
  else:
    tokenizer = tokenizer_lib.HFTokenizer.from_file(os.path.expanduser(text.tokenizer))
  if tokenizer.eos_id is None:
    raise ConfigError(f'The {tokenizer.kind} tokenizer has no EOS token to end each caption with:'
                      ' use one that has (</s>, <|endoftext|>, <eos>).')
  return tokenizer


def _synthetic(settings: DataSettings, size: int):
  """Generated images of caption_classes colours, each captioned by a template drawn for it."""
  classes = settings.part(ImageTextSettings).caption_classes
  count = settings.eval_examples
  splits, captions = [], []
  for key, examples in (((rng.GENERATE,), 9 * count), ((rng.HELD_OUT,), count)):
    source = images.synthetic_images(examples, size, classes, key)
    template = rng.generator(rng.TASK, *key).integers(0, len(TEMPLATES), size=examples)
    splits.append(source)
    captions.append([TEMPLATES[t].format(CLASS_NAMES[label])
                     for t, label in zip(template, source.labels)])
  return splits, captions, {'class_names': list(CLASS_NAMES[:classes])}


def _jsonl(settings: DataSettings):
  """Every record of data.path (training) and data.eval_path (held out; None: every tenth
  record of data.path)."""
  text, image_key = settings.part(TextSettings), settings.part(images.ImageSettings).image_key
  if not text.path:
    raise ConfigError('data.name="jsonl" reads image-text records from data.path: set it to a '
                      'JSONL file of {"image": path, "text": caption} lines.')

  def records(path):
    path = pathlib.Path(os.path.expanduser(path))
    if not path.is_file():
      raise ConfigError(f'data.path={path}: no such file; give a JSONL file of image-text records.')
    rows = [json.loads(line) for line in path.read_text(encoding='utf-8').splitlines() if line]
    missing = [key for key in (image_key, text.text_key) if rows and key not in rows[0]]
    if missing:
      raise ConfigError(f'{path}: the records have no {missing[0]!r} key: set data.image_key and '
                        f'data.text_key to the keys of the image path and the caption.')
    return [(str(path.parent / row[image_key]), row[text.text_key]) for row in rows]

  train = records(text.path)
  held_out = records(text.eval_path) if text.eval_path else train[::10]
  if not text.eval_path:
    train = [pair for i, pair in enumerate(train) if i % 10]
  splits = [_ImageFiles([path for path, _ in pairs]) for pairs in (train, held_out)]
  return splits, [[caption for _, caption in pairs] for pairs in (train, held_out)], {}


def make_image_text_task(settings: DataSettings, seed: int, tokenizer_dir=None, *,
                         image_size=None, text_len=None, vocab_size=None, **unused):
  """The pairs of data.name ('synthetic' or 'jsonl') for a model of `image_size` images and
  `text_len` text positions."""
  del unused
  own = settings.part(ImageTextSettings)
  size, text_len = image_size or _SYNTHETIC_SIZE, text_len or settings.seq_len
  if settings.name == 'synthetic':
    splits, captions, extra = _synthetic(settings, size)
    scale = 'normalize({}, {})'.format(*images.channel_stats(splits[0].images))
    pp_train, pp_eval = image_preprocessing(settings.part(images.ImageSettings), size, scale)
  else:
    pp_train, pp_eval = image_preprocessing(settings.part(images.ImageSettings), size)
    splits, captions, extra = _jsonl(settings)
  tokenizer = _tokenizer(settings, captions[0], tokenizer_dir, vocab_size)
  ids = tuple(encode_captions(c, tokenizer, text_len, own.truncate_captions) for c in captions)
  info = {'image_shape': pp_train.output_shape() or (size, size, 3), 'vocab_size': tokenizer.size,
          'eos_id': tokenizer.eos_id, 'text_len': text_len, 'num_train_examples': len(splits[0]),
          'source': settings.name, **extra}
  return ImageTextTask(tuple(splits), ids, seed=seed, pp_train=pp_train, pp_eval=pp_eval,
                       tokenizer=tokenizer, info=info)


register_task(Task('image_text', make_image_text_task, ('synthetic', 'jsonl')))
