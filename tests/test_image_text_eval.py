"""A dual encoder's evaluation and image-text sources: zero-shot classification and retrieval
(data.image_text_eval) against NumPy written out here, the TFDS sources of pairs (a caption
feature, several captions per image, a classification dataset captioned by class name), and
bad input (zero-shot settings among it) refused before compiling."""
import json
import pathlib
import re
import subprocess
import sys

import jax
import numpy as np
from PIL import Image
import pytest
import tensorflow_datasets as tfds

from helpers import mock_tfds
from process_env import process_env
from transformer_jax import config_lib, data, train
from transformer_jax.data import image_text, image_text_eval, rng, sources
from transformer_jax.errors import ConfigError, UserError
from transformer_jax.sweep import override
from unittest import mock

ROOT = pathlib.Path(__file__).resolve().parent.parent


def unit(x):
  return x / np.sqrt((x * x).sum(-1, keepdims=True))


def test_class_embeddings_average_the_normalised_prompts_and_normalise_again():
  prompts = np.random.default_rng(0).normal(size=(3 * 4, 5)).astype(np.float32)  # 3 classes x 4
  got = image_text_eval.class_embeddings(prompts, 3)
  for c in range(3):
    mean = sum(unit(prompts[c * 4 + p]) for p in range(4)) / 4
    np.testing.assert_allclose(got[c], mean / np.linalg.norm(mean), rtol=1e-6)


def test_top_k_accuracy_counts_the_label_among_the_k_most_similar_classes():
  classes = np.eye(6, dtype=np.float32)
  # Image 0 is nearest class 0; image 1 ranks its label (2) sixth; image 2 ranks its label (5)
  # third, after classes 1 and 0.
  images = np.array([[9, 1, 0, 0, 0, 0], [6, 5, 1, 4, 3, 2], [8, 9, 0, 0, 0, 7]], np.float32)
  got = image_text_eval.top_k_accuracies(images, classes, np.array([0, 2, 5]), ks=(1, 3, 5))
  assert got == {1: 1 / 3, 3: 2 / 3, 5: 2 / 3}


def brute_force_recalls(images, texts, owners, k):
  """Recall at k by sorting: an image's top k texts, a text's top k images."""
  scores = unit(images) @ unit(texts).T
  i2t = [any(owners[j] == i for j in np.argsort(-scores[i])[:k]) for i in range(len(images))]
  t2i = [owners[j] in np.argsort(-scores[:, j])[:k] for j in range(len(texts))]
  return np.mean(i2t), np.mean(t2i)


def test_retrieval_counts_an_image_retrieved_by_any_of_its_captions():
  # Image 0's captions are texts 0 and 1, image 1's text 2, image 2's text 3. Image 0's nearest
  # text is its second caption; image 1's nearest two are image 0's captions.
  images = np.array([[1, 0, 0], [0.9, 0.1, 0], [0, 0, 1]], np.float32)
  texts = np.array([[0.8, 0.6, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1]], np.float32)
  owners = np.array([0, 0, 1, 2])
  got = image_text_eval.retrieval_recalls(images, texts, owners, ks=(1, 2, 3))
  # i2t: images 0 and 2 at 1, image 1 at 3. t2i: text 0's nearest image is 1, then 0; texts 1,
  # 2 and 3 find theirs first.
  assert got['i2t_r1'] == got['i2t_r2'] == pytest.approx(2 / 3) and got['i2t_r3'] == 1.0
  assert got['t2i_r1'] == pytest.approx(3 / 4) and got['t2i_r2'] == 1.0
  numbers = np.random.default_rng(1)
  images, texts = numbers.normal(size=(20, 8)), numbers.normal(size=(50, 8))
  owners = np.concatenate([np.arange(20), numbers.integers(0, 20, size=30)])
  got = image_text_eval.retrieval_recalls(images, texts, owners)
  for k in (1, 5):
    assert (got[f'i2t_r{k}'], got[f't2i_r{k}']) == pytest.approx(
        brute_force_recalls(images, texts, owners, k))


def pairs(settings, **sizes):
  return data.make_data(settings, 'image_text', seed=0, process_index=0, process_count=1,
                        **{'image_size': 16, 'text_len': 48, **sizes})


def test_several_captions_per_image_one_drawn_per_example_and_all_evaluated(monkeypatch):
  """clevr's questions (a Text in a Sequence of features, as coco_captions' captions): each
  training example takes one of its image's ten, the same for the same (seed, step)."""
  settings = {'name': 'clevr', 'text_key': 'question_answer/question', 'batch_size': 8,
              'eval_batch_size': 2,
              'train_split': 'train', 'eval_split': 'validation'}
  with mock_tfds(6, equal_lengths=True):
    made = pairs(settings)
    batch, again = made.train_batch(5), pairs(settings).train_batch(5)
    source = made.task.train
    records = rng.shuffled(0, 5, 8, slice(None), len(source))
    questions = source.read(records)[2]
    captions = [made.vocab.decode(ids) for ids in batch['text']]
    held_out = made.task.eval_examples(np.arange(2))
    first = [options[0] for options in made.task.held_out.read([0, 1])[2]]
  assert batch['image'].shape == (8, 16, 16, 3) and (batch['label'] == -1).all()
  assert all(c in options for c, options in zip(captions, questions))
  assert not all(c == options[0] for c, options in zip(captions, questions))
  assert all((batch[k] == again[k]).all() for k in batch)
  assert [made.vocab.decode(ids) for ids in held_out['text']] == first
  assert all(len(options) == 10 for options in questions)


def test_a_dataset_without_the_text_feature_is_refused_naming_the_fix():
  with mock_tfds(4), pytest.raises(ConfigError, match=r"no Text feature .*data.text_key.*"
                                                      r"data.captions='label'"):
    pairs({'name': 'cifar100', 'batch_size': 4})


def test_a_classification_dataset_is_captioned_by_its_class_names():
  templates = ('a photo of a {}.', 'the {}, blurred')
  settings = {'name': 'cifar100', 'captions': 'label', 'caption_templates': templates,
              'batch_size': 8}
  with mock_tfds(12):
    made = pairs(settings)
    batch = made.train_batch(0)
  names = made.info['class_names']
  assert len(names) == 100  # the mock's ClassLabel names its classes by number
  for ids, label in zip(batch['text'], batch['label']):
    assert made.vocab.decode(ids) in [t.format(names[label]) for t in templates]


@pytest.mark.parametrize('templates', [('no slot',), ('{} and {}',), ()])
def test_templates_need_one_slot_for_the_class_name(templates):
  with pytest.raises(ConfigError, match=r"one \{\} each"):
    data.DataSettings.of({'name': 'x', 'caption_templates': templates})
  with pytest.raises(ConfigError, match=r"one \{\} each"):
    train.resolve(override(config_lib.from_file(ROOT / 'configs' / 'clip_reference.py'),
                           {'eval.zero_shot_templates': templates}), 'cpu')


@pytest.mark.parametrize('settings, fix', [
    ({'eval.zero_shot_dataset': 'cifar1O'}, "eval.zero_shot_dataset='cifar1O' is neither prepared"),
    ({'eval.zero_shot_split': 'tset'}, "eval.zero_shot_split='tset': Unknown split"),
    ({'eval.zero_shot_dataset': 'clevr'},
     "eval.zero_shot_dataset='clevr' has no ClassLabel feature"),
    ({'eval.zero_shot_classes': ('cat', 'dog')},
     'eval.zero_shot_classes names 2 classes but cifar10 has 10: give one name per class'),
])
def test_zero_shot_settings_the_data_cannot_score_fail_before_compiling(settings, fix, tmp_path):
  config = override(config_lib.from_file(ROOT / 'configs' / 'clip_reference.py', 'smoke'),
                    {'eval.zero_shot_dataset': 'cifar10', **settings})
  with mock_tfds(4), mock.patch.object(sources, 'prepare_cifar10', lambda *args: 'cifar10'):
    # The mock serves any split: a split a prepared dataset lacks fails as TFDS fails it.
    serve = tfds.core.DatasetBuilder.as_data_source

    def as_data_source(builder, split, **kwargs):
      if split not in ('train', 'test'):
        raise ValueError(f"Unknown split {split!r}. Should be one of ['train', 'test'].")
      return serve(builder, split=split, **kwargs)
    with mock.patch.object(tfds.core.DatasetBuilder, 'as_data_source', as_data_source), \
        pytest.raises(UserError, match=re.escape(fix)) as error:
      train.train(config, str(tmp_path))
  assert '\n' not in str(error.value) and not any(tmp_path.iterdir())  # nothing ran


def test_a_long_caption_with_truncation_off_fails_in_the_first_batch_naming_the_fix(tmp_path):
  Image.new('RGB', (8, 8)).save(tmp_path / 'a.png')
  lines = [json.dumps({'image': 'a.png', 'text': 'a very long caption ' * (i + 1)})
           for i in range(10)]
  (tmp_path / 'pairs.jsonl').write_text('\n'.join(lines))
  settings = {'name': 'jsonl', 'path': str(tmp_path / 'pairs.jsonl'), 'batch_size': 4,
              'eval_batch_size': 1, 'truncate_captions': False}
  with pytest.raises(ConfigError, match='set data.truncate_captions=True or raise model.max_len'):
    pairs(settings, text_len=24).train_batch(0)


def test_towers_of_different_widths_need_a_projection():
  config = override(config_lib.from_file(ROOT / 'configs' / 'clip_reference.py'),
                    {'model.embed_dim': 0, 'model.text_width': 32})
  with pytest.raises(ConfigError, match='set model.embed_dim to the width of a shared embedding'):
    train.resolve(config, 'cpu')


LAUNCH = """
import sys
from unittest import mock
from absl import app
sys.path[:0] = [{tests!r}, {root!r}]
from helpers import mock_tfds
import launch
from transformer_jax.data import sources
# The mock's cifar10 stands for the prepared one (data.sources finds or prepares it by name).
with mock_tfds(24, equal_lengths=True), mock.patch.object(sources, 'prepare_cifar10',
                                                          lambda *args: 'cifar10'):
  app.run(launch.main, flags_parser=launch.parse_flags)
"""


def launched(workdir, *flags, mode='train') -> subprocess.CompletedProcess:
  """launch.py on TFDS's mock data, as a user runs it, its output captured."""
  script = LAUNCH.format(tests=str(ROOT / 'tests'), root=str(ROOT))
  return subprocess.run(
      [sys.executable, '-c', script, f'--config={ROOT / "configs" / "clip_reference.py"}:smoke',
       f'--workdir={workdir}', f'--mode={mode}', '--config.model.num_layers=1',
       '--config.model.text_layers=1', *flags],
      capture_output=True, text=True, timeout=600, env={'JAX_PLATFORMS': 'cpu', 'PATH': ''})


def launch(workdir, *flags, mode='train'):
  """launch.py on TFDS's mock data: (the metrics rows it wrote, its log)."""
  result = launched(workdir, *flags, mode=mode)
  assert result.returncode == 0, result.stderr[-3000:]
  rows = [json.loads(line) for line in (workdir / 'metrics.jsonl').read_text().splitlines()]
  return rows, result.stderr


@pytest.mark.slow
def test_captions_of_a_tfds_dataset_train_and_retrieve_through_launch(tmp_path):
  rows, _ = launch(tmp_path, '--config.data.name=clevr', '--config.data.eval_split=validation',
                '--config.data.text_key=question_answer/question', '--config.model.max_len=24',
                '--config.data.batch_size=8', '--config.data.eval_batch_size=8')
  final = [row for row in rows if 'eval_loss' in row][-1]
  assert final['step'] == 4
  for name in ('i2t_r1', 'i2t_r5', 't2i_r1', 't2i_r5'):
    assert 0 <= final[f'eval_retrieval_{name}'] <= 1
  # 24 images of 10 questions each: recall at 5 of 240 questions for chance is about 5/24.
  assert final['eval_retrieval_t2i_r5'] >= final['eval_retrieval_t2i_r1']


@pytest.mark.slow
def test_zero_shot_on_mock_cifar10_equals_numpy_on_the_trained_model(tmp_path):
  """The run's eval_zero_shot_accuracy and top-5 at its last evaluation, and --mode=eval's,
  against the same prediction computed here from the checkpoint's embeddings."""
  templates = ('a photo of a {}.', 'a {}, blurred.')
  flags = ['--config.eval.zero_shot_dataset=cifar10',
           f'--config.eval.zero_shot_templates={templates}']
  rows, _ = launch(tmp_path, *flags)
  final = [row for row in rows if 'eval_zero_shot_accuracy' in row][-1]
  config = config_lib.from_file(ROOT / 'configs' / 'clip_reference.py', 'smoke')
  override(config, {'model.num_layers': 1, 'model.text_layers': 1,
                    'eval.zero_shot_dataset': 'cifar10', 'eval.zero_shot_templates': templates})
  with mock_tfds(24, equal_lengths=True), mock.patch.object(sources, 'prepare_cifar10',
                                                            lambda *args: 'cifar10'):
    run, params, _ = train.restore_trained(config, str(tmp_path))
    task = run.data.task
    test = sources.open_image_dataset('cifar10', data_dir=None, manual_dir=None,
                                      train_split='test', eval_split='test', image_key='image',
                                      label_key='label')
    records = [test.held_out[i] for i in range(len(test.held_out))]
  pictures = np.stack([task.pp_eval(r['image'], None) for r in records])
  labels = np.array([r['label'] for r in records])
  prompts = [t.format(name.replace('_', ' ')) for name in test.class_names for t in templates]
  embed = lambda method, x: np.asarray(jax.jit(
      lambda p, x: run.model.apply({'params': p}, x, method=method))(params, x))
  image_emb = unit(embed('embed_images', pictures))
  text_emb = unit(embed('embed_texts', image_text.encode_captions(prompts, task.vocab, 32, True)))
  classes = unit(text_emb.reshape(10, 2, -1).mean(axis=1))
  order = np.argsort(-(image_emb @ classes.T), axis=1)
  assert final['eval_zero_shot_accuracy'] == pytest.approx(np.mean(order[:, 0] == labels))
  assert final['eval_zero_shot_top5'] == pytest.approx(
      np.mean([label in row[:5] for row, label in zip(order, labels)]))
  _, log = launch(tmp_path, *flags, mode='eval')
  assert f"'eval_zero_shot_accuracy': {final['eval_zero_shot_accuracy']}" in log


@pytest.mark.slow
def test_a_jsonl_of_image_files_trains_and_retrieves_through_launch(tmp_path):
  colours = {'red': (255, 0, 0), 'green': (0, 255, 0), 'blue': (0, 0, 255)}
  lines = []
  for i in range(40):
    name = list(colours)[i % 3]
    Image.new('RGB', (12, 12), colours[name]).save(tmp_path / f'{i}.png')
    lines.append(json.dumps({'image': f'{i}.png', 'text': [f'a {name} square', f'{name}']}))
  (tmp_path / 'pairs.jsonl').write_text('\n'.join(lines))
  rows, _ = launch(tmp_path / 'run', '--config.data.name=jsonl',
                   f'--config.data.path={tmp_path / "pairs.jsonl"}',
                   '--config.data.batch_size=4', '--config.data.eval_batch_size=4')
  final = [row for row in rows if 'eval_loss' in row][-1]
  assert final['step'] == 4 and np.isfinite(final['eval_loss'])
  assert all(0 <= final[f'eval_retrieval_{n}'] <= 1 for n in ('i2t_r1', 't2i_r1', 'i2t_r5'))


def _noise_pairs(folder: pathlib.Path, count: int) -> pathlib.Path:
  """A JSONL of `count` noise images (no ties between embeddings) with two captions each."""
  generator = np.random.default_rng(0)
  lines = []
  for i in range(count):
    pixels = generator.integers(0, 256, size=(12, 12, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(folder / f'{i}.png')
    lines.append(json.dumps({'image': f'{i}.png', 'text': [f'picture {i}', f'number {i % 7}']}))
  (folder / 'pairs.jsonl').write_text('\n'.join(lines))
  return folder / 'pairs.jsonl'


def _with_line(jsonl: pathlib.Path, number: int, line: str) -> None:
  """Line `number` (from 1) of `jsonl` replaced by `line`."""
  lines = jsonl.read_text().splitlines()
  lines[number - 1] = line
  jsonl.write_text('\n'.join(lines))


# (line, what is written there, the message that refuses it as the JSONL is opened); the first
# four are a user's mistakes that once ended in a traceback or a line naming no file.
BAD_RECORDS = [
    (3, json.dumps({'image': 'lost.png', 'text': 'x'}),
     "{jsonl}:3: the image {folder}/lost.png does not exist: fix the path (a relative one is "
     "from the JSONL's folder), or drop the line."),
    (4, '{"image": "3.png", "text": "unterminated}',
     '{jsonl}:4 is not JSON (Unterminated string starting at: column 28): data.name=jsonl reads '
     'one JSON object per line.'),
    (5, json.dumps({'image': '4.png', 'caption': 'x'}),
     "{jsonl}:5 has no caption under data.text_key='text' (its keys: ['caption', 'image']): "
     'set --config.data.text_key.'),
    (6, json.dumps({'image': '5.png', 'text': []}),
     "{jsonl}:6 has an empty list of captions under data.text_key='text': caption its image, "
     'or drop the line.'),
    (7, json.dumps({'picture': '6.png', 'text': 'x'}),
     "{jsonl}:7 has no image path under data.image_key='image' (its keys: ['picture', 'text']): "
     'set --config.data.image_key.'),
    (8, json.dumps({'image': 7, 'text': 'x'}),
     "{jsonl}:8: its image path under data.image_key='image' is 7: write a string there."),
    (9, json.dumps({'image': '8.png', 'text': ['x', None]}),
     '{jsonl}:9: its caption under data.text_key=\'text\' is ["x", null]: write a string or a '
     'list of strings there.'),
    (10, '["9.png", "x"]',
     '{jsonl}:10 is ["9.png", "x"], not a JSON object: data.name=jsonl reads one JSON object per '
     'line.'),
]


@pytest.mark.parametrize('number, line, message', BAD_RECORDS)
def test_a_bad_record_of_an_image_text_jsonl_is_refused_at_open_naming_its_line(
    number, line, message, tmp_path):
  jsonl = _noise_pairs(tmp_path, 20)
  _with_line(jsonl, number, line)
  with pytest.raises(ConfigError) as error:
    pairs({'name': 'jsonl', 'path': str(jsonl), 'batch_size': 4})
  assert str(error.value) == message.format(jsonl=jsonl, folder=tmp_path)


def test_an_image_that_does_not_decode_is_named_by_its_path_and_line_when_read(tmp_path):
  jsonl = _noise_pairs(tmp_path, 20)  # records 0 and 10 held out, the other 18 train
  (tmp_path / '6.png').write_text('not an image')
  encoded = (tmp_path / '10.png').read_bytes()
  (tmp_path / '10.png').write_bytes(encoded[:len(encoded) // 2])
  made = pairs({'name': 'jsonl', 'path': str(jsonl), 'batch_size': 18, 'eval_batch_size': 2})
  not_an_image = (f'{jsonl}:7: the image {tmp_path}/6.png does not decode (not a format Pillow '
                  'reads): replace it with an image file (PNG, JPEG, ...), or drop the line.')
  # Batch 0 is the first epoch, every training record; read as training reads it, in grain's
  # threads, the error reaches the caller as it was raised.
  with pytest.raises(UserError) as error:
    next(made.train_iterator())
  assert str(error.value) == not_an_image
  with pytest.raises(UserError) as error:
    made.task.eval_examples(np.array([1]))  # the second held-out record, line 11
  assert str(error.value) == (
      f'{jsonl}:11: the image {tmp_path}/10.png does not decode (image file is truncated): '
      'replace it with an image file (PNG, JPEG, ...), or drop the line.')
  (tmp_path / '6.png').unlink()  # gone after the file was opened
  with pytest.raises(UserError) as error:
    made.train_batch(0)
  assert str(error.value) == (f'{jsonl}:7: the image {tmp_path}/6.png cannot be read (No such '
                              'file or directory): restore it, or drop the line.')


@pytest.mark.slow  # six launch.py processes, about 100 s on 2 shared cores
def test_a_bad_jsonl_ends_launch_in_one_line_and_the_corrected_file_trains_in_its_workdir(
    tmp_path):
  jsonl = _noise_pairs(tmp_path, 20)
  good = jsonl.read_text()
  workdir = tmp_path / 'run'
  flags = ['--config.data.name=jsonl', f'--config.data.path={jsonl}',
           '--config.data.batch_size=18', '--config.data.eval_batch_size=2']

  def refused(message):
    result = launched(workdir, *flags)
    assert result.returncode == 1 and 'Traceback' not in result.stderr, result.stderr[-3000:]
    assert result.stderr.splitlines()[-1] == message

  for number, line, message in BAD_RECORDS[:4]:
    _with_line(jsonl, number, line)
    refused(message.format(jsonl=jsonl, folder=tmp_path))
    assert not workdir.exists()  # refused as the data was opened, before anything was written
    jsonl.write_text(good)
  picture = (tmp_path / '6.png').read_bytes()
  (tmp_path / '6.png').write_text('not an image')
  refused(f'{jsonl}:7: the image {tmp_path}/6.png does not decode (not a format Pillow reads): '
          'replace it with an image file (PNG, JPEG, ...), or drop the line.')
  (tmp_path / '6.png').write_bytes(picture)
  rows, _ = launch(workdir, *flags)
  final = [row for row in rows if 'eval_loss' in row][-1]
  assert final['step'] == 4 and np.isfinite(final['eval_loss'])


@pytest.mark.slow
def test_retrieval_over_two_processes_equals_one_process(tmp_path):
  """Each process reads every held-out pair: the embeddings of a batch made from a whole host
  copy and gathered back, so two processes of two devices score what one of four does."""
  from test_train_processes import free_port  # pylint: disable=import-outside-toplevel
  pairs = _noise_pairs(tmp_path, 160)  # every tenth held out: 16 pairs
  flags = [f'--config={ROOT / "configs" / "clip_reference.py"}:smoke',
           '--config.model.num_layers=1', '--config.model.text_layers=1',
           '--config.data.name=jsonl', f'--config.data.path={pairs}',
           '--config.data.batch_size=8', '--config.data.eval_batch_size=8',
           '--config.training.steps=2', '--config.training.eval_every=2']

  def start(workdir, devices, *extra):
    env = process_env(devices)
    return subprocess.Popen([sys.executable, str(ROOT / 'launch.py'), *flags,
                             f'--workdir={workdir}', *extra], env=env, cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

  address = f'localhost:{free_port()}'
  runs = [start(tmp_path / 'two', 2, f'--coordinator_address={address}', '--num_processes=2',
                f'--process_id={i}') for i in range(2)] + [start(tmp_path / 'one', 4)]
  for run in runs:
    assert run.wait(timeout=600) == 0, run.stdout.read()[-3000:]

  def final(workdir):
    rows = [json.loads(line) for line in (workdir / 'metrics.jsonl').read_text().splitlines()]
    return [row for row in rows if 'eval_retrieval_i2t_r1' in row][-1]
  two, one = final(tmp_path / 'two'), final(tmp_path / 'one')
  for name in ('i2t_r1', 'i2t_r5', 't2i_r1', 't2i_r5'):
    assert two[f'eval_retrieval_{name}'] == one[f'eval_retrieval_{name}'], name
  np.testing.assert_allclose(two['eval_loss'], one['eval_loss'], rtol=1e-5)
