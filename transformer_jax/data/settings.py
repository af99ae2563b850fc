"""The data section's settings: the keys every source shares (DataSettings), and the settings
each source or task owns (a DataPart declared beside its code and registered here), all read from
the one flat config.data section, resolved once (`DataSettings.of(config.data)`).

A new source adds its keys by declaring a DataPart and calling `register_part`: the config's data
section (config_lib.base_config) is the shared keys and every registered part's."""
import dataclasses
import types
from typing import Any, ClassVar, Mapping

from transformer_jax.errors import ConfigError
from transformer_jax.ranges import COUNT, Range
from transformer_jax.settings import Settings

__all__ = ['DataPart', 'DataSettings', 'parts', 'register_part']


class DataPart(Settings):
  """The keys of config.data that one source or task owns (frozen dataclass fields, with their
  RANGES and CHOICES); PART names it."""
  SECTION = 'data'
  PART: ClassVar[str] = ''

  @classmethod
  def pick(cls, values: Mapping[str, Any]) -> 'DataPart':
    """The part's settings from a data section's values (the other keys are left for others)."""
    own = cls.defaults()
    return cls.of({key: value for key, value in values.items() if key in own})

  def sizes(self) -> dict[str, int]:
    """The model sizes these settings state (a tokenizer's vocab_size), which the model's unset
    ones follow."""
    return {}


_PARTS: dict[str, type[DataPart]] = {}


def register_part(part: type[DataPart]) -> type[DataPart]:
  """Adds (or replaces) a part; its keys join config.data. Usable as a class decorator."""
  shared = set(DataSettings.defaults()) - {'parts'}
  for key in part.defaults():
    owners = [p.PART for p in _PARTS.values() if p.PART != part.PART and key in p.defaults()]
    if key in shared or owners:
      raise ValueError(f'data.{key} of the part {part.PART!r} is already a key of '
                       f'{owners[0] if owners else "the shared settings"}.')
  _PARTS[part.PART] = part
  return part


def parts() -> dict[str, type[DataPart]]:
  return dict(_PARTS)


@dataclasses.dataclass(frozen=True)
class DataSettings(Settings):
  """The keys every source shares; each registered part's settings are in `parts` (`part`)."""
  SECTION = 'data'
  # A source the data package makes for the family's task (data.TASKS), or any TFDS dataset's
  # name.
  name: str | None = None
  # The data task; None: the model family's. Another task that makes the family's batches
  # (data.Task.layout) may replace it: 'span_corruption' for an encoder-decoder.
  task: str | None = None
  tfds_data_dir: str | None = None  # TFDS data dir; None: TFDS's default (TFDS_DATA_DIR or ~/...)
  manual_dir: str | None = None  # local source files to prepare a dataset from (see sources.py)
  download: bool = True  # whether a dataset that is not prepared may be downloaded
  seq_len: int = 64  # tokens per window or packed row; source and target length of seq2seq
  batch_size: int = 128  # the GLOBAL batch, split evenly over the processes
  eval_batch_size: int | None = None  # None: batch_size
  eval_steps: int = -1  # eval batches; -1 or None: every full batch of the held-out split
  eval_examples: int = 1024  # held-out size of generated data; synthetic trains on 9x as much
  # TFDS split strings: 'train[:98%]', ...; eval_split None: 'test' where the dataset has one,
  # else 'validation'.
  train_split: str = 'train'
  eval_split: str | None = None
  num_threads: int = 2  # grain threads assembling training batches ahead of the device
  prefetch_buffer_size: int = 4  # training batches grain keeps ready
  parts: Mapping[str, DataPart] = dataclasses.field(default_factory=dict, compare=False)

  RANGES = {
      'seq_len': COUNT, 'batch_size': COUNT,
      'eval_batch_size': Range(1, integer=True, optional=True),
      'eval_steps': Range(1, integer=True, special=(-1,), optional=True),
      'eval_examples': COUNT, 'num_threads': Range(0, integer=True),
      'prefetch_buffer_size': Range(0, integer=True),
  }

  @classmethod
  def of(cls, section: 'Mapping[str, Any] | DataSettings') -> 'DataSettings':
    """The shared settings and every registered part's of a data section (a ConfigDict or a
    dict); a key of neither fails, naming the keys there are."""
    if isinstance(section, cls):
      return section
    values = {key: value for key, value in dict(section).items() if value is not None}
    shared = set(cls.defaults()) - {'parts'}
    known = shared.union(*(part.defaults() for part in _PARTS.values()))
    unknown = sorted(set(values) - known)
    if unknown:
      raise ConfigError(f'Unknown data settings {unknown}: the keys of config.data are '
                        f'{sorted(known)}.')
    return cls(**{key: tuple(value) if isinstance(value, list) else value
                  for key, value in values.items() if key in shared},
               parts=types.MappingProxyType(
                   {name: part.pick(values) for name, part in _PARTS.items()}))

  @classmethod
  def defaults(cls) -> dict[str, Any]:
    return {field.name: field.default for field in dataclasses.fields(cls)
            if field.name != 'parts'}

  @classmethod
  def section_defaults(cls) -> dict[str, Any]:
    """Every key of config.data with its default: the shared keys, then each part's."""
    merged = cls.defaults()
    for part in _PARTS.values():
      merged.update(part.defaults())
    return merged

  @classmethod
  def section_types(cls) -> dict[str, type]:
    """The type of each key of config.data whose default is None."""
    merged = cls.placeholder_types()
    for part in _PARTS.values():
      merged.update(part.placeholder_types())
    return merged

  def part(self, part: type[DataPart]) -> DataPart:
    """The settings of a registered part (its defaults where the section was resolved before it
    registered)."""
    return self.parts.get(part.PART) or part()

  def stated_sizes(self) -> dict[str, int]:
    """The model sizes the parts state (data.vocab_size, ...), before any data is read."""
    sizes = {}
    for settings in self.parts.values():
      sizes.update(settings.sizes())
    return sizes

  def to_dict(self) -> dict[str, Any]:
    """The flat data section these settings were resolved from."""
    flat = {key: getattr(self, key) for key in self.defaults()}
    for settings in self.parts.values():
      flat.update(dataclasses.asdict(settings))
    return flat
