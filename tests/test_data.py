"""The data package: pure batches, process shares, formats, MLM statistics, seq2seq targets, the
TFDS builders prepared from tiny local files, the text splits and the missing-data errors."""
import dataclasses
import io
import logging
import tarfile

import numpy as np
from PIL import Image
import pytest
import tensorflow_datasets as tfds
from tensorflow_datasets.image_classification import cifar

from transformer_jax import config_lib, data
from transformer_jax.data import builders, corpus, images, rng, sources
from transformer_jax.models import registry

FAMILIES = ('vit', 'decoder', 'encoder', 'encoder_decoder')
SYNTHETIC = dict(name='synthetic', seq_len=16, batch_size=8, eval_batch_size=8, eval_examples=32)
IMAGE_SIZES = dict(image_size=8, num_classes=5)  # the model's, which generated images take
TEXT = ''.join(f'{i}: the quick brown fox jumps over the lazy dog.\n' for i in range(40))


def make(family, process_index=0, process_count=1, **overrides):
  return data.make_data({**SYNTHETIC, **overrides}, registry.get(family).task, seed=3,
                        process_index=process_index, process_count=process_count, **IMAGE_SIZES)


def assert_batches_equal(a, b):
  assert a.keys() == b.keys()
  for key in a:
    np.testing.assert_array_equal(a[key], b[key], err_msg=key)


@pytest.mark.parametrize('family', FAMILIES)
def test_train_batch_is_a_pure_function_of_the_step(family):
  ds = make(family)
  assert_batches_equal(ds.train_batch(5), make(family).train_batch(5))  # a fresh "resumed" run
  changed = [key for key, value in ds.train_batch(5).items()
             if not np.array_equal(value, ds.train_batch(6)[key])]
  assert changed, 'steps 5 and 6 gave the same batch'
  iterator = ds.train_iterator(5)
  for step in range(5, 8):
    assert_batches_equal(next(iterator), ds.train_batch(step))


@pytest.mark.parametrize('family', FAMILIES)
@pytest.mark.parametrize('process_count', [2, 4])
def test_process_shares_concatenate_to_the_global_batch(family, process_count):
  whole = make(family, eval_examples=33)
  shares = [make(family, p, process_count, eval_examples=33) for p in range(process_count)]
  for step in (0, 37):  # step 37's rows 296..303 straddle two epochs of 297 synthetic images
    expected = whole.train_batch(step)
    got = [share.train_batch(step) for share in shares]
    assert len(got[0][next(iter(expected))]) == 8 // process_count
    assert_batches_equal({k: np.concatenate([g[k] for g in got]) for k in expected}, expected)
  for expected, *got in zip(whole.eval_batches(), *(share.eval_batches() for share in shares)):
    assert_batches_equal({k: np.concatenate([g[k] for g in got]) for k in expected}, expected)


def test_batch_size_must_divide_by_the_processes():
  with pytest.raises(ValueError, match=r'data.batch_size=8 .* multiple of the 3 processes'):
    make('decoder', 0, 3)


FORMATS = {
    'vit': {'image': ((8, 8, 8, 3), np.float32), 'label': ((8,), np.int32)},
    'decoder': {'inputs': ((8, 16), np.int32), 'targets': ((8, 16), np.int32)},
    'encoder': {'inputs': ((8, 16), np.int32), 'targets': ((8, 16), np.int32),
                'weights': ((8, 16), np.float32)},
    'encoder_decoder': {'inputs': ((8, 16), np.int32), 'input_valid': ((8, 16), np.bool_),
                        'decoder_inputs': ((8, 16), np.int32), 'targets': ((8, 16), np.int32),
                        'weights': ((8, 16), np.float32)},
}


@pytest.mark.parametrize('family', FAMILIES)
def test_shapes_and_dtypes(family):
  ds = make(family)
  eval_batches = list(ds.eval_batches())
  assert len(eval_batches) == 4 and ds.info['num_eval_examples'] == 32
  for batch in (ds.train_batch(0), eval_batches[0]):
    assert {k: (v.shape, v.dtype) for k, v in batch.items()} == FORMATS[family]
  if family != 'vit':
    assert all(batch['inputs'].max() < ds.info['vocab_size'] == ds.vocab.size
               for batch in eval_batches)


def test_eval_batches_are_the_same_at_every_call_and_for_every_seed():
  ds = make('encoder')
  other_seed = data.make_data(SYNTHETIC, 'masked', seed=4, process_index=0, process_count=1)
  for a, b, c in zip(ds.eval_batches(), ds.eval_batches(), other_seed.eval_batches()):
    assert_batches_equal(a, b)
    assert_batches_equal(a, c)


def test_eval_steps():
  assert len(list(make('decoder', eval_steps=2).eval_batches())) == 2
  assert make('decoder', eval_batch_size=5).info['num_eval_examples'] == 30  # full batches only
  with pytest.raises(ValueError, match='eval_steps=5, but the held-out split has 4 batches'):
    make('decoder', eval_steps=5)


def test_mlm_corruption_statistics():
  ds = make('encoder', batch_size=64, seq_len=128)
  batches = [ds.train_batch(step) for step in range(20)]  # 163,840 positions
  inputs, targets, weights = (np.concatenate([b[k] for b in batches])
                              for k in ('inputs', 'targets', 'weights'))
  selected = weights == 1
  assert set(np.unique(weights)) == {0.0, 1.0}
  np.testing.assert_array_equal(inputs[~selected], targets[~selected])
  assert abs(selected.mean() - 0.15) < 0.005
  masked = inputs[selected] == ds.vocab.mask_id
  kept = inputs[selected] == targets[selected]
  chars = ds.vocab.size - 1
  assert abs(masked.mean() - 0.8) < 0.01
  # A random replacement equals the original with probability 1 / chars.
  assert abs(kept.mean() - (0.1 + 0.1 / chars)) < 0.01
  assert abs((~masked & ~kept).mean() - 0.1 * (1 - 1 / chars)) < 0.01
  assert targets.max() < ds.vocab.mask_id


@pytest.mark.parametrize('name, transform', [('seq2seq_reverse', lambda s: s[::-1]),
                                             ('seq2seq_sort', sorted),
                                             ('synthetic', lambda s: s)])
def test_seq2seq_targets_transform_the_inputs(name, transform):
  ds = make('encoder_decoder', name=name, seq2seq_min_len=3)
  vocab = ds.vocab
  assert (vocab.pad_id, vocab.bos_id, vocab.eos_id) == (0, 1, 2)
  for batch in (ds.train_batch(0), next(ds.eval_batches())):
    lengths = batch['input_valid'].sum(axis=1)
    assert 3 <= lengths.min() and lengths.max() <= 15
    for row, length in enumerate(lengths):
      source = vocab.decode(batch['inputs'][row])
      assert len(source) == length and not (batch['inputs'][row, length:]).any()
      assert vocab.decode(batch['targets'][row]) == ''.join(transform(source))
      assert batch['targets'][row, length] == vocab.eos_id
      assert batch['weights'][row].sum() == length + 1
    np.testing.assert_array_equal(batch['decoder_inputs'][:, 0], vocab.bos_id)
    np.testing.assert_array_equal(batch['decoder_inputs'][:, 1:], batch['targets'][:, :-1])


def test_seq2seq_exact_match_counts_the_outputs_that_are_exactly_the_target():
  ds = make('encoder_decoder', name='seq2seq_reverse', exact_match_examples=6, eval_batch_size=4)
  vocab, batch_sizes = ds.vocab, []

  def generate(prompt_tokens, inputs, input_valid, max_new_tokens, eos_id, **keywords):
    """The reversed source then EOS for rows whose source starts below the alphabet's middle,
    a wrong last symbol for the others."""
    batch_sizes.append(len(inputs))
    assert (prompt_tokens == vocab.bos_id).all() and max_new_tokens == 16
    out = np.zeros((len(inputs), max_new_tokens), np.int32)
    for row, (ids, valid) in enumerate(zip(inputs, input_valid)):
      target = list(ids[valid][::-1])
      if ids[0] >= vocab.size // 2:
        target[-1] = eos_id + 1 if target[-1] != eos_id + 1 else eos_id + 2
      out[row, :len(target) + 1] = target + [eos_id]
    return out

  sources = ds.task.eval_examples(np.arange(6))['inputs']
  right = float(np.mean(sources[:, 0] < vocab.size // 2))
  assert 0 < right < 1, 'the test needs right and wrong rows'
  assert ds.task.generation_metrics(generate, 4) == {'eval_exact_match': pytest.approx(right)}
  assert batch_sizes == [4, 4]  # 6 pairs: the last batch filled up with repeats
  assert make('encoder_decoder', name='seq2seq_reverse').task.generation_metrics(generate, 4) == {}


def test_synthetic_data_is_learnable():
  """Synthetic text is a bigram cycle; a synthetic image's class is the nearest class mean."""
  batch = make('decoder').train_batch(0)
  following = dict(zip(batch['inputs'].ravel(), batch['targets'].ravel()))
  assert all(following[i] == t for i, t in zip(batch['inputs'].ravel(), batch['targets'].ravel()))
  ds = make('vit', batch_size=256, augment=False)
  train = ds.train_batch(0)
  means = np.stack([train['image'][train['label'] == c].mean(axis=0) for c in range(5)])
  held_out = next(make('vit', eval_batch_size=32).eval_batches())
  distances = ((held_out['image'][:, None] - means[None]) ** 2).sum(axis=(2, 3, 4))
  assert (distances.argmin(axis=1) == held_out['label']).mean() > 0.9


@pytest.mark.parametrize('key', [(1, 0, 12345), (0,), (6, 2 ** 32 - 1, 7), (1, 2 ** 32, 5),
                                 (4, 3, 2 ** 70 + 9)])
def test_a_generator_draws_the_numbers_of_its_key_seeded_as_numpy_seeds_it(key):
  expected = np.random.default_rng(key)  # SeedSequence of the ints, bigger ones split in words
  generator = rng.generator(*key)
  np.testing.assert_array_equal(generator.integers(0, 2 ** 62, 8), expected.integers(0, 2 ** 62, 8))
  assert generator.random() == expected.random()


def test_channel_stats_are_exact():
  batch = np.random.default_rng(0).integers(0, 256, size=(50, 4, 4, 3), dtype=np.uint8)
  mean, std = images.channel_stats(batch)
  np.testing.assert_allclose(mean, batch.mean(axis=(0, 1, 2)), rtol=1e-6)
  np.testing.assert_allclose(std, batch.std(axis=(0, 1, 2)), rtol=1e-6)


def test_vocab_round_trip_and_errors():
  vocab = data.Vocab.of_text('hello world', mask=True)
  assert vocab.tokens[:3] == (' ', 'd', 'e') and vocab.mask_id == vocab.size - 1
  assert vocab.decode(vocab.encode('low drew')) == 'low drew'
  with pytest.raises(ValueError, match=r"outside the vocabulary: \['z'\]"):
    vocab.encode('hello zorro')
  seq = data.Vocab.seq2seq('ab')
  assert seq.decode([1, 3, 4, 3, 2, 4, 0]) == 'aba'


# ---- text sources ---------------------------------------------------------------------------

def windows_text(ds, batches):
  return ''.join(ds.vocab.decode(row) for batch in batches for row in batch['inputs'])


def test_text_file_is_split_90_10(tmp_path):
  path = tmp_path / 'corpus.txt'
  path.write_bytes(TEXT.encode())
  ds = data.make_data({'name': 'text_file', 'path': str(path), 'seq_len': 16, 'batch_size': 4,
                       'eval_batch_size': 4}, 'next_token', seed=0, process_index=0,
                      process_count=1)
  split = int(len(TEXT) * 0.9)
  assert ds.info['num_train_tokens'] == split and ds.vocab.tokens == tuple(sorted(set(TEXT)))
  covered = ds.info['num_eval_examples'] * 16
  assert windows_text(ds, ds.eval_batches()) == TEXT[split:split + covered]
  for step in range(10):
    batch = ds.train_batch(step)
    for inputs, targets in zip(batch['inputs'], batch['targets']):
      window = ds.vocab.decode(inputs) + ds.vocab.decode(targets)[-1]
      assert window in TEXT[:split]


def test_tiny_shakespeare_builder_prepares_from_input_txt(tmp_path):
  manual = tmp_path / 'manual'
  manual.mkdir()
  (manual / 'input.txt').write_bytes(TEXT.encode())
  data_dir = str(tmp_path / 'tfds')
  ds = data.make_data({'name': 'tiny_shakespeare', 'tfds_data_dir': data_dir,
                       'manual_dir': str(manual), 'download': False, 'seq_len': 32,
                       'batch_size': 4, 'eval_batch_size': 4}, 'next_token', seed=0,
                      process_index=0, process_count=1)
  read = {split: tfds.data_source(sources.SHAKESPEARE, split=split, data_dir=data_dir,
                                  download=False)
          for split in ('train', 'validation', 'test')}
  assert [len(source) for source in read.values()] == [1, 1, 1]
  texts = tuple(source[0]['text'].decode() for source in read.values())
  assert texts == builders.stock_splits(TEXT)
  split = int(len(TEXT) * 0.9)  # held out: validation + test, the last 10%
  covered = ds.info['num_eval_examples'] * 32
  assert windows_text(ds, ds.eval_batches()) == TEXT[split:split + covered]
  assert ds.info['num_train_tokens'] == split


# ---- CIFAR-10 ------------------------------------------------------------------------------

def write_jpeg_layout(root, per_split=(('train', 2), ('test', 1))):
  """A tiny CIFAR-10 JPEG layout; returns {relative path: decoded pixels}."""
  pixels = {}
  noise = np.random.default_rng(0)
  for split, count in per_split:
    for name in builders.CIFAR10_CLASSES:
      (root / split / name).mkdir(parents=True)
      for i in range(count):
        array = noise.integers(0, 256, size=(32, 32, 3), dtype=np.uint8)
        path = root / split / name / f'{i:04d}.jpg'
        Image.fromarray(array).save(path, quality=75)
        pixels[f'{split}/{name}/{path.name}'] = np.asarray(Image.open(path).convert('RGB'))
  return pixels


def read_split(name, split, data_dir):
  source = tfds.data_source(name, split=split, data_dir=str(data_dir), download=False)
  return (np.stack([example['image'] for example in source]),
          np.array([example['label'] for example in source]))


def cifar_config(tmp_path, manual_dir, **overrides):
  return {'name': 'cifar10', 'tfds_data_dir': str(tmp_path / 'tfds'), 'manual_dir': str(manual_dir),
          'download': False, 'batch_size': 8, 'eval_batch_size': 5, **overrides}


def test_cifar10_builder_prepares_from_a_jpeg_layout(tmp_path, caplog):
  pixels = write_jpeg_layout(tmp_path / 'manual')
  with caplog.at_level(logging.WARNING):
    ds = data.make_data(cifar_config(tmp_path, tmp_path / 'manual'), 'image', seed=0,
                        process_index=0, process_count=1)
  assert 'JPEG q75 copy' in caplog.text and ds.info['source'] == sources.CIFAR10_JPEG
  assert ds.info['num_train_examples'] == 20 and ds.info['num_eval_examples'] == 10
  for split, count in (('train', 20), ('test', 10)):
    source = tfds.data_source(sources.CIFAR10_JPEG, split=split, data_dir=str(tmp_path / 'tfds'),
                              download=False)
    assert len(source) == count
    for example in source:
      path = example['id'].decode()
      np.testing.assert_array_equal(example['image'], pixels[path])
      assert example['label'] == builders.CIFAR10_CLASSES.index(path.split('/')[1])
  batch = ds.train_batch(0)
  assert batch['image'].shape == (8, 32, 32, 3) and batch['image'].dtype == np.float32


def test_cifar10_builder_reads_the_jpeg_archive_alike(tmp_path):
  pixels = write_jpeg_layout(tmp_path / 'layout', per_split=(('train', 1), ('test', 1)))
  (tmp_path / 'manual').mkdir()
  with tarfile.open(tmp_path / 'manual' / builders.CIFAR10_JPEG, 'w:gz') as tar:
    tar.add(tmp_path / 'layout' / 'train', arcname='cifar10/train')
    tar.add(tmp_path / 'layout' / 'test', arcname='cifar10/test')
  name = sources.prepare_cifar10(str(tmp_path / 'tfds'), str(tmp_path / 'manual'), download=False)
  for split in ('train', 'test'):
    expected = [(label, pixels[f'{split}/{name}/0000.jpg'])
                for label, name in enumerate(builders.CIFAR10_CLASSES)]
    got_images, got_labels = read_split(name, split, tmp_path / 'tfds')
    order = np.argsort(got_labels)
    np.testing.assert_array_equal(got_labels[order], [label for label, _ in expected])
    np.testing.assert_array_equal(got_images[order], np.stack([image for _, image in expected]))


def test_cifar10_builder_parses_the_official_binary_archive(tmp_path):
  """Records of one label byte and the red, green and blue 32x32 planes, ids in archive order."""
  noise = np.random.default_rng(0)
  manual = tmp_path / 'manual'
  manual.mkdir()
  expected = {}
  with tarfile.open(manual / builders.CIFAR10_BINARY, 'w:gz') as tar:
    for split, members in builders._BINARY_MEMBERS.items():
      labels = noise.integers(0, 10, size=2 * len(members), dtype=np.uint8)
      hwc = noise.integers(0, 256, size=(2 * len(members), 32, 32, 3), dtype=np.uint8)
      records = np.concatenate([labels[:, None], hwc.transpose(0, 3, 1, 2).reshape(len(hwc), -1)],
                               axis=1)
      for member, part in zip(members, np.split(records, len(members))):
        info = tarfile.TarInfo(member)
        info.size = part.nbytes
        tar.addfile(info, io.BytesIO(part.tobytes()))
      expected[split] = labels, hwc
  assert sources.prepare_cifar10(str(tmp_path / 'tfds'), str(manual),
                                 download=False) == sources.CIFAR10_ORIGINAL
  for split, (labels, hwc) in expected.items():
    source = tfds.data_source(sources.CIFAR10_ORIGINAL, split=split,
                              data_dir=str(tmp_path / 'tfds'), download=False)
    assert len(source) == len(labels)
    for example in source:
      index = int(example['id'].decode().removeprefix(f'{split}_'))
      np.testing.assert_array_equal(example['image'], hwc[index])
      assert example['label'] == labels[index]


class StockCifar10(cifar.Cifar10, skip_registration=True):
  """TFDS's own cifar10 builder (name, version, features), fed a few images without TensorFlow:
  what a stock preparation leaves in a data dir."""
  name = 'cifar10'

  def _split_generators(self, dl_manager):
    return {split: self._few(split) for split in ('train', 'test')}

  def _few(self, split):
    for i in range(10):
      image = Image.fromarray(np.full((32, 32, 3), 20 * i, np.uint8))
      yield f'{split}{i}', {'id': f'{split}{i}', 'image': image, 'label': i}


def test_a_stock_prepared_cifar10_is_read_as_it_is(tmp_path):
  StockCifar10(data_dir=str(tmp_path / 'tfds'), file_format='array_record').download_and_prepare()
  write_jpeg_layout(tmp_path / 'manual', per_split=(('train', 1), ('test', 1)))
  name = sources.prepare_cifar10(str(tmp_path / 'tfds'), str(tmp_path / 'manual'), download=False)
  assert name == 'cifar10'
  images_, labels = read_split(name, 'train', tmp_path / 'tfds')
  np.testing.assert_array_equal(images_[:, 0, 0, 0], 20 * labels)
  assert not (tmp_path / 'tfds' / 'transformer_jax_cifar10').exists()


# ---- missing data ----------------------------------------------------------------------------

def test_missing_cifar10_says_how_to_provide_it(tmp_path):
  (tmp_path / 'empty').mkdir()
  with pytest.raises(data.DataNotFoundError) as error:
    data.make_data(cifar_config(tmp_path, tmp_path / 'empty'), 'image', seed=0, process_index=0,
                   process_count=1)
  message = str(error.value)
  for needle in ('--config.data.manual_dir=DIR', 'cifar-10-binary.tar.gz',
                 'train/<class>/NNNN.jpg', 'cifar10-jpeg-q75.tar.gz', '--config.data.tfds_data_dir',
                 '--config.data.download=True'):
    assert needle in message


def test_missing_tiny_shakespeare_reports_the_failed_download(tmp_path, monkeypatch):
  monkeypatch.setattr(sources, '_unreachable', lambda url: f'no route to {url}')
  with pytest.raises(data.DataNotFoundError) as error:
    data.make_data({'name': 'tiny_shakespeare', 'tfds_data_dir': str(tmp_path)}, 'masked',
                   seed=0, process_index=0, process_count=1)
  message = str(error.value)
  assert 'DIR holds input.txt' in message and '--config.data.name=text_file' in message
  assert f'no route to {builders.SHAKESPEARE_URL}' in message


def test_unknown_names_and_families_fail_clearly(tmp_path):
  with pytest.raises(data.DataNotFoundError, match=f"mnist is not prepared in {tmp_path} "):
    make('vit', name='mnist', tfds_data_dir=str(tmp_path))
  with pytest.raises(data.DataNotFoundError,
                     match="data.name='mnits' is neither prepared .* did you mean 'mnist'"):
    make('vit', name='mnits', tfds_data_dir=str(tmp_path))
  with pytest.raises(data.DataNotFoundError, match=f"mnist is not prepared in {tmp_path} "):
    make('decoder', name='mnist', tfds_data_dir=str(tmp_path))  # any TFDS text dataset
  with pytest.raises(ValueError, match="data.name='mnist' is not one of"):
    make('encoder_decoder', name='mnist')
  with pytest.raises(ValueError, match="'seq2seq_sort' feeds seq2seq models, not 'next_tok"):
    make('decoder', name='seq2seq_sort')


def test_data_settings_resolve_defaults_and_refuse_unknown_keys():
  settings = data.DataSettings.of({'name': 'jsonl', 'seq_len': None, 'packing': True,
                                   'mixup_alpha': 0.2})
  assert (settings.name, settings.seq_len) == ('jsonl', 64)
  # Each source's keys are its own part's, checked by it.
  assert settings.part(corpus.TextSettings).packing
  assert settings.part(images.ImageSettings).mixing == images.Mixing(0.2, 0.0, 0.5)
  assert data.DataSettings.of(settings) is settings
  with pytest.raises(ValueError, match=r"Unknown data settings \['pakcing'\]"):
    data.DataSettings.of({'pakcing': True})
  with pytest.raises(ValueError, match=r'data.cutmix_prob=2'):
    data.DataSettings.of({'cutmix_prob': 2})
  # The placeholders of the config's keys whose default is None carry the fields' types.
  types = data.DataSettings.section_types()
  assert types['vocab_size'] is int and types['path'] is str and 'seq_len' not in types


def test_a_source_adds_its_settings_without_editing_a_union():
  @dataclasses.dataclass(frozen=True)
  class ClipSettings(data.DataPart):
    PART = 'clips_for_this_test'
    clip_seconds: float = 2.0
  try:
    data.register_part(ClipSettings)
    assert config_lib.base_config().data.clip_seconds == 2.0
    assert data.DataSettings.of({'clip_seconds': 3.0}).part(ClipSettings).clip_seconds == 3.0
    with pytest.raises(ValueError, match='already a key of'):
      data.register_part(dataclasses.make_dataclass(
          'Clash', [('seq_len', int, 3)], bases=(data.DataPart,), frozen=True))
  finally:
    data.settings._PARTS.pop(ClipSettings.PART)
