"""Per-example image preprocessing from a spec string, after big_vision's pp strings:

    'decode|inception_crop(224)|flip_lr|randaug(2, 10)|value_range(-1, 1)'

ops separated by '|', each `name` or `name(args)` with Python literals as arguments. `build`
checks the whole spec before any data is read and returns a picklable `Preprocess`, called on
one example in a data worker with the numpy generator of that example: every random draw comes
from it. The ops are Pillow and numpy on the CPU, overlapped with the device's step.
"""
import ast
import difflib
import inspect
import io

import numpy as np
from PIL import Image

from transformer_jax.data import randaugment
from transformer_jax.errors import ConfigError

__all__ = ['METHODS', 'OPS', 'Preprocess', 'build', 'parse']

Size = tuple[int, int] | None  # (height, width) when an op fixes both, else None


def _require(ok: bool, message: str):
  if not ok:
    raise ValueError(message)


def _positive_int(name: str, value):
  _require(isinstance(value, int) and not isinstance(value, bool) and value > 0,
           f'{name} must be a positive int, got {value!r}')


def _number(name: str, value, low: float = -np.inf, high: float = np.inf):
  within = f' in [{low}, {high}]' if np.isfinite([low, high]).all() else ''
  _require(isinstance(value, (int, float)) and not isinstance(value, bool) and
           low <= value <= high, f'{name} must be a number{within}, got {value!r}')


def _pair(height: int, width: int | None) -> tuple[int, int]:
  width = height if width is None else width
  _positive_int('height', height)
  _positive_int('width', width)
  return height, width


class _Op:
  """One op: its constructor takes the spec's arguments and checks them; `random` says whether
  it draws from the generator; `output_size` maps the (height, width) it is given (or None
  when unknown) to the one it returns."""
  random = False

  def __call__(self, image: np.ndarray, generator: np.random.Generator) -> np.ndarray:
    raise NotImplementedError

  def output_size(self, size: Size) -> Size:
    return size


class Decode(_Op):
  """decode, or decode(channels) for arrays that are no image (latents: a VAE's 32x32x4).

  decode: encoded bytes (PNG, JPEG, ...) or a uint8 array (H, W), (H, W, 1), (H, W, 3),
  (H, W, 4) to uint8 (H, W, 3): grey is repeated, alpha dropped (bytes of other modes, such as a
  palette, by Pillow's conversion to RGB). decode(C), C other than 3: uint8 arrays (H, W, C)
  kept as they are, since their channels have no colour mode.
  """

  def __init__(self, channels: int = 3):
    _positive_int('channels', channels)
    self.channels = channels

  def __call__(self, image, generator):
    if self.channels != 3:
      image = np.asarray(image)
      _require(image.dtype == np.uint8 and image.ndim == 3 and image.shape[-1] == self.channels,
               f'decode({self.channels}) takes uint8 arrays (H, W, {self.channels}), got '
               f'{getattr(image, "dtype", type(image).__name__)} {getattr(image, "shape", "")}')
      return image
    if isinstance(image, (bytes, bytearray, memoryview)):
      with Image.open(io.BytesIO(image)) as decoded:  # RGB is already RGB: no converted copy
        return np.asarray(decoded if decoded.mode == 'RGB' else decoded.convert('RGB'))
    image = np.asarray(image)
    if image.dtype != np.uint8 or image.ndim not in (2, 3) or (
        image.ndim == 3 and image.shape[-1] not in (1, 3, 4)):
      raise ValueError(f'decode takes encoded bytes or uint8 images (H, W) or (H, W, 1|3|4), '
                       f'got {image.dtype} {image.shape}')
    if image.ndim == 2:
      image = image[..., None]
    return np.repeat(image, 3, axis=-1) if image.shape[-1] == 1 else image[..., :3]


# Pillow's resampling filters by the names the ops take (`method`); each widens its support to
# antialias when shrinking. transformers' image processors name them by these numbers
# (`resample`: PILImageResampling, Pillow's own values).
METHODS = {'nearest': Image.Resampling.NEAREST, 'bilinear': Image.Resampling.BILINEAR,
           'bicubic': Image.Resampling.BICUBIC, 'lanczos': Image.Resampling.LANCZOS,
           'box': Image.Resampling.BOX, 'hamming': Image.Resampling.HAMMING}


def _method(method: str) -> str:
  _require(method in METHODS, f"method must be one of {', '.join(METHODS)}, got {method!r}")
  return method


def _resize(image: np.ndarray, height: int, width: int, method: str = 'bilinear') -> np.ndarray:
  """Pillow's resize with the filter `method` (METHODS)."""
  return np.asarray(Image.fromarray(image).resize((width, height), METHODS[method]))


class Resize(_Op):
  """resize(S) or resize(height, width), method='bilinear': to exactly that size with Pillow's
  filter `method` (METHODS; transformers' SigLIP processor: 'bicubic')."""

  def __init__(self, height: int, width: int | None = None, method: str = 'bilinear'):
    self.size, self.method = _pair(height, width), _method(method)

  def __call__(self, image, generator):
    return _resize(image, *self.size, self.method)

  def output_size(self, size):
    return self.size


class ResizeSmall(_Op):
  """resize_small(S, method='bilinear', floor=False): the shorter side to S, the longer one
  rounded to keep the aspect ratio (as big_vision's), or with `floor` rounded down,
  int(S * long / short), as torchvision's Resize(S) and transformers' `shortest_edge` (CLIP's
  processor) compute it; Pillow's filter `method`."""

  def __init__(self, size: int, method: str = 'bilinear', floor: bool = False):
    _positive_int('size', size)
    _require(isinstance(floor, bool), f'floor must be True or False, got {floor!r}')
    self.size, self.method, self.floor = size, _method(method), floor

  def __call__(self, image, generator):
    height, width = image.shape[:2]
    if self.floor:
      long = int(self.size * max(height, width) / min(height, width))
      shape = (long, self.size) if width <= height else (self.size, long)
    else:
      scale = self.size / min(height, width)
      shape = (round(height * scale), round(width * scale))
    return _resize(image, *shape, self.method)

  def output_size(self, size):
    return None


def _draw_offsets(generator: np.random.Generator, rows: int, columns: int) -> tuple[int, int]:
  """(top, left) uniform in [0, rows) x [0, columns): the numbers of one
  `generator.integers(0, [rows, columns])`, which draws each bound in turn, without the cost of
  its broadcasting (a few microseconds an image)."""
  return int(generator.integers(rows)), int(generator.integers(columns))


def _crop_offsets(shape: tuple[int, ...], height: int, width: int,
                  op: str) -> tuple[int, int]:
  """The room (rows, columns) left around a crop from an image of `shape`, refusing an image
  smaller than the crop."""
  rows, columns = shape[0] - height, shape[1] - width
  if rows < 0 or columns < 0:
    raise ValueError(f'{op} of {height}x{width} from an image of '
                     f'{shape[0]}x{shape[1]}: resize it first (e.g. resize_small)')
  return rows, columns


class CentralCrop(_Op):
  """central_crop(S) or central_crop(height, width): the centre, offsets (H - h) // 2."""

  def __init__(self, height: int, width: int | None = None):
    self.size = _pair(height, width)

  def __call__(self, image, generator):
    rows, columns = _crop_offsets(image.shape, *self.size, 'central_crop')
    top, left = rows // 2, columns // 2
    return image[top:top + self.size[0], left:left + self.size[1]]

  def output_size(self, size):
    return self.size


class RandomCrop(_Op):
  """random_crop(S, pad=0): zero padding of `pad` on every side, then an S x S crop at offsets
  (top, left) drawn uniformly (_draw_offsets)."""
  random = True

  def __init__(self, size: int, pad: int = 0):
    _positive_int('size', size)
    _require(isinstance(pad, int) and pad >= 0, f'pad must be an int >= 0, got {pad!r}')
    self.size, self.pad = size, pad

  def __call__(self, image, generator):
    height, width = image.shape[:2]
    pad, size = self.pad, self.size
    room = _crop_offsets((height + 2 * pad, width + 2 * pad), size, size, 'random_crop')
    top, left = (offset - pad for offset in _draw_offsets(generator, room[0] + 1, room[1] + 1))
    if 0 <= top <= height - size and 0 <= left <= width - size:
      return image[top:top + size, left:left + size]
    # The window reaches into the padding: its part of the image on zeros, without padding the
    # whole image first.
    out = np.zeros((size, size, *image.shape[2:]), image.dtype)
    (row, row_end), (column, column_end) = (
        (max(start, 0), max(min(start + size, side), start, 0))
        for start, side in ((top, height), (left, width)))
    out[row - top:row_end - top, column - left:column_end - left] = image[
        row:row_end, column:column_end]
    return out

  def output_size(self, size):
    return self.size, self.size


class InceptionCrop(_Op):
  """inception_crop(S, area_min=5, area_max=100, method='bilinear'): the random-resized crop of
  Szegedy et al. 2015 (torchvision's RandomResizedCrop): up to 10 tries of an area of
  area_min..area_max percent of the image and a log-uniform aspect ratio in [3/4, 4/3] until the
  box fits, else the central crop of the nearest ratio in range; resized to S x S by Pillow's
  filter `method`. big_vision's ViT configs use area_min=5 (torchvision's default is 8);
  open_clip trains with area_min=90, method='bicubic' (its RandomResizedCrop(scale=(0.9, 1)))."""
  random = True
  _TRIES = 10
  _LOG_RATIOS = (np.log(3 / 4), np.log(4 / 3))

  def __init__(self, size: int, area_min: float = 5, area_max: float = 100,
               method: str = 'bilinear'):
    _positive_int('size', size)
    self.method = _method(method)
    _number('area_min', area_min, 0, 100)
    _number('area_max', area_max, 0, 100)
    _require(0 < area_min <= area_max, f'need 0 < area_min <= area_max (percent of the image), '
             f'got {area_min}, {area_max}')
    self.size, self.area_min, self.area_max = size, area_min, area_max

  def box(self, height: int, width: int, generator: np.random.Generator):
    """(top, left, box_height, box_width) of the crop of an image of height x width."""
    for _ in range(self._TRIES):
      area = height * width * generator.uniform(self.area_min, self.area_max) / 100
      ratio = np.exp(generator.uniform(*self._LOG_RATIOS))
      box_width, box_height = round(np.sqrt(area * ratio)), round(np.sqrt(area / ratio))
      if 0 < box_width <= width and 0 < box_height <= height:
        top, left = _draw_offsets(generator, height - box_height + 1, width - box_width + 1)
        return top, left, box_height, box_width
    ratio = np.clip(width / height, 3 / 4, 4 / 3)
    box_height, box_width = min(height, round(width / ratio)), min(width, round(height * ratio))
    return (height - box_height) // 2, (width - box_width) // 2, box_height, box_width

  def __call__(self, image, generator):
    top, left, height, width = self.box(*image.shape[:2], generator)
    return _resize(image[top:top + height, left:left + width], self.size, self.size,
                   self.method)

  def output_size(self, size):
    return self.size, self.size


class FlipLR(_Op):
  """flip_lr(p=0.5): a horizontal flip with probability p."""
  random = True

  def __init__(self, p: float = 0.5):
    _number('p', p, 0, 1)
    self.p = p

  def __call__(self, image, generator):
    return image[:, ::-1] if generator.random() < self.p else image


class RandAug(_Op):
  """randaug(num_ops=2, magnitude=9): RandAugment (randaugment.py)."""
  random = True

  def __init__(self, num_ops: int = 2, magnitude: float = 9):
    _require(isinstance(num_ops, int) and num_ops >= 0, f'num_ops must be an int >= 0, '
             f'got {num_ops!r}')
    _number('magnitude', magnitude, 0, randaugment.MAX_LEVEL)
    self.num_ops, self.magnitude = num_ops, magnitude

  def __call__(self, image, generator):
    return randaugment.rand_augment(image, generator, self.num_ops, self.magnitude)


def _channel_values(name: str, value) -> np.ndarray:
  values = np.asarray(value, np.float32)
  _require(values.ndim <= 1, f'{name} must be a number or one per channel, got {value!r}')
  return values


class Normalize(_Op):
  """normalize(mean, std): float32 (x - mean) / std, in pixel units (0..255), a number or one
  per channel each: statistics of pixels in [0, 1] (transformers' image_mean and image_std)
  times 255, as big_vision's vgg_value_range and clip_value_range write them."""

  def __init__(self, mean, std):
    self.mean, self.std = _channel_values('mean', mean), _channel_values('std', std)
    _require(bool(np.all(self.std > 0)), f'std must be positive, got {std!r}')
    self._per_pixel = ((), self.mean, self.std)  # (shape, mean and std of that shape)

  def __call__(self, image, generator):
    # The same operations on arrays of the image's shape: numpy's loops over 3 channels at a time
    # cost several times more. Those of the last shape are kept (one, so that images of many
    # sizes take no memory), read once: grain's threads share the op.
    shape, mean, std = self._per_pixel
    if shape != image.shape:
      mean, std = (np.broadcast_to(values, image.shape).copy() for values in (self.mean, self.std))
      self._per_pixel = (image.shape, mean, std)
    out = image.astype(np.float32)
    out -= mean
    out /= std
    return out


class ValueRange(_Op):
  """value_range(low=-1, high=1): float32, [0, 255] mapped linearly onto [low, high]."""

  def __init__(self, low: float = -1, high: float = 1):
    _number('low', low)
    _number('high', high)
    _require(low < high, f'need low < high, got {low!r}, {high!r}')
    self.low, self.high = low, high

  def __call__(self, image, generator):
    return image.astype(np.float32) * np.float32((self.high - self.low) / 255) + np.float32(
        self.low)


OPS = {
    'decode': Decode,
    'resize': Resize,
    'resize_small': ResizeSmall,
    'central_crop': CentralCrop,
    'random_crop': RandomCrop,
    'inception_crop': InceptionCrop,
    'flip_lr': FlipLR,
    'randaug': RandAug,
    'normalize': Normalize,
    'value_range': ValueRange,
}
_FLOAT_OPS = ('normalize', 'value_range')  # ops whose output is float32: the last op, if any


def _usage(name: str) -> str:
  """'resize(height, width=None)'."""
  parameters = [p.name if p.default is p.empty else f'{p.name}={p.default!r}'
                for p in inspect.signature(OPS[name]).parameters.values()]
  return f"{name}({', '.join(parameters)})"


def _parse_op(text: str) -> tuple[str, tuple, dict]:
  """'name' or 'name(literal, ..., key=literal)' -> (name, args, kwargs); ValueError if not."""
  try:
    node = ast.parse(text, mode='eval').body
  except SyntaxError:
    node = None
  if isinstance(node, ast.Name):
    name, args, kwargs = node.id, (), {}
  elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
    try:
      name = node.func.id
      args = tuple(ast.literal_eval(arg) for arg in node.args)
      kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg is not None}
    except (ValueError, TypeError):
      raise ValueError(f'{text!r}: arguments must be Python literals (numbers, strings, '
                       f'tuples)') from None
    if len(kwargs) < len(node.keywords):
      raise ValueError(f'{text!r}: write keyword arguments out, not **')
  else:
    raise ValueError(f'{text!r} is not an op: write name or name(args), e.g. random_crop(32, '
                     f'pad=4)')
  if name not in OPS:
    nearest = difflib.get_close_matches(name, OPS, n=1)
    hint = f"did you mean '{nearest[0]}'? " if nearest else ''
    raise ValueError(f"unknown op '{name}': {hint}the ops are {', '.join(OPS)}")
  try:
    inspect.signature(OPS[name]).bind(*args, **kwargs)
  except TypeError as error:
    raise ValueError(f'{text}: {error}; the op takes {_usage(name)}') from None
  return name, args, kwargs


def parse(spec: str, key: str = 'data.pp') -> list[tuple[str, tuple, dict]]:
  """[(op name, positional args, keyword args)] of a spec, each op known and its arguments
  accepted by its signature; ConfigError naming `key` otherwise."""
  if not isinstance(spec, str) or not spec.strip():
    raise ConfigError(f"{key}={spec!r}: give the preprocessing ops as a string, e.g. "
                      f"'decode|resize(32)|value_range(-1, 1)'")
  try:
    return [_parse_op(text.strip()) for text in spec.split('|')]
  except ValueError as error:
    raise ConfigError(f'{key}={spec!r}: {error}') from None


def build(spec: str, key: str = 'data.pp') -> 'Preprocess':
  """The Preprocess of a spec, checked whole (ops, arguments, order) before any data is read."""
  ops = parse(spec, key)
  names = [name for name, _, _ in ops]
  if 'decode' in names[1:]:
    raise ConfigError(f"{key}={spec!r}: decode must be the first op (it is implied when absent)")
  if any(name in _FLOAT_OPS for name in names[:-1]):
    raise ConfigError(f'{key}={spec!r}: {" or ".join(_FLOAT_OPS)} must be the last op, and only '
                      f'one of them: the ops before it work on uint8 pixels')
  if names[0] != 'decode':
    ops.insert(0, ('decode', (), {}))
  built = []
  for name, args, kwargs in ops:
    try:
      built.append(OPS[name](*args, **kwargs))
    except ValueError as error:
      call = ', '.join([*map(repr, args), *(f'{k}={v!r}' for k, v in kwargs.items())])
      raise ConfigError(f'{key}={spec!r}: {name}({call}): {error}') from None
  return Preprocess(spec, built)


class Preprocess:
  """The ops of a spec, applied in order to one example: `preprocess(image, generator)`.

  The output is uint8 (H, W, 3) (H, W, C after decode(C)), or float32 when the spec ends with
  normalize or value_range.
  """

  def __init__(self, spec: str, ops: list[_Op]):
    self.spec, self.ops = spec, ops

  def __call__(self, image, generator: np.random.Generator) -> np.ndarray:
    for op in self.ops:
      image = op(image, generator)
    return np.ascontiguousarray(image)

  def output_shape(self) -> tuple[int, int, int] | None:
    """(height, width, channels) of every output when the ops fix both sides, else None."""
    size = None
    for op in self.ops:
      size = op.output_size(size)
    return None if size is None else (*size, self.ops[0].channels)  # ops[0]: the decode

  @property
  def is_random(self) -> bool:
    return any(op.random for op in self.ops)

  def __repr__(self) -> str:
    return f'Preprocess({self.spec!r})'
