"""Translation data for the encoder-decoder: pairs of a TFDS Translation dataset as batches,
unpacked and packed, their process shares, their errors, BLEU, and configs/wmt_transformer.py
through launch.py on a small stand-in for wmt14_translate/de-en prepared in a data dir."""
import itertools
import json
import subprocess
import sys

import jax
import numpy as np
import pytest
import tensorflow_datasets as tfds
import tokenizers

from helpers import mock_tfds, ROOT
from transformer_jax import aot, data, models
from transformer_jax.data import translation
from transformer_jax.errors import ConfigError

SUBJECTS = [('the cat', 'die Katze'), ('the dog', 'der Hund'), ('a bird', 'ein Vogel'),
            ('my friend', 'mein Freund')]
VERBS = [('sees', 'sieht'), ('likes', 'mag'), ('finds', 'findet')]
OBJECTS = [('the house', 'das Haus'), ('a tree', 'einen Baum'), ('the river', 'den Fluss'),
           ('a book', 'ein Buch')]
ADVERBS = [('today', 'heute'), ('again', 'wieder'), ('', '')]
# (en, de): 144 sentences, every third held out; a training pair without a source is left out.
PAIRS = [tuple(' '.join(filter(None, words)).capitalize() + '.' for words in zip(*parts))
         for parts in itertools.product(SUBJECTS, VERBS, OBJECTS, ADVERBS)]
TRAIN = [p for i, p in enumerate(PAIRS) if i % 3] + [('Nothing.', '')]
TEST = PAIRS[::3]
NAME = 'wmt14_translate/de-en'


class Wmt14Translate(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """A stand-in for wmt14_translate/de-en: its name, config and features; TFDS reads it from
  the data dir by name, without this code, as it reads a wmt14_translate prepared elsewhere."""
  VERSION = tfds.core.Version('1.0.0')
  BUILDER_CONFIGS = [tfds.core.BuilderConfig(name='de-en')]

  def _info(self):
    return tfds.core.DatasetInfo(builder=self,
                                 features=tfds.features.Translation(languages=('de', 'en')))

  def _split_generators(self, dl_manager):
    return {'train': self._generate_examples(TRAIN), 'test': self._generate_examples(TEST)}

  def _generate_examples(self, pairs):
    for i, (en, de) in enumerate(pairs):
      yield i, {'en': en, 'de': de}


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
  directory = tmp_path_factory.mktemp('tfds')
  Wmt14Translate(config='de-en', data_dir=str(directory),
                 file_format='array_record').download_and_prepare()
  return str(directory)


def make(data_dir, process_index=0, process_count=1, seed=3, **options):
  return data.make_data({'name': NAME, 'tfds_data_dir': data_dir, 'tokenizer': 'bpe',
                         'vocab_size': 300, 'seq_len': 32, 'batch_size': 4, **options},
                        'seq2seq', seed=seed, process_index=process_index,
                        process_count=process_count)


def records(data_dir, split='test'):
  """(en, de) of each record of `split` in the order prepared (TFDS shuffles the examples)."""
  source = tfds.data_source(NAME, split=split, data_dir=data_dir)
  return [(source[i]['en'].decode(), source[i]['de'].decode()) for i in range(len(source))]


def expected_pairs(tokenizer, pairs, seq_len=32):
  """(source ids + EOS, target ids + EOS), each cut to seq_len, of the pairs that have a source:
  the config name 'de-en' reads from German to English."""
  return [tuple((tokenizer.encode(text) + [tokenizer.eos_id])[:seq_len] for text in (de, en))
          for en, de in pairs if de]


def test_unpacked_batches_are_each_pair_tokenized_with_bos_and_eos(data_dir):
  made = make(data_dir, bleu_examples=0)
  tokenizer = made.vocab
  assert made.info['languages'] == ['de', 'en']
  assert made.info['num_train_pairs'] == len(TRAIN) - 1  # the pair without a source
  assert made.task.num_eval_examples == len(TEST)
  batch = made.task.eval_examples(np.arange(len(TEST)))
  for row, (source, target) in enumerate(expected_pairs(tokenizer, records(data_dir))):
    assert batch['inputs'][row, :len(source)].tolist() == source
    assert batch['input_valid'][row].tolist() == [i < len(source) for i in range(32)]
    assert batch['targets'][row, :len(target)].tolist() == target
    assert batch['decoder_inputs'][row, :len(target)].tolist() == [tokenizer.bos_id] + target[:-1]
    assert batch['weights'][row].tolist() == [float(i < len(target)) for i in range(32)]
    assert not batch['inputs'][row, len(source):].any()
    assert not batch['targets'][row, len(target):].any()
  assert tokenizer.decode(batch['targets'][0]) == records(data_dir)[0][0]


def test_a_task_prefix_goes_before_each_unpacked_source(data_dir):
  plain = make(data_dir, bleu_examples=0)
  prefixed = make(data_dir, bleu_examples=0, task_prefix='translate German to English: ')
  prefix = plain.vocab.encode('translate German to English: ')
  rows = np.arange(len(TEST))
  batch, expected = prefixed.task.eval_examples(rows), plain.task.eval_examples(rows)
  np.testing.assert_array_equal(batch['inputs'][:, :len(prefix)], np.tile(prefix, (len(TEST), 1)))
  np.testing.assert_array_equal(batch['inputs'][:, len(prefix):],
                                expected['inputs'][:, :32 - len(prefix)])
  np.testing.assert_array_equal(batch['input_valid'].sum(axis=1), np.minimum(
      expected['input_valid'].sum(axis=1) + len(prefix), 32))
  np.testing.assert_array_equal(batch['targets'], expected['targets'])
  with pytest.raises(ConfigError, match='set data.packing=False'):
    make(data_dir, packing=True, task_prefix='translate: ')


def test_packed_rows_hold_whole_pairs_in_order_as_matching_segments(data_dir):
  made = make(data_dir, packing=True, seq_len=64)
  held_out = made.task.eval_examples(np.arange(made.task.num_eval_examples))
  segments = []
  for row in range(len(held_out['inputs'])):
    source_ids, target_ids = held_out['input_segment_ids'][row], held_out['target_segment_ids'][row]
    assert set(source_ids[source_ids > 0]) == set(target_ids[target_ids > 0])
    for k in range(1, source_ids.max() + 1):
      source, target = source_ids == k, target_ids == k
      segments.append((held_out['inputs'][row, source].tolist(),
                       held_out['targets'][row, target].tolist()))
      assert held_out['input_positions'][row, source].tolist() == list(range(source.sum()))
      assert held_out['target_positions'][row, target].tolist() == list(range(target.sum()))
      assert held_out['decoder_inputs'][row, target].tolist() == (
          [made.vocab.bos_id] + segments[-1][1][:-1])
    assert (held_out['weights'][row] == (target_ids > 0)).all()
    assert not held_out['inputs'][row, source_ids == 0].any()
    assert not held_out['targets'][row, target_ids == 0].any()
  assert segments == expected_pairs(made.vocab, records(data_dir), seq_len=64)
  assert made.task.num_eval_examples <= len(TEST) / 2  # rows hold several pairs
  cut = make(data_dir, packing=True, seq_len=4).task.eval_examples(np.arange(3))
  assert cut['target_segment_ids'][0].tolist() == [1, 1, 1, 1]  # a longer target, cut
  assert cut['targets'][0].tolist() == made.vocab.encode(records(data_dir)[0][0])[:4]


@pytest.mark.parametrize('packing', [False, True])
def test_process_shares_concatenate_to_the_one_process_batch_of_each_step(data_dir, packing):
  whole = make(data_dir, packing=packing, bleu_examples=0)
  shares = [make(data_dir, index, 2, packing=packing, bleu_examples=0) for index in (0, 1)]
  for step in (0, 7, 40):  # 40 * 4 examples: past the first epoch
    batch = whole.train_batch(step)
    for key, value in batch.items():
      np.testing.assert_array_equal(
          np.concatenate([share.train_batch(step)[key] for share in shares]), value, key)
  rows = whole.task.train.num_rows
  visited = np.concatenate([whole.task.train_batch(step, 4, slice(None))['inputs']
                            for step in range(-(-rows // 4))])[:rows]
  assert len({tuple(row) for row in visited}) == rows  # an epoch visits every row once
  other_seed = make(data_dir, packing=packing, seed=4, bleu_examples=0)
  assert not np.array_equal(other_seed.train_batch(0)['inputs'], whole.train_batch(0)['inputs'])


def test_languages_and_splits_that_are_not_there_fail_naming_the_fix(data_dir):
  with mock_tfds(8):  # para_crawl's config name 'enbg' does not say the direction
    with pytest.raises(ConfigError, match=r"para_crawl/enbg translates between the languages "
                                          r"\['bg', 'en'\]; data.source_language is unset"):
      data.make_data({'name': 'para_crawl/enbg'}, 'seq2seq', seed=0, process_index=0,
                     process_count=1)
  with pytest.raises(ConfigError, match=r"data.target_language='fr' is not one of them"):
    make(data_dir, target_language='fr')
  with pytest.raises(ConfigError, match="data.source_language and data.target_language are both"):
    make(data_dir, source_language='en', target_language='en')
  with pytest.raises(ConfigError, match=r"data.train_split='training': .* The splits of "
                                        r"wmt14_translate: \{'train': 97, 'test': 48\}"):
    make(data_dir, train_split='training')
  with pytest.raises(ConfigError, match="up to EOS, which the data.tokenizer='chars'"):
    make(data_dir, tokenizer='chars')


def test_a_mock_ted_hrlr_dataset_reads_its_direction_from_the_config_name():
  with mock_tfds(12):
    made = data.make_data({'name': 'ted_hrlr_translate/pt_to_en', 'tokenizer': 'bpe',
                           'vocab_size': 280, 'seq_len': 24, 'batch_size': 4, 'packing': True},
                          'seq2seq', seed=0, process_index=0, process_count=1)
    records = tfds.data_source('ted_hrlr_translate/pt_to_en', split='train')
    first = records[0]
  assert made.info['languages'] == ['pt', 'en']
  row = made.task.eval_examples(np.arange(1))
  assert row['inputs'][0, row['input_segment_ids'][0] == 1].tolist() == (
      made.vocab.encode(first['pt']) + [made.vocab.eos_id])[:24]


def test_bleu_and_exact_match_of_the_translations_against_the_references(data_dir):
  made = make(data_dir, bleu_examples=7, eval_batch_size=4)
  tokenizer, shapes = made.vocab, []
  references = {tuple(source): target
                for source, target in expected_pairs(tokenizer, records(data_dir))}

  def translations(right):
    """generate() answering the reference for the first `right` calls' rows, else nothing."""
    calls = []

    def generate(prompt_tokens, inputs, input_valid, max_new_tokens, **keywords):
      shapes.append(inputs.shape)
      calls.append(inputs.shape)
      assert (prompt_tokens == tokenizer.bos_id).all() and keywords['eos_id'] == tokenizer.eos_id
      out = np.zeros((len(inputs), max_new_tokens), np.int32)
      for row, (ids, valid) in enumerate(zip(inputs, input_valid)):
        target = references[tuple(ids[valid])] if len(calls) <= right else [tokenizer.eos_id]
        out[row, :len(target)] = target
      return out
    return generate

  assert made.task.generation_metrics(translations(2), 4) == {'eval_bleu': pytest.approx(100),
                                                              'eval_exact_match': 1.0}
  assert shapes == [(4, 32), (4, 32)]  # 7 pairs: the last batch filled up with a repeat
  assert made.task.generation_metrics(translations(0), 4) == {'eval_bleu': 0.0,
                                                              'eval_exact_match': 0.0}
  half = made.task.generation_metrics(translations(1), 4)
  assert 0 < half['eval_bleu'] < 100 and half['eval_exact_match'] == pytest.approx(4 / 7)
  # By hand: n-gram precisions 7/8, 5/7, 3/6, 2/5, no brevity penalty: their geometric mean.
  assert translation.bleu(['the cat sat on the red mat today'],
                          ['the cat sat on the mat today']) == pytest.approx(100 * 8 ** -0.25)
  assert make(data_dir, bleu_examples=0).task.generation_metrics(translations(2), 4) == {}


@pytest.mark.slow  # a launch.py process of its own, about 15 s
def test_the_wmt_config_trains_and_reports_bleu_through_launch(tmp_path, data_dir):
  result = subprocess.run(
      [sys.executable, str(ROOT / 'launch.py'),
       f'--config={ROOT / "configs" / "wmt_transformer.py"}:smoke', f'--workdir={tmp_path}',
       f'--config.data.tfds_data_dir={data_dir}'],
      capture_output=True, text=True, timeout=600, cwd=ROOT,
      env={'JAX_PLATFORMS': 'cpu', 'PATH': '', 'TRANSFORMER_JAX_CACHE': str(tmp_path / 'cache')})
  assert result.returncode == 0, result.stderr[-3000:]
  rows = [json.loads(line) for line in (tmp_path / 'metrics.jsonl').read_text().splitlines()]
  final = [row for row in rows if 'eval_bleu' in row][-1]
  assert final['step'] == 3 and 0 <= final['eval_bleu'] <= 100 and final['eval_bits_per_byte'] > 0
  assert 'BLEU' in result.stderr
  assert (tmp_path / 'tokenizer' / 'tokenizer.json').is_file()


@pytest.mark.parametrize('packing', [False, True])
def test_the_abstract_batch_of_compile_mode_is_the_translation_batchs_layout(data_dir, packing):
  layout = lambda batch: {k: (tuple(v.shape), np.dtype(v.dtype)) for k, v in batch.items()}
  real = make(data_dir, packing=packing, bleu_examples=0).train_batch(0)
  stand_in = data.make_data({'name': 'synthetic', 'seq_len': 32, 'batch_size': 4}, 'seq2seq',
                            seed=0).train_batch(0)
  mesh = jax.make_mesh((1,), ('data',), axis_types=(jax.sharding.AxisType.Auto,),
                       devices=jax.devices()[:1])
  packed = models.registry.get('encoder_decoder').packed_shapes if packing else None
  assert layout(aot.abstract_batch(stand_in, mesh, packed)) == layout(real)


def test_a_tokenizer_without_bos_starts_the_decoder_from_pad_in_training_and_decoding(
    data_dir, tmp_path):
  """T5's tokenizer.json has no BOS, and T5 starts its decoder from PAD: the targets are shifted
  by it and held-out translation starts from it."""
  text = ' '.join(' '.join(pair) for pair in PAIRS + TRAIN)
  words = sorted({word for word, _ in tokenizers.pre_tokenizers.Whitespace().pre_tokenize_str(
      text)})
  model = tokenizers.Tokenizer(tokenizers.models.WordLevel(
      {token: i for i, token in enumerate(['<pad>', '</s>', '<unk>', *words])}, unk_token='<unk>'))
  model.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
  model.add_special_tokens(['<pad>', '</s>', '<unk>'])
  model.save(str(tmp_path / 'tokenizer.json'))
  made = make(data_dir, tokenizer=str(tmp_path / 'tokenizer.json'), vocab_size=None,
              bleu_examples=3)
  tokenizer = made.vocab
  assert (tokenizer.pad_id, tokenizer.eos_id, tokenizer.bos_id) == (0, 1, None)
  batch = made.task.eval_examples(np.arange(3))
  for previous, targets, weights in zip(batch['decoder_inputs'], batch['targets'],
                                        batch['weights']):
    length = int(weights.sum())
    assert previous[:length].tolist() == [0] + targets[:length - 1].tolist()
  references = {tuple(ids[valid]): targets[weights > 0]
                for ids, valid, targets, weights in zip(batch['inputs'], batch['input_valid'],
                                                        batch['targets'], batch['weights'])}

  def generate(prompt_tokens, inputs, input_valid, max_new_tokens, **unused):
    assert prompt_tokens.tolist() == [[0]] * len(inputs)
    out = np.zeros((len(inputs), max_new_tokens), np.int32)
    for row, (ids, valid) in enumerate(zip(inputs, input_valid)):
      target = references[tuple(ids[valid])]
      out[row, :len(target)] = target
    return out
  assert made.task.generation_metrics(generate, 4)['eval_bleu'] == pytest.approx(100)
