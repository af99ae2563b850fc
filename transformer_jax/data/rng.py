"""numpy generators keyed by integers, so that every batch is a pure function of its key.

A key starts with a stream (what the numbers are for), then the seed and the step or epoch:
the same key gives the same numbers in any process, thread or order of calls, which is what
makes a resumed run see the batches of an uninterrupted one.
"""
import functools

import numpy as np

__all__ = ['generator', 'permutation', 'shuffled']

# Streams. The synthetic tasks and every held-out split are keyed without the seed: the data
# is the same for every seed, which is what makes eval metrics comparable from seed to seed.
SHUFFLE, AUGMENT, WINDOWS, GENERATE, HELD_OUT, TASK, MIX, SPANS, CAPTIONS = range(9)


def generator(*key: int) -> np.random.Generator:
  # Ints below 2^32 are one 32-bit word each of SeedSequence's entropy: given as those words,
  # it makes the same generator at half the cost (one per example of every batch).
  entropy = np.array(key, np.uint32) if all(0 <= k < 2 ** 32 for k in key) else key
  return np.random.Generator(np.random.PCG64(np.random.SeedSequence(entropy)))


@functools.lru_cache(maxsize=4)
def permutation(seed: int, epoch: int, size: int) -> np.ndarray:
  """The order of `size` training records in `epoch` (cached: a batch's examples share one)."""
  return generator(SHUFFLE, seed, epoch).permutation(size)


def shuffled(seed: int, step: int, batch_size: int, rows: slice, size: int) -> list[int]:
  """The records of the `rows` of training batch `step`: example k = step * batch_size + row of
  the run is record permutation(seed, k // size)[k % size] of the `size`, so each epoch visits
  every record once."""
  return [int(permutation(seed, k // size, size)[k % size])
          for k in (step * batch_size + row for row in range(batch_size)[rows])]
