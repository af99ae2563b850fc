"""Finds, prepares and reads the datasets on disk, or says exactly how to provide them.

CIFAR-10 and TinyShakespeare are read with `tfds.data_source` (array_record, no TensorFlow), in
this order: a stock-prepared dataset (`cifar10`, `tiny_shakespeare`) as it is; the project's own
builders already prepared; the own builder prepared from the manual dir or, where allowed, by
download. Nothing else is ever substituted: when all fail, DataNotFoundError says what to provide.
"""
import logging

from etils import epath
import numpy as np
import requests
import tensorflow_datasets as tfds

from transformer_jax.data import builders
from transformer_jax.errors import ConfigError, UserError

__all__ = [
    'CIFAR10_HELP', 'CIFAR10_JPEG', 'CIFAR10_ORIGINAL', 'DataNotFoundError', 'load_cifar10',
    'load_text_file', 'load_tiny_shakespeare', 'read_images', 'read_text', 'SHAKESPEARE',
    'SHAKESPEARE_HELP']

log = logging.getLogger(__name__)

CIFAR10_ORIGINAL = 'transformer_jax_cifar10/original'
CIFAR10_JPEG = 'transformer_jax_cifar10/jpeg_q75'
SHAKESPEARE = 'transformer_jax_tiny_shakespeare'
_CHUNK = 5000  # examples decoded per read

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


def load_cifar10(data_dir, manual_dir, download: bool) -> dict:
  """{'train': (images, labels), 'test': (images, labels), 'source': TFDS name}: uint8
  (N, 32, 32, 3) images and int32 labels, decoded into memory once."""
  binary = builders.find_cifar10_binary(manual_dir)
  jpeg = builders.find_cifar10_jpeg(manual_dir)
  recipes = [(CIFAR10_ORIGINAL, binary, builders.CIFAR10_URL)] if binary or download else []
  recipes += [(CIFAR10_JPEG, jpeg, None)] if jpeg else []
  name = _find_or_prepare(('cifar10', CIFAR10_ORIGINAL, CIFAR10_JPEG), recipes, data_dir,
                          manual_dir, CIFAR10_HELP)
  if name == CIFAR10_JPEG:
    log.warning('CIFAR-10 comes from a JPEG q75 copy (%s): not bit-exact, it costs about 2 to 3 '
                'points of test accuracy; say so wherever an accuracy on it is reported.', name)
  return {'source': name, **{split: read_images(name, split, data_dir)
                             for split in builders.SPLITS}}


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
  text = epath.Path(path).read_bytes().decode('utf-8')
  split = int(len(text) * 0.9)
  return text[:split], text[split:]


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
    log.info('Preparing %s from %s into %s.', name, local or url, data_dir or 'the TFDS data dir')
    tfds.disable_progress_bar()
    tfds.builder(name, data_dir=data_dir, file_format='array_record').download_and_prepare(
        download_config=tfds.download.DownloadConfig(manual_dir=manual_dir,
                                                     try_download_gcs=False))
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


def read_images(name: str, split: str, data_dir) -> tuple[np.ndarray, np.ndarray]:
  source = tfds.data_source(name, split=split, data_dir=data_dir, download=False)
  images, labels = [], []
  for start in range(0, len(source), _CHUNK):
    examples = source.__getitems__(range(start, min(start + _CHUNK, len(source))))
    images.append(np.stack([example['image'] for example in examples]))
    labels.append(np.array([example['label'] for example in examples], np.int32))
  return np.concatenate(images), np.concatenate(labels)


def read_text(name: str, split: str, data_dir) -> str:
  source = tfds.data_source(name, split=split, data_dir=data_dir, download=False)
  return ''.join(example['text'].decode('utf-8') for example in source)
