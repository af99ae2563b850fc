"""Preprocessing specs, RandAugment and mixup/CutMix: each op against an independent
computation on the same image (numpy formulas, Pillow), the spec errors, and the pairs of
mixing rows whatever the number of processes."""
import io
import math
import pickle
import random

import numpy as np
from PIL import Image
import pytest

from transformer_jax.data import mixing, preprocess, randaugment
from transformer_jax.errors import ConfigError

CIFAR_NORM = 'normalize((125.3, 123.0, 113.9), (63.0, 62.1, 66.7))'


def random_image(height=32, width=40, channels=3, seed=0):
  shape = (height, width) if channels is None else (height, width, channels)
  return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


def gen(seed=0):
  return np.random.default_rng(seed)


def apply(spec, image, seed=0):
  return preprocess.build(spec)(image, gen(seed))


def png(array):
  buffer = io.BytesIO()
  Image.fromarray(array).save(buffer, 'PNG')
  return buffer.getvalue()


def coordinate_image(height, width):
  """Red = 5 x row, green = 5 x column (sides up to 51): a crop can be read back from its
  pixels."""
  rows, columns = np.meshgrid(np.arange(height), np.arange(width), indexing='ij')
  return np.stack([5 * rows, 5 * columns, np.zeros_like(rows)], axis=-1).astype(np.uint8)


# --- spec parsing and checks ---

def test_parse_reads_names_and_literal_arguments():
  assert preprocess.parse("decode|random_crop(32, pad=4)|normalize((1, 2, 3), 4.5)") == [
      ('decode', (), {}), ('random_crop', (32,), {'pad': 4}),
      ('normalize', ((1, 2, 3), 4.5), {})]


@pytest.mark.parametrize('spec,says', [
    ('decode|flip|value_range', "did you mean 'flip_lr'"),
    ('decode|resize(1, 2, 3)', "method must be one of nearest, bilinear, bicubic"),
    ('decode|resize(1, 2, 3, 4)', "resize(height, width=None, method='bilinear')"),
    ("decode|inception_crop(8, method='cubic')", "method must be one of"),
    ('decode|resize_small(8, floor=1)', 'floor must be True or False, got 1'),
    ('decode|inception_crop(224, area=3)', "unexpected keyword argument 'area'"),
    ('decode|resize(-4)', 'height must be a positive int'),
    ('decode|randaug(2, 11)', 'magnitude must be a number in [0, 10]'),
    ("decode|flip_lr('often')", "p must be a number in [0, 1], got 'often'"),
    ('decode|normalize(0, 1)|flip_lr', 'must be the last op'),
    ('decode|value_range|normalize(0, 1)', 'must be the last op'),
    ('flip_lr|decode', 'decode must be the first op'),
    ("decode|resize(__import__('os').getpid())", 'must be Python literals'),
    ('decode||flip_lr', "'' is not an op"),
    ('decode|flip_lr(', 'is not an op'),
    ('', 'give the preprocessing ops as a string'),
])
def test_a_bad_spec_is_refused_at_build_naming_its_key(spec, says):
  with pytest.raises(ConfigError) as error:
    preprocess.build(spec, key='data.pp_train')
  message = str(error.value)
  assert message.startswith('data.pp_train=') and says in message and '\n' not in message


def test_output_shape_and_is_random_follow_the_ops():
  cases = {
      'decode': (None, False),
      'resize_small(256)': (None, False),
      'resize_small(256)|central_crop(224)|value_range(-1, 1)': ((224, 224, 3), False),
      'resize(20, 30)|flip_lr': ((20, 30, 3), True),
      'inception_crop(224)|resize_small(300)': (None, True),
      'decode|random_crop(32, pad=4)|randaug(2, 9)': ((32, 32, 3), True),
  }
  for spec, (shape, is_random) in cases.items():
    built = preprocess.build(spec)
    assert (built.output_shape(), built.is_random) == (shape, is_random), spec


def test_a_preprocess_survives_pickling_with_the_same_outputs():
  spec = f'decode|random_crop(32, pad=4)|flip_lr|randaug(2, 9)|{CIFAR_NORM}'
  built = preprocess.build(spec)
  copy = pickle.loads(pickle.dumps(built))
  image = random_image(32, 32)
  np.testing.assert_array_equal(copy(image, gen(5)), built(image, gen(5)))
  assert repr(copy) == f'Preprocess({spec!r})'


# --- the ops ---

@pytest.mark.parametrize('channels', [None, 1, 3, 4])
def test_decode_of_png_bytes_and_of_arrays_gives_rgb(channels):
  image = random_image(channels=channels)
  planes = image.reshape(*image.shape[:2], -1)
  expected = np.repeat(planes, 3, axis=-1) if planes.shape[-1] == 1 else planes[..., :3]
  from_array = apply('decode', image)
  assert from_array.dtype == np.uint8 and from_array.shape == (32, 40, 3)
  np.testing.assert_array_equal(from_array, expected)
  if channels != 1:  # Pillow writes no (H, W, 1) PNG
    np.testing.assert_array_equal(apply('decode', png(image)), expected)


def test_decode_of_c_channels_keeps_latents_as_they_are():
  """decode(4): a VAE's 32x32x4 latents (as uint8 stand-ins) are no RGBA image: every channel is
  kept; arrays of other channel counts and encoded bytes are refused."""
  latents = random_image(32, 32, channels=4)
  np.testing.assert_array_equal(apply('decode(4)', latents), latents)
  assert apply('decode', latents).shape == (32, 32, 3)
  assert preprocess.build('decode(4)|random_crop(32, pad=4)').output_shape() == (32, 32, 4)
  mean, std = (10.0, 20.0, 30.0, 40.0), (2.0, 4.0, 5.0, 8.0)
  np.testing.assert_allclose(apply(f'decode(4)|normalize({mean}, {std})', latents),
                             (latents - np.float32(mean)) / np.float32(std), rtol=1e-6)
  for wrong in (random_image(32, 32, channels=3), png(random_image(32, 32, channels=4))):
    with pytest.raises(ValueError, match=r'decode\(4\) takes uint8 arrays \(H, W, 4\)'):
      apply('decode(4)', wrong)


def encoded(image, format='PNG'):
  buffer = io.BytesIO()
  image.save(buffer, format)
  return buffer.getvalue()


def test_decode_of_bytes_of_other_modes_gives_their_rgb_colours():
  indices = random_image(channels=None) % 7
  palette = random_image(7, 1, seed=1)[:, 0]  # 7 colours
  paletted = Image.fromarray(indices)
  paletted.putpalette(palette.ravel().tolist())  # 'L' becomes 'P'
  assert paletted.mode == 'P'
  np.testing.assert_array_equal(apply('decode', encoded(paletted)), palette[indices])
  grey_alpha = random_image(channels=2)
  np.testing.assert_array_equal(apply('decode', encoded(Image.fromarray(grey_alpha))),
                                np.repeat(grey_alpha[..., :1], 3, axis=-1))
  bits = random_image(channels=None) > 127
  np.testing.assert_array_equal(apply('decode', encoded(Image.fromarray(bits))),
                                np.repeat(bits[..., None] * np.uint8(255), 3, axis=-1))
  cmyk = Image.frombytes('CMYK', (40, 32), random_image(channels=4).tobytes())
  from_jpeg = Image.open(io.BytesIO(encoded(cmyk, 'JPEG')))
  assert from_jpeg.mode == 'CMYK'
  np.testing.assert_array_equal(apply('decode', encoded(cmyk, 'JPEG')),
                                np.asarray(from_jpeg.convert('RGB')))


def test_decode_refuses_what_is_not_a_uint8_image():
  with pytest.raises(ValueError, match='float32'):
    apply('decode', np.zeros((4, 4, 3), np.float32))
  with pytest.raises(ValueError, match=r'\(4, 4, 2\)'):
    apply('decode', np.zeros((4, 4, 2), np.uint8))


def test_decode_of_jpeg_bytes_is_pillows_decoding():
  buffer = io.BytesIO()
  Image.fromarray(random_image()).save(buffer, 'JPEG', quality=90)
  expected = np.asarray(Image.open(io.BytesIO(buffer.getvalue())))
  np.testing.assert_array_equal(apply('decode', buffer.getvalue()), expected)


def test_resize_is_pillows_bilinear_to_exactly_that_size():
  image = random_image(32, 40)
  for spec, (height, width) in {'resize(20, 24)': (20, 24), 'resize(64)': (64, 64)}.items():
    expected = np.asarray(Image.fromarray(image).resize((width, height), Image.BILINEAR))
    np.testing.assert_array_equal(apply(spec, image), expected)


@pytest.mark.parametrize('method', sorted(preprocess.METHODS))
def test_each_resize_method_is_that_filter_of_pillows(method):
  image = random_image(32, 40)
  filter_ = getattr(Image.Resampling, method.upper())
  for spec, (height, width) in {f"resize(20, 24, method='{method}')": (20, 24),
                                f"resize_small(16, method='{method}')": (16, 20)}.items():
    expected = np.asarray(Image.fromarray(image).resize((width, height), filter_))
    np.testing.assert_array_equal(apply(spec, image), expected)


@pytest.mark.parametrize('shape,size,expected', [
    ((375, 500), 256, (256, 341)), ((500, 375), 256, (341, 256)), ((32, 32), 48, (48, 48)),
    ((300, 200), 100, (150, 100))])
def test_resize_small_sets_the_shorter_side_and_keeps_the_aspect(shape, size, expected):
  out = apply(f'resize_small({size})', random_image(*shape))
  assert out.shape == (*expected, 3)


@pytest.mark.parametrize('shape,size', [((20, 31), 12), ((31, 20), 12), ((375, 500), 224),
                                        ((13, 13), 7), ((7, 200), 5)])
def test_resize_small_with_floor_sizes_as_transformers_shortest_edge(shape, size):
  """floor=True: the longer side int(S * long / short), as transformers' CLIP processor and
  torchvision's Resize(S) compute it (20x31 to 12: 18 columns, where rounding gives 19)."""
  transforms = pytest.importorskip('transformers.image_transforms')
  image = random_image(*shape)
  expected = transforms.get_resize_output_image_size(image, size, default_to_square=False,
                                                     input_data_format='channels_last')
  out = apply(f'resize_small({size}, floor=True)', image)
  assert out.shape == (*expected, 3)
  if shape == (20, 31):
    assert apply(f'resize_small({size})', image).shape == (12, 19, 3)


def test_central_crop_is_the_centre_slice_and_refuses_a_smaller_image():
  image = random_image(33, 40)
  np.testing.assert_array_equal(apply('central_crop(16, 20)', image), image[8:24, 10:30])
  np.testing.assert_array_equal(apply('central_crop(7)', image), image[13:20, 16:23])
  with pytest.raises(ValueError, match='central_crop of 34x34 from an image of 33x40'):
    apply('central_crop(34)', image)


def test_random_crop_is_a_slice_of_the_zero_padded_image_at_drawn_offsets():
  image = random_image(32, 32)
  padded = np.pad(image, ((4, 4), (4, 4), (0, 0)))
  tops = set()
  for seed in range(60):
    top, left = gen(seed).integers(0, [9, 9])
    tops.add(int(top))
    np.testing.assert_array_equal(apply('random_crop(32, pad=4)', image, seed),
                                  padded[top:top + 32, left:left + 32])
  assert tops == set(range(9))


@pytest.mark.parametrize('shape,size,pad', [((9, 13), 8, 3), ((12, 10), 5, 7), ((6, 6), 6, 0),
                                            ((3, 4), 4, 2)])
def test_random_crop_windows_anywhere_in_the_padding_are_those_of_the_padded_image(shape, size,
                                                                                   pad):
  image = random_image(*shape) | 1  # no zero pixel: the padding is told apart
  padded = np.pad(image, ((pad, pad), (pad, pad), (0, 0)))
  zeros = []
  for seed in range(120):
    top, left = gen(seed).integers(0, [shape[0] + 2 * pad - size + 1,
                                       shape[1] + 2 * pad - size + 1])
    out = apply(f'random_crop({size}, pad={pad})', image, seed)
    np.testing.assert_array_equal(out, padded[top:top + size, left:left + size])
    zeros.append((out == 0).mean())
  assert any(0 < z < 1 for z in zeros) == (pad > 0)  # windows reach into the padding,
  assert (max(zeros) == 1) == (pad > size)  # lie all in it where it is wider than they are,
  assert (min(zeros) == 0) == (min(shape) >= size)  # and all in the image where it has room


def test_random_crop_refuses_a_padded_image_smaller_than_the_crop():
  with pytest.raises(ValueError, match='random_crop of 9x9 from an image of 8x10'):
    apply('random_crop(9, pad=1)', random_image(6, 8))


def test_flip_lr_mirrors_the_columns_with_probability_p():
  image = random_image()
  np.testing.assert_array_equal(apply('flip_lr(p=1)', image), image[:, ::-1])
  np.testing.assert_array_equal(apply('flip_lr(0)', image), image)
  flipped = [np.array_equal(apply('flip_lr', image, seed), image[:, ::-1]) for seed in range(200)]
  assert 70 < sum(flipped) < 130


def crop_box_of(output):
  """(top, left, height, width) of the crop of a coordinate image that `output` enlarges."""
  rows, columns = np.rint(output[..., 0] / 5), np.rint(output[..., 1] / 5)
  top, left = int(rows.min()), int(columns.min())
  return top, left, int(rows.max()) - top + 1, int(columns.max()) - left + 1


def test_inception_crop_boxes_stay_within_the_area_and_aspect_ranges():
  height, width, size = 40, 50, 128  # every box is enlarged, so its pixels can be read back
  image = coordinate_image(height, width)
  fractions = []
  for seed in range(100):
    out = apply(f'inception_crop({size})', image, seed)
    top, left, h, w = crop_box_of(out)
    # The box is the crop, resized (not an artefact of reading it back).
    crop = image[top:top + h, left:left + w]
    np.testing.assert_array_equal(out, np.asarray(
        Image.fromarray(crop).resize((size, size), Image.BILINEAR)))
    # h and w are rounded from a box of area 5..100 % and aspect ratio w / h in [3/4, 4/3].
    assert (w + 0.5) * (h + 0.5) >= 0.05 * height * width
    assert (w + 0.5) / (h - 0.5) >= 3 / 4 and (w - 0.5) / (h + 0.5) <= 4 / 3
    fractions.append(h * w / (height * width))
  assert min(fractions) < 0.2 and max(fractions) > 0.8


def torchvision_box(height, width, scale, ratio, draw):
  """(top, left, height, width): torchvision's RandomResizedCrop.get_params (torchvision 0.2x,
  transforms.py), its torch draws replaced by `draw` (Python's random.Random)."""
  area = height * width
  log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
  for _ in range(10):
    target_area = area * draw.uniform(*scale)
    aspect_ratio = math.exp(draw.uniform(*log_ratio))
    w = int(round(math.sqrt(target_area * aspect_ratio)))
    h = int(round(math.sqrt(target_area / aspect_ratio)))
    if 0 < w <= width and 0 < h <= height:
      return draw.randint(0, height - h), draw.randint(0, width - w), h, w
  in_ratio = width / height
  if in_ratio < min(ratio):
    w, h = width, int(round(width / min(ratio)))
  elif in_ratio > max(ratio):
    h, w = height, int(round(height * max(ratio)))
  else:
    w, h = width, height
  return (height - h) // 2, (width - w) // 2, h, w


@pytest.mark.parametrize('shape', [(300, 400), (256, 256), (400, 250)])
def test_open_clips_crop_draws_torchvisions_boxes(shape):
  """inception_crop(S, area_min=90, area_max=100), open_clip's RandomResizedCrop(scale=(0.9,
  1.0)): the boxes' areas, aspect ratios and offsets are distributed as those of torchvision's
  algorithm under other random numbers (two-sample Kolmogorov-Smirnov, 2,000 boxes each), every
  box within the ranges or the fallback."""
  stats = pytest.importorskip('scipy.stats')
  height, width = shape
  op = preprocess.OPS['inception_crop'](224, area_min=90, area_max=100, method='bicubic')
  ours = np.array([op.box(height, width, gen(seed)) for seed in range(2000)])
  draw = random.Random(0)
  theirs = np.array([torchvision_box(height, width, (0.9, 1.0), (3 / 4, 4 / 3), draw)
                     for _ in range(2000)])
  for boxes in (ours, theirs):
    top, left, h, w = boxes.T
    assert (top >= 0).all() and (left >= 0).all()
    assert (top + h <= height).all() and (left + w <= width).all()
  describe = lambda boxes: {'area': boxes[:, 2] * boxes[:, 3], 'ratio': boxes[:, 3] / boxes[:, 2],
                            'top': boxes[:, 0], 'left': boxes[:, 1]}
  for name, values in describe(ours).items():
    assert stats.ks_2samp(values, describe(theirs)[name]).pvalue > 1e-3, name
  # No box of 90-100 % and ratio 3/4..4/3 fits a 400x250 image: each is the fallback.
  fallback = torchvision_box(height, width, (2, 2), (3 / 4, 4 / 3), draw)  # fits no try
  area = ours[:, 2] * ours[:, 3] / (height * width)
  assert ((area > 0.89) & (area <= 1) | (ours == fallback).all(axis=1)).all()


def test_open_clips_crop_is_pillows_bicubic_resize_of_the_box():
  """The output of a drawn box is torchvision's resized_crop of a PIL image: PIL's crop, then
  its bicubic resize to S x S."""
  image = random_image(300, 400)
  spec = "inception_crop(224, area_min=90, area_max=100, method='bicubic')"
  op = preprocess.build(spec).ops[1]
  for seed in range(3):
    top, left, height, width = op.box(300, 400, gen(seed))
    expected = Image.fromarray(image).crop((left, top, left + width, top + height)).resize(
        (224, 224), Image.Resampling.BICUBIC)
    np.testing.assert_array_equal(apply(spec, image, seed), np.asarray(expected))


@pytest.mark.parametrize('shape,box', [((8, 50), (0, 19, 8, 11)), ((50, 8), (19, 0, 11, 8))])
def test_inception_crop_falls_back_to_the_central_crop_of_the_nearest_ratio(shape, box):
  # With at least 60 % of a 1:8 image, no box of ratio 3/4..4/3 fits in 10 tries.
  out = apply('inception_crop(32, area_min=60)', coordinate_image(*shape))
  assert crop_box_of(out) == box


def test_normalize_and_value_range_are_their_formulas_in_float32():
  image = random_image()
  mean, std = np.array([125.3, 123.0, 113.9]), np.array([63.0, 62.1, 66.7])
  out = apply(CIFAR_NORM, image)
  assert out.dtype == np.float32
  np.testing.assert_allclose(out, (image - mean) / std, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(apply('normalize(127.5, 127.5)', image), image / 127.5 - 1,
                             atol=1e-6)
  for low, high in ((-1, 1), (0, 1)):
    out = apply(f'value_range({low}, {high})', image)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, low + image / 255 * (high - low), atol=1e-6)


def test_normalize_gives_each_shape_its_own_float32_formula_in_any_order():
  normalize = preprocess.build(CIFAR_NORM)
  mean = np.float32([125.3, 123.0, 113.9])
  std = np.float32([63.0, 62.1, 66.7])
  for shape in ((32, 40), (32, 40), (8, 5), (32, 40), (1, 1)):
    image = random_image(*shape, seed=sum(shape))
    for pixels in (image, image[:, ::-1]):
      np.testing.assert_array_equal(normalize(pixels, None),
                                    (pixels.astype(np.float32) - mean) / std)


def test_the_reference_specs_give_their_shapes_and_dtypes():
  jpeg = io.BytesIO()
  Image.fromarray(random_image(375, 500)).save(jpeg, 'JPEG')
  for spec in ('decode|inception_crop(224)|flip_lr|randaug(2, 10)|value_range(-1, 1)',
               'decode|resize_small(256)|central_crop(224)|value_range(-1, 1)'):
    out = apply(spec, jpeg.getvalue())
    assert out.shape == (224, 224, 3) and out.dtype == np.float32
    assert -1 <= out.min() < out.max() <= 1
  out = apply('random_crop(32, pad=4)|flip_lr|randaug(2, 9)', random_image(32, 32, 1))
  assert out.shape == (32, 32, 3) and out.dtype == np.uint8


# --- RandAugment ---

def blend(degenerate, image, factor):
  """Pillow's Image.blend: degenerate x (1 - factor) + image x factor, clipped to 0..255."""
  return np.clip(degenerate * (1.0 - factor) + image * factor, 0, 255).astype(np.uint8)


def grey(image):
  """ITU-R 601-2 luma, Pillow's conversion to 'L'."""
  return image @ np.array([0.299, 0.587, 0.114])


def assert_within_one(actual, expected):
  difference = np.abs(actual.astype(int) - expected.astype(int))
  assert difference.max() <= 1 and difference.mean() < 0.5, difference.max()


def ra(name, image, arg):
  out = randaugment.OPS[name](image, arg)
  assert out.dtype == np.uint8 and out.shape == image.shape, name
  return out


@pytest.fixture
def image():
  return random_image(24, 32)


def test_randaugment_pixel_ops_are_their_numpy_formulas(image):
  wide = image.astype(int)
  np.testing.assert_array_equal(ra('Invert', image, None), 255 - image)
  np.testing.assert_array_equal(ra('Solarize', image, 100),
                                np.where(image < 100, image, 255 - image))
  np.testing.assert_array_equal(ra('SolarizeAdd', image, 99),
                                np.where(image < 128, np.minimum(wide + 99, 255), image))
  for bits in (1, 3, 4):
    np.testing.assert_array_equal(ra('Posterize', image, bits),
                                  image & (0xFF << (8 - bits) & 0xFF))
  # 0 bits is tensorflow/tpu's argument below magnitude 2.5; its shifts clamp to 7 bits: 1 kept.
  np.testing.assert_array_equal(ra('Posterize', image, 0), image & 0x80)


def test_randaugment_enhance_ops_blend_with_pillows_degenerate_images(image):
  factor = 1.72  # magnitude 9
  np.testing.assert_array_equal(ra('Brightness', image, factor), blend(0, image, factor))
  np.testing.assert_array_equal(ra('Brightness', image, 0.4), blend(0, image, 0.4))
  # Pillow's grey level is a fixed-point luma, so the others may differ by a rounding.
  mean_grey = np.floor(grey(image).mean() + 0.5)
  assert_within_one(ra('Contrast', image, factor), blend(mean_grey, image, factor))
  assert_within_one(ra('Color', image, factor), blend(np.rint(grey(image))[..., None], image,
                                                      factor))
  smooth = image.astype(float)  # Pillow's SMOOTH: 3x3 of ones, centre 5, / 13; border kept
  windows = np.lib.stride_tricks.sliding_window_view(smooth, (3, 3), axis=(0, 1))
  smooth[1:-1, 1:-1] = (windows.sum(axis=(-2, -1)) + 4 * smooth[1:-1, 1:-1]) / 13
  assert_within_one(ra('Sharpness', image, factor), blend(np.rint(smooth), image, factor))


def test_autocontrast_stretches_each_channel_to_the_full_range(image):
  image = (image // 2 + 40).astype(np.uint8)  # 40..167
  lo, hi = image.min(axis=(0, 1)), image.max(axis=(0, 1))
  expected = np.floor((image - lo) * (255 / (hi - lo))).clip(0, 255)
  np.testing.assert_array_equal(ra('AutoContrast', image, None), expected)
  flat = np.full((4, 4, 3), 9, np.uint8)
  np.testing.assert_array_equal(ra('AutoContrast', flat, None), flat)


def test_equalize_maps_each_channel_through_its_cumulative_histogram(image):
  image = (image // 4 + image // 8).astype(np.uint8)  # an uneven histogram over 0..94
  expected = np.empty_like(image)
  for c in range(3):
    histogram = np.bincount(image[..., c].ravel(), minlength=256)
    step = (histogram.sum() - histogram[np.flatnonzero(histogram)[-1]]) // 255
    lut = (np.concatenate([[0], np.cumsum(histogram)[:-1]]) + step // 2) // step
    expected[..., c] = np.clip(lut, 0, 255)[image[..., c]]
  np.testing.assert_array_equal(ra('Equalize', image, None), expected)


@pytest.mark.parametrize('pixels', [3, -5])
def test_translate_by_whole_pixels_shifts_and_fills_with_grey(image, pixels):
  filled = np.full((24 + 20, 32 + 20, 3), 128, np.uint8)
  filled[10:-10, 10:-10] = image
  np.testing.assert_array_equal(ra('TranslateX', image, pixels),
                                filled[10:-10, 10 + pixels:10 + pixels + 32])
  np.testing.assert_array_equal(ra('TranslateY', image, pixels),
                                filled[10 + pixels:10 + pixels + 24, 10:-10])


def test_shear_takes_each_row_from_its_sheared_position(image):
  shear = 0.3
  rows, columns = np.meshgrid(np.arange(24), np.arange(32), indexing='ij')
  source = np.floor(columns + 0.5 + shear * (rows + 0.5)).astype(int)  # pixel centres
  inside = (source >= 0) & (source < 32)
  expected = np.where(inside[..., None], image[rows, source.clip(0, 31)], 128)
  np.testing.assert_array_equal(ra('ShearX', image, shear), expected)
  np.testing.assert_array_equal(ra('ShearY', image.transpose(1, 0, 2), shear),
                                expected.transpose(1, 0, 2))


def test_rotate_turns_about_the_centre_and_fills_with_grey():
  square = random_image(32, 32)
  np.testing.assert_array_equal(ra('Rotate', square, 90.0), np.rot90(square))
  np.testing.assert_array_equal(ra('Rotate', square, -90.0), np.rot90(square, -1))
  turned = ra('Rotate', square, 30.0)
  assert (turned[0, 0] == 128).all() and (turned[-1, -1] == 128).all()
  np.testing.assert_array_equal(turned[15:17, 15:17].mean(), square[15:17, 15:17].mean())


def test_cutout_greys_the_square_clipped_to_the_image(image):
  out = ra('Cutout', image, (3, 1, 10))  # rows -2..3 and columns 7..12, clipped
  expected = image.copy()
  expected[0:4, 7:13] = 128
  np.testing.assert_array_equal(out, expected)


def test_op_args_at_magnitude_9_are_tensorflow_tpus_scaled_to_the_image():
  def arg(name, shape=(224, 224, 3), seed=0):
    return randaugment.op_arg(name, 9, shape, gen(seed))
  assert [arg(n) for n in ('AutoContrast', 'Equalize', 'Invert')] == [None] * 3
  assert (arg('Posterize'), arg('Solarize'), arg('SolarizeAdd')) == (3, 230, 99)
  for name in ('Color', 'Contrast', 'Brightness', 'Sharpness'):
    assert arg(name) == pytest.approx(1.72)
  signs = set()
  for seed in range(20):
    for name, value in (('Rotate', 27.0), ('ShearX', 0.27), ('TranslateX', 90.0)):
      assert abs(arg(name, seed=seed)) == pytest.approx(value)
    signs.add(np.sign(arg('Rotate', seed=seed)))
  assert signs == {-1, 1}
  assert abs(arg('TranslateX', (32, 64, 3))) == pytest.approx(90 * 64 / 224)
  assert abs(arg('TranslateY', (32, 64, 3))) == pytest.approx(90 * 32 / 224)
  half, row, column = arg('Cutout', (224, 100, 3))
  assert half == int(36 * 100 / 224) and 0 <= row < 224 and 0 <= column < 100
  assert arg('Cutout')[0] == 36


@pytest.mark.parametrize('name', ['Rotate', 'ShearX', 'ShearY', 'TranslateX', 'TranslateY',
                                  'Cutout'])
def test_geometric_ops_are_the_identity_at_magnitude_0(image, name):
  np.testing.assert_array_equal(ra(name, image, randaugment.op_arg(name, 0, image.shape, gen())),
                                image)


def test_rand_augment_is_a_function_of_the_generator_and_stays_uint8_rgb(image):
  outputs = [randaugment.rand_augment(image, gen(seed), 2, 9) for seed in range(40)]
  for seed, out in enumerate(outputs):
    assert out.dtype == np.uint8 and out.shape == image.shape
    np.testing.assert_array_equal(out, randaugment.rand_augment(image, gen(seed), 2, 9))
  distinct = {out.tobytes() for out in outputs}
  assert len(distinct) > 30
  np.testing.assert_array_equal(randaugment.rand_augment(image, gen(), 0, 9), image)


# --- mixup and CutMix ---

def labelled_batch(batch_size=8, height=6, width=5):
  """Every pixel value unique, so where each pixel came from can be read back."""
  images = np.arange(batch_size * height * width * 3, dtype=np.float32).reshape(
      batch_size, height, width, 3)
  return images, np.arange(batch_size) * 3 % 10


def mix(images, labels, seed=0, rows=None, batch_size=None, **alphas):
  batch_size = batch_size or len(images)
  rows = rows or slice(0, batch_size)
  return mixing.mix_pairs(images[rows], labels[rows], gen(seed), batch_size=batch_size,
                          rows=rows, **alphas)


def test_mixup_rows_are_lam_own_plus_one_minus_lam_partner():
  images, labels = labelled_batch()
  out = mix(images, labels, mixup_alpha=0.8, cutmix_alpha=0.0)
  lam = out['mix_weight']
  partner = np.arange(8) ^ 1
  assert out['image'].dtype == np.float32 and lam.dtype == np.float32
  np.testing.assert_allclose(out['image'], lam[:, None, None, None] * images
                             + (1 - lam[:, None, None, None]) * images[partner], rtol=1e-6)
  np.testing.assert_array_equal(lam[::2], lam[1::2])
  assert ((lam > 0) & (lam < 1)).all() and len(set(lam.tolist())) == 4
  np.testing.assert_array_equal(out['label'], labels)
  np.testing.assert_array_equal(out['label_mix'], labels[partner])


def test_cutmix_rows_are_pixelwise_one_image_and_own_fraction_is_the_weight():
  images, labels = labelled_batch(16, 12, 10)
  out = mix(images, labels, mixup_alpha=0.0, cutmix_alpha=1.0)
  partner = np.arange(16) ^ 1
  own, other = out['image'] == images, out['image'] == images[partner]
  assert (own ^ other).all()
  own_fraction = own[..., 0].mean(axis=(1, 2))
  np.testing.assert_array_equal(out['mix_weight'], own_fraction.astype(np.float32))
  assert (own_fraction < 1).any()
  # Each pair swaps one box: the partner's region in one row is its own in the other.
  np.testing.assert_array_equal(other[::2], other[1::2])


def test_mixed_labels_make_soft_labels_that_sum_to_one():
  images, labels = labelled_batch(32, 8, 8)
  out = mix(images, labels, mixup_alpha=0.8, cutmix_alpha=1.0, cutmix_prob=0.5)
  weight = out['mix_weight'][:, None]
  soft = weight * np.eye(10)[out['label']] + (1 - weight) * np.eye(10)[out['label_mix']]
  np.testing.assert_allclose(soft.sum(axis=1), 1, rtol=1e-6)
  np.testing.assert_allclose(soft[np.arange(32), out['label']], out['mix_weight'], rtol=1e-6)
  cut = (out['image'] == images).any(axis=(1, 2, 3))  # mixup leaves no pixel as it was
  assert 0 < cut.sum() < 32


@pytest.mark.parametrize('processes', [2, 4])
def test_process_shares_concatenate_to_the_one_process_batch(processes):
  images, labels = labelled_batch(16)
  alphas = dict(mixup_alpha=0.8, cutmix_alpha=1.0)
  whole = mix(images, labels, seed=7, **alphas)
  share = 16 // processes
  parts = [mix(images, labels, seed=7, rows=slice(p * share, (p + 1) * share), batch_size=16,
               **alphas) for p in range(processes)]
  for key, value in whole.items():
    np.testing.assert_array_equal(np.concatenate([part[key] for part in parts]), value)


@pytest.mark.parametrize('rows,batch_size', [(slice(1, 5), 8), (slice(0, 3), 8),
                                             (slice(0, 7), 7)])
def test_rows_that_split_a_pair_are_refused(rows, batch_size):
  images, labels = labelled_batch(8)
  with pytest.raises(ConfigError, match='must be even'):
    mixing.mix_pairs(images[rows], labels[rows], gen(), batch_size=batch_size, rows=rows,
                     mixup_alpha=0.8, cutmix_alpha=1.0)


@pytest.mark.parametrize('values,key', [((-0.1, 1.0, 0.5), 'data.mixup_alpha'),
                                        ((0.8, -1.0, 0.5), 'data.cutmix_alpha'),
                                        ((0.8, 1.0, 1.5), 'data.cutmix_prob')])
def test_check_mixing_names_the_key_out_of_range(values, key):
  with pytest.raises(ConfigError, match=key):
    mixing.check_mixing(*values)
  mixing.check_mixing(0.0, 0.0, 0.0)


def test_a_fixed_seed_gives_the_same_augmented_batch_on_a_rerun():
  spec = f'decode|random_crop(32, pad=4)|flip_lr|randaug(2, 9)|{CIFAR_NORM}'
  raw = np.stack([random_image(32, 32, seed=i) for i in range(8)])
  labels = np.arange(8)

  def batch(seed, step):
    built = preprocess.build(spec)
    images = np.stack([built(x, np.random.default_rng((seed, step, i))) for i, x in
                       enumerate(raw)])
    return mixing.mix_pairs(images, labels, np.random.default_rng((seed, step)), batch_size=8,
                            rows=slice(0, 8), mixup_alpha=0.8, cutmix_alpha=1.0)

  first, again, other = batch(1, 3), batch(1, 3), batch(1, 4)
  for key in first:
    np.testing.assert_array_equal(first[key], again[key])
  assert not np.array_equal(first['image'], other['image'])
