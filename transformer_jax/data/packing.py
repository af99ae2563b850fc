"""Packing: whole documents placed into rows of `length` tokens, with segment ids and positions
that restart at each document (as Flax's lm1b/wmt examples and MaxText pack).

A document longer than `length` is first cut into pieces of `length`; pieces are then placed
into rows in corpus order, each row filled until the next piece does not fit (next-fit), so a
piece is never split across rows. In a row, piece i has segment id i + 1 and positions 0, 1, ...;
the rest of the row is padding: segment id 0, token id `pad_id`.
"""
import dataclasses

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
  """The packing of the documents at `starts` (int, num_documents + 1 offsets) into `length`."""
  starts = np.asarray(starts, np.int64)
  sizes = np.diff(starts)
  sizes, begin = sizes[sizes > 0], starts[:-1][sizes > 0]
  counts = -(-sizes // length)
  first_piece = np.cumsum(counts) - counts
  document = np.repeat(np.arange(len(sizes)), counts)
  index_in_document = np.arange(counts.sum()) - first_piece[document]
  piece_starts = begin[document] + index_in_document * length
  piece_lengths = np.minimum(length, sizes[document] - index_in_document * length)
  return Packing(piece_starts, piece_lengths, index_in_document == 0,
                 next_fit(piece_lengths, length))


def next_fit(lengths: np.ndarray, length: int, paired: np.ndarray | None = None) -> np.ndarray:
  """Row boundaries: a new row starts where the next piece would overflow the current one. With
  `paired` (the lengths of a second stream's pieces, as a translation's targets are to its
  sources), where the next piece would overflow either stream."""
  paired = lengths if paired is None else paired
  row_starts, filled, filled_paired = [0], 0, 0
  for i, (size, size_paired) in enumerate(zip(lengths.tolist(), paired.tolist())):
    if filled + size > length or filled_paired + size_paired > length:
      row_starts.append(i)
      filled = filled_paired = 0
    filled += size
    filled_paired += size_paired
  row_starts.append(len(lengths))
  return np.asarray(row_starts, np.int64)


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
