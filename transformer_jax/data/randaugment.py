"""RandAugment (Cubuk et al. 2019) on uint8 (H, W, 3) arrays, as big_vision uses it.

big_vision's `randaug` runs tensorflow/tpu's `distort_image_with_randaugment`: each of `num_ops`
layers picks one of the 16 ops below uniformly and applies it, always, at the one shared
`magnitude` (out of 10). Its prob argument is drawn but never used for these ops, so no op is
skipped at random here either. Where this file departs from tensorflow/tpu, on purpose:
- Translate and Cutout scale with the image: tensorflow/tpu's 100 px and 40 px are for 224 px
  images and would push a 32 px image out of the frame; here they are fractions of the side that
  give those pixels at 224 px.
- Contrast blends with the mean grey level, as Pillow does; tensorflow/tpu's degenerate image is
  the pixel count / 256 (a known bug that makes the op depend on the image's size).
- Posterize keeps int(4 m / 10) bits, as tensorflow/tpu does (so it weakens as m grows: 3 bits at
  m=9, 4 at m=10); at m < 2.5 that is 0 bits, which TensorFlow's clamped shifts turn into 1 bit,
  and so does this file.
Equalize, AutoContrast and the enhance ops are Pillow's, which tensorflow/tpu re-implements.
The ops are numpy, equal to Pillow 13's to the bit (tests/test_preprocess.py compares them with
the installed Pillow) and several times faster on small images: the pixel maps of ImageOps as
its lookup tables compute them, the enhance ops as its fixed-point grey and float32 blend and
filter, the geometric ops as the source pixels its transforms pick (kept for a shape and
matrix).
"""
import functools
import math
from typing import NamedTuple

import numpy as np

__all__ = ['FILL', 'LEVELS', 'MAX_LEVEL', 'OPS', 'op_arg', 'rand_augment']

MAX_LEVEL = 10
FILL = (128, 128, 128)  # the grey of the pixels that geometric ops and Cutout bring in
_FILL_PIXEL = np.array([FILL], np.uint8)
_REFERENCE_SIDE = 224  # tensorflow/tpu's translate and cutout constants are pixels at this side
_SOLARIZE_ADD_BELOW = 128
_LUMA = np.array([19595, 38470, 7471], np.float32)  # Pillow's RGB to L, in 16-bit fixed point
_VALUES = np.arange(256)  # the identity lookup table
_SMOOTH_WEIGHTS = np.float32([1, 5]) / np.float32(13)  # Pillow's SMOOTH kernel, in float32
_OFFSETS = np.arange(0, 256 * 4, 256)[:, None]  # where a channel's table starts, of 4 at most


class Level(NamedTuple):
  """How an op's argument follows the magnitude m: at_max * m / MAX_LEVEL + offset."""
  at_max: float
  offset: float = 0.0
  signed: bool = False  # negated with probability 1/2
  side: str | None = None  # at_max is pixels at a 224 px 'height', 'width' or 'shorter' side
  integer: bool = False  # truncated to an int, as tensorflow/tpu's int()


# Cubuk et al. 2019 (arXiv:1909.13719), with the constants of tensorflow/tpu's
# models/official/efficientnet/autoaugment.py (level_to_arg, cutout_const=40, translate_const=100).
LEVELS = {
    'AutoContrast': None,
    'Equalize': None,
    'Invert': None,
    'Rotate': Level(30.0, signed=True),  # degrees
    'Posterize': Level(4, integer=True),  # bits kept
    'Solarize': Level(256, integer=True),  # threshold: pixels at or above it are inverted
    'Color': Level(1.8, offset=0.1),  # enhance factor, 1 = unchanged
    'Contrast': Level(1.8, offset=0.1),
    'Brightness': Level(1.8, offset=0.1),
    'Sharpness': Level(1.8, offset=0.1),
    'ShearX': Level(0.3, signed=True),  # shear coefficient
    'ShearY': Level(0.3, signed=True),
    'TranslateX': Level(100, signed=True, side='width'),  # pixels
    'TranslateY': Level(100, signed=True, side='height'),
    'Cutout': Level(40, integer=True, side='shorter'),  # half the side of the grey square
    'SolarizeAdd': Level(110, integer=True),  # added to the pixels below 128
}


def _channel_indices(image: np.ndarray) -> np.ndarray:
  """(C, H * W) intp: each pixel's value + 256 x its channel, its entry in C stacked tables of
  256 (per-channel histograms and lookup tables in one call each, as Pillow keeps them)."""
  channels = image.shape[-1]
  indices = image.reshape(-1, channels).T.astype(np.intp, order='C')
  indices += _OFFSETS[:channels]
  return indices


def _look_up(luts: np.ndarray, indices: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
  """The image of `shape` whose channel c is luts[c] of its pixels (Pillow's Image.point)."""
  planes = np.take(luts.astype(np.uint8).ravel(), indices)  # a channel's pixels in a row
  return np.ascontiguousarray(planes.T).reshape(shape)


def auto_contrast(image: np.ndarray, _=None) -> np.ndarray:
  """Pillow's ImageOps.autocontrast (cutoff 0): each channel's lowest value to 0 and highest to
  255 by int(value x scale + offset), in float64 as its lookup table computes them (then in
  0..255 already, its clipping does nothing); a constant channel is left as it is."""
  planes = np.ascontiguousarray(image.reshape(-1, image.shape[-1]).T)  # a channel a row
  low = planes.min(axis=1, keepdims=True).astype(np.int64)
  spread = planes.max(axis=1, keepdims=True) - low
  scale = np.where(spread > 0, 255.0 / np.maximum(spread, 1), 1.0)
  offset = np.where(spread > 0, -low * scale, 0.0)
  stretched = (planes * scale + offset).astype(np.uint8)
  return np.ascontiguousarray(stretched.T).reshape(image.shape)


def equalize(image: np.ndarray, _=None) -> np.ndarray:
  """Pillow's ImageOps.equalize: per channel, step = (pixels - the count of its highest value)
  // 255, and value v maps to (step // 2 + the count of values below v) // step, at most 255;
  a channel of one value, or of step 0, is left as it is."""
  indices = _channel_indices(image)
  channels, pixels = indices.shape
  counts = np.bincount(indices.ravel(), minlength=256 * channels).reshape(channels, 256)
  highest = 255 - (counts[:, ::-1] > 0).argmax(axis=1)
  steps = (pixels - counts[np.arange(channels), highest])[:, None] // 255
  below = np.cumsum(counts, axis=1) - counts
  luts = np.minimum((steps // 2 + below) // np.maximum(steps, 1), 255)
  return _look_up(np.where(steps > 0, luts, _VALUES), indices, image.shape)


def invert(image: np.ndarray, _=None) -> np.ndarray:
  return 255 - image


def posterize(image: np.ndarray, bits: int) -> np.ndarray:
  """The highest max(bits, 1) bits of each value, as Pillow's ImageOps.posterize."""
  return image & np.uint8(0xFF << (8 - max(bits, 1)) & 0xFF)


def solarize(image: np.ndarray, threshold: int) -> np.ndarray:
  """Values at or above `threshold` inverted, as Pillow's ImageOps.solarize."""
  return np.where(image < threshold, image, 255 - image)


def solarize_add(image: np.ndarray, addition: int) -> np.ndarray:
  return np.take(_solarize_add_lut(addition), image)


@functools.lru_cache(maxsize=32)  # one addition per magnitude
def _solarize_add_lut(addition: int) -> np.ndarray:
  lut = np.where(_VALUES < _SOLARIZE_ADD_BELOW, np.clip(_VALUES + addition, 0, 255), _VALUES)
  lut = lut.astype(np.uint8)
  lut.flags.writeable = False
  return lut


def _grey(pixels: np.ndarray) -> np.ndarray:
  """(H, W, 1) float32 of float32 RGB pixels: Pillow's conversion to L, (19595 R + 38470 G +
  7471 B + 0x8000) >> 16, in whole numbers below 2^24, exact in float32 (a BLAS product, where
  numpy's integer one is slow)."""
  return np.floor((pixels @ _LUMA + 0x8000) * np.float32(2 ** -16))[..., None]


def _blend(degenerate, pixels: np.ndarray, factor: float) -> np.ndarray:
  """Pillow's Image.blend(degenerate, image, factor) of the image's float32 `pixels` (which it
  overwrites), in Pillow's C float32 arithmetic: degenerate + factor x (image - degenerate),
  clipped to 0..255 and truncated."""
  pixels -= degenerate
  pixels *= np.float32(factor)
  pixels += degenerate
  return np.clip(pixels, 0, 255, out=pixels).astype(np.uint8)


def color(image: np.ndarray, factor: float) -> np.ndarray:
  """Pillow's ImageEnhance.Color: a blend with the image's grey levels."""
  pixels = image.astype(np.float32)
  return _blend(_grey(pixels), pixels, factor)


def contrast(image: np.ndarray, factor: float) -> np.ndarray:
  """Pillow's ImageEnhance.Contrast: a blend with the mean grey level rounded to an integer
  (ImageStat's mean of the L image, in float64)."""
  pixels = image.astype(np.float32)
  grey = _grey(pixels)
  mean = int(int(grey.sum(dtype=np.int64)) / grey.size + 0.5)
  return _blend(np.float32(mean), pixels, factor)


def brightness(image: np.ndarray, factor: float) -> np.ndarray:
  """Pillow's ImageEnhance.Brightness: a blend with black."""
  return _blend(np.float32(0), image.astype(np.float32), factor)


def sharpness(image: np.ndarray, factor: float) -> np.ndarray:
  """Pillow's ImageEnhance.Sharpness: a blend with its SMOOTH filter (3x3 of weights 1, the
  centre's 5, over 13; the border pixels kept), in its float32 arithmetic (libImaging/Filter.c:
  a row's three products summed left to right, the rows below, at and above added in turn to
  0.5, clipped to 0..255 and truncated)."""
  pixels = image.astype(np.float32)
  smooth = pixels.copy()
  if min(image.shape[:2]) >= 3:
    weighted = pixels * _SMOOTH_WEIGHTS[0]
    across = (weighted[:, :-2] + weighted[:, 1:-1]) + weighted[:, 2:]
    centre = (weighted[1:-1, :-2] + pixels[1:-1, 1:-1] * _SMOOTH_WEIGHTS[1]) + weighted[1:-1, 2:]
    total = np.float32(0.5) + across[2:]
    total += centre
    total += across[:-2]
    smooth[1:-1, 1:-1] = np.floor(np.clip(total, 0, 255, out=total))
  return _blend(smooth, pixels, factor)


def rotate(image: np.ndarray, degrees: float) -> np.ndarray:
  """Counter-clockwise about the centre, nearest neighbour as tensorflow/tpu: Pillow's
  Image.rotate, to the bit: the transform of its matrix, rounded to 15 digits (which gives
  the pixels of its shortcuts for whole and half turns, and quarter turns of a square)."""
  height, width = image.shape[:2]
  angle = -math.radians(degrees % 360.0)
  a, b = round(math.cos(angle), 15), round(math.sin(angle), 15)
  d, e = round(-math.sin(angle), 15), round(math.cos(angle), 15)
  x, y = -width / 2, -height / 2  # the centre to the origin, turned, and back
  return _affine(image, (a, b, a * x + b * y + 0.0 + width / 2,
                         d, e, d * x + e * y + 0.0 + height / 2))


def _affine(image: np.ndarray, matrix: tuple[float, ...]) -> np.ndarray:
  """Output pixel (x, y) takes input pixel (a x + b y + c, d x + e y + f), matrix (a, ..., f),
  nearest neighbour, FILL outside: Pillow's Image.transform(AFFINE, NEAREST), to the bit."""
  height, width = image.shape[:2]
  sources = _affine_sources(height, width, tuple(float(value) for value in matrix))
  pixels = np.concatenate([image.reshape(-1, image.shape[-1]), _FILL_PIXEL])
  return np.take(pixels, sources, axis=0)


@functools.lru_cache(maxsize=32)  # RandAugment has 10 matrices at a magnitude, a shape
def _affine_sources(height: int, width: int, matrix: tuple[float, ...]) -> np.ndarray:
  """(H, W) read-only: the flat index of the input pixel each output pixel takes, H * W (the
  fill) where none, as Pillow's engines (libImaging/Geometry.c) compute them: one pixel step
  at a time in float64 (ImagingScaleAffine, or beyond 16.16's range), else in 16.16 fixed
  point (affine_fixed); positions truncate, as its COORD and >> 16."""
  a, b, c, d, e, f = matrix
  if b == 0 and d == 0:
    columns = _truncated(_stepped(c + a * 0.5, a, width))[None, :]
    rows = _truncated(_stepped(f + e * 0.5, e, height))[:, None]
  elif _fits_16_16(matrix, width, height):
    fix = lambda value: math.floor(value * 65536.0 + 0.5)
    y, x = np.ogrid[:height, :width]
    columns = (fix(c + a * 0.5 + b * 0.5) + y * fix(b) + x * fix(a)) >> 16
    rows = (fix(f + d * 0.5 + e * 0.5) + y * fix(e) + x * fix(d)) >> 16
  else:
    columns = _truncated(_stepped(_stepped(c + b * 0.5 + a * 0.5, b, height), a, width))
    rows = _truncated(_stepped(_stepped(f + e * 0.5 + d * 0.5, e, height), d, width))
  inside = (columns >= 0) & (columns < width) & (rows >= 0) & (rows < height)
  sources = np.where(inside, rows * width + columns, height * width)
  sources.flags.writeable = False  # shared by every call of the cache
  return sources


def _stepped(starts, step: float, count: int) -> np.ndarray:
  """starts (a number, or one per row) followed by count - 1 additions of `step`, one at a
  time in float64 as Pillow's loops add them (np.cumsum adds in order)."""
  starts = np.asarray(starts, np.float64)[..., None]
  steps = np.full((*starts.shape[:-1], max(count - 1, 0)), step)
  return np.cumsum(np.concatenate([starts, steps], axis=-1), axis=-1)[..., :count]


def _truncated(positions: np.ndarray) -> np.ndarray:
  """Pillow's COORD: -1 below 0, else the whole part."""
  return np.where(positions < 0, -1, positions.astype(np.int64))


def _fits_16_16(matrix: tuple[float, ...], width: int, height: int) -> bool:
  """Pillow's check_fixed at the four corners: every position within +-32768."""
  a, b, c, d, e, f = matrix
  return all(abs(x * a + y * b + c) < 32768.0 and abs(x * d + y * e + f) < 32768.0
             for x, y in ((0, 0), (width, height), (0, height), (width, 0)))


def shear_x(image: np.ndarray, shear: float) -> np.ndarray:
  return _affine(image, (1, shear, 0, 0, 1, 0))


def shear_y(image: np.ndarray, shear: float) -> np.ndarray:
  return _affine(image, (1, 0, 0, shear, 1, 0))


def translate_x(image: np.ndarray, pixels: float) -> np.ndarray:
  """The content moves left by `pixels` (right when negative)."""
  return _affine(image, (1, 0, pixels, 0, 1, 0))


def translate_y(image: np.ndarray, pixels: float) -> np.ndarray:
  """The content moves up by `pixels` (down when negative)."""
  return _affine(image, (1, 0, 0, 0, 1, pixels))


def cutout(image: np.ndarray, box: tuple[int, int, int]) -> np.ndarray:
  """box = (half_side, centre_row, centre_column): that square, clipped to the image, is grey."""
  half, row, column = box
  out = image.copy()
  out[max(row - half, 0):row + half, max(column - half, 0):column + half] = FILL
  return out


OPS = {
    'AutoContrast': auto_contrast,
    'Equalize': equalize,
    'Invert': invert,
    'Rotate': rotate,
    'Posterize': posterize,
    'Solarize': solarize,
    'Color': color,
    'Contrast': contrast,
    'Brightness': brightness,
    'Sharpness': sharpness,
    'ShearX': shear_x,
    'ShearY': shear_y,
    'TranslateX': translate_x,
    'TranslateY': translate_y,
    'Cutout': cutout,
    'SolarizeAdd': solarize_add,
}
_NAMES = tuple(OPS)


def op_arg(name: str, magnitude: float, shape: tuple[int, ...], generator: np.random.Generator):
  """The argument of OPS[name] at `magnitude` for an image of `shape`, drawing its sign (and
  Cutout's centre) from `generator`."""
  level = LEVELS[name]
  if level is None:
    return None
  height, width = shape[:2]
  arg = magnitude / MAX_LEVEL * level.at_max
  if level.side is not None:
    side = {'height': height, 'width': width, 'shorter': min(height, width)}[level.side]
    arg = arg * side / _REFERENCE_SIDE
  arg = int(arg + level.offset) if level.integer else arg + level.offset
  if level.signed and generator.random() < 0.5:
    arg = -arg
  if name == 'Cutout':
    return arg, int(generator.integers(height)), int(generator.integers(width))
  return arg


def rand_augment(image: np.ndarray, generator: np.random.Generator, num_ops: int,
                 magnitude: float) -> np.ndarray:
  """`num_ops` ops, each drawn uniformly from OPS, applied in turn at `magnitude` (0 to 10)."""
  for _ in range(num_ops):
    name = _NAMES[generator.integers(len(_NAMES))]
    image = OPS[name](image, op_arg(name, magnitude, image.shape, generator))
  return image
