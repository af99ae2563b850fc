"""Orbax checkpoints in the workdir: async saves, keep the last N, resume from the latest
readable one, and a save on SIGTERM."""
import os
import signal
import time

import logging
import jax
import numpy as np
import orbax.checkpoint as ocp

log = logging.getLogger(__name__)


def latest_step(workdir: str) -> int | None:
  """The newest finished checkpoint's step in workdir, without opening a manager."""
  directory = os.path.join(workdir, 'checkpoints')
  steps = [int(name) for name in os.listdir(directory) if name.isdigit()] if os.path.isdir(
      directory) else []
  return max(steps, default=None)


class Checkpoints:
  """The train state at chosen steps under workdir/checkpoints/<step>."""

  def __init__(self, workdir: str, keep: int):
    self.directory = os.path.join(os.path.abspath(workdir), 'checkpoints')
    self.manager = ocp.CheckpointManager(
        self.directory, options=ocp.CheckpointManagerOptions(
            max_to_keep=keep, enable_async_checkpointing=True, create=True))

  def save(self, step: int, state) -> None:
    self.manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state)), force=True)

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def restore_latest(self, abstract_state):
    """(state, step) from the newest checkpoint that restores; (None, None) when there is none.

    A checkpoint that fails to restore (truncated or corrupt files) is skipped, with a warning,
    for the one before it, and moved aside to <step>.corrupt so that the resumed run can save
    that step again. Orbax writes into a temporary directory and renames it only when the save
    is complete, so an interrupted save never appears among the steps.
    """
    for step in sorted(self.manager.all_steps(), reverse=True):
      try:
        restored = self.manager.restore(
            step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state)))
        return restored.state, step
      except Exception as error:  # pylint: disable=broad-except
        log.warning('Checkpoint at step %d in %s cannot be restored (%s: %s); moving it to '
                    '%d.corrupt.<time> and trying the one before it.', step, self.directory,
                    type(error).__name__, error, step)
        self._move_aside(step)
    return None, None

  def _move_aside(self, step: int) -> None:
    if jax.process_index() == 0:
      path = os.path.join(self.directory, str(step))
      os.rename(path, f'{path}.corrupt.{time.time_ns()}')
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
      multihost_utils.sync_global_devices(f'checkpoint {step} moved aside')
    self.manager.reload()

  def wait(self) -> None:
    self.manager.wait_until_finished()

  def close(self) -> None:
    self.manager.wait_until_finished()
    self.manager.close()


class PreemptionFlag:
  """Set by SIGTERM; every process learns of it at the same step."""

  def __init__(self):
    self._received = False
    self._previous = signal.signal(signal.SIGTERM, self._handle)

  def _handle(self, signum, frame):
    del signum, frame
    self._received = True

  def reached(self) -> bool:
    if jax.process_count() == 1:
      return self._received
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    return bool(np.any(multihost_utils.process_allgather(np.array(self._received))))

  def restore(self) -> None:
    signal.signal(signal.SIGTERM, self._previous)
