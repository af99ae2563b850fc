"""Hugging Face's `audiofolder` layout (the datasets library's folder-based builder, whose
conventions this follows), read as the speech task's training and held-out rows, every row and
every file's header checked when the folder is opened.

  DIR/metadata.csv           one split: the last tenth of its rows (at least one) held out
  DIR/train/metadata.csv     split folders, the folders being the splits: DIR/<data.train_split>
  DIR/test/metadata.csv      trains and DIR/<data.eval_split> is held out; data.eval_split unset:
  DIR/validation/...         DIR/test where there is one, else DIR/validation (the rule of a
                             TFDS dataset's splits); neither: the training folder's last tenth

A metadata file is metadata.csv (a header row, then one row per file; UTF-8, a byte-order mark
allowed) or metadata.jsonl (one JSON object per line), the two that datasets reads besides
Parquet. Its `file_name` names an audio file by its path from the metadata file's folder (in a
subfolder: 'clips/0.wav'; '\\' read as '/', as datasets does; or absolute), its transcript
column (data.transcript_key; default `transcription`) holds the text.

Each of these is refused in one line naming the file (and line) and the fix: a folder holding
both metadata files, or a metadata.parquet; metadata files in DIR and in split folders at once;
a split folder (train, test, validation or one the settings name) without a metadata file;
split folders none of which the settings or the names test and validation hold out (a `dev`);
a CSV row whose fields do not match the header, a JSONL line that is not a JSON object, a row
without its file name or transcript; an audio file that is not there, whose header libsndfile
cannot read (soundfile.SoundFile opens it without decoding the samples) or that holds no
samples. The headers are read one file after another, which threads did not speed up on a
2-core machine (docs/speech.md has the time it takes).
"""
import csv
import io
import json
import logging
import os
import pathlib
import time
from typing import Iterator, NamedTuple

from transformer_jax.data import audio, sources
from transformer_jax.errors import ConfigError, UserError

__all__ = ['METADATA', 'METADATA_FILES', 'open_folder', 'Row']

log = logging.getLogger(__name__)

METADATA = 'metadata.csv'
METADATA_FILES = (METADATA, 'metadata.jsonl')
PARQUET = 'metadata.parquet'
FILE_COLUMN = 'file_name'
TRANSCRIPT_COLUMN = 'transcription'
TRAIN = 'train'  # data.train_split's default
HELD_OUT = ('test', 'validation')  # data.eval_split unset: the first there is held out
LAYOUTS = (f'an audiofolder is DIR/{METADATA} (columns {FILE_COLUMN}, {TRANSCRIPT_COLUMN}) beside '
           f'the audio files, or a folder per split (DIR/train, DIR/test) holding one')


class Row(NamedTuple):
  """An utterance: its audio file, its transcript, and the metadata line naming it."""
  path: str
  text: str
  origin: str  # 'DIR/metadata.csv:9'


def open_folder(directory: str, *, train_split: str, eval_split: str | None,
                transcript_key: str | None) -> tuple[list[Row], list[Row]]:
  """The training and held-out rows of the audiofolder `directory` (data.audio_dir), in the
  order of their metadata files; a UserError naming the first bad folder, row or file."""
  started = time.perf_counter()
  root = pathlib.Path(directory)
  if not root.is_dir():
    raise ConfigError(f'data.audio_dir={directory} is not a folder: {LAYOUTS}.')
  column = transcript_key or TRANSCRIPT_COLUMN
  own = _metadata_file(root)
  with os.scandir(root) as entries:  # hidden and special folders skipped, as datasets does
    folders = sorted(entry.name for entry in entries
                     if entry.is_dir() and not entry.name.startswith(('.', '__')))
  splits = {name: _metadata_file(root / name) for name in folders}
  if own:
    train, held_out, summary = _one_split(root, own, column, splits, train_split, eval_split)
  else:
    train, held_out, summary = _split_folders(root, column, splits, train_split, eval_split)
  for row in train + held_out:
    audio.check_audio(row.path, row.origin)
  log.info('Audio folder %s: %s; %d files\' headers checked in %.2f s.', directory, summary,
           len(train) + len(held_out), time.perf_counter() - started)
  return train, held_out


def _one_split(root, metadata, column, splits, train_split, eval_split):
  """The rows of DIR's own metadata file, its last tenth held out."""
  beside = sorted(name for name, found in splits.items() if found)
  if beside:
    raise UserError(f'{root} holds {metadata.name} and split folders holding their own '
                    f'({", ".join(beside)}): keep one layout, the one file or the split folders.')
  if eval_split or train_split != TRAIN:
    raise ConfigError(f'data.train_split={train_split!r} and data.eval_split={eval_split!r} name '
                      f'split folders, and data.audio_dir={root} has one {metadata.name} (its '
                      f'last tenth held out): unset them, or make a folder per split.')
  return _last_tenth(_rows(metadata, column), metadata)


def _split_folders(root, column, splits, train_split, eval_split):
  """The rows of the split folders data.train_split and data.eval_split name (or the last tenth
  of the training folder's)."""
  named = {TRAIN, *HELD_OUT, train_split, eval_split} - {None}
  bare = sorted(name for name in named if name in splits and not splits[name])
  if bare:
    raise UserError(f'The split folder {root / bare[0]} has no {METADATA} (or '
                    f'{METADATA_FILES[1]}) naming its audio files and their transcripts: write '
                    f'one (columns {FILE_COLUMN}, {TRANSCRIPT_COLUMN}).')
  found = sorted(name for name, metadata in splits.items() if metadata)
  if not found:
    raise UserError(f'no {METADATA} (or {METADATA_FILES[1]}) in data.audio_dir={root} nor in a '
                    f'split folder of it: {LAYOUTS}.')
  for key, name in (('train_split', train_split), ('eval_split', eval_split)):
    if name is not None and name not in found:
      raise ConfigError(f'data.{key}={name!r}: {root} has no split folder {name} holding a '
                        f'metadata file; its split folders: {", ".join(found)}. Set '
                        f'data.{key} to one of them.')
  held_name = eval_split or next(
      (name for name in HELD_OUT if name in found and name != train_split), None)
  others = [name for name in found if name not in (train_split, held_name)]
  if held_name == train_split:
    raise ConfigError(f'data.eval_split={held_name!r} is the training folder too: hold out '
                      f'another ({", ".join(others) or "there is none"}).')
  train = _rows(splits[train_split], column)
  if held_name is None:
    if others:
      raise ConfigError(f'{root} has the split folder {others[0]} beside {train_split}, and no '
                        f'{" or ".join(HELD_OUT)}: set data.eval_split={others[0]} to hold it out.')
    return _last_tenth(train, splits[train_split])
  held_out = _rows(splits[held_name], column)
  unread = f'; not read: {", ".join(others)} (data.eval_split names the one held out)'
  return train, held_out, (f'{train_split}/ ({len(train)} files) trains, {held_name}/ '
                           f'({len(held_out)}) is held out{unread if others else ""}')


def _last_tenth(rows: list[Row], metadata: pathlib.Path) -> tuple[list[Row], list[Row], str]:
  """The rows but the last tenth (at least one), and those."""
  if len(rows) < 2:
    raise UserError(f'{metadata} lists {len(rows)} file(s): a folder needs at least 2 (one held '
                    'out).')
  held = max(1, len(rows) // 10)
  return rows[:-held], rows[-held:], (f'the first {len(rows) - held} files of {metadata} train, '
                                      f'its last {held} are held out')


def _metadata_file(folder: pathlib.Path) -> pathlib.Path | None:
  """The folder's metadata file, if it has one; a UserError where it has two or Parquet's."""
  found = [folder / name for name in METADATA_FILES if (folder / name).is_file()]
  if len(found) > 1:
    raise UserError(f'{folder} holds both {" and ".join(METADATA_FILES)}: keep the one that '
                    'lists its files.')
  if not found and (folder / PARQUET).is_file():
    raise UserError(f'{folder / PARQUET}: Parquet metadata is not read; write it as {METADATA} '
                    f'(pandas.read_parquet(path).to_csv(\'{folder / METADATA}\', index=False)).')
  return found[0] if found else None


def _rows(metadata: pathlib.Path, column: str) -> list[Row]:
  """The rows of a metadata file, each file's path made from the metadata file's folder."""
  text = sources.decode_utf8(metadata.read_bytes(), metadata).removeprefix('\ufeff')
  records = _csv_records if metadata.name == METADATA else _jsonl_records
  rows = []
  for origin, record in records(metadata, text, column):
    name, transcript = record[FILE_COLUMN], record[column]
    if not isinstance(name, str) or not name.strip():
      raise UserError(f'{origin} names no audio file under {FILE_COLUMN} ({name!r}): give the '
                      'file\'s path from the metadata file\'s folder, or remove that line.')
    if not isinstance(transcript, str):
      raise UserError(f'{origin} has {transcript!r} under {column}, not a transcript: give the '
                      'text (in quotes), or remove that line.')
    rows.append(Row(str(metadata.parent / name.replace('\\', '/')), transcript, origin))
  if not rows:
    raise UserError(f'{metadata} lists no files: add a row per audio file ({FILE_COLUMN}, '
                    f'{column}).')
  return rows


def _csv_records(path: pathlib.Path, text: str, column: str) -> Iterator[tuple[str, dict]]:
  """('path:line', {column: field}) of each row of a CSV file's text, after its header."""
  reader = csv.reader(io.StringIO(text, newline=''))
  try:
    header = next(reader, [])
    missing = [key for key in (FILE_COLUMN, column) if key not in header]
    if missing:
      raise UserError(f'{path} has no column {" or ".join(missing)} (it has {header}): name its '
                      f'columns {FILE_COLUMN} and {TRANSCRIPT_COLUMN}, or set '
                      'data.transcript_key to the transcripts\' column.')
    for fields in reader:
      if not fields:  # a blank line
        continue
      if len(fields) != len(header):
        raise UserError(f'{path}:{reader.line_num} has {len(fields)} fields where its header has '
                        f'{len(header)}: quote a field that holds a comma ("a, b").')
      yield f'{path}:{reader.line_num}', dict(zip(header, fields))
  except csv.Error as error:
    raise UserError(f'{path}:{reader.line_num} is not CSV ({error}): quote a field that holds '
                    'a comma, a quote (doubled: "") or a line break.') from None


def _jsonl_records(path: pathlib.Path, text: str, column: str) -> Iterator[tuple[str, dict]]:
  """('path:line', record) of each non-blank line of a JSONL file's text."""
  for number, line in enumerate(text.split('\n'), 1):
    if not line.strip():
      continue
    try:
      record = json.loads(line)
    except json.JSONDecodeError as error:
      raise UserError(f'{path}:{number} is not JSON ({error.msg}): {path.name} holds one JSON '
                      'object per line.') from None
    missing = ([key for key in (FILE_COLUMN, column) if key not in record]
               if isinstance(record, dict) else [FILE_COLUMN, column])
    if missing:
      keys = sorted(record) if isinstance(record, dict) else type(record).__name__
      raise UserError(f'{path}:{number} has no {" or ".join(missing)} (its keys: {keys}): give '
                      f'each line {FILE_COLUMN} and {TRANSCRIPT_COLUMN}, or set '
                      'data.transcript_key to the transcripts\' key.')
    yield f'{path}:{number}', record
