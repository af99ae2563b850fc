"""Valid ranges of numeric settings, and the message that names the key and a value that works."""
import dataclasses
import math
from typing import Any

from transformer_jax.errors import ConfigError

__all__ = ['COUNT', 'FRACTION', 'OPTIONAL_FRACTION', 'Range']


@dataclasses.dataclass(frozen=True)
class Range:
  """The valid values of a numeric config key: [low, high] (open ends where asked), whole
  numbers only where `integer`, plus the `special` values (such as -1 for "all") and None where
  `optional`. Infinities are never admitted, and NaN fails every comparison."""
  low: float | None = None
  high: float | None = None
  integer: bool = False
  open_low: bool = False
  open_high: bool = False
  special: tuple = ()
  optional: bool = False
  example: float | None = None  # the value to suggest, where the key's default is not a good one

  def admits(self, value: Any) -> bool:
    if value is None:
      return self.optional
    if isinstance(value, bool) or not isinstance(value, (int, float)):
      return False
    if value in self.special:
      return True
    if not math.isfinite(value) or (self.integer and value != int(value)):
      return False
    above = self.low is None or (value > self.low if self.open_low else value >= self.low)
    below = self.high is None or (value < self.high if self.open_high else value <= self.high)
    return above and below

  def describe(self) -> str:
    kind = 'a whole number' if self.integer else 'a finite number'
    bounds = []
    if self.low is not None:
      bounds.append(f'{">" if self.open_low else ">="} {self.low:g}')
    if self.high is not None:
      bounds.append(f'{"<" if self.open_high else "<="} {self.high:g}')
    text = f'{kind} {" and ".join(bounds)}'.strip()
    extras = [repr(v) for v in self.special] + (['None'] if self.optional else [])
    return f'{text} (or {" or ".join(extras)})' if extras else text

  def check(self, key: str, value: Any, default: Any = None) -> None:
    """Fails unless `value` is admitted, naming the key and a value that works (`example`, else
    the default where it is one)."""
    if not self.admits(value):
      candidates = (self.example, default, self.low, (self.low or 0) + 1)
      example = next(c for c in candidates if c is not None and self.admits(c))
      raise ConfigError(f'{key}={value!r} must be {self.describe()}: for example '
                        f'--config.{key}={example}.')


COUNT = Range(1, integer=True)  # a positive whole number
FRACTION = Range(0, 1, open_high=True)  # [0, 1)
OPTIONAL_FRACTION = Range(0, 1, open_high=True, optional=True)  # [0, 1) or None
