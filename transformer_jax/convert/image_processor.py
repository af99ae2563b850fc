"""An image processor's preprocessor_config.json (transformers' CLIPImageProcessor,
SiglipImageProcessor) <-> the run's preprocessing specs (data.preprocess).

The held-out spec is the processor's steps as transformers' Pillow backend runs them: Pillow's
resize with the processor's filter (`resample`) to `size` ({"shortest_edge": S}: the shorter
side to S and the longer to int(S * long / short), resize_small(S, floor=True); {"height": H,
"width": W}: resize(H, W)), the centre crop (offsets rounded down, as central_crop), then
(x * rescale_factor - image_mean) / image_std, written in pixel units as normalize(image_mean /
rescale_factor, image_std / rescale_factor). The training spec is the recipe the weights were
trained with: for CLIP, open_clip's image_transform(is_train=True), a RandomResizedCrop(scale=(0.9,
1.0)) resized bicubically, then the same normalisation; for SigLIP the held-out steps themselves,
unaugmented: the SigLIP recipe's augmentation is not public (big_vision's image-text configs
feed their SigLIP models resize(224)|value_range(-1, 1), the processor's steps, at evaluation).

Export writes the run's held-out spec back, read as the same steps. resize_small(S) without
floor=True rounds the longer side where transformers rounds it down: where S * long / short has a
fraction of one half or more, the two resize to one column (or row) more or less before the same
centre crop.
"""
import dataclasses
import inspect
from typing import Callable

import numpy as np

from transformer_jax.convert.architecture import CheckpointError
from transformer_jax.data import preprocess

__all__ = ['FILE', 'ImageProcessor', 'OPENAI_MEAN', 'OPENAI_STD', 'processor_values', 'specs']

FILE = 'preprocessor_config.json'
# transformers' PILImageResampling, Pillow's own numbers, by data.preprocess's method names.
RESAMPLE = {name: int(value) for name, value in preprocess.METHODS.items()}
OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)  # transformers' OPENAI_CLIP_MEAN and _STD
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclasses.dataclass(frozen=True)
class ImageProcessor:
  """One of transformers' image processor classes.

  name: its image_processor_type.
  defaults: image size -> its defaults (the class attributes, at the model's image size where
    they size the image), which a preprocessor_config.json overrides key by key.
  default_to_square: how it reads a `size` given as one int: (S, S), or the shorter side.
  train_crop: (area_min, area_max) in percent of the training inception_crop of the recipe the
    weights come from; None: training takes the held-out steps.
  """
  name: str
  defaults: Callable[[int], dict]
  default_to_square: bool
  train_crop: tuple[float, float] | None = None


def _number(value: float) -> float:
  """A statistic to 12 significant digits (float32 holds 7), so that the specs read well and
  import followed by export gives config.json's numbers back."""
  return float(f'{value:.12g}')


def _numbers(values) -> tuple[float, ...]:
  return tuple(_number(v) for v in np.atleast_1d(np.asarray(values, np.float64)))


def _size(value, square: bool, key: str, where: str) -> dict:
  """A size as transformers' get_size_dict reads it: a dict as it is, one int (H, W) = (S, S)
  with `square` else the shorter side S, a pair (H, W)."""
  if isinstance(value, dict):
    return value
  if isinstance(value, int):
    return {'height': value, 'width': value} if square else {'shortest_edge': value}
  if isinstance(value, (list, tuple)) and len(value) == 2:
    return {'height': value[0], 'width': value[1]}
  raise CheckpointError(f'{where}: {key}={value!r} is no size transformers reads.')


def specs(processor: ImageProcessor, values: dict | None, image_size: int,
          where: str) -> tuple[str, str]:
  """(the training spec, the held-out spec) of `processor` as `values` (a
  preprocessor_config.json's; None: the class's defaults at `image_size`) set it, for a model of
  `image_size` images; CheckpointError naming the key where the steps have no op here or do not
  give image_size x image_size images."""
  given = {key: value for key, value in (values or {}).items() if value is not None}
  v = {**processor.defaults(image_size), **given}
  refuse = lambda key, why: CheckpointError(f'{where}: {key}={v[key]!r} {why}; transformer_jax '
                                           'reproduces the resize, centre crop, rescale and '
                                           'normalisation of CLIP and SigLIP processors.')
  if v.get('do_pad'):
    raise refuse('do_pad', 'pads the images')
  steps, shape = [], None
  if v['do_resize']:
    if v['resample'] not in RESAMPLE.values():
      raise refuse('resample', "is no filter of Pillow's")
    method = {number: name for name, number in RESAMPLE.items()}[v['resample']]
    size = _size(v['size'], processor.default_to_square, 'size', where)
    if set(size) == {'shortest_edge'}:
      steps.append(f"resize_small({size['shortest_edge']}, method='{method}', floor=True)")
    elif set(size) == {'height', 'width'}:
      shape = (size['height'], size['width'])
      steps.append(f"resize({shape[0]}, {shape[1]}, method='{method}')")
    else:
      raise refuse('size', 'has no op here')
  if v.get('do_center_crop'):
    crop = _size(v['crop_size'], True, 'crop_size', where)
    if set(crop) != {'height', 'width'}:
      raise refuse('crop_size', 'has no op here')
    shorter = _size(v['size'], processor.default_to_square, 'size', where).get('shortest_edge')
    if v['do_resize'] and shorter is not None and max(crop.values()) > shorter:
      raise refuse('crop_size', f'is larger than the resized shorter side {shorter}, which '
                   'transformers pads')
    shape = (crop['height'], crop['width'])
    steps.append(f'central_crop({shape[0]}, {shape[1]})')
  if shape != (image_size, image_size):
    raise CheckpointError(f'{where} gives images of {"varying sizes" if shape is None else shape} '
                         f'but config.json\'s image_size is {image_size}: the model takes '
                         f'{image_size}x{image_size} images.')
  scale = float(v['rescale_factor']) if v['do_rescale'] else 1.0
  if v['do_normalize']:
    mean, std = (_numbers(np.asarray(v[key], np.float64) / scale)
                 for key in ('image_mean', 'image_std'))
    values_op = f'normalize({mean}, {std})'
  elif v['do_rescale']:
    values_op = f'value_range(0, {_number(255 * scale)})'
  else:
    raise refuse('do_rescale', 'and do_normalize=False leave the pixels unscaled')
  held_out = '|'.join(['decode', *steps, values_op])
  if processor.train_crop is None:
    return held_out, held_out
  area_min, area_max = processor.train_crop
  crop = (f"inception_crop({image_size}, area_min={area_min}, area_max={area_max}, "
          "method='bicubic')")
  return '|'.join(['decode', crop, values_op]), held_out


def processor_values(processor: ImageProcessor, spec: str) -> dict:
  """The preprocessor_config.json of `processor` that runs the held-out `spec`: its resize,
  centre crop and value op as transformers' steps; CheckpointError naming any other op."""
  ops = preprocess.parse(spec, 'data.pp_eval')
  if ops[0][0] == 'decode':
    ops = ops[1:]
  values = {'image_processor_type': processor.name, 'do_convert_rgb': True, 'do_resize': False,
            'do_center_crop': False}
  order = ('resize', 'central_crop', 'value')  # the steps in transformers' order
  done = -1
  for name, args, kwargs in ops:
    op = preprocess.OPS[name](*args, **kwargs)
    # The statistics as the spec writes them (the op holds them in float32).
    given = inspect.signature(preprocess.OPS[name]).bind(*args, **kwargs).arguments
    step = {'resize_small': 'resize', 'resize': 'resize', 'central_crop': 'central_crop',
            'normalize': 'value', 'value_range': 'value'}.get(name)
    if step is None or order.index(step) <= done:
      raise CheckpointError(
          f"data.pp_eval={spec!r}: {processor.name} runs a resize, a centre crop and a "
          f"normalisation, in that order, and has no step for {name} there: export a run whose "
          "held-out spec is such steps.")
    done = order.index(step)
    if step == 'resize':
      size = ({'shortest_edge': op.size} if name == 'resize_small' else
              {'height': op.size[0], 'width': op.size[1]})
      values.update(do_resize=True, size=size, resample=RESAMPLE[op.method])
    elif step == 'central_crop':
      values.update(do_center_crop=True, crop_size={'height': op.size[0], 'width': op.size[1]})
    elif name == 'normalize':
      mean, std = (np.broadcast_to(np.asarray(given[key], np.float64), (3,)) / 255
                   for key in ('mean', 'std'))
      values.update(do_rescale=True, rescale_factor=1 / 255, do_normalize=True,
                    image_mean=list(_numbers(mean)), image_std=list(_numbers(std)))
    else:  # value_range(low, high) = (x / 255 - mean) / std
      span = op.high - op.low
      values.update(do_rescale=True, rescale_factor=1 / 255, do_normalize=True,
                    image_mean=[_number(-op.low / span)] * 3, image_std=[_number(1 / span)] * 3)
  if 'do_rescale' not in values:
    raise CheckpointError(f'data.pp_eval={spec!r} ends without normalize or value_range: '
                         f'{processor.name} gives float pixels.')
  return values
