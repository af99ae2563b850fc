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
from transformer_jax.data.settings import DataPart, DataSettings, register_part
from transformer_jax.errors import ConfigError
from transformer_jax.ranges import Range

__all__ = ['Corpus', 'field_error', 'jsonl_records', 'open_corpus', 'tfds_split',
           'TextSettings']

JSONL_HELD_OUT_EVERY = 10  # without data.eval_path, every tenth JSONL document is held out


@register_part
@dataclasses.dataclass(frozen=True)
class TextSettings(DataPart):
  """The keys of config.data that text corpora and their tokenizers read."""
  PART = 'text'
  path: str | None = None  # text_file: any UTF-8 file; jsonl: a JSONL file or a glob of them
  eval_path: str | None = None  # jsonl: the held-out documents; None: every tenth of data.path
  text_key: str = 'text'  # jsonl and TFDS text: the text feature of a record
  # 'chars'; 'bpe', a byte-level BPE trained on the training documents; or the path of a
  # tokenizer.json (or of a Hugging Face checkpoint holding one).
  tokenizer: str = 'chars'
  # The tokenizer's ids: a trained BPE's size; a character vocabulary or a tokenizer.json has at
  # most this many. model.vocab_size follows it where unset. None: whatever the data has.
  vocab_size: int | None = None
  packing: bool = False  # whole documents packed into rows, with segment ids (data.packing)
  token_dir: str | None = None  # tokenized corpora; None: $TRANSFORMER_JAX_CACHE/tokens or ~/.cache
  mlm_probability: float = 0.15  # encoder: share of positions selected for the MLM loss

  RANGES = {'vocab_size': Range(1, integer=True, optional=True),
            'mlm_probability': Range(0, 1, open_low=True)}

  def sizes(self) -> dict[str, int]:
    return {'vocab_size': self.vocab_size} if self.vocab_size else {}


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
    return _in_memory(name, *sources.load_text_file(_text(settings).path))
  if name == 'jsonl':
    return _jsonl(settings)
  return tuple(tfds_split(settings, name, key) for key in ('train_split', 'eval_split'))


def _text(settings: DataSettings) -> TextSettings:
  return settings.part(TextSettings)


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
  text = _text(settings)
  if not text.path:
    raise ConfigError('data.name=jsonl reads --config.data.path=FILE_OR_GLOB (JSONL, one '
                      'document per line under data.text_key).')
  text_key, files = text.text_key, _files(text.path, 'path')
  identity = {'files': _file_identity(files), 'text_key': text_key}
  if text.eval_path:
    held_out_files = _files(text.eval_path, 'eval_path')
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
  """The text of each record of `files`, naming the file and line of a bad one."""
  for file in files:
    for number, record in jsonl_records(file):
      if not isinstance(record.get(text_key), str):
        raise field_error(file, number, record, 'text', 'text_key', text_key)
      yield record[text_key]


def jsonl_records(file) -> Iterator[tuple[int, dict]]:
  """(line number, record) of each non-blank line of the JSONL `file`: a ConfigError naming the
  file and line of one that is not UTF-8 or not a JSON object."""
  with open(file, 'rb') as lines:
    offset = 0
    for number, data in enumerate(lines, 1):
      line = sources.decode_utf8(data, file, offset)
      offset += len(data)
      if not line.strip():
        continue
      try:
        record = json.loads(line.rstrip('\r\n'))  # an unterminated string ends at the line's end
      except json.JSONDecodeError as error:
        raise ConfigError(f'{file}:{number} is not JSON ({error.msg}: column {error.colno}): '
                          'data.name=jsonl reads one JSON object per line.') from None
      if not isinstance(record, dict):
        raise ConfigError(f'{file}:{number} is {_shown(record)}, not a JSON object: '
                          'data.name=jsonl reads one JSON object per line.')
      yield number, record


def field_error(file, number: int, record: dict, what: str, key: str, value: str,
                kinds: str = 'a string') -> ConfigError:
  """The error for line `number` of `file`, whose record holds no `what` (one of `kinds`) under
  data.`key` (= `value`): naming its keys, or what it holds there instead."""
  if value in record:
    return ConfigError(f'{file}:{number}: its {what} under data.{key}={value!r} is '
                       f'{_shown(record[value])}: write {kinds} there.')
  return ConfigError(f'{file}:{number} has no {what} under data.{key}={value!r} (its keys: '
                     f'{sorted(record)}): set --config.data.{key}.')


def _shown(value) -> str:
  text = json.dumps(value)
  return text if len(text) <= 40 else f'{text[:37]}...'


def tfds_split(settings: DataSettings, name: str, key: str, text_key: str | None = None) -> Corpus:
  """The split data.`key` of the TFDS dataset `name`, the documents under `text_key` (default:
  data.text_key)."""
  text_key = text_key or _text(settings).text_key
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
