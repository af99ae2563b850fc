"""Image-text pairs for dual encoders (models.clip): {'image': float32 (b, H, W, C), 'text': int32
(b, T) caption ids, 'label': int32 (b,), -1 where the data names no class}.

Sources (data.name):
- 'synthetic': generated images of data.caption_classes colours, captioned by class name;
- 'jsonl': a JSONL file of {"image": path, "text": caption} records (paths relative to the file;
  the keys are data.image_key and data.text_key; a record's text may be a list of captions),
  every record checked when the file is opened (JSON, keys, captions, the image file's
  existence), an image that does not decode named by its path and line when it is read;
- any other name, a TFDS dataset: with data.captions='text' its Image feature data.image_key and
  Text feature data.text_key (a Text, a Sequence of Text, or a Text inside a Sequence of
  features, named by its path: 'captions/text' for coco_captions); with data.captions='label'
  an image-classification dataset, each image captioned by its ClassLabel data.label_key's name
  ('cifar10' prepared as the image task prepares it).
Captions by class name are every template of data.caption_templates filled with the name. A
record may have several captions: training example k takes one of them, drawn with numbers keyed
by (seed, k), so that a batch is a pure function of (seed, step); a held-out pair is its record's
first caption, and retrieval (`embedding_metrics`) scores all of them.

Images go through the image task's preprocessing (data.pp_train / data.pp_eval, or the default to
model.image_size); captions through the text data's tokenizers (data.tokenizer: 'chars' or 'bpe'
built from the training captions, the first 1,024 records' of a TFDS dataset, or a
tokenizer.json), each as [BOS] ids EOS, padded to the text tower's positions, as they are read: a
caption too long for them fails in the batch that reads it (the first batch is read before
anything compiles).
"""
import dataclasses
import os
import pathlib
from typing import Any, Callable

import numpy as np
from PIL import Image, UnidentifiedImageError

from transformer_jax.data import corpus, image_text_eval, images, preprocess, rng, sources
from transformer_jax.data import tokenizer as tokenizer_lib
from transformer_jax.data.corpus import TextSettings
from transformer_jax.data.pipeline import Task, image_preprocessing, register_task
from transformer_jax.data.settings import DataPart, DataSettings, register_part
from transformer_jax.settings import check_templates
from transformer_jax.data.vocab import Vocab
from transformer_jax.errors import ConfigError, UserError
from transformer_jax.ranges import COUNT

__all__ = ['CLASS_NAMES', 'encode_captions', 'ImageTextSettings', 'ImageTextTask', 'PairSplit',
           'TEMPLATES']

# The classes and caption templates of generated pairs.
CLASS_NAMES = ('apple', 'boat', 'cloud', 'desk', 'eagle', 'fern', 'goat', 'harp', 'igloo',
               'jelly', 'kite', 'lamp', 'moth', 'nest', 'owl', 'pear')
TEMPLATES = ('a photo of a {}.', 'a {} in the picture.', 'this is a {}', 'my {}.',
             'a blurry photo of the {}.')
_SYNTHETIC_SIZE = 32  # the side of generated images for a model that states none
_ASCII = ''.join(map(chr, range(32, 127)))  # always in a character vocabulary
_TOKENIZER_RECORDS = 1024  # the training records of a TFDS dataset a vocabulary is built from
_DECODE = preprocess.Decode()  # a JSONL's image files, as they are read


@register_part
@dataclasses.dataclass(frozen=True)
class ImageTextSettings(DataPart):
  """The keys of config.data that image-text pairs read (beside the image and text parts')."""
  PART = 'image_text'
  # A caption longer than the text tower's positions is cut to them (keeping its EOS); False:
  # refused, naming the caption.
  truncate_captions: bool = True
  caption_classes: int = 10  # synthetic: the classes of the generated pairs
  # A TFDS dataset's captions: 'text', its Text feature data.text_key; 'label', each of
  # caption_templates filled with the name of the image's class (data.label_key).
  captions: str = 'text'
  caption_templates: tuple[str, ...] = TEMPLATES  # each with one '{}' for the class name

  RANGES = {'caption_classes': COUNT}
  CHOICES = {'captions': ('text', 'label')}

  def check(self) -> None:
    super().check()
    if self.caption_classes > len(CLASS_NAMES):
      raise ConfigError(f'data.caption_classes={self.caption_classes}: generated pairs have at '
                        f'most {len(CLASS_NAMES)} classes; lower it.')
    check_templates(self.caption_templates, 'data.caption_templates')


def class_captions(class_names, templates) -> list[str]:
  """Every template filled with every class name, class by class: (C * P) captions."""
  return [template.format(name) for name in class_names for template in templates]


@dataclasses.dataclass(frozen=True)
class PairSplit:
  """One split's images and captions: `source` read by index like a TFDS data source (len,
  __getitems__), `captions` a record's captions (at least one), `label` its class (-1: none)."""
  source: Any
  captions: Callable[[dict], list[str]]
  label: Callable[[dict], int] = lambda record: -1
  image_key: str = 'image'

  def __len__(self) -> int:
    return len(self.source)

  def read(self, indices: list[int]) -> tuple[list, np.ndarray, list[list[str]]]:
    """(encoded or decoded images, int32 labels, captions) of the records `indices`."""
    records = self.source.__getitems__(indices)
    captions = [self.captions(record) for record in records]
    for index, options in zip(indices, captions):
      if not options:
        raise UserError(f'Record {index} of the image-text data has no caption: drop it, or '
                        'caption it.')
    return ([record[self.image_key] for record in records],
            np.array([self.label(record) for record in records], np.int32), captions)


class ImageTextTask:
  """Training batches of shuffled pairs, a pure function of (seed, step), and held-out pairs by
  index, from two PairSplits; `embedding_metrics` scores a model's embeddings (retrieval on the
  held-out pairs with `retrieval`, zero-shot classification where config.eval asks)."""

  def __init__(self, splits: tuple[PairSplit, PairSplit], *, seed: int, pp_train, pp_eval,
               tokenizer, text_len: int, truncate: bool, retrieval: bool, settings: DataSettings,
               info: dict):
    self.train, self.held_out = splits
    self.seed, self.pp_train, self.pp_eval = seed, pp_train, pp_eval
    self.vocab, self.text_len, self.truncate = tokenizer, text_len, truncate
    self.retrieval, self.settings = retrieval, settings
    self.num_eval_examples = len(self.held_out)
    self.info = info
    self._zero_shot = {}

  def encode(self, captions: list[str]) -> np.ndarray:
    return encode_captions(captions, self.vocab, self.text_len, self.truncate)

  def train_batch(self, step: int, batch_size: int, rows: slice) -> dict:
    ks = [step * batch_size + row for row in range(batch_size)[rows]]
    records = rng.shuffled(self.seed, step, batch_size, rows, len(self.train))
    pictures, labels, captions = self.train.read(records)
    chosen = [options[rng.generator(rng.CAPTIONS, self.seed, k).integers(len(options))]
              if len(options) > 1 else options[0] for options, k in zip(captions, ks)]
    return self._pairs(pictures, labels, chosen, self.pp_train,
                       [(rng.AUGMENT, self.seed, k) for k in ks])

  def eval_examples(self, indices: np.ndarray) -> dict:
    indices = [int(index) for index in indices]
    pictures, labels, captions = self.held_out.read(indices)
    return self._pairs(pictures, labels, [options[0] for options in captions], self.pp_eval,
                       [(rng.HELD_OUT, index) for index in indices])

  def _pairs(self, pictures, labels, captions, pp, keys) -> dict:
    images_ = [pp(picture, rng.generator(*key) if pp.is_random else None)
               for picture, key in zip(pictures, keys)]
    return {'image': np.stack(images_), 'text': self.encode(captions), 'label': labels}

  def embedding_metrics(self, embed, batch_size: int, evaluation) -> dict:
    """eval_retrieval_{i2t,t2i}_r{1,5} over every held-out pair (with `retrieval`) and, where
    evaluation.zero_shot_dataset is set, eval_zero_shot_accuracy and eval_zero_shot_top5;
    embed(method, inputs) -> (n, D) runs the model's 'embed_images' or 'embed_texts' on at most
    `batch_size` rows."""
    results = {}
    if self.retrieval:
      results |= self._retrieval(embed, batch_size)
    if evaluation.zero_shot_dataset:
      results |= self._zero_shot_metrics(embed, batch_size, evaluation)
    return results

  def check_evaluation(self, evaluation) -> None:
    """Opens evaluation.zero_shot_dataset's split as the first evaluation will (reading no
    record), so that a dataset TFDS does not know or has not prepared, a split it lacks, one
    without a ClassLabel, or zero_shot_classes of another count fail before anything compiles."""
    if evaluation.zero_shot_dataset:
      self._zero_shot_dataset(evaluation)

  def _embed_images(self, embed, batch_size: int, read, count: int) -> tuple[np.ndarray, list]:
    """(image embeddings, the read batches' other outputs) of records 0..count-1 of a split,
    read(indices) -> (encoded images, anything)."""
    embedded, extras = [], []
    for start in range(0, count, batch_size):
      indices = list(range(start, min(start + batch_size, count)))
      pictures, extra = read(indices)
      batch = np.stack([self.pp_eval(picture, None) for picture in pictures])
      embedded.append(embed('embed_images', batch))
      extras.append(extra)
    return np.concatenate(embedded), extras

  def _embed_texts(self, embed, batch_size: int, captions: list[str]) -> np.ndarray:
    return np.concatenate([embed('embed_texts', self.encode(captions[start:start + batch_size]))
                           for start in range(0, len(captions), batch_size)])

  def _retrieval(self, embed, batch_size: int) -> dict:
    def read(indices):
      pictures, _, captions = self.held_out.read(indices)
      return pictures, captions
    image_embeddings, batches = self._embed_images(embed, batch_size, read, len(self.held_out))
    per_image = [options for captions in batches for options in captions]
    owners = np.repeat(np.arange(len(per_image)), [len(options) for options in per_image])
    texts = self._embed_texts(embed, batch_size, [c for options in per_image for c in options])
    recalls = image_text_eval.retrieval_recalls(image_embeddings, texts, owners)
    return {f'eval_retrieval_{name}': value for name, value in recalls.items()}

  def _zero_shot_metrics(self, embed, batch_size: int, evaluation) -> dict:
    dataset, class_names = self._zero_shot_dataset(evaluation)
    templates = evaluation.zero_shot_templates
    prompts = self._embed_texts(embed, batch_size, class_captions(class_names, templates))
    classes = image_text_eval.class_embeddings(prompts, len(class_names))
    image_key, label_key = self._image_keys()
    count = min(len(dataset), evaluation.zero_shot_examples or len(dataset))

    def read(indices):
      records = dataset.__getitems__(indices)
      return [r[image_key] for r in records], [int(r[label_key]) for r in records]
    image_embeddings, labels = self._embed_images(embed, batch_size, read, count)
    accuracy = image_text_eval.top_k_accuracies(image_embeddings, classes,
                                                np.concatenate(labels).astype(np.int64))
    return {'eval_zero_shot_accuracy': accuracy[1], 'eval_zero_shot_top5': accuracy[5]}

  def _image_keys(self) -> tuple[str, str]:
    own = self.settings.part(images.ImageSettings)
    return own.image_key, own.label_key

  def _zero_shot_dataset(self, evaluation):
    """(the split's records, its class names) of evaluation.zero_shot_dataset, opened once."""
    key = (evaluation.zero_shot_dataset, evaluation.zero_shot_split,
           tuple(evaluation.zero_shot_classes))
    if key not in self._zero_shot:
      split = 'eval.zero_shot_split'
      dataset = _classification_dataset(
          self.settings, evaluation.zero_shot_dataset, evaluation.zero_shot_split,
          evaluation.zero_shot_split,
          {'name': 'eval.zero_shot_dataset', 'train_split': split, 'eval_split': split})
      names = tuple(evaluation.zero_shot_classes) or dataset.class_names
      if len(names) != dataset.num_classes:
        raise ConfigError(f'eval.zero_shot_classes names {len(names)} classes but '
                          f'{dataset.name} has {dataset.num_classes}: give one name per class, '
                          'in the order of its labels.')
      self._zero_shot[key] = (dataset.held_out, [n.replace('_', ' ') for n in names])
    return self._zero_shot[key]


def _classification_dataset(settings: DataSettings, name: str, train_split: str,
                            eval_split: str | None, keys: dict[str, str] | None = None
                            ) -> sources.ImageDataset:
  """A TFDS image-classification dataset ('cifar10' found or prepared as the image task
  does); `keys`: sources.open_image_dataset's."""
  own = settings.part(images.ImageSettings)
  if name == 'cifar10':
    name = sources.prepare_cifar10(settings.tfds_data_dir, settings.manual_dir, settings.download)
  return sources.open_image_dataset(name, data_dir=settings.tfds_data_dir,
                                    manual_dir=settings.manual_dir, train_split=train_split,
                                    eval_split=eval_split, image_key=own.image_key,
                                    label_key=own.label_key, keys=keys)


class _ImageFiles:
  """The image files and captions of a JSONL's records, read by index: each image decoded (as
  the preprocessing's decode does), a file that cannot be read or decoded named with its record's
  line."""

  def __init__(self, jsonl: pathlib.Path, pairs: list[tuple[str, list[str], int]]):
    self.jsonl, self.pairs = jsonl, pairs  # (image path, captions, line number)

  def __len__(self) -> int:
    return len(self.pairs)

  def __getitems__(self, indices: list[int]) -> list[dict]:
    records = []
    for i in indices:
      path, captions, line = self.pairs[i]
      records.append({'image': self._image(path, line), 'captions': captions})
    return records

  def _image(self, path: str, line: int) -> np.ndarray:
    where = f'{self.jsonl}:{line}: the image {path}'
    try:
      data = pathlib.Path(path).read_bytes()
    except OSError as error:
      raise UserError(f'{where} cannot be read ({error.strerror}): restore it, or drop the '
                      'line.') from None
    try:
      return _DECODE(data, None)
    except (OSError, Image.DecompressionBombError) as error:  # Pillow's: bytes it cannot decode
      reason = ('not a format Pillow reads' if isinstance(error, UnidentifiedImageError)
                else str(error))
      raise UserError(f'{where} does not decode ({reason}): replace it with an image file '
                      '(PNG, JPEG, ...), or drop the line.') from None


def encode_captions(captions: list[str], tokenizer, length: int, truncate: bool) -> np.ndarray:
  """int32 (N, length): each caption as [BOS] ids EOS (the tokenizer's own, BOS where it has
  one: CLIP's <|startoftext|> caption <|endoftext|>, BERT's [CLS] caption [SEP]), then the pad id
  (EOS where the tokenizer has none). A caption longer than `length` is cut to length - 1 ids and
  its EOS, or with `truncate` off refused."""
  eos, bos = tokenizer.eos_id, tokenizer.bos_id
  pad = eos if tokenizer.pad_id is None else tokenizer.pad_id
  out = np.full((len(captions), length), pad, np.int32)
  for row, caption in enumerate(captions):
    try:
      ids = tokenizer.encode(caption)
    except ValueError as error:  # a character vocabulary's unknown character
      raise ConfigError(f'Caption {caption[:40]!r}: {error} Use a tokenizer that covers them: '
                        "data.tokenizer='bpe' (bytes) or a tokenizer.json.") from None
    ids = ([] if bos is None else [bos]) + ids + [eos]
    if len(ids) > length:
      if not truncate:
        raise ConfigError(f'Caption {row} ({caption[:40]!r}...) is {len(ids)} tokens, more than '
                          f'the text tower\'s model.max_len={length} positions: set '
                          'data.truncate_captions=True or raise model.max_len.')
      ids = ids[:length - 1] + [eos]
    out[row, :len(ids)] = ids
  return out


def _tokenizer(settings: DataSettings, captions: list[str], tokenizer_dir, vocab_size):
  """The run's saved tokenizer, else data.tokenizer's: PAD, BOS, EOS, printable ASCII and the
  captions' other characters (so that prompts made later, as zero-shot's, encode); a BPE trained
  on the captions; or a tokenizer.json. It must have an EOS token."""
  saved = tokenizer_lib.saved(tokenizer_dir) if tokenizer_dir else None
  text = settings.part(TextSettings)
  if saved is not None:
    tokenizer = saved
  elif text.tokenizer == 'chars':
    tokenizer = Vocab.seq2seq(''.join(sorted(set(_ASCII + ''.join(captions)))))
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
  """Generated images of caption_classes colours, captioned by class name."""
  own = settings.part(ImageTextSettings)
  names = CLASS_NAMES[:own.caption_classes]
  by_class = _by_class(names, own.caption_templates)
  splits = tuple(PairSplit(images.synthetic_images(examples, size, len(names), key),
                           lambda record: by_class[record['label']], lambda record: record['label'])
                 for key, examples in (((rng.GENERATE,), 9 * settings.eval_examples),
                                       ((rng.HELD_OUT,), settings.eval_examples)))
  return splits, class_captions(names, own.caption_templates), {'class_names': list(names)}


def _by_class(class_names, templates) -> list[list[str]]:
  return [[template.format(name) for template in templates] for name in class_names]


def _jsonl(settings: DataSettings):
  """Every record of data.path (training) and data.eval_path (held out; None: every tenth
  record of data.path), each checked as the file is opened (_checked_pairs)."""
  text, image_key = settings.part(TextSettings), settings.part(images.ImageSettings).image_key
  if not text.path:
    raise ConfigError('data.name="jsonl" reads image-text records from data.path: set it to a '
                      'JSONL file of {"image": path, "text": caption} lines.')

  def opened(key: str) -> _ImageFiles:
    path = pathlib.Path(os.path.expanduser(getattr(text, key)))
    if not path.is_file():
      raise ConfigError(f'data.{key}={path}: no such file; give a JSONL file of image-text '
                        'records.')
    return _ImageFiles(path, _checked_pairs(path, image_key, text.text_key))

  train = opened('path')
  if text.eval_path:
    held_out = opened('eval_path')
  else:
    train, held_out = (_ImageFiles(train.jsonl, [pair for i, pair in enumerate(train.pairs)
                                                 if (i % 10 == 0) == held])
                       for held in (False, True))
  splits = tuple(PairSplit(files, lambda record: record['captions'])
                 for files in (train, held_out))
  return splits, [c for _, captions, _ in train.pairs for c in captions], {}


def _checked_pairs(path: pathlib.Path, image_key: str,
                   text_key: str) -> list[tuple[str, list[str], int]]:
  """(image path, captions, line number) of each record of the JSONL `path`, every one checked
  as the file is read: JSON, an image path under data.image_key naming a file (relative to the
  JSONL's folder), a caption or a non-empty list of them under data.text_key. A bad record is a
  ConfigError naming the file, the line and the fix."""
  folder, pairs = str(path.parent), []
  for number, record in corpus.jsonl_records(path):
    image, captions = record.get(image_key), record.get(text_key)
    if not isinstance(image, str):
      raise corpus.field_error(path, number, record, 'image path', 'image_key', image_key)
    captions = [captions] if isinstance(captions, str) else captions
    if not isinstance(captions, list) or not all(isinstance(c, str) for c in captions):
      raise corpus.field_error(path, number, record, 'caption', 'text_key', text_key,
                               'a string or a list of strings')
    if not captions:
      raise ConfigError(f'{path}:{number} has an empty list of captions under '
                        f'data.text_key={text_key!r}: caption its image, or drop the line.')
    file = os.path.join(folder, image)
    if not os.path.isfile(file):
      raise ConfigError(f'{path}:{number}: the image {file} does not exist: fix the path (a '
                        "relative one is from the JSONL's folder), or drop the line.")
    pairs.append((file, captions, number))
  if not pairs:
    raise ConfigError(f'{path} holds no records: give a JSONL file of {{"{image_key}": path, '
                      f'"{text_key}": caption}} lines.')
  return pairs


def _labelled(settings: DataSettings):
  """A TFDS image-classification dataset, each image captioned by its class's name."""
  own = settings.part(ImageTextSettings)
  dataset = _classification_dataset(settings, settings.name, settings.train_split,
                                    settings.eval_split)
  names = [name.replace('_', ' ') for name in dataset.class_names] or [
      str(label) for label in range(dataset.num_classes)]
  by_class = _by_class(names, own.caption_templates)
  image_key, label_key = (settings.part(images.ImageSettings).image_key,
                          settings.part(images.ImageSettings).label_key)
  splits = tuple(PairSplit(source, lambda record: by_class[int(record[label_key])],
                           lambda record: int(record[label_key]), image_key)
                 for source in (dataset.train, dataset.held_out))
  return splits, class_captions(names, own.caption_templates), {
      'class_names': names, 'source': dataset.name, 'splits': dataset.splits}


def _captioned(settings: DataSettings):
  """A TFDS dataset of images and captions (data.text_key, a path through nested features)."""
  image_key = settings.part(images.ImageSettings).image_key
  text_key = settings.part(TextSettings).text_key
  dataset = sources.open_image_text_dataset(
      settings.name, data_dir=settings.tfds_data_dir, train_split=settings.train_split,
      eval_split=settings.eval_split, image_key=image_key, text_key=text_key)
  captions = lambda record: _texts_at(record, text_key)
  splits = tuple(PairSplit(source, captions, image_key=image_key)
                 for source in (dataset.train, dataset.held_out))
  first = list(range(min(len(splits[0]), _TOKENIZER_RECORDS)))
  return splits, [c for options in splits[0].read(first)[2] for c in options], {
      'source': dataset.name, 'splits': dataset.splits}


def _texts_at(record: dict, path: str) -> list[str]:
  """The text (one, or a list) at a '/'-separated path of a record, as strings."""
  value = record
  for key in path.split('/'):
    value = value[key]
  values = list(value) if isinstance(value, list) or np.ndim(value) else [value]
  as_text = lambda v: v.item() if isinstance(v, np.ndarray) else v
  return [t.decode('utf-8') if isinstance(t, bytes) else str(t) for t in map(as_text, values)]


def make_image_text_task(settings: DataSettings, seed: int, tokenizer_dir=None, *,
                         image_size=None, text_len=None, vocab_size=None, **unused):
  """The pairs of data.name ('synthetic', 'jsonl' or a TFDS dataset) for a model of
  `image_size` images and `text_len` text positions."""
  del unused
  own = settings.part(ImageTextSettings)
  size, text_len = image_size or _SYNTHETIC_SIZE, text_len or settings.seq_len
  image_settings = settings.part(images.ImageSettings)
  if settings.name == 'synthetic':
    splits, captions, extra = _synthetic(settings, size)
    scale = 'normalize({}, {})'.format(*images.channel_stats(splits[0].source.images))
    pp_train, pp_eval = image_preprocessing(image_settings, size, scale)
  else:
    pp_train, pp_eval = image_preprocessing(image_settings, size)
    make = {'jsonl': _jsonl}.get(settings.name) or (
        _labelled if own.captions == 'label' else _captioned)
    splits, captions, extra = make(settings)
  tokenizer = _tokenizer(settings, captions, tokenizer_dir, vocab_size)
  info = {'image_shape': pp_train.output_shape() or (size, size, 3), 'vocab_size': tokenizer.size,
          'eos_id': tokenizer.eos_id, 'text_len': text_len, 'num_train_examples': len(splits[0]),
          'source': settings.name, **extra}
  # Retrieval among captions that only name a class would score ties.
  captioned = settings.name == 'jsonl' or (settings.name != 'synthetic' and own.captions == 'text')
  return ImageTextTask(splits, seed=seed, pp_train=pp_train, pp_eval=pp_eval,
                       tokenizer=tokenizer, text_len=text_len, truncate=own.truncate_captions,
                       retrieval=captioned, settings=settings, info=info)


register_task(Task('image_text', make_image_text_task, ('synthetic', 'jsonl', 'cifar10')))
