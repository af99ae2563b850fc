"""XLA:CPU's runtime set up for training steps: computations run in the calling thread, and the
memory a step frees stays mapped for the next one.

Each execution of a compiled step allocates its temporaries in one block (130 MB for the
reference LM's step at batch 32 x 64), which glibc's malloc maps afresh above 32 MB and unmaps
when it is freed: every page is faulted in and zeroed again at every step (32,000 page faults
and about 60 ms of system time per step of the reference LM, measured with getrusage, against a
step of about 100 ms without them). glibc can keep such blocks on its heap instead
(M_MMAP_MAX 0, a trim threshold it never reaches), but only for the main thread's arena: a block
that large is mapped whatever the settings in the arenas of other threads, and with async
dispatch XLA runs the step, and allocates, in a thread of its own. Inline execution puts the
allocation in the calling thread. The compiled program is the same either way, so are the
numbers.
"""
import ctypes
import ctypes.util
import platform

import jax

__all__ = ['configure']

# glibc's malloc.h
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4


def configure(keep_freed_memory: bool = True) -> None:
  """Call before the first computation: JAX reads the dispatch setting when it starts its CPU
  client. The malloc settings (`keep_freed_memory`) apply only where the CPU is the backend (and
  glibc the C library); the dispatch setting only ever concerns the CPU client. A process that
  also runs another framework's large steps should leave the malloc settings out: with PyTorch's
  allocations on the same heap, a whisper-tiny training step of ours took 14.5-45 s after a few
  torch steps against 11.8-12.2 s before them (12.0-12.5 s after them without the settings)."""
  jax.config.update('jax_cpu_enable_async_dispatch', False)
  if (not keep_freed_memory or jax.default_backend() != 'cpu'
      or platform.libc_ver()[0] != 'glibc'):
    return
  libc = ctypes.CDLL(ctypes.util.find_library('c'))
  libc.mallopt(_M_MMAP_MAX, 0)
  libc.mallopt(_M_TRIM_THRESHOLD, 2 ** 31 - 1)
