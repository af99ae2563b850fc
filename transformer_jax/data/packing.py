"""Packing: whole documents placed into rows of `length` tokens, with segment ids and positions
that restart at each document (as Flax's lm1b/wmt examples and MaxText pack).

A document longer than `length` is first cut into pieces of `length`; pieces are then placed
into rows in corpus order, each row filled until the next piece does not fit (next-fit), so a
piece is never split across rows. In a row, piece i has segment id i + 1 and positions 0, 1, ...;
the rest of the row is padding: segment id 0, token id `pad_id`.
"""
import dataclasses
import json
import os
import pathlib
import shutil

import numpy as np

__all__ = ['next_fit', 'Packing', 'pack', 'packed_rows']


@dataclasses.dataclass(frozen=True)
class Packing:
  """Pieces (offset into the token stream, length, whether it starts its document) and the
  rows they fill: row r holds pieces row_starts[r] .. row_starts[r + 1] - 1."""
  piece_starts: np.ndarray
  piece_lengths: np.ndarray
  piece_first: np.ndarray
  row_starts: np.ndarray

  @property
  def num_rows(self) -> int:
    return len(self.row_starts) - 1


def pack(starts: np.ndarray, length: int) -> Packing:
  """The packing of the documents at `starts` (int, num_documents + 1 offsets) into `length`,
  in memory (`cached` keeps a large one on disk)."""
  piece_starts, piece_lengths, first = _pieces(np.asarray(starts, np.int64), length)
  return Packing(piece_starts, piece_lengths, first, next_fit(piece_lengths, length))


def _pieces(starts: np.ndarray, length: int):
  """(offset, length, starts its document) of each piece of the documents at `starts`."""
  sizes = np.diff(starts)
  sizes, begin = sizes[sizes > 0], starts[:-1][sizes > 0]
  counts = -(-sizes // length)
  first_piece = np.cumsum(counts) - counts
  document = np.repeat(np.arange(len(sizes)), counts)
  index_in_document = np.arange(counts.sum()) - first_piece[document]
  return (begin[document] + index_in_document * length,
          np.minimum(length, sizes[document] - index_in_document * length).astype(np.int32),
          index_in_document == 0)


def next_fit(lengths: np.ndarray, length: int, paired: np.ndarray | None = None) -> np.ndarray:
  """Row boundaries: a new row starts where the next piece would overflow the current one. With
  `paired` (the lengths of a second stream's pieces, as a translation's targets are to its
  sources), where the next piece would overflow either stream."""
  breaks, _ = _row_breaks(lengths, length, paired)
  return np.asarray([0, *breaks, len(lengths)], np.int64)


def _row_breaks(lengths, length: int, paired=None, filled=(0, 0)) -> tuple[list[int], tuple]:
  """The pieces that start a new row, and how full the last row is (both streams), continuing a
  row filled `filled` by earlier pieces."""
  paired = lengths if paired is None else paired
  breaks, (used, used_paired) = [], filled
  for i, (size, size_paired) in enumerate(zip(lengths.tolist(), paired.tolist())):
    if used + size > length or used_paired + size_paired > length:
      breaks.append(i)
      used = used_paired = 0
    used += size
    used_paired += size_paired
  return breaks, (used, used_paired)


_FILES = {'piece_starts': np.int64, 'piece_lengths': np.int32, 'piece_first': np.bool_,
          'row_starts': np.int64}


def cached(directory, starts: np.ndarray, length: int, chunk: int = 1 << 20) -> Packing:
  """pack(starts, length), memory-mapped from `directory`, which is written first where it is not
  complete: `chunk` documents at a time, under a temporary name renamed when done, so that
  neither building nor reading it holds more than a chunk in memory."""
  directory = pathlib.Path(directory)
  if not (directory / 'info.json').is_file():
    partial = directory.with_name(f'.{directory.name}.{os.getpid()}.partial')
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    counts = _write_chunks(partial, starts, length, chunk)
    (partial / 'info.json').write_text(json.dumps(counts))
    try:
      os.rename(partial, directory)
    except OSError:  # another process wrote the same packing first
      shutil.rmtree(partial, ignore_errors=True)
  counts = json.loads((directory / 'info.json').read_text())
  return Packing(*(np.memmap(directory / f'{name}.bin', dtype=dtype, mode='r',
                             shape=(counts[name],)) for name, dtype in _FILES.items()))


def _write_chunks(directory: pathlib.Path, starts: np.ndarray, length: int, chunk: int) -> dict:
  """Writes the packing's arrays chunk by chunk; returns their lengths."""
  files = {name: open(directory / f'{name}.bin', 'wb') for name in _FILES}
  pieces, rows, filled = 0, 1, (0, 0)
  try:
    files['row_starts'].write(np.zeros(1, np.int64).tobytes())
    for low in range(0, len(starts) - 1, chunk):
      piece_starts, piece_lengths, first = _pieces(np.asarray(starts[low:low + chunk + 1]), length)
      for name, values in (('piece_starts', piece_starts), ('piece_lengths', piece_lengths),
                           ('piece_first', first)):
        files[name].write(values.astype(_FILES[name]).tobytes())
      breaks, filled = _row_breaks(piece_lengths, length, filled=filled)
      files['row_starts'].write((pieces + np.asarray(breaks, np.int64)).tobytes())
      rows, pieces = rows + len(breaks), pieces + len(piece_lengths)
    files['row_starts'].write(np.asarray([pieces], np.int64).tobytes())
  finally:
    for file in files.values():
      file.close()
  return {'piece_starts': pieces, 'piece_lengths': pieces, 'piece_first': pieces,
          'row_starts': rows + 1}


def packed_rows(packing: Packing, tokens: np.ndarray, rows, length: int, *, start_id: int,
                pad_id: int = 0) -> dict[str, np.ndarray]:
  """int32 (len(rows), length) each: 'tokens' (the pieces' ids), 'previous' (the id before each
  token: the next-token inputs whose targets are 'tokens'; `start_id` before a document's first
  token), 'segment_ids' and 'positions'."""
  out = {key: np.zeros((len(rows), length), np.int32)
         for key in ('tokens', 'previous', 'segment_ids', 'positions')}
  out['tokens'][:] = pad_id
  out['previous'][:] = pad_id
  for r, row in enumerate(rows):
    filled = 0
    for segment, piece in enumerate(range(packing.row_starts[row], packing.row_starts[row + 1])):
      start, size = int(packing.piece_starts[piece]), int(packing.piece_lengths[piece])
      span = slice(filled, filled + size)
      out['tokens'][r, span] = tokens[start:start + size]
      out['previous'][r, filled + 1:filled + size] = tokens[start:start + size - 1]
      out['previous'][r, filled] = start_id if packing.piece_first[piece] else tokens[start - 1]
      out['segment_ids'][r, span] = segment + 1
      out['positions'][r, span] = np.arange(size)
      filled += size
  return out
