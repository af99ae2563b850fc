"""One training run per workdir: WORKDIR/.lock, held with flock(2) for the run's lifetime.

The kernel releases a flock when the last descriptor of its open file closes, which happens however
its process ends (SIGKILL included), so a lock never outlives its run and needs no clean-up. The
file holds the holder's host and pid, for the message that refuses a second run. The processes of
one multi-process run share its workdir: process 0 takes the lock and tells the others whether it
got it.

Only training takes the lock. eval, describe and compile write nothing to the workdir; a DiT's
sample writes a folder of its own under WORKDIR/samples, renamed into place whole; export writes
WORKDIR/hf alone, from a finished checkpoint, which a training run never writes, so a run's
latest checkpoint can be exported while it trains.
"""
import contextlib
import errno
import fcntl
import logging
import os
import socket

import jax
import numpy as np

from transformer_jax.errors import UserError

__all__ = ['held', 'LOCK_FILE']

log = logging.getLogger(__name__)

LOCK_FILE = '.lock'

# What flock raises where a filesystem has no locks (some NFS and Lustre mounts).
_NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)


@contextlib.contextmanager
def held(workdir: str):
  """Holds `workdir`'s lock for the body (creating the workdir). Raises UserError, naming the host
  and pid of the holder, when another run holds it; every process of a multi-process run raises
  when process 0 could not take it."""
  with contextlib.ExitStack() as stack:
    taken = True
    if jax.process_index() == 0:
      descriptor = _open(workdir)
      stack.callback(os.close, descriptor)  # closing it releases the lock
      taken = _take(descriptor)
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
      taken = bool(multihost_utils.broadcast_one_to_all(np.array(taken)))
    if not taken:
      holder = _holder(descriptor) if jax.process_index() == 0 else 'another run (process 0 says)'
      raise UserError(f'{workdir} is in use by {holder}: two runs on one workdir would overwrite '
                      'each other\'s checkpoints. Wait for it to end, stop it, or choose another '
                      '--workdir.')
    yield


def _open(workdir: str) -> int:
  os.makedirs(workdir, exist_ok=True)
  # Never truncated on opening: the file names the holder while another run holds it.
  return os.open(os.path.join(workdir, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)


def _take(descriptor: int) -> bool:
  """Whether this process now holds the lock (then the file names it); True without a lock where
  the filesystem has none, with a warning."""
  try:
    fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:
    return False
  except OSError as error:
    if error.errno not in _NO_LOCKS:
      raise
    log.warning('The workdir\'s filesystem has no file locks (%s): a second run on it would not '
                'be refused.', error.strerror)
    return True
  os.ftruncate(descriptor, 0)
  os.pwrite(descriptor, f'{socket.gethostname()} {os.getpid()}\n'.encode(), 0)
  return True


def _holder(descriptor: int) -> str:
  """'process PID on HOST', as the holder wrote it."""
  written = os.pread(descriptor, 4096, 0).decode(errors='replace').split()
  if len(written) != 2:  # the holder is between taking the lock and writing its name
    return 'another run'
  host, pid = written
  return f'process {pid} on {host}'
