"""RandAugment (Cubuk et al. 2019) on uint8 (H, W, 3) arrays with Pillow, as big_vision uses it.

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
"""
from typing import NamedTuple

import numpy as np
from PIL import Image, ImageEnhance, ImageOps

__all__ = ['FILL', 'LEVELS', 'MAX_LEVEL', 'OPS', 'op_arg', 'rand_augment']

MAX_LEVEL = 10
FILL = (128, 128, 128)  # the grey of the pixels that geometric ops and Cutout bring in
_REFERENCE_SIDE = 224  # tensorflow/tpu's translate and cutout constants are pixels at this side
_SOLARIZE_ADD_BELOW = 128


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


def _pil(image: np.ndarray) -> Image.Image:
  return Image.fromarray(image)


def _array(image: Image.Image) -> np.ndarray:
  return np.asarray(image)


def auto_contrast(image: np.ndarray, _=None) -> np.ndarray:
  return _array(ImageOps.autocontrast(_pil(image)))


def equalize(image: np.ndarray, _=None) -> np.ndarray:
  return _array(ImageOps.equalize(_pil(image)))


def invert(image: np.ndarray, _=None) -> np.ndarray:
  return _array(ImageOps.invert(_pil(image)))


def posterize(image: np.ndarray, bits: int) -> np.ndarray:
  return _array(ImageOps.posterize(_pil(image), max(bits, 1)))


def solarize(image: np.ndarray, threshold: int) -> np.ndarray:
  return _array(ImageOps.solarize(_pil(image), threshold))


def solarize_add(image: np.ndarray, addition: int) -> np.ndarray:
  values = np.arange(256)
  lut = np.where(values < _SOLARIZE_ADD_BELOW, np.clip(values + addition, 0, 255), values)
  return lut.astype(np.uint8)[image]


def color(image: np.ndarray, factor: float) -> np.ndarray:
  return _array(ImageEnhance.Color(_pil(image)).enhance(factor))


def contrast(image: np.ndarray, factor: float) -> np.ndarray:
  return _array(ImageEnhance.Contrast(_pil(image)).enhance(factor))


def brightness(image: np.ndarray, factor: float) -> np.ndarray:
  return _array(ImageEnhance.Brightness(_pil(image)).enhance(factor))


def sharpness(image: np.ndarray, factor: float) -> np.ndarray:
  """Blends with Pillow's SMOOTH filter (3x3, centre weight 5 of 13; the border kept)."""
  return _array(ImageEnhance.Sharpness(_pil(image)).enhance(factor))


def rotate(image: np.ndarray, degrees: float) -> np.ndarray:
  """Counter-clockwise about the centre, nearest neighbour as tensorflow/tpu."""
  return _array(_pil(image).rotate(degrees, resample=Image.NEAREST, fillcolor=FILL))


def _affine(image: np.ndarray, matrix: tuple[float, ...]) -> np.ndarray:
  """Output pixel (x, y) takes input pixel (a x + b y + c, d x + e y + f), matrix (a, ..., f)."""
  height, width = image.shape[:2]
  return _array(_pil(image).transform((width, height), Image.AFFINE, matrix,
                                      resample=Image.NEAREST, fillcolor=FILL))


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
