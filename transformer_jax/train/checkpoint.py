"""Orbax checkpoints: async saves, keep the last N, resume from the latest readable one, refuse
one that does not fit the model, and a save on SIGTERM.

A checkpoint is compared with what the config builds before anything is restored, from the tree
of shapes and dtypes Orbax stores beside the arrays: a checkpoint that differs is refused with a
CheckpointMismatchError naming the differing paths, and nothing on disk changes. Only a
checkpoint that cannot be read (missing or truncated files, unreadable metadata) is skipped for
the one before it, and only a writable manager (training) moves it aside.
"""
import os
import signal
import time

import logging
import jax
import numpy as np
import orbax.checkpoint as ocp

from transformer_jax.errors import CheckpointMismatchError

__all__ = ['Checkpoints', 'describe_differences', 'latest_step', 'PreemptionFlag']

log = logging.getLogger(__name__)

_ITEM = 'state'
_SHOWN_DIFFERENCES = 6


def latest_step(workdir: str) -> int | None:
  """The newest finished checkpoint's step in workdir, without opening a manager."""
  directory = os.path.join(workdir, 'checkpoints')
  steps = [int(name) for name in os.listdir(directory) if name.isdigit()] if os.path.isdir(
      directory) else []
  return max(steps, default=None)


class Checkpoints:
  """The train state at chosen steps under `directory`/<step> (a run's workdir/checkpoints).

  With `read_only`, nothing in the directory is ever written, renamed or deleted: what eval,
  sample and a run starting from another run's parameters use.
  """

  def __init__(self, directory: str, keep: int | None = None, read_only: bool = False):
    self.directory = os.path.abspath(directory)
    self.read_only = read_only
    if read_only:  # the options read_only would otherwise reset, one warning each
      options = ocp.CheckpointManagerOptions(read_only=True, create=False, max_to_keep=None,
                                             save_interval_steps=0, cleanup_tmp_directories=False)
    else:
      options = ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=True,
                                             create=True)
    self.manager = ocp.CheckpointManager(self.directory, options=options,
                                         item_handlers={_ITEM: ocp.PyTreeCheckpointHandler()})

  def save(self, step: int, state) -> None:
    self.manager.save(step, args=ocp.args.Composite(**{_ITEM: ocp.args.PyTreeSave(state)}),
                      force=True)

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def all_steps(self) -> list[int]:
    return sorted(self.manager.all_steps())

  def restore_latest(self, abstract_state, *, params_only: bool = False, step: int | None = None):
    """(tree, step) of the newest readable checkpoint (or of `step`); (None, None) if none.

    abstract_state: the TrainState of ShapeDtypeStructs with shardings that the config builds.
    params_only: restore the parameters the model runs with alone (the optimizer's settings do
    not matter): abstract_state.params, or their moving average where the state keeps one
    (`ema`), a LoraState's base with those adapters merged in.
    A checkpoint whose tree, shapes or dtypes differ raises CheckpointMismatchError.
    """
    target = abstract_state
    if params_only:
      target = {name: getattr(abstract_state, name) for name in ('params', 'base', 'ema')
                if getattr(abstract_state, name, None) is not None}
    for candidate in ([step] if step is not None else reversed(self.all_steps())):
      try:
        saved = self._stored_shapes(candidate)
      except Exception as error:  # pylint: disable=broad-except
        self._skip_unreadable(candidate, error)
        continue
      wanted = _shapes(target)
      if params_only:
        saved = {path: leaf for path, leaf in saved.items() if path[0] in target}
      differences = describe_differences(saved, wanted)
      if differences:
        params_differ = any(saved.get(p) != wanted.get(p) for p in saved.keys() | wanted.keys()
                            if p[0] == 'params')
        raise CheckpointMismatchError(self._refusal(candidate, differences), params_differ)
      try:
        restored = self._restore(candidate, target, partial=params_only)
      except Exception as error:  # pylint: disable=broad-except
        self._skip_unreadable(candidate, error)
        continue
      if params_only:
        state = abstract_state.replace(**restored)
        return state.model_params(state.ema), candidate
      return restored, candidate
    return None, None

  def restore_saved_params(self, step: int | None = None):
    """(parameters, step) of the newest readable checkpoint (or of `step`) in the shapes it
    stores, for a run of another model to take parts of: its moving average where it keeps
    one, else its params; (None, None) if none. A LoRA run's (adapters beside a base) are
    refused: merge them first (--mode=export)."""
    for candidate in ([step] if step is not None else reversed(self.all_steps())):
      try:
        stored = self.manager.item_metadata(candidate)[_ITEM].tree
        if 'base' in stored:
          raise CheckpointMismatchError(
              f'The checkpoint at step {candidate} in {self.directory} holds LoRA adapters over a '
              'base: export the merged model (--mode=export) and start from that directory.',
              params_differ=True)
        name = 'ema' if stored.get('ema') else 'params'
        target = {name: jax.tree.map(_on_one_device, stored[name])}
        return self._restore(candidate, target, partial=True)[name], candidate
      except CheckpointMismatchError:
        raise
      except Exception as error:  # pylint: disable=broad-except
        self._skip_unreadable(candidate, error)
    return None, None

  def _restore(self, step: int, target, partial: bool):
    """The arrays of `target`'s leaves at `step`, each placed with the target's sharding."""
    restore = ocp.args.PyTreeRestore(
        item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target),
        partial_restore=partial)
    return self.manager.restore(step, args=ocp.args.Composite(**{_ITEM: restore}))[_ITEM]

  def _stored_shapes(self, step: int) -> dict:
    metadata = self.manager.item_metadata(step)[_ITEM]
    if metadata is None:
      raise FileNotFoundError(f'no {_ITEM} metadata')
    return _shapes(metadata.tree)

  def _refusal(self, step: int, differences: list[str]) -> str:
    lines = [f'The checkpoint at step {step} in {self.directory} does not fit what the config '
             'builds; nothing on disk was changed:']
    return '\n'.join(lines + [f'  {line}' for line in differences])

  def _skip_unreadable(self, step: int, error: Exception) -> None:
    reason = f'{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ""}'
    if self.read_only:
      log.warning('The checkpoint at step %d in %s cannot be restored (%s); using the one before '
                  'it.', step, self.directory, reason)
      return
    moved = self._move_aside(step)
    log.warning('The checkpoint at step %d cannot be restored (%s); moved it to %s and using the '
                'one before it.', step, reason, moved)

  def _move_aside(self, step: int) -> str:
    path = os.path.join(self.directory, str(step))
    moved = f'{path}.corrupt.{time.time_ns()}'
    if jax.process_index() == 0:
      os.rename(path, moved)
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
      multihost_utils.sync_global_devices(f'checkpoint {step} moved aside')
    self.manager.reload()
    return moved

  def wait(self) -> None:
    self.manager.wait_until_finished()

  def close(self) -> None:
    self.manager.wait_until_finished()
    self.manager.close()


def _on_one_device(metadata) -> jax.ShapeDtypeStruct:
  return jax.ShapeDtypeStruct(metadata.shape, metadata.dtype,
                              sharding=jax.sharding.SingleDeviceSharding(jax.local_devices()[0]))


def _key_name(key) -> str:
  for attribute in ('key', 'name', 'idx'):
    if hasattr(key, attribute):
      return str(getattr(key, attribute))
  return str(key)


def _shapes(tree) -> dict[tuple[str, ...], tuple[tuple[int, ...], str]]:
  """{('params', 'embed', 'tokens'): ((65, 128), 'float32'), ...} of a tree's arrays; dict keys,
  attribute names and sequence indices alike become path names, so that a TrainState and the
  nested dicts Orbax stores for it give the same paths."""
  return {tuple(_key_name(k) for k in path): (tuple(leaf.shape), np.dtype(leaf.dtype).name)
          for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def describe_differences(saved: dict, wanted: dict) -> list[str]:
  """The differences between two `_shapes` trees, one line each, parameters first: a subtree
  only one side has is named once, at its root."""
  lines = []
  for ours, theirs, where in ((saved, wanted, 'in the checkpoint, not in the model'),
                              (wanted, saved, 'in the model, not in the checkpoint')):
    prefixes = {tuple(p[:i]) for p in theirs for i in range(1, len(p) + 1)}
    roots = set()
    for path in ours:
      if path not in theirs:
        depth = next(i for i in range(1, len(path) + 1) if path[:i] not in prefixes)
        roots.add(path[:depth])
    lines += [(root, f'{"/".join(root)}: {where}') for root in roots]
  for path in saved.keys() & wanted.keys():
    if saved[path] != wanted[path]:
      lines.append((path, f'{"/".join(path)}: {_describe(saved[path])} in the checkpoint, '
                          f'{_describe(wanted[path])} in the model'))
  lines.sort(key=lambda item: (item[0][0] != 'params', item[0]))
  shown = [line for _, line in lines[:_SHOWN_DIFFERENCES]]
  if len(lines) > _SHOWN_DIFFERENCES:
    shown.append(f'... and {len(lines) - _SHOWN_DIFFERENCES} more')
  return shown


def _describe(shape_dtype) -> str:
  shape, dtype = shape_dtype
  return f'{shape} {dtype}'


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
