"""A checkpoint's image processor as preprocessing specs (convert.image_processor) and back: the
specs give the pixel values of transformers' CLIPImageProcessor and SiglipImageProcessor on the
same images, and what export writes, transformers loads and runs alike."""
import json

import numpy as np
import pytest

from transformer_jax import convert
from transformer_jax.convert import clip, image_processor, siglip
from transformer_jax.data import preprocess

transformers = pytest.importorskip('transformers')

# Both resize and crop with Pillow, bit for bit; then ours computes (x - 255 m) / (255 s) and
# transformers (float32(x / 255) - m) / s, each in float32: values up to |0 - 0.48| / 0.27 ~ 2.2,
# whose float32 spacing is 2.4e-7, a few roundings apart. Measured: at most 3.6e-7 (and 2.6
# on the 30x47 image with resize_small's rounding in place of floor=True).
ATOL = 2e-6
SIZE = 24
# Shapes (H, W) whose longer side at SIZE has a fraction of one half or more (47: 37.6, which
# transformers rounds down to 37), none, or none to resize.
SHAPES = [(30, 47), (47, 30), (37, 53), (SIZE, SIZE), (61, 100)]


def random_image(shape, seed=0):
  return np.random.default_rng(seed).integers(0, 256, (*shape, 3), dtype=np.uint8)


def theirs(processor, image) -> np.ndarray:
  """transformers' pixel_values of one image, as (H, W, C)."""
  return processor(image, return_tensors='np')['pixel_values'][0].transpose(1, 2, 0)


def ours(spec: str, image) -> np.ndarray:
  return preprocess.build(spec)(image, None)


def assert_same_pixels(spec: str, processor):
  for index, shape in enumerate(SHAPES):
    image = random_image(shape, index)
    np.testing.assert_allclose(ours(spec, image), theirs(processor, image), atol=ATOL, rtol=0,
                               err_msg=str(shape))


def load(cls, directory):
  return getattr(transformers, cls).from_pretrained(directory)


@pytest.mark.parametrize('processor, theirs_class, size', [
    (clip.PROCESSOR, 'CLIPImageProcessor', {'shortest_edge': SIZE}),
    (siglip.PROCESSOR, 'SiglipImageProcessor', {'height': SIZE, 'width': SIZE})])
def test_the_class_defaults_give_transformers_pixels(processor, theirs_class, size):
  """Without a preprocessor_config.json: the class's own defaults (bicubic; CLIP's shorter side,
  centre crop and OpenAI's statistics; SigLIP's square resize to [-1, 1]) at the model's size."""
  train, held_out = image_processor.specs(processor, None, SIZE, 'DIR')
  theirs_processor = getattr(transformers, theirs_class)(size=size, crop_size=SIZE)
  assert_same_pixels(held_out, theirs_processor)
  if processor is clip.PROCESSOR:  # open_clip's training crop, then the same values
    values_op = held_out.rpartition('|')[2]
    assert train == (f"decode|inception_crop({SIZE}, area_min=90, area_max=100, "
                     f"method='bicubic')|{values_op}")
    assert values_op == ('normalize((122.7709383, 116.7460125, 104.09373615), '
                         '(68.5005327, 66.6321579, 70.32316305))')
  else:  # big_vision trains SigLIP on the held-out steps
    assert train == held_out


OPENAI_CONFIG = {  # the layout of openai/clip-vit-base-patch32's, at a smaller size
    'crop_size': SIZE, 'do_center_crop': True, 'do_normalize': True, 'do_resize': True,
    'feature_extractor_type': 'CLIPFeatureExtractor',
    'image_mean': [0.48145466, 0.4578275, 0.40821073],
    'image_std': [0.26862954, 0.26130258, 0.27577711], 'resample': 3, 'size': SIZE}
OWN_CONFIG = {  # every step set otherwise
    'image_processor_type': 'CLIPImageProcessor', 'do_resize': True, 'size': {'shortest_edge': 29},
    'resample': 2, 'do_center_crop': True, 'crop_size': {'height': SIZE, 'width': SIZE},
    'do_rescale': True, 'rescale_factor': 1 / 255, 'do_normalize': True,
    'image_mean': [0.4, 0.5, 0.6], 'image_std': [0.2, 0.25, 0.3]}
SIGLIP_CONFIG = {  # google/siglip-base-patch16-224's, at a smaller size
    'do_normalize': True, 'do_rescale': True, 'do_resize': True, 'image_mean': [0.5, 0.5, 0.5],
    'image_processor_type': 'SiglipImageProcessor', 'image_std': [0.5, 0.5, 0.5],
    'processor_class': 'SiglipProcessor', 'resample': 3, 'rescale_factor': 0.00392156862745098,
    'size': {'height': SIZE, 'width': SIZE}}


@pytest.mark.parametrize('processor, cls, values', [
    (clip.PROCESSOR, 'CLIPImageProcessor', OPENAI_CONFIG),
    (clip.PROCESSOR, 'CLIPImageProcessor', OWN_CONFIG),
    (siglip.PROCESSOR, 'SiglipImageProcessor', SIGLIP_CONFIG)])
def test_a_preprocessor_config_is_read_and_written_back_as_transformers_runs_it(
    tmp_path, processor, cls, values):
  (tmp_path / 'hf').mkdir()
  (tmp_path / 'hf' / image_processor.FILE).write_text(json.dumps(values))
  original = load(cls, tmp_path / 'hf')
  _, held_out = image_processor.specs(processor, values, SIZE, 'DIR')
  assert_same_pixels(held_out, original)
  # Written back: the same steps, which transformers loads and runs alike.
  written = image_processor.processor_values(processor, held_out)
  (tmp_path / 'ours').mkdir()
  (tmp_path / 'ours' / image_processor.FILE).write_text(json.dumps(written))
  back = load(cls, tmp_path / 'ours')
  assert_same_pixels(held_out, back)
  for key in ('size', 'crop_size', 'resample', 'image_mean', 'image_std', 'rescale_factor'):
    if getattr(original, 'do_center_crop', False) or key != 'crop_size':
      assert getattr(back, key) == getattr(original, key), key
  assert image_processor.specs(processor, written, SIZE, 'DIR')[1] == held_out


@pytest.mark.parametrize('values, says', [
    ({'do_pad': True}, 'do_pad=True pads the images'),
    ({'size': {'shortest_edge': 20}}, 'crop_size=' + repr({'height': SIZE, 'width': SIZE})
     + ' is larger than the resized shorter side 20'),
    ({'do_center_crop': False}, 'gives images of varying sizes'),
    ({'size': {'height': 20, 'width': 20}, 'do_center_crop': False},
     "gives images of (20, 20) but config.json's image_size is 24"),
    ({'size': {'longest_edge': 30}}, "size={'longest_edge': 30} has no op here"),
    ({'resample': 7}, "resample=7 is no filter of Pillow's"),
    ({'do_rescale': False, 'do_normalize': False}, 'leave the pixels unscaled'),
])
def test_steps_without_an_op_here_are_refused_naming_the_key(values, says):
  with pytest.raises(convert.CheckpointError, match='^DIR') as error:
    image_processor.specs(clip.PROCESSOR, values, SIZE, 'DIR')
  assert says in str(error.value)


@pytest.mark.parametrize('spec, says', [
    ('decode|resize_small(24)|flip_lr|central_crop(24)|value_range(-1, 1)',
     'has no step for flip_lr'),
    ('decode|central_crop(24)|resize(24)|value_range(-1, 1)', 'has no step for resize there'),
    ('decode|resize(24)', 'ends without normalize or value_range'),
])
def test_export_refuses_a_held_out_spec_transformers_cannot_run(spec, says):
  with pytest.raises(convert.CheckpointError, match='data.pp_eval=') as error:
    image_processor.processor_values(clip.PROCESSOR, spec)
  assert says in str(error.value)


def test_value_range_exports_as_its_mean_and_std():
  """value_range(low, high) = (x / 255 - mean) / std with std = 1 / (high - low), mean = -low *
  std: [-1, 1] is SigLIP's 0.5 and 0.5."""
  values = image_processor.processor_values(siglip.PROCESSOR,
                                            'decode|resize(24)|value_range(-1, 1)')
  assert values['image_mean'] == [0.5] * 3 and values['image_std'] == [0.5] * 3
  assert values['resample'] == 2 and values['size'] == {'height': SIZE, 'width': SIZE}
