"""Corpora of documents: the training and held-out documents of a text source, read lazily, each
split with an identity that changes whenever its documents may have (the key of its token files).

Sources: a UTF-8 text file (one document, split 90/10 by characters), TinyShakespeare, JSONL
files (one document per record), and any TFDS dataset with a text feature.
"""
import dataclasses
import glob
import hashlib
import json
import os
from typing import Any, Callable, Iterator

from transformer_jax.data import sources
from transformer_jax.data.settings import DataSettings
from transformer_jax.errors import ConfigError

__all__ = ['Corpus', 'open_corpus', 'tfds_split']

JSONL_HELD_OUT_EVERY = 10  # without data.eval_path, every tenth JSONL document is held out


@dataclasses.dataclass(frozen=True)
class Corpus:
  """One split's documents: `documents()` yields them in order (each call anew), `identity` is
  JSON-able and changes with them, `single`: the split is one running text (no separators)."""
  name: str
  split: str
  documents: Callable[[], Iterator[str]]
  identity: dict[str, Any]
  single: bool = False


def open_corpus(settings: DataSettings, name: str) -> tuple[Corpus, Corpus]:
  """(training, held-out) documents of data.name `name`, by the DataSettings `settings`."""
  if name == 'tiny_shakespeare':
    train, held_out = sources.load_tiny_shakespeare(settings.tfds_data_dir, settings.manual_dir,
                                                    settings.download)
    return _in_memory(name, train, held_out)
  if name == 'text_file':
    return _in_memory(name, *sources.load_text_file(settings.path))
  if name == 'jsonl':
    return _jsonl(settings)
  return tuple(tfds_split(settings, name, key) for key in ('train_split', 'eval_split'))


def _in_memory(name: str, train: str, held_out: str) -> tuple[Corpus, Corpus]:
  def corpus(split, text):
    digest = hashlib.sha256(text.encode('utf-8')).hexdigest()
    return Corpus(name, split, lambda: iter([text]), {'sha256': digest}, single=True)
  return corpus('train', train), corpus('held_out', held_out)


def _files(pattern: str, key: str) -> list[str]:
  files = sorted(glob.glob(os.path.expanduser(pattern)))
  if not files:
    raise ConfigError(f'data.{key}={pattern!r} matches no file: give a JSONL file or a glob '
                      "such as 'corpus/*.jsonl'.")
  return files


def _file_identity(files: list[str]) -> list:
  return [(os.path.abspath(f), os.path.getsize(f), os.stat(f).st_mtime_ns) for f in files]


def _jsonl(settings: DataSettings) -> tuple[Corpus, Corpus]:
  """data.path's JSONL files (a file or a glob) in sorted order, data.text_key of each record;
  held out: data.eval_path's files, else every tenth record."""
  if not settings.path:
    raise ConfigError('data.name=jsonl reads --config.data.path=FILE_OR_GLOB (JSONL, one '
                      'document per line under data.text_key).')
  text_key, files = settings.text_key, _files(settings.path, 'path')
  identity = {'files': _file_identity(files), 'text_key': text_key}
  if settings.eval_path:
    held_out_files = _files(settings.eval_path, 'eval_path')
    read = lambda fs: lambda: _records(fs, text_key)
    return (Corpus('jsonl', 'train', read(files), identity),
            Corpus('jsonl', 'held_out', read(held_out_files),
                   {'files': _file_identity(held_out_files), 'text_key': text_key}))
  every = JSONL_HELD_OUT_EVERY

  def split(held_out: bool):
    return lambda: (text for i, text in enumerate(_records(files, text_key))
                    if (i % every == every - 1) == held_out)
  return (Corpus('jsonl', 'train', split(False), {**identity, 'every': every, 'part': 'train'}),
          Corpus('jsonl', 'held_out', split(True), {**identity, 'every': every, 'part': 'held'}))


def _records(files: list[str], text_key: str) -> Iterator[str]:
  """The text of each non-blank line of `files`, naming the file and line of a bad one."""
  for file in files:
    with open(file, 'rb') as lines:
      offset = 0
      for number, data in enumerate(lines, 1):
        line = sources.decode_utf8(data, file, offset)
        offset += len(data)
        if not line.strip():
          continue
        try:
          record = json.loads(line)
        except json.JSONDecodeError as error:
          raise ConfigError(f'{file}:{number} is not JSON ({error.msg}): data.name=jsonl reads '
                            'one JSON object per line.') from None
        if not isinstance(record, dict) or not isinstance(record.get(text_key), str):
          keys = sorted(record) if isinstance(record, dict) else type(record).__name__
          raise ConfigError(f'{file}:{number} has no text under data.text_key={text_key!r} '
                            f'(its keys: {keys}): set --config.data.text_key.')
        yield record[text_key]


def tfds_split(settings: DataSettings, name: str, key: str, text_key: str | None = None) -> Corpus:
  """The split data.`key` of the TFDS dataset `name`, the documents under `text_key` (default:
  data.text_key)."""
  text_key = text_key or settings.text_key
  source, identity = sources.open_text_split(
      name, data_dir=settings.tfds_data_dir, key=key, split=getattr(settings, key),
      text_key=text_key)

  def documents():
    for start in range(0, len(source), 1024):
      records = source.__getitems__(list(range(start, min(start + 1024, len(source)))))
      for record in records:
        text = record[text_key]
        yield text.decode('utf-8') if isinstance(text, bytes) else str(text)
  return Corpus(name, 'train' if key == 'train_split' else 'held_out', documents, identity)
