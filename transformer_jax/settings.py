"""Settings: a config section resolved once into a frozen dataclass, every key with its type and
default declared in one place; the training and mesh sections' here, the data section's in
data.DataSettings."""
import dataclasses
import types
import typing
from typing import Any, Mapping

from transformer_jax.errors import ConfigError

__all__ = ['MeshSettings', 'Settings', 'TrainingSettings']


class Settings:
  """A base of frozen dataclasses whose fields are the keys of one config section (SECTION)."""
  SECTION: typing.ClassVar[str] = ''

  @classmethod
  def of(cls, section: 'Mapping[str, Any] | Settings'):
    """The settings of a config section (a ConfigDict or a dict); None or missing: the
    default; a key that is no field fails, naming the fields."""
    if isinstance(section, cls):
      return section
    values = {key: value for key, value in dict(section).items() if value is not None}
    unknown = sorted(set(values) - set(cls.defaults()))
    if unknown:
      raise ConfigError(f'Unknown {cls.SECTION} settings {unknown}: the keys of config.'
                        f'{cls.SECTION} are {sorted(cls.defaults())}.')
    return cls(**{key: tuple(value) if isinstance(value, list) else value
                  for key, value in values.items()})

  @classmethod
  def defaults(cls) -> dict[str, Any]:
    return {field.name: field.default for field in dataclasses.fields(cls)}

  @classmethod
  def placeholder_types(cls) -> dict[str, type]:
    """The type of each field whose default is None (a typed placeholder in the config)."""
    return {field.name: next(t for t in typing.get_args(field.type) if t is not type(None))
            for field in dataclasses.fields(cls) if isinstance(field.type, types.UnionType)}


@dataclasses.dataclass(frozen=True)
class TrainingSettings(Settings):
  """The keys of config.training."""
  SECTION = 'training'
  steps: int = 1000
  grad_accum_steps: int = 1  # the global batch is split into this many sequential microbatches
  label_smoothing: float = 0.0  # of the training loss, every family (Szegedy et al. 2016)
  log_every: int = 50
  eval_every: int = 500
  checkpoint_every: int = 500
  keep_checkpoints: int = 3
  peak_flops_per_device: float | None = None  # for MFU where the table has none
  # A jax.profiler trace of profile_steps steps from step profile_start (as the log numbers them;
  # unset: none), in WORKDIR/profile for TensorBoard/XProf and Perfetto. A run resumed past that
  # step traces nothing.
  profile_start: int | None = None
  profile_steps: int = 3
  # The memory of one device, for the plan of --mode=describe; unset: what JAX reports for the
  # device (GPUs and TPUs do; a CPU does not).
  device_memory_gb: float | None = None


@dataclasses.dataclass(frozen=True)
class MeshSettings(Settings):
  """The device mesh: axis names and sizes; -1 takes all remaining devices of all processes.
  Tensor parallelism needs a 'model' axis: axes=('data', 'model'), shape=(-1, 2)."""
  SECTION = 'mesh'
  axes: tuple[str, ...] = ('data',)
  shape: tuple[int, ...] = (-1,)
