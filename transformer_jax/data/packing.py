"""Packing: whole documents placed into rows of `length` tokens, with segment ids and positions
that restart at each document (as Flax's lm1b/wmt examples and MaxText pack).

A document longer than `length` is first cut into pieces of `length`; pieces are then placed
into rows in corpus order, each row filled until the next piece does not fit (next-fit), so a
piece is never split across rows. In a row, piece i has segment id i + 1 and positions 0, 1, ...;
the rest of the row is padding: segment id 0, token id `pad_id`.
"""
import dataclasses
import pathlib

import numpy as np

from transformer_jax.data import files

__all__ = ['cached', 'cached_pairs', 'cached_windows', 'Packing', 'pack', 'packed_rows']


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
  breaks, _ = _row_breaks(piece_lengths, length)
  return Packing(piece_starts, piece_lengths, first,
                 np.asarray([0, *breaks, len(piece_lengths)], np.int64))


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


def _row_breaks(lengths, length: int | tuple[int, int], paired=None,
                filled=(0, 0)) -> tuple[list[int], tuple]:
  """Next-fit: the pieces that start a new row (where the piece would overflow the row, or with
  `paired`, the lengths of a second stream's pieces, either stream; `length` a pair gives the
  streams rows of their own lengths), and how full the last row is, continuing a row filled
  `filled` by earlier pieces."""
  paired = lengths if paired is None else paired
  length, paired_length = (length, length) if np.isscalar(length) else length
  breaks, (used, used_paired) = [], filled
  for i, (size, size_paired) in enumerate(zip(lengths.tolist(), paired.tolist())):
    if used + size > length or used_paired + size_paired > paired_length:
      breaks.append(i)
      used = used_paired = 0
    used += size
    used_paired += size_paired
  return breaks, (used, used_paired)


_DOCUMENT_FILES = {'piece_starts': np.int64, 'piece_lengths': np.int32, 'piece_first': np.bool_}
_PAIR_FILES = {'kept': np.int64, 'source_starts': np.int64, 'source_lengths': np.int32,
               'target_starts': np.int64, 'target_lengths': np.int32}


def cached(directory, starts: np.ndarray, length: int, chunk: int = 1 << 20) -> Packing:
  """pack(starts, length), memory-mapped from `directory` (written first where it is not
  complete, `chunk` documents at a time: neither building nor reading it holds more than a
  chunk in memory)."""
  def pieces(low: int, high: int):
    piece_starts, piece_lengths, first = _pieces(np.asarray(starts[low:high + 1]), length)
    return ({'piece_starts': piece_starts, 'piece_lengths': piece_lengths, 'piece_first': first},
            piece_lengths, None)
  files = _cached(directory, len(starts) - 1, chunk, pieces, length, _DOCUMENT_FILES)
  return Packing(files['piece_starts'], files['piece_lengths'], files['piece_first'],
                 files['row_starts'])


def cached_pairs(directory, source_starts: np.ndarray, target_starts: np.ndarray, length: int,
                 packed: bool, chunk: int = 1 << 20,
                 empty: int = 0) -> tuple[Packing, Packing, np.ndarray]:
  """(sources, targets, kept) of the pairs of two token files with a source (of more than
  `empty` tokens: 1 where each source ends with EOS): each pair one piece per stream, cut to
  `length`; with `packed` rows filled until either stream would overflow, else a row per pair.
  `kept`: the pairs' indices. Memory-mapped as `cached` is."""
  def pieces(low: int, high: int):
    sources, targets = (np.asarray(s[low:high + 1]) for s in (source_starts, target_starts))
    kept = np.flatnonzero(np.diff(sources) > empty)
    source_lengths, target_lengths = (np.minimum(np.diff(s)[kept], length).astype(np.int32)
                                      for s in (sources, targets))
    return ({'kept': kept + low, 'source_starts': sources[:-1][kept],
             'source_lengths': source_lengths, 'target_starts': targets[:-1][kept],
             'target_lengths': target_lengths}, source_lengths, target_lengths)
  files = _cached(directory, len(source_starts) - 1, chunk, pieces, length if packed else 0,
                  _PAIR_FILES)
  first = np.broadcast_to(np.True_, files['kept'].shape)
  return (Packing(files['source_starts'], files['source_lengths'], first, files['row_starts']),
          Packing(files['target_starts'], files['target_lengths'], first, files['row_starts']),
          files['kept'])


def cached_windows(directory, starts: np.ndarray, window: int, grown, row_lengths: tuple[int, int],
                   chunk: int = 1 << 20) -> Packing:
  """The documents at `starts` cut into windows of `window` tokens (a document's last one
  shorter; windows of fewer than 2 tokens left out), each window growing into a pair of pieces
  of lengths grown(window lengths) -> (first stream's, second's) int arrays, as a corruption
  does: the rows are filled next-fit until either stream would overflow its row of
  `row_lengths`. The Packing's pieces are the windows. Memory-mapped as `cached` is."""
  def pieces(low: int, high: int):
    piece_starts, piece_lengths, first = _pieces(np.asarray(starts[low:high + 1]), window)
    kept = piece_lengths >= 2
    piece_lengths = piece_lengths[kept]
    return ({'piece_starts': piece_starts[kept], 'piece_lengths': piece_lengths,
             'piece_first': first[kept]}, *grown(piece_lengths))
  files = _cached(directory, len(starts) - 1, chunk, pieces, row_lengths, _DOCUMENT_FILES)
  return Packing(files['piece_starts'], files['piece_lengths'], files['piece_first'],
                 files['row_starts'])


def _cached(directory, count: int, chunk: int, pieces, length: int | tuple[int, int],
            dtypes: dict) -> dict:
  """The arrays of `dtypes` and 'row_starts', memory-mapped from `directory`; where it is not
  complete, written first from pieces(low, high) -> (arrays, lengths, paired lengths) of items
  low..high - 1, under a temporary name renamed when done. Length 0: a row per piece."""
  directory = pathlib.Path(directory)
  dtypes = {**dtypes, 'row_starts': np.int64}
  sizes = files.completed(
      directory, lambda folder: _write_chunks(folder, count, chunk, pieces, length, dtypes))
  return {name: np.memmap(directory / f'{name}.bin', dtype=dtype, mode='r', shape=(sizes[name],))
          for name, dtype in dtypes.items()}


def _write_chunks(directory: pathlib.Path, count: int, chunk: int, pieces,
                  length: int | tuple[int, int], dtypes: dict) -> dict:
  """Writes the arrays chunk by chunk, the rows by next-fit across chunks; returns the sizes."""
  outputs = {name: open(directory / f'{name}.bin', 'wb') for name in dtypes}
  num_pieces, num_rows, filled = 0, 1, (0, 0)
  try:
    outputs['row_starts'].write(np.zeros(1, np.int64).tobytes())
    for low in range(0, count, chunk):
      arrays, lengths, paired = pieces(low, min(low + chunk, count))
      for name, values in arrays.items():
        outputs[name].write(np.asarray(values, dtypes[name]).tobytes())
      breaks, filled = _row_breaks(lengths, length, paired, filled)
      breaks = num_pieces + np.asarray(breaks, np.int64)
      breaks = breaks[breaks > 0]  # the first row starts at piece 0 already
      outputs['row_starts'].write(breaks.tobytes())
      num_rows, num_pieces = num_rows + len(breaks), num_pieces + len(lengths)
    outputs['row_starts'].write(np.asarray([num_pieces], np.int64).tobytes())
  finally:
    for output in outputs.values():
      output.close()
  return {**{name: num_pieces for name in dtypes}, 'row_starts': num_rows + 1}


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
