"""Errors caused by what the user asked for, not by a bug: launch.py prints their message alone
(no traceback), so each message must say what to change."""

__all__ = ['CheckpointMismatchError', 'ConfigError', 'UserError']


class UserError(Exception):
  """A setting, a path or a checkpoint that the user must change; the message names the fix."""


class ConfigError(UserError, ValueError):
  """A config value out of its range, or inconsistent with another key or with the devices."""


class CheckpointMismatchError(UserError, ValueError):
  """A checkpoint whose tree, shapes or dtypes differ from what the config builds;
  `params_differ` is False when only the optimizer state differs."""

  def __init__(self, message: str, params_differ: bool = True):
    super().__init__(message)
    self.params_differ = params_differ
