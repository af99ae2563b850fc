"""Image datasets from TFDS: a dataset of a user's own read by name without its code, the
checks that stop a wrong name, split, key or class count before compiling, the batches that
stay pure functions of (seed, step) for any process count, and launch.py on TFDS's mock data
of imagenet2012, cifar100 and oxford_flowers102."""
import json
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
from PIL import Image
import pytest
import tensorflow_datasets as tfds

from transformer_jax import config_lib, data, sweep, train
from transformer_jax.errors import ConfigError, UserError
from transformer_jax.train import losses, setup
from helpers import mock_tfds, ROOT

USER_DATASET = 'user_grey_shapes'


class UserGreyShapes(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """A dataset of a user's own: grey images of several sizes, under keys of its own. Not
  registered, so TFDS reads it back from its files alone, as it would without this code."""
  VERSION = tfds.core.Version('1.0.0')

  def _info(self):
    return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
        'picture': tfds.features.Image(shape=(None, None, 1)),
        'kind': tfds.features.ClassLabel(names=['a', 'b', 'c'])}))

  def _split_generators(self, dl_manager):
    del dl_manager
    return {'train': self._generate_examples(24, seed=0),
            'test': self._generate_examples(8, seed=1)}

  def _generate_examples(self, count, seed):
    noise = np.random.default_rng(seed)
    for i in range(count):
      pixels = noise.integers(0, 256, size=(10 + i % 5, 12 + i % 3), dtype=np.uint8)
      yield i, {'picture': Image.fromarray(pixels, mode='L'), 'kind': i % 3}


@pytest.fixture(scope='module')
def user_dir(tmp_path_factory):
  directory = tmp_path_factory.mktemp('tfds')
  UserGreyShapes(data_dir=str(directory), file_format='array_record').download_and_prepare()
  return str(directory)


def user_data(user_dir, process_index=0, process_count=1, **overrides):
  config = {'name': USER_DATASET, 'tfds_data_dir': user_dir, 'image_key': 'picture',
            'label_key': 'kind', 'batch_size': 8, 'eval_batch_size': 4, **overrides}
  return data.make_data(config, 'image', seed=1, process_index=process_index,
                        process_count=process_count, image_size=8)


def test_a_users_own_dataset_is_read_by_name_from_its_files(user_dir):
  ds = user_data(user_dir)
  assert ds.info['num_classes'] == 3 and ds.info['image_shape'] == (8, 8, 3)
  assert ds.info['num_train_examples'] == 24 and ds.eval_steps == 2
  batch = ds.train_batch(0)
  assert batch['image'].shape == (8, 8, 8, 3) and batch['image'].dtype == np.float32
  grey = batch['image'][..., :1]  # grey became RGB: three equal channels
  np.testing.assert_array_equal(batch['image'], np.repeat(grey, 3, axis=-1))
  held_out = next(ds.eval_batches())
  source = tfds.data_source(USER_DATASET, split='test', data_dir=user_dir, download=False)
  np.testing.assert_array_equal(held_out['label'], [source[i]['kind'] for i in range(4)])


def test_png_records_are_decoded_once_by_the_decode_op_as_tfds_decodes_them(user_dir):
  ds = user_data(user_dir, pp_eval='decode|central_crop(8)|value_range(-1, 1)')
  held_out = next(ds.eval_batches())
  assert ds.task.held_out[0]['picture'].startswith(b'\x89PNG')  # read undecoded
  source = tfds.data_source(USER_DATASET, split='test', data_dir=user_dir, download=False)
  grey = [source[i]['picture'] for i in range(4)]  # TFDS's decoding: (H, W, 1)
  rows, columns = (np.array([g.shape[:2] for g in grey]).T - 8) // 2
  expected = np.stack([np.repeat(g[r:r + 8, c:c + 8], 3, axis=-1)
                       for g, r, c in zip(grey, rows, columns)]) / 127.5 - 1
  np.testing.assert_allclose(held_out['image'], expected, atol=1e-6)


def test_any_split_string_and_the_default_eval_split(user_dir):
  ds = user_data(user_dir, train_split='train[:75%]', eval_split='train[75%:]')
  assert ds.info['num_train_examples'] == 18 and ds.info['num_eval_examples'] == 4
  assert ds.info['splits'] == ('train[:75%]', 'train[75%:]')
  assert user_data(user_dir).info['splits'] == ('train', 'test')


@pytest.mark.parametrize('overrides, message', [
    (dict(eval_split='validation'), r"data.eval_split='validation': Unknown split 'validation'.*"
                                    r"The splits of user_grey_shapes: \{'train': 24, 'test': 8\}"),
    (dict(image_key='image'), r"data.image_key='image': user_grey_shapes has no Image feature of "
                              r"that name; its Image features: \['picture'\]"),
    (dict(label_key='picture'), r"data.label_key='picture': .* its ClassLabel features: "
                                r"\['kind'\]"),
    (dict(name='user_grey_shape'), r"data.name='user_grey_shape' is neither prepared in .* "
                                   r"\(prepared there: \['user_grey_shapes'\]\) nor a TFDS "
                                   r"dataset; did you mean 'user_grey_shapes'\?"),
    (dict(name='cifar100'), r'cifar100 is not prepared in .* \(prepared there: '
                            r"\['user_grey_shapes'\]\): set --config.data.tfds_data_dir"),
])
def test_wrong_names_splits_and_keys_fail_in_one_line(user_dir, overrides, message):
  with pytest.raises((ConfigError, data.DataNotFoundError), match=message) as error:
    user_data(user_dir, **overrides)
  assert '\n' not in str(error.value)


def test_preprocessing_that_disagrees_with_the_model_is_refused(user_dir):
  with pytest.raises(ConfigError, match='pp_train.*pp_eval give images of different shapes'):
    user_data(user_dir, pp_train='decode|resize(8)', pp_eval='decode|resize(6)')


@pytest.mark.parametrize('process_count', [2, 4])
def test_process_shares_with_randaugment_and_mixing_concatenate_to_the_global_batch(
    user_dir, process_count):
  augment = dict(pp_train='decode|inception_crop(8)|flip_lr|randaug(2, 9)|value_range(-1, 1)',
                 mixup_alpha=0.8, cutmix_alpha=1.0, batch_size=16)
  whole = user_data(user_dir, **augment)
  shares = [user_data(user_dir, p, process_count, **augment) for p in range(process_count)]
  for step in (0, 2):  # step 2's rows 32..47 straddle two epochs of 24 images
    expected = whole.train_batch(step)
    got = [share.train_batch(step) for share in shares]
    for key in expected:
      np.testing.assert_array_equal(np.concatenate([g[key] for g in got]), expected[key], key)
  iterator = shares[1].train_iterator(1)  # grain's threads give the batches train_batch gives
  for step in (1, 2):
    batch = next(iterator)
    for key, value in shares[1].train_batch(step).items():
      np.testing.assert_array_equal(batch[key], value, key)
  assert not np.array_equal(whole.train_batch(0)['image'], whole.train_batch(1)['image'])


def test_odd_process_shares_cannot_mix_in_pairs(user_dir):
  with pytest.raises(ConfigError, match='even'):  # before any batch is read
    user_data(user_dir, mixup_alpha=0.2, batch_size=6, process_count=2)


def mock_config(path, arg, **overrides):
  return sweep.override(config_lib.from_file(ROOT / 'configs' / path, arg), overrides)


def test_a_model_with_another_class_count_is_refused_before_compiling():
  config = mock_config('vit_cifar.py', 'smoke', **{'data.name': 'cifar100'})
  with mock_tfds(16):
    with pytest.raises(ConfigError, match=r'The data has 100 classes but model.num_classes=10: '
                                          r'leave model.num_classes unset \(0\) to follow the '
                                          r'data, or set --config.model.num_classes=100'):
      setup.build_run(train.resolve(config))
    config.model.num_classes = 0  # unset: the model follows the data's classes
    assert setup.build_run(config).model_config.num_classes == 100


@pytest.mark.parametrize('config, flags', [
    ('vit_i1k.py:smoke', []),
    pytest.param('vit_cifar.py:smoke',
                 ['--config.data.name=cifar100', '--config.model.num_classes=100'],
                 marks=pytest.mark.slow),
    pytest.param('vit_i1k.py:smoke', [
        '--config.data.name=oxford_flowers102', '--config.model.num_classes=102',
        '--config.data.train_split=train', '--config.data.eval_split=test',
        '--config.data.eval_batch_size=16'], marks=pytest.mark.slow),  # another process, 17 s
])
def test_launch_trains_and_evaluates_on_mock_tfds_data(tmp_path, config, flags):
  result = subprocess.run(
      [sys.executable, str(ROOT / 'tests' / 'mock_launch.py'),
       f'--config={ROOT / "configs" / config}', f'--workdir={tmp_path}',
       '--config.data.batch_size=8', *flags],
      capture_output=True, text=True, timeout=600, env={'JAX_PLATFORMS': 'cpu', 'PATH': ''})
  assert result.returncode == 0, result.stderr[-3000:]
  rows = [json.loads(line) for line in (tmp_path / 'metrics.jsonl').read_text().splitlines()]
  final = [row for row in rows if 'eval_top5_accuracy' in row][-1]
  assert final['step'] == 3 and 0 <= final['eval_accuracy'] <= final['eval_top5_accuracy'] <= 1
  assert 'top-5' in result.stderr


def test_the_loss_of_mixed_rows_is_the_cross_entropy_of_their_soft_labels():
  noise = np.random.default_rng(0)
  logits = noise.normal(size=(6, 7)).astype(np.float32)
  labels, partners = noise.integers(0, 7, size=6), noise.integers(0, 7, size=6)
  lam = noise.uniform(size=6).astype(np.float32)
  weights = np.ones(6, np.float32)
  for smoothing in (0.0, 0.1):
    soft = (lam[:, None] * np.eye(7)[labels] + (1 - lam[:, None]) * np.eye(7)[partners])
    soft = (1 - smoothing) * soft + smoothing / 7
    log_probs = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    sums = losses.loss_sums(jnp.asarray(logits), jnp.asarray(labels), jnp.asarray(weights),
                            label_smoothing=smoothing, mix=(jnp.asarray(partners), lam))
    np.testing.assert_allclose(sums['loss'], -(soft * log_probs).sum(), rtol=1e-5)


def test_top5_accuracy_counts_the_targets_among_the_five_highest_logits():
  noise = np.random.default_rng(1)
  logits = noise.normal(size=(64, 12)).astype(np.float32)
  targets = noise.integers(0, 12, size=64)
  sums = losses.loss_sums(jnp.asarray(logits), jnp.asarray(targets), jnp.ones(64), top5=True)
  rank = (logits > logits[np.arange(64), targets][:, None]).sum(axis=1)  # higher logits
  assert float(sums['correct_top5']) == (rank < 5).sum()
  assert float(sums['correct']) == (rank == 0).sum() and 0 < (rank < 5).sum() < 64


class UserManualShapes(tfds.core.GeneratorBasedBuilder):
  """A registered builder that prepares from files a user downloaded (data.manual_dir), as
  imagenet2012 does from its tars: one .npy of uint8 images and one of labels."""
  VERSION = tfds.core.Version('1.0.0')
  MANUAL_DOWNLOAD_INSTRUCTIONS = 'Put images.npy and labels.npy in the manual dir.'

  def _info(self):
    return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
        'image': tfds.features.Image(shape=(None, None, 3)),
        'label': tfds.features.ClassLabel(num_classes=4)}))

  def _split_generators(self, dl_manager):
    images = np.load(dl_manager.manual_dir / 'images.npy')
    labels = np.load(dl_manager.manual_dir / 'labels.npy')
    return {'train': self._generate_examples(images[:12], labels[:12]),
            'test': self._generate_examples(images[12:], labels[12:])}

  def _generate_examples(self, images, labels):
    for i, (image, label) in enumerate(zip(images, labels)):
      yield i, {'image': Image.fromarray(image), 'label': int(label)}


def test_manual_dir_prepares_a_dataset_from_the_users_files(tmp_path):
  noise = np.random.default_rng(2)
  (tmp_path / 'manual').mkdir()
  images = noise.integers(0, 256, size=(16, 9, 11, 3), dtype=np.uint8)
  np.save(tmp_path / 'manual' / 'images.npy', images)
  np.save(tmp_path / 'manual' / 'labels.npy', np.arange(16) % 4)
  config = {'name': 'user_manual_shapes', 'tfds_data_dir': str(tmp_path / 'tfds'),
            'batch_size': 4, 'eval_batch_size': 4}
  with pytest.raises(data.DataNotFoundError, match='user_manual_shapes is not prepared'):
    data.make_data(config, 'image', seed=0, process_index=0, process_count=1)
  ds = data.make_data({**config, 'manual_dir': str(tmp_path / 'manual')}, 'image', seed=0,
                      process_index=0, process_count=1, image_size=8)
  assert ds.info['num_classes'] == 4 and ds.info['num_train_examples'] == 12
  assert ds.eval_steps == 1 and ds.train_batch(0)['image'].shape == (4, 8, 8, 3)
  assert (tmp_path / 'tfds' / 'user_manual_shapes' / '1.0.0' / 'dataset_info.json').exists()


def test_the_default_preprocessing_brings_images_to_the_models_size():
  """Without pp specs, images of any size become model.image_size."""
  config = mock_config('vit_cifar.py', 'smoke', **{
      'data.name': 'oxford_flowers102', 'data.pp_train': None, 'data.pp_eval': None,
      'data.eval_split': 'test', 'model.num_classes': 102, 'model.image_size': 16})
  with mock_tfds(16):
    run = setup.build_run(train.resolve(config))
    assert run.data.info['image_shape'] == (16, 16, 3)
    assert run.data.train_batch(0)['image'].shape == (8, 16, 16, 3)


def image_folder(root, splits=('train', 'test'), classes=('cat', 'dog', 'emu'), count=4):
  """A folder of torchvision's ImageFolder layout: per split and class `count` images of their
  own sizes, grey PNGs and RGB JPEGs, one in a subfolder, and a file that is no image. Returns
  {(split, class): [the pixels of each image, in name order]}."""
  noise, pixels = np.random.default_rng(0), {}
  for split in splits:
    for name in classes:
      folder = root / split / name
      (folder / 'more').mkdir(parents=True)
      (folder / 'notes.txt').write_text('not an image')
      pixels[split, name] = []
      for i in range(count):
        grey = i % 2 == 0
        image = noise.integers(0, 256, size=(6 + i, 7 + i) + (() if grey else (3,)),
                               dtype=np.uint8)
        # names sort as 0.png, 1.jpg, ...; the last in a subfolder (more/3.jpg sorts last)
        path = folder / ('more/' if i == count - 1 else '') / f'{i}.{"png" if grey else "jpg"}'
        Image.fromarray(image).save(path, quality=95)
        with Image.open(path) as saved:  # a JPEG's pixels as Pillow decodes them
          pixels[split, name].append(np.asarray(saved.convert('RGB')))
  return pixels


def folder_data(root, **overrides):
  config = {'name': 'imagefolder', 'image_dir': str(root), 'batch_size': 4, 'eval_batch_size': 3,
            'pp_eval': 'decode|resize(8, method="nearest")', **overrides}
  return data.make_data(config, 'image', seed=0, process_index=0, process_count=1, image_size=8)


def test_an_image_folder_is_read_class_by_folder_name_the_classes_in_turn(tmp_path):
  pixels = image_folder(tmp_path)
  ds = folder_data(tmp_path)
  assert ds.info['num_classes'] == 3 and ds.info['splits'] == ('train', 'test')
  assert ds.info['num_train_examples'] == 12 and ds.task.num_eval_examples == 12
  held_out = ds.task.held_out
  # Class i is the i-th folder name in sorted order; the records take the classes in turn.
  assert [held_out[i]['label'] for i in range(6)] == [0, 1, 2, 0, 1, 2]
  assert held_out[4]['image'] == (tmp_path / 'test' / 'dog' / '1.jpg').read_bytes()
  batch = ds.task.eval_examples(np.arange(6))
  expected = [pixels['test', name][rank] for rank in (0, 1) for name in ('cat', 'dog', 'emu')]
  expected = [np.asarray(Image.fromarray(p).convert('RGB').resize((8, 8), Image.NEAREST))
              for p in expected]
  np.testing.assert_array_equal(batch['image'], np.stack(expected).astype(np.float32))
  np.testing.assert_array_equal(batch['label'], [0, 1, 2, 0, 1, 2])
  assert sorted(held_out.paths)[-1].endswith('emu/more/3.jpg')  # subfolders read too


def test_an_image_folder_without_a_held_out_split_holds_out_a_tenth_of_each_class(tmp_path):
  image_folder(tmp_path, splits=('train',), count=12)
  ds = folder_data(tmp_path)
  assert ds.info['num_train_examples'] == 33 and ds.task.num_eval_examples == 3
  assert [p.rsplit('/', 2)[-2:] for p in ds.task.held_out.paths] == [
      ['more', '11.jpg']] * 3  # each class's last image by name
  assert [ds.task.held_out[i]['label'] for i in range(3)] == [0, 1, 2]


def test_data_eval_split_holds_out_a_folder_of_another_name(tmp_path):
  image_folder(tmp_path, splits=('train', 'dev'), classes=('a', 'b'))
  with pytest.raises(ConfigError, match=r'split folder dev beside train, and no test or '
                                        r'validation: set data.eval_split=dev'):
    folder_data(tmp_path)
  assert folder_data(tmp_path, eval_split='dev').info['splits'] == ('train', 'dev')


@pytest.mark.parametrize('breakage, message', [
    (lambda root: None, r"data.image_dir=.*/nowhere is not a folder: an image folder is "
                        r"DIR/train/<class>/<image>"),
    (lambda root: (root / 'test' / 'fox').mkdir(), r'test/fox is a class the training folder '
                                                   r'.*/train lacks \(its classes: a, b\)'),
    (lambda root: (root / 'train' / 'a' / '0.png').write_bytes(b'not a png'),
     r'train/a/0.png is not an image Pillow reads'),
    (lambda root: (root / 'train' / 'c').mkdir(), r'The class folder .*/train/c holds no images'),
])
def test_a_bad_image_folder_is_refused_naming_the_folder_or_file(tmp_path, breakage, message):
  image_folder(tmp_path, classes=('a', 'b'), count=2)
  breakage(tmp_path)
  root = tmp_path / 'nowhere' if 'nowhere' in message else tmp_path
  with pytest.raises((ConfigError, UserError), match=message) as error:
    folder_data(root)
  assert '\n' not in str(error.value)


@pytest.mark.parametrize('overrides, message', [
    ({'image_dir': None}, r"data.name='imagefolder' reads data.image_dir"),
    ({'eval_split': 'validation'}, r"data.eval_split='validation': .* has no split folder "
                                   r'validation; its folders: test, train'),
    ({'train_split': 'test', 'eval_split': 'test'}, r"data.eval_split='test' is the training "
                                                    'folder too'),
])
def test_image_folder_settings_that_name_no_folder_are_refused(tmp_path, overrides, message):
  image_folder(tmp_path, classes=('a',), count=1)
  with pytest.raises(ConfigError, match=message):
    folder_data(tmp_path, **overrides)
