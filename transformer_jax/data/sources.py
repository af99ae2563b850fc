"""Finds, prepares and reads the datasets on disk, or says exactly how to provide them.

Every dataset is read with `tfds.data_source` (array_record, no TensorFlow). An image dataset is
any TFDS image-classification dataset prepared in the data dir: a stock one, or one a user
prepared with a builder of their own (TFDS reads it by name from the dir, without its code);
`open_image_dataset` gives its splits as random-access sources, decoded record by record by
whoever reads them. CIFAR-10 and TinyShakespeare are found in this order: a stock-prepared
dataset (`cifar10`, `tiny_shakespeare`) as it is; the project's own builders already prepared;
the own builder prepared from the manual dir or, where allowed, by download. Nothing else is
ever substituted: when all fail, DataNotFoundError says what to provide.
"""
import dataclasses
import difflib
import logging
import os
from typing import Any

from etils import epath
import numpy as np
import requests
import tensorflow_datasets as tfds

from transformer_jax.data import builders
from transformer_jax.errors import ConfigError, UserError

__all__ = [
    'AudioDataset', 'CIFAR10_HELP', 'CIFAR10_JPEG', 'CIFAR10_ORIGINAL', 'DataNotFoundError',
    'decode_utf8', 'ImageDataset', 'load_text_file', 'load_tiny_shakespeare',
    'open_audio_dataset', 'open_image_dataset', 'open_image_text_dataset', 'open_text_split',
    'prepare_cifar10', 'prepared_datasets', 'read_text', 'SHAKESPEARE', 'SHAKESPEARE_HELP',
    'text_features', 'translation_languages']

log = logging.getLogger(__name__)

CIFAR10_ORIGINAL = 'transformer_jax_cifar10/original'
CIFAR10_JPEG = 'transformer_jax_cifar10/jpeg_q75'
SHAKESPEARE = 'transformer_jax_tiny_shakespeare'

CIFAR10_HELP = f"""CIFAR-10 is not prepared in {{data_dir}} and could not be prepared.
Provide it by one of:
  * --config.data.manual_dir=DIR where DIR holds {builders.CIFAR10_BINARY} (the official archive,
    {builders.CIFAR10_URL});
  * --config.data.manual_dir=DIR where DIR holds train/<class>/NNNN.jpg and test/<class>/NNNN.jpg
    (classes {' '.join(builders.CIFAR10_CLASSES)}) or the archive {builders.CIFAR10_JPEG} of that
    layout (a JPEG q75 copy: about 2 to 3 points lower test accuracy);
  * --config.data.tfds_data_dir=DIR where `cifar10` is already prepared in array_record;
  * --config.data.download=True on a machine that reaches www.cs.toronto.edu."""

SHAKESPEARE_HELP = f"""TinyShakespeare is not prepared in {{data_dir}} and could not be prepared.
Provide it by one of:
  * --config.data.manual_dir=DIR where DIR holds {builders.SHAKESPEARE_FILE}
    ({builders.SHAKESPEARE_URL});
  * --config.data.tfds_data_dir=DIR where `tiny_shakespeare` is already prepared in array_record;
  * --config.data.download=True on a machine that reaches raw.githubusercontent.com;
  * or any UTF-8 file: --config.data.name=text_file --config.data.path=FILE."""


class DataNotFoundError(UserError, FileNotFoundError):
  """A dataset is neither prepared nor preparable; the message says how to provide it."""


def prepare_cifar10(data_dir, manual_dir, download: bool) -> str:
  """The TFDS name under which CIFAR-10 is prepared in `data_dir`, preparing it where needed."""
  binary = builders.find_cifar10_binary(manual_dir)
  jpeg = builders.find_cifar10_jpeg(manual_dir)
  recipes = [(CIFAR10_ORIGINAL, binary, builders.CIFAR10_URL)] if binary or download else []
  recipes += [(CIFAR10_JPEG, jpeg, None)] if jpeg else []
  name = _find_or_prepare(('cifar10', CIFAR10_ORIGINAL, CIFAR10_JPEG), recipes, data_dir,
                          manual_dir, CIFAR10_HELP)
  if name == CIFAR10_JPEG:
    log.warning('CIFAR-10 comes from a JPEG q75 copy (%s): not bit-exact, it costs about 2 to 3 '
                'points of test accuracy; say so wherever an accuracy on it is reported.', name)
  return name


def load_tiny_shakespeare(data_dir, manual_dir, download: bool) -> tuple[str, str]:
  """(train text, held-out text): TFDS's train split (the first 90%, 1,003,854 characters) and
  its validation + test splits, which together are the reference character LM's held-out text
  (the last 10%)."""
  local = builders.find_shakespeare(manual_dir)
  recipes = [(SHAKESPEARE, local, builders.SHAKESPEARE_URL)] if local or download else []
  name = _find_or_prepare(('tiny_shakespeare', SHAKESPEARE), recipes, data_dir, manual_dir,
                          SHAKESPEARE_HELP)
  train, validation, test = (read_text(name, split, data_dir)
                             for split in ('train', 'validation', 'test'))
  return train, validation + test


def load_text_file(path) -> tuple[str, str]:
  """(first 90%, rest) of the characters of a UTF-8 file: TinyShakespeare's split above."""
  if not path:
    raise ConfigError('data.name=text_file reads --config.data.path=FILE (any UTF-8 text file).')
  if not epath.Path(path).exists():
    raise DataNotFoundError(f'No file at --config.data.path={path}.')
  text = decode_utf8(epath.Path(path).read_bytes(), path)
  split = int(len(text) * 0.9)
  return text[:split], text[split:]


def decode_utf8(data: bytes, path, offset: int = 0) -> str:
  """`data`, the bytes of the file `path` from byte `offset` on, as text; a ConfigError naming
  the file, the offset of the first byte that is not UTF-8 and how to convert the file."""
  try:
    return data.decode('utf-8')
  except UnicodeDecodeError as error:
    raise ConfigError(
        f'{path} is not UTF-8 from byte {offset + error.start} on ({data[error.start]:#04x}: '
        f'{error.reason}). Convert the file to UTF-8 (from Latin-1, say: iconv -f LATIN1 -t UTF-8 '
        f'{path} > {path}.utf8) and read the converted one.') from None


def _find_or_prepare(prepared, recipes, data_dir, manual_dir, help_text) -> str:
  """The first name in `prepared` already prepared (readable by tfds.data_source), else the first
  of `recipes` (name, local source, url) that prepares: from its local source where there is
  one, else by download; an unreachable url moves on to the next recipe."""
  for name in prepared:
    if _is_prepared(name, data_dir):
      return name
  failures = []
  for name, local, url in recipes:
    unreachable = None if local else _unreachable(url)
    if unreachable:
      failures.append(f'  (the download for {name} failed: {unreachable})')
      continue
    _prepare(name, data_dir, manual_dir, source=local or url)
    return name
  raise DataNotFoundError('\n'.join([help_text.format(data_dir=data_dir or 'the TFDS data dir')]
                                    + failures))


def _unreachable(url: str) -> str | None:
  """Why `url` cannot be fetched, or None. One quick try: offline, TFDS's downloader would
  retry for minutes before failing."""
  try:
    requests.head(url, timeout=10, allow_redirects=True).raise_for_status()
  except requests.RequestException as error:
    return str(error)
  return None


def _is_prepared(name: str, data_dir) -> bool:
  builder = tfds.builder(name, data_dir=data_dir)
  if not builder.data_path.exists() or not builder.is_prepared():  # exists: no warning if absent
    return False
  if builder.info.available_file_formats() & set(tfds.core.FileFormat.with_random_access()):
    return True
  log.warning('%s is prepared in %s as %s, which tfds.data_source cannot read; skipping it. '
              'With TensorFlow, `tfds build %s --file_format=array_record` makes it readable.',
              name, builder.data_dir, builder.info.file_format.value, name)
  return False


def read_text(name: str, split: str, data_dir) -> str:
  source = tfds.data_source(name, split=split, data_dir=data_dir, download=False)
  return ''.join(example['text'].decode('utf-8') for example in source)


@dataclasses.dataclass(frozen=True)
class ImageDataset:
  """The two splits of an image-classification dataset as random-access sources (len() and
  [index] -> the record's features, decoded when read but for a PNG or JPEG image, left to the
  `decode` op), and its number of classes."""
  name: str
  train: Any
  held_out: Any
  num_classes: int
  splits: tuple[str, str]
  class_names: tuple[str, ...] = ()  # the ClassLabel's names, where it has them


def open_image_dataset(name: str, *, data_dir, manual_dir, train_split: str,
                       eval_split: str | None, image_key: str, label_key: str,
                       keys: dict[str, str] | None = None) -> ImageDataset:
  """The TFDS dataset `name` prepared in `data_dir` (prepared first from `manual_dir` where it
  is not yet), checked for its feature keys and splits; reads no record. An error names the
  config keys `keys` gives for 'name', 'train_split' and 'eval_split' (default data.*)."""
  keys = {'name': 'data.name', 'train_split': 'data.train_split',
          'eval_split': 'data.eval_split', **(keys or {})}
  builder = _builder(name, data_dir, keys['name'])
  if manual_dir and not builder.is_prepared():
    try:
      _prepare(name, data_dir, manual_dir, source=manual_dir)
    except ModuleNotFoundError as error:  # most stock builders prepare with TensorFlow
      raise DataNotFoundError(
          f'TFDS cannot prepare {name} from data.manual_dir={manual_dir} here: {error}. Install '
          f'TensorFlow, or prepare it on a machine with it: tfds build {name} --manual_dir='
          f'{manual_dir} --file_format=array_record.') from None
    builder = _builder(name, data_dir, keys['name'])
  eval_split = eval_split or next((s for s in ('test', 'validation') if s in builder.info.splits),
                                  'test')
  features = builder.info.features
  decoders = {image_key: tfds.decode.SkipDecoding()} if _is_encoded(features, image_key) else None
  train, held_out = (_split_source(builder, keys[key], split, data_dir, decoders)
                     for key, split in (('train_split', train_split), ('eval_split', eval_split)))
  for key, value, kind in (('image_key', image_key, tfds.features.Image),
                           ('label_key', label_key, tfds.features.ClassLabel)):
    if value not in features or not isinstance(features[value], kind):
      fitting = [k for k in features.keys() if isinstance(features[k], kind)]
      if not fitting:
        raise ConfigError(f'{keys["name"]}={name!r} has no {kind.__name__} feature (its '
                          f'features: {sorted(features.keys())}): give an image-classification '
                          'dataset.')
      raise ConfigError(f'data.{key}={value!r}: {name} has no {kind.__name__} feature of that '
                        f'name; its {kind.__name__} features: {fitting} (all: '
                        f'{sorted(features.keys())}).')
  return ImageDataset(name, train, held_out, features[label_key].num_classes,
                      (train_split, eval_split), tuple(features[label_key].names or ()))


def open_image_text_dataset(name: str, *, data_dir, train_split: str, eval_split: str | None,
                            image_key: str, text_key: str) -> ImageDataset:
  """The TFDS dataset `name` of images and captions prepared in `data_dir`, checked for its
  Image feature `image_key` and its Text feature `text_key`: a Text, a Sequence of Text, or a Text
  inside a Sequence of features, named by its path ('captions/text'). Reads no record."""
  builder = _builder(name, data_dir)
  features = builder.info.features
  texts = text_features(features)
  if text_key not in texts:
    raise ConfigError(f'data.text_key={text_key!r}: {name} has no Text feature of that name (its '
                      f'Text features: {texts}): set data.text_key to one, or caption each image '
                      "by its class name with data.captions='label'.")
  if image_key not in features or not isinstance(features[image_key], tfds.features.Image):
    raise ConfigError(f'data.image_key={image_key!r}: {name} has no Image feature of that name '
                      f'(all its features: {sorted(features.keys())}).')
  eval_split = eval_split or next((s for s in ('test', 'validation') if s in builder.info.splits),
                                  'test')
  decoders = {image_key: tfds.decode.SkipDecoding()} if _is_encoded(features, image_key) else None
  train, held_out = (_split_source(builder, key, split, data_dir, decoders)
                     for key, split in (('train_split', train_split), ('eval_split', eval_split)))
  return ImageDataset(name, train, held_out, 0, (train_split, eval_split))


def text_features(features, prefix: str = '') -> list[str]:
  """The paths of the Text features among `features`, through Sequences and nested dicts."""
  if isinstance(features, tfds.features.Text):
    return [prefix]
  if isinstance(features, tfds.features.Sequence):
    return text_features(features.feature, prefix)
  if isinstance(features, tfds.features.FeaturesDict):
    return [path for key in features.keys()
            for path in text_features(features[key], f'{prefix}/{key}' if prefix else key)]
  return []


def _is_encoded(features, image_key: str) -> bool:
  """Whether the records hold `image_key` as PNG or JPEG bytes of uint8 pixels: then they are
  read undecoded and decoded once, by the `decode` op (TFDS's decoding first costs more). RGB,
  grey and RGBA images come out as they did from TFDS's decoding; palette, bilevel and CMYK
  ones in their colours (TFDS's gave their indices, 0/1 or inks). Images of other dtypes stay
  TFDS's to decode."""
  feature = features[image_key] if image_key in features else None
  return isinstance(feature, tfds.features.Image) and feature.np_dtype == np.uint8


@dataclasses.dataclass(frozen=True)
class AudioDataset:
  """The two splits of a speech dataset as random-access sources (len() and [index] -> the
  record's features, its audio a NumPy waveform), the keys of its audio and its transcript, the
  audio's sample rate (None: unstated) and, where the transcript is a ClassLabel, its names."""
  name: str
  train: Any
  held_out: Any
  audio_key: str
  transcript_key: str
  sample_rate: int | None
  label_names: tuple[str, ...] | None
  splits: tuple[str, str]


def open_audio_dataset(name: str, *, data_dir, train_split: str, eval_split: str | None,
                       audio_key: str | None, transcript_key: str | None) -> AudioDataset:
  """The TFDS speech dataset `name` prepared in `data_dir`: its Audio feature `audio_key` and its
  Text or ClassLabel feature `transcript_key` (None: the dataset's only one of each kind, a Text
  before a ClassLabel); eval_split None: 'test' where it has one, else 'validation'. Reads no
  record."""
  _audio_without_tensorflow()
  try:
    builder = _builder(name, data_dir)
  except ModuleNotFoundError as error:  # a feature TFDS builds with TensorFlow alone
    raise DataNotFoundError(f'TFDS describes {name} with TensorFlow, which is not installed '
                            f'({error}): pip install tensorflow-cpu, or convert the dataset to an '
                            'audiofolder (data.name=audiofolder).') from None
  features = builder.info.features
  audio_key = _feature_key(name, features, audio_key, 'audio_key', (tfds.features.Audio,))
  transcript_key = _feature_key(name, features, transcript_key, 'transcript_key',
                                (tfds.features.Text, tfds.features.ClassLabel))
  eval_split = eval_split or next((s for s in ('test', 'validation') if s in builder.info.splits),
                                  'test')
  train, held_out = (_split_source(builder, key, split, data_dir)
                     for key, split in (('train_split', train_split), ('eval_split', eval_split)))
  label = features[transcript_key]
  names = tuple(label.names) if isinstance(label, tfds.features.ClassLabel) else None
  return AudioDataset(name, train, held_out, audio_key, transcript_key,
                      features[audio_key].sample_rate, names, (train_split, eval_split))


def _feature_key(name: str, features, key: str | None, setting: str, kinds: tuple) -> str:
  """`key`, checked to be a feature of one of `kinds`; None: the only feature of the first kind
  the dataset has one of."""
  if key is not None:
    if key in features and isinstance(features[key], kinds):
      return key
  else:
    for kind in kinds:
      found = [k for k in features.keys() if isinstance(features[k], kind)]
      if len(found) == 1:
        return found[0]
  fitting = [k for k in features.keys() if isinstance(features[k], kinds)]
  wanted = ' or '.join(kind.__name__ for kind in kinds)
  which = 'of that name' if key is not None else 'alone (None picks the only one)'
  raise ConfigError(f'data.{setting}={key!r}: {name} has no {wanted} feature {which}; set '
                    f'data.{setting} to one of {fitting} (all: {sorted(features.keys())}).')


def _audio_without_tensorflow() -> None:
  """TFDS 4.9's Audio feature asks TensorFlow for its dtype's name when it is built (to describe
  a dataset, before any record is read), though a record of a non-lazy Audio feature is a NumPy
  array that NumPy decodes: where TensorFlow is not installed, the decoder keeps NumPy's dtype."""
  try:
    import tensorflow  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
    return
  except ImportError:
    pass
  from tensorflow_datasets.core.features import audio_feature  # pylint: disable=import-outside-toplevel

  def numpy_init(decoder, file_format, np_dtype, shape):
    decoder._file_format, decoder._np_dtype, decoder._dtype = file_format, np_dtype, np_dtype
    decoder._shape, decoder._channels = shape, shape[1] if len(shape) > 1 else 1

  audio_feature._AudioDecoder.__init__ = numpy_init


def open_text_split(name: str, *, data_dir, key: str, split: str | None, text_key: str):
  """(random-access source, identity) of a split of the TFDS dataset `name` prepared in
  `data_dir`, checked for its Text feature `text_key`; split None: 'test' where the dataset has
  one, else 'validation'. The identity (data dir, split, version) changes with the records.
  Reads no record."""
  builder = _builder(name, data_dir)
  split = split or next((s for s in ('test', 'validation') if s in builder.info.splits), 'test')
  source = _split_source(builder, key, split, data_dir)
  features = builder.info.features
  if text_key not in features or not isinstance(features[text_key], tfds.features.Text):
    texts = [k for k in features.keys() if isinstance(features[k], tfds.features.Text)]
    raise ConfigError(f'data.text_key={text_key!r}: {name} has no Text feature of that name; its '
                      f'Text features: {texts} (all: {sorted(features.keys())}).')
  return source, {'data_dir': os.path.abspath(builder.data_dir), 'split': split,
                  'version': str(builder.info.version), 'text_key': text_key}


def class_names(name: str, data_dir, label_key: str) -> list[str]:
  """The class names of the ClassLabel feature `label_key` of the TFDS dataset `name`. Reads no
  record."""
  features = _builder(name, data_dir).info.features
  if label_key not in features or not isinstance(features[label_key], tfds.features.ClassLabel):
    labels = [k for k in features.keys() if isinstance(features[k], tfds.features.ClassLabel)]
    raise ConfigError(f'data.label_key={label_key!r}: {name} has no ClassLabel feature of that '
                      f'name; its ClassLabel features: {labels}.')
  return list(features[label_key].names)


def translation_languages(name: str, data_dir) -> tuple[str, ...] | None:
  """The languages of the Translation feature of the TFDS dataset `name` (its records: one text
  per language); None where its features are not a Translation. Reads no record."""
  features = _builder(name, data_dir).info.features
  if not isinstance(features, tfds.features.Translation):
    return None
  return tuple(features.languages)


def prepared_datasets(data_dir) -> list[str]:
  """The names of the datasets prepared in `data_dir` (each with a dataset_info.json)."""
  root = epath.Path(data_dir or tfds.core.constants.DATA_DIR)
  if not root.is_dir():
    return []
  return sorted({info.relative_to(root).parts[0] for pattern in ('*/*/dataset_info.json',
                                                                 '*/*/*/dataset_info.json')
                 for info in root.glob(pattern)})


def _builder(name: str, data_dir, key: str = 'data.name'):
  try:
    return tfds.builder(name, data_dir=data_dir)
  except tfds.core.registered.DatasetNotFoundError:
    prepared = prepared_datasets(data_dir)
    known = prepared + tfds.list_builders(with_community_datasets=False)
    near = difflib.get_close_matches(name, known, n=1)
    raise DataNotFoundError(
        f'{key}={name!r} is neither prepared in {_shown(data_dir)} (prepared there: '
        f'{prepared}) nor a TFDS dataset{f"; did you mean {near[0]!r}?" if near else "."}'
    ) from None


def _split_source(builder, key: str, split: str, data_dir, decoders=None):
  """The split's data source; `key`, the config key naming the split ('train_split': data's)."""
  key = key if '.' in key else f'data.{key}'
  try:
    return builder.as_data_source(split=split, decoders=decoders)
  except ValueError as error:  # TFDS: "Unknown split 'x'. Should be one of [...]."
    splits = {s: info.num_examples for s, info in builder.info.splits.items()}
    raise ConfigError(f'{key}={split!r}: {error} The splits of {builder.name}: {splits}; '
                      "a slice such as 'train[98%:]' holds out part of one.") from None
  except (AssertionError, NotImplementedError, FileNotFoundError):
    if builder.is_prepared():
      raise DataNotFoundError(
          f'{builder.name} is prepared in {builder.data_dir} as {builder.info.file_format.value},'
          ' which tfds.data_source cannot read: with TensorFlow, `tfds build '
          f'{builder.name} --file_format=array_record` makes it readable.') from None
    raise DataNotFoundError(
        f'{builder.name} is not prepared in {_shown(data_dir)} (prepared there: '
        f'{prepared_datasets(data_dir)}): set --config.data.tfds_data_dir to where it is, '
        '--config.data.manual_dir to its downloaded files where TFDS prepares it from them, or '
        f'prepare it with TensorFlow: tfds build {builder.name} --file_format=array_record'
        f'{f" --data_dir={data_dir}" if data_dir else ""}.') from None


def _shown(data_dir) -> str:
  return data_dir or f'{tfds.core.constants.DATA_DIR} (TFDS\'s default data dir)'


def _prepare(name: str, data_dir, manual_dir, source) -> None:
  log.info('Preparing %s from %s into %s.', name, source, _shown(data_dir))
  tfds.disable_progress_bar()
  tfds.builder(name, data_dir=data_dir, file_format='array_record').download_and_prepare(
      download_config=tfds.download.DownloadConfig(manual_dir=manual_dir, try_download_gcs=False))
