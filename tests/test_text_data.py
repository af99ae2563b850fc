"""Text corpora: tokenizers, token files, packing, and their errors."""
import itertools
import json
import math
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tokenizers

import helpers
import train_helpers
from helpers import mock_tfds
from transformer_jax import config_lib, data, models, train
from transformer_jax.data import corpus, packing, token_files
from transformer_jax.data import tokenizer as tokenizer_lib
from transformer_jax.errors import ConfigError
from transformer_jax.models import registry, styles
from transformer_jax.train import losses
from transformer_jax.train.step import StepSettings

ROOT = pathlib.Path(__file__).resolve().parent.parent
TEXT = 'Ünïcode and ASCII, mixed: ☃ snow, ça va? '


def documents(count=120):
  """Documents of 1 to 40 words, a few of them long enough to be cut by a row of 32."""
  words = ['alpha', 'beta', 'gamma', 'délta', 'ε', 'snow☃']
  return [' '.join(words[(i + j) % len(words)] for j in range(1 + (7 * i) % 40))
          for i in range(count)]


def write_jsonl(path, texts, key='text'):
  path.write_text(''.join(json.dumps({key: t, 'id': i}) + '\n' for i, t in enumerate(texts)))
  return str(path)


def make(task='next_token', process_index=0, process_count=1, **options):
  return data.make_data({'batch_size': 4, 'seq_len': 32, **options}, task, seed=5,
                        process_index=process_index, process_count=process_count)


def test_trained_bpe_round_trips_text_and_counts_its_bytes():
  bpe = tokenizer_lib.train_bpe(documents() + [TEXT], 300)
  assert (bpe.pad_id, bpe.bos_id, bpe.eos_id, bpe.mask_id) == (0, 1, 2, 3)
  ids = bpe.encode(TEXT)
  assert bpe.decode(ids) == TEXT
  assert bpe.decode(ids + [bpe.eos_id] + ids) == TEXT  # decoding stops at EOS
  assert bpe.token_bytes[ids].sum() == len(TEXT.encode('utf-8'))
  assert bpe.token_bytes[:4].tolist() == [0, 0, 0, 0]
  assert len(ids) < len(TEXT.encode('utf-8'))  # merges were learned


def test_tokenizer_json_of_a_checkpoint_finds_its_special_tokens(tmp_path):
  """A GPT-2-like byte-level tokenizer.json with <|endoftext|> as its only special token."""
  model = tokenizers.Tokenizer(tokenizers.models.BPE())
  model.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
  model.decoder = tokenizers.decoders.ByteLevel()
  model.train_from_iterator(documents(), tokenizers.trainers.BpeTrainer(
      vocab_size=280, special_tokens=['<|endoftext|>'], show_progress=False,
      initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet()))
  model.save(str(tmp_path / 'tokenizer.json'))
  loaded = tokenizer_lib.HFTokenizer.from_file(tmp_path)  # a checkpoint directory
  assert loaded.eos_id == model.token_to_id('<|endoftext|>')
  assert (loaded.bos_id, loaded.pad_id, loaded.mask_id) == (None, None, None)
  assert loaded.decode(loaded.encode(TEXT)) == TEXT
  assert loaded.token_bytes[loaded.encode(TEXT)].sum() == len(TEXT.encode('utf-8'))


def test_saved_tokenizers_read_back(tmp_path):
  chars = data.Vocab.of_text(TEXT, mask=True, eos=True)
  bpe = tokenizer_lib.train_bpe(documents(), 290)
  for name, made in (('chars', chars), ('bpe', bpe)):
    tokenizer_lib.save(made, tmp_path / name)
    back = tokenizer_lib.saved(tmp_path / name)
    assert back.fingerprint == made.fingerprint
    assert back.encode(TEXT) == made.encode(TEXT)
  assert tokenizer_lib.saved(tmp_path / 'nothing') is None


def test_bad_tokenizers_fail_in_one_line(tmp_path):
  with pytest.raises(ConfigError, match=r"data.tokenizer=.*/none: no tokenizer.json there"):
    tokenizer_lib.HFTokenizer.from_file(tmp_path / 'none')
  (tmp_path / 'tokenizer.json').write_text('{"not": "a tokenizer"}')
  with pytest.raises(ConfigError, match='is not a tokenizer.json that the tokenizers package'):
    tokenizer_lib.HFTokenizer.from_file(tmp_path / 'tokenizer.json')
  with pytest.raises(ConfigError, match='at least 260 ids'):
    tokenizer_lib.train_bpe(documents(), 100)


def test_jsonl_corpus_holds_out_every_tenth_document_and_names_bad_lines(tmp_path):
  texts = documents(30)
  path = write_jsonl(tmp_path / 'c.jsonl', texts)
  train, held_out = corpus.open_corpus(data.DataSettings.of({'path': path}), 'jsonl')
  assert list(held_out.documents()) == texts[9::10]
  assert list(train.documents()) == [t for i, t in enumerate(texts) if i % 10 != 9]
  bad = tmp_path / 'bad.jsonl'
  bad.write_text('{"text": "fine"}\n\n{"text": broken\n')
  settings = data.DataSettings.of({'path': str(bad)})
  with pytest.raises(ConfigError, match=r'bad.jsonl:3 is not JSON'):
    list(corpus.open_corpus(settings, 'jsonl')[0].documents())
  bad.write_text('{"text": "fine"}\n{"body": "no text key"}\n')
  with pytest.raises(ConfigError, match=r"bad.jsonl:2 has no text under data.text_key='text' "
                                        r"\(its keys: \['body'\]\)"):
    list(corpus.open_corpus(settings, 'jsonl')[0].documents())
  with pytest.raises(ConfigError, match="data.path='.*missing.*' matches no file"):
    corpus.open_corpus(data.DataSettings.of({'path': str(tmp_path / 'missing*.jsonl')}), 'jsonl')


def test_token_files_are_keyed_by_corpus_and_tokenizer(tmp_path):
  path = tmp_path / 'c.jsonl'
  write_jsonl(path, documents())
  root = tmp_path / 'tokens'
  first = make(name='jsonl', path=str(path), token_dir=str(root), tokenizer='bpe',
               vocab_size=300)
  folders = set(os.listdir(root))
  again = make(name='jsonl', path=str(path), token_dir=str(root), tokenizer='bpe',
               vocab_size=300)
  assert set(os.listdir(root)) == folders  # read back, not redone
  np.testing.assert_array_equal(first.train_batch(3)['inputs'], again.train_batch(3)['inputs'])
  make(name='jsonl', path=str(path), token_dir=str(root), tokenizer='bpe', vocab_size=270)
  assert len(set(os.listdir(root)) - folders) == 3  # another BPE: its tokens are new
  write_jsonl(path, documents()[::-1])
  os.utime(path, ns=(1, 1))
  changed = make(name='jsonl', path=str(path), token_dir=str(root), tokenizer='bpe',
                 vocab_size=300)
  assert not np.array_equal(changed.task.train_ids, first.task.train_ids)


def test_token_files_hold_each_document_then_eos(tmp_path):
  texts = documents()
  tokenizer = tokenizer_lib.train_bpe(texts, 300)
  source = corpus.Corpus('test', 'train', lambda: iter(texts), {'v': 1})
  tokens = token_files.tokenized(source, tokenizer, tmp_path, separator=tokenizer.eos_id)
  assert tokens.tokens.dtype == np.uint16 and tokens.num_documents == len(texts)
  for i in (0, 7, len(texts) - 1):
    ids = tokens.tokens[tokens.starts[i]:tokens.starts[i + 1]].tolist()
    assert ids == tokenizer.encode(texts[i]) + [tokenizer.eos_id]


def test_an_interrupted_tokenization_is_redone(tmp_path):
  tokenizer = tokenizer_lib.train_bpe(documents(), 300)

  def failing():
    yield from documents()[:50]
    raise KeyboardInterrupt

  with pytest.raises(KeyboardInterrupt):
    token_files.tokenized(corpus.Corpus('c', 'train', failing, {'v': 2}), tokenizer, tmp_path,
                          tokenizer.eos_id)
  assert os.listdir(tmp_path) == []  # nothing half-written is left to be read
  whole = token_files.tokenized(corpus.Corpus('c', 'train', lambda: iter(documents()), {'v': 2}),
                                tokenizer, tmp_path, tokenizer.eos_id)
  assert whole.num_documents == len(documents())


def test_a_large_vocabulary_is_stored_as_uint32(tmp_path):
  class Wide:
    size, fingerprint = 70_000, 'wide'

    def encode(self, text):
      return [69_999] * len(text)

  tokens = token_files.tokenized(corpus.Corpus('w', 'train', lambda: iter(['abc']), {}), Wide(),
                                 tmp_path, separator=None)
  assert tokens.tokens.dtype == np.uint32 and tokens.tokens.tolist() == [69_999] * 3


def test_an_empty_corpus_fails_clearly(tmp_path):
  path = write_jsonl(tmp_path / 'empty.jsonl', [''] * 20)
  with pytest.raises(ConfigError, match='The train split of jsonl holds no text'):
    make(name='jsonl', path=path, token_dir=str(tmp_path))


def test_pack_keeps_whole_documents_in_rows():
  sizes = np.random.default_rng(0).integers(1, 50, size=300)
  starts = np.concatenate([[0], np.cumsum(sizes)])
  packed = packing.pack(starts, 32)
  stream = np.arange(starts[-1])
  rows = packing.packed_rows(packed, stream, range(packed.num_rows), 32, start_id=-1)
  pieces = []
  for r in range(packed.num_rows):
    for segment in range(1, rows['segment_ids'][r].max() + 1):
      at = rows['segment_ids'][r] == segment
      np.testing.assert_array_equal(rows['positions'][r][at], np.arange(at.sum()))
      pieces.append(rows['tokens'][r][at])
    assert (rows['segment_ids'][r] > 0).sum() == sum(map(len, pieces[-segment:]))
  np.testing.assert_array_equal(np.concatenate(pieces), stream)  # all, in order, once
  # A document of at most 32 tokens is one piece; a longer one is cut into pieces of 32.
  expected = [min(32, s - k) for s in sizes for k in range(0, s, 32)]
  assert [len(p) for p in pieces] == expected
  # The next row's first piece would not have fitted.
  filled = (rows['segment_ids'] > 0).sum(axis=1)
  assert all(filled[r] + len(rows['tokens'][r + 1][rows['segment_ids'][r + 1] == 1]) > 32
             for r in range(packed.num_rows - 1))


@pytest.mark.parametrize('task', ['next_token', 'masked'])
def test_packed_batches_hold_documents_with_restarted_positions(tmp_path, task):
  texts = documents()
  path = write_jsonl(tmp_path / 'c.jsonl', texts)
  made = make(task, name='jsonl', path=path, tokenizer='bpe', vocab_size=300, packing=True)
  bpe = made.vocab
  encoded = {tuple(bpe.encode(t) + [bpe.eos_id]) for t in texts}
  batch = made.train_batch(4)
  for row in range(4):
    for segment in range(1, batch['segment_ids'][row].max() + 1):
      at = batch['segment_ids'][row] == segment
      targets = batch['targets'][row][at]
      assert any(targets.tolist() == list(doc[k:k + 32]) for doc in encoded
                 for k in range(0, len(doc), 32))
      if task == 'next_token':
        assert batch['inputs'][row][at][1:].tolist() == targets[:-1].tolist()
        assert (batch['weights'][row][at] == 1).all()
  assert (batch['weights'][batch['segment_ids'] == 0] == 0).all()  # padding carries no loss


@pytest.mark.parametrize('task', ['next_token', 'masked'])
def test_packed_process_shares_concatenate_to_the_one_process_batch(tmp_path, task):
  path = write_jsonl(tmp_path / 'c.jsonl', documents())
  options = dict(name='jsonl', path=path, tokenizer='bpe', vocab_size=300, packing=True)
  whole = make(task, **options).train_batch(7)
  shares = [make(task, p, 2, **options).train_batch(7) for p in range(2)]
  for key in whole:
    np.testing.assert_array_equal(np.concatenate([s[key] for s in shares]), whole[key], key)
  assert not np.array_equal(make(task, **options).train_batch(8)['targets'], whole['targets'])


def test_token_bytes_add_up_to_the_bytes_of_the_text(tmp_path):
  texts = documents()
  path = write_jsonl(tmp_path / 'c.jsonl', texts)
  for tokenizer in ('bpe', 'chars'):
    made = make(name='jsonl', path=path, tokenizer=tokenizer, vocab_size=300)
    held_out = texts[9::10]
    assert made.token_bytes[made.task.eval_ids].sum() == sum(len(t.encode()) for t in held_out)


def test_a_file_that_is_not_utf8_is_named_with_the_offset_of_its_first_bad_byte(tmp_path):
  latin1 = 'naïve text\ncafé au lait\n'.encode('latin-1')  # ï is 0xef at byte 2 here
  path = tmp_path / 'latin1.txt'
  path.write_bytes(latin1)
  expected = (rf'^{path} is not UTF-8 from byte 2 on \(0xef: invalid continuation byte\)\. '
              rf'Convert .*iconv -f LATIN1 -t UTF-8 {path} > {path}.utf8')
  with pytest.raises(ConfigError, match=expected):
    make(name='text_file', path=str(path))
  records = [json.dumps({'text': 'plain'}).encode(), '{"text": "déjà"}'.encode('latin-1')]
  jsonl = tmp_path / 'latin1.jsonl'
  jsonl.write_bytes(b'\n'.join(records) + b'\n')
  first_bad = len(records[0]) + 1 + records[1].index(b'\xe9')  # byte offset in the file
  with pytest.raises(ConfigError, match=rf'^{jsonl} is not UTF-8 from byte {first_bad} on '
                                        r'\(0xe9: invalid continuation byte\)'):
    list(corpus.open_corpus(data.DataSettings.of({'path': str(jsonl)}), 'jsonl')[0].documents())


def test_bits_per_byte_of_an_ascii_character_run_is_the_loss_over_ln_2(tmp_path):
  config = train_helpers.small_config('decoder', steps=2)
  config.data.update(name='text_file', path=write_text(tmp_path, 'abcd efgh. ' * 300),
                     eval_steps=-1)
  config.model.vocab_size = 16
  workdir = str(tmp_path / 'run')
  train.train(config, workdir)
  result = train.evaluate(config, workdir)
  assert result['eval_bits_per_byte'] == pytest.approx(result['eval_loss'] / math.log(2), 1e-6)
  saved = tokenizer_lib.saved(tmp_path / 'run' / 'tokenizer')
  assert saved.tokens == tuple(sorted(set('abcd efgh.')))


def test_bits_per_byte_of_bpe_on_non_ascii_text_counts_the_utf8_bytes_it_scored(tmp_path):
  """Tokens of several bytes, characters of two and three, and EOS between documents (scored,
  of no bytes): the summed loss in bits over the bytes of the decoded targets."""
  config = train_helpers.small_config('decoder', steps=2, **{'mesh.shape': (1,)})
  config.data.update(name='jsonl', path=write_jsonl(tmp_path / 'c.jsonl', documents()),
                     tokenizer='bpe', vocab_size=300, eval_batch_size=1, eval_steps=-1)
  config.model.vocab_size = 300
  workdir = str(tmp_path / 'run')
  train.train(config, workdir)
  result = train.evaluate(config, workdir)
  run = train.build_run(config, workdir)
  scored = np.concatenate([batch['targets'][batch.get('weights', 1) > 0].ravel()
                           for batch in run.data.eval_batches()])
  vocab = run.data.vocab
  special = {vocab.pad_id, vocab.bos_id, vocab.eos_id, vocab.mask_id}
  texts = [vocab.decode(list(piece))  # each run of ordinary tokens, a document or part of one
           for is_special, piece in itertools.groupby(scored, lambda i: i in special)
           if not is_special]
  assert len(texts) >= 3 and '\ufffd' not in ''.join(texts)  # no character cut in two
  utf8_bytes = sum(len(text.encode('utf-8')) for text in texts)
  assert utf8_bytes > 1.5 * len(scored) and utf8_bytes > len(''.join(texts))
  assert result['eval_bits_per_byte'] == pytest.approx(
      result['eval_loss'] * len(scored) / math.log(2) / utf8_bytes, rel=1e-6)


def write_text(tmp_path, text):
  (tmp_path / 'text.txt').write_text(text)
  return str(tmp_path / 'text.txt')


def test_tfds_text_dataset_by_name(tmp_path):
  with mock_tfds(40):
    made = make(name='lm1b', tokenizer='bpe', vocab_size=280, packing=True, seq_len=16)
    assert made.info['num_train_rows'] > 0
    with pytest.raises(ConfigError, match="data.text_key='body': lm1b has no Text feature"):
      make(name='lm1b', text_key='body')


def test_masked_lm_needs_a_mask_token(tmp_path):
  model = tokenizers.Tokenizer(tokenizers.models.BPE())
  model.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
  model.train_from_iterator(documents(), tokenizers.trainers.BpeTrainer(
      vocab_size=280, special_tokens=['</s>'], show_progress=False,
      initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet()))
  model.save(str(tmp_path / 'tokenizer.json'))
  path = write_jsonl(tmp_path / 'c.jsonl', documents())
  with pytest.raises(ConfigError, match='needs a MASK token'):
    make('masked', name='jsonl', path=path, tokenizer=str(tmp_path / 'tokenizer.json'))
  made = make(name='jsonl', path=path, tokenizer=str(tmp_path / 'tokenizer.json'))
  assert made.vocab.eos_id == model.token_to_id('</s>')


def _loss_sum(model, family, params, batch):
  out = losses.logits_targets_weights(model, family, params, batch)
  return float(losses.loss_sums(*out)['loss'])


@pytest.mark.parametrize('family, style', [
    pytest.param('decoder', 'gpt2', marks=pytest.mark.slow), ('decoder', 'llama'),
    ('encoder', 'bert')])
def test_the_loss_of_a_packed_batch_is_the_sum_of_its_documents_losses(tmp_path, rng, family,
                                                                        style):
  """A batch the pipeline packed, against each of its segments scored alone, unpacked."""
  path = write_jsonl(tmp_path / 'c.jsonl', documents())
  task = registry.get(family).task
  made = make(task, name='jsonl', path=path, tokenizer='bpe', vocab_size=300, packing=True)
  # Weights large enough that attending across documents changes the loss measurably.
  cfg = helpers.tiny(family, vocab_size=300, max_len=32, init_std=0.3, **styles.STYLES[style])
  model, params = models.build(cfg), helpers.init(cfg, rng)
  batch = made.train_batch(2)
  # Each document alone in a row of its own, from position 0, the rest of the row masked out
  # ('valid') and weighted 0: one program scores them all, each unpacked.
  alone = {key: [] for key in ('inputs', 'targets', 'weights', 'valid')}
  for row in range(len(batch['inputs'])):
    for segment in range(1, batch['segment_ids'][row].max() + 1):
      at = batch['segment_ids'][row] == segment
      for key in ('inputs', 'targets', 'weights'):
        alone[key].append(np.zeros_like(batch[key][row]))
        alone[key][-1][:at.sum()] = batch[key][row][at]
      alone['valid'].append(np.arange(len(at)) < at.sum())
  alone = {key: np.stack(rows) for key, rows in alone.items()}
  if family == 'decoder':  # causal: the rest of a row cannot reach its document
    del alone['valid']
  alone = _loss_sum(model, registry.get(family), params, alone)
  packed = _loss_sum(model, registry.get(family), params, batch)
  assert packed == pytest.approx(alone, rel=1e-5)
  unsegmented = {k: v for k, v in batch.items() if k not in ('segment_ids', 'positions')}
  assert _loss_sum(model, registry.get(family), params, unsegmented) != pytest.approx(alone,
                                                                                      rel=1e-4)


def _mock_launch(tmp_path, *flags):
  result = subprocess.run(
      [sys.executable, str(ROOT / 'tests' / 'mock_launch.py'), f'--workdir={tmp_path / "run"}',
       *flags, f'--config.data.token_dir={tmp_path / "tokens"}'],
      capture_output=True, text=True, timeout=600, env={'JAX_PLATFORMS': 'cpu', 'PATH': ''})
  assert result.returncode == 0, result.stderr[-3000:]
  return result.stderr + result.stdout


def _files(directory):
  return sorted((str(p), p.stat().st_mtime_ns) for p in directory.rglob('*'))


@pytest.mark.slow
def test_launch_trains_on_a_tfds_text_dataset_and_samples_with_its_saved_tokenizer(tmp_path):
  """GPT-2 small's config on (mock) lm1b with a trained BPE, packed, shrunk to seconds."""
  _mock_launch(tmp_path, f'--config={ROOT / "configs" / "gpt2_small.py"}:smoke,corpus=lm1b',
               '--config.model.width=32', '--config.model.num_heads=2',
               '--config.model.max_len=32', '--config.model.vocab_size=300',
               '--config.model.dtype=float32', '--config.data.seq_len=32')
  rows = [json.loads(line)
          for line in (tmp_path / 'run' / 'metrics.jsonl').read_text().splitlines()]
  final = [row for row in rows if 'eval_bits_per_byte' in row][-1]
  assert final['step'] == 3 and final['eval_bits_per_byte'] > 0
  assert tokenizer_lib.saved(tmp_path / 'run' / 'tokenizer').size <= 300
  before = _files(tmp_path / 'run')
  shutil.rmtree(next((tmp_path / 'tokens').glob('bpe-*')))  # only the run's copy is left
  out = _mock_launch(tmp_path, f'--config={ROOT / "configs" / "gpt2_small.py"}',
                     '--mode=sample', '--config.sample.prompt=ab',
                     '--config.sample.max_new_tokens=6')
  assert "Tokenizer: the run's own" in out
  assert '--- sample 0 (step 3) ---\nab' in out and '[' not in out.split('--- sample 0')[1]
  out = _mock_launch(tmp_path, f'--config={ROOT / "configs" / "gpt2_small.py"}',
                     '--mode=sample', '--config.sample.prompt=ab', '--config.sample.beam_size=3',
                     '--config.sample.num_samples=2', '--config.sample.max_new_tokens=6')
  assert '--- sample 1 (step 3) ---\nab' in out and '--- sample 2' not in out
  out = _mock_launch(tmp_path, f'--config={ROOT / "configs" / "gpt2_small.py"}', '--mode=eval')
  assert 'eval_bits_per_byte' in out
  assert _files(tmp_path / 'run') == before  # eval and sample write nothing


def test_data_vocab_size_alone_sizes_the_bpe_and_the_model(tmp_path):
  """A config whose characters state the vocabulary (data.vocab_size=65) trains a BPE of 512 ids
  with the model's table following it, saying the size once."""
  path = tmp_path / 'input.txt'
  path.write_text(' '.join(documents()) * 4)
  config = config_lib.from_file(ROOT / 'configs' / 'gpt_shakespeare.py', 'smoke')
  config.data.update(name='text_file', path=str(path), tokenizer='bpe', vocab_size=512,
                     seq_len=32, token_dir=str(tmp_path / 'tokens'))
  config.model.update(width=32, num_heads=2, max_len=32)
  run = train.build_run(config)
  assert run.model_config.vocab_size == 512 >= run.data.vocab.size
  config.model.vocab_size = 256  # a model's table given smaller than the data's is refused
  with pytest.raises(ConfigError, match='data settings has 512 token ids but '
                                        'model.vocab_size=256'):
    train.resolve(config)


def test_a_vocabulary_larger_than_the_model_table_and_short_held_out_rows_fail_clearly(tmp_path):
  path = write_jsonl(tmp_path / 'c.jsonl', documents())
  made = make(name='jsonl', path=path, tokenizer='bpe', vocab_size=300)
  decoder = registry.get('decoder')
  with pytest.raises(ConfigError, match=f'The data has {made.vocab.size} token ids but '
                                        'model.vocab_size=256: leave model.vocab_size unset'):
    decoder.follow_data(helpers.tiny('decoder', vocab_size=256), made.info, 'The data')
  # Unset, the model's vocabulary is the data's.
  cfg = decoder.follow_data(helpers.tiny('decoder', vocab_size=0), made.info, 'The data')
  assert cfg.vocab_size == made.vocab.size
  with pytest.raises(ConfigError, match='The held-out split has .* examples, fewer than one eval '
                                        'batch of data.eval_batch_size=4096: lower it'):
    make(name='jsonl', path=path, tokenizer='bpe', vocab_size=300, packing=True,
         eval_batch_size=4096)


def test_a_tfds_config_name_makes_one_token_folder(tmp_path):
  """A builder config's name (wiki40b/en) holds a slash, which must not nest the folder."""
  tokens = token_files.tokenized(corpus.Corpus('wiki40b/en', 'train', lambda: iter(['ab']), {}),
                                 data.Vocab.of_text('ab'), tmp_path, separator=None)
  assert tokens.tokens.tolist() == [0, 1] and len(os.listdir(tmp_path)) == 1


def test_label_smoothing_reaches_the_text_families():
  """Vaswani et al.'s 0.1 for translation: the step of a text family smooths its targets."""
  config = train_helpers.small_config('encoder_decoder')
  config.training.label_smoothing = 0.1
  settings = StepSettings.of(train.resolve(config))
  assert settings.label_smoothing == 0.1
  logits = np.random.default_rng(0).normal(size=(2, 3, 5)).astype(np.float32)
  targets, weights = np.array([[0, 1, 2], [3, 4, 0]]), np.array([[1, 1, 1], [1, 1, 0]], np.float32)
  log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  soft = 0.9 * np.eye(5)[targets] + 0.1 / 5
  expected = -((soft * log_probs).sum(-1) * weights).sum()
  got = losses.loss_sums(logits, targets, weights, label_smoothing=settings.label_smoothing)
  assert float(got['loss']) == pytest.approx(expected, rel=1e-5)


def test_a_packing_built_chunk_by_chunk_on_disk_equals_the_one_in_memory(tmp_path):
  sizes = np.random.default_rng(1).integers(0, 80, size=5000)  # empty documents too
  starts = np.concatenate([[0], np.cumsum(sizes)])
  whole = packing.pack(starts, 32)
  for chunk in (1, 7, 4096):
    on_disk = packing.cached(tmp_path / f'chunks-{chunk}', starts, 32, chunk=chunk)
    assert isinstance(on_disk.row_starts, np.memmap)
    for field in ('piece_starts', 'piece_lengths', 'piece_first', 'row_starts'):
      np.testing.assert_array_equal(getattr(on_disk, field), getattr(whole, field), field)
  again = packing.cached(tmp_path / 'chunks-7', starts[:10], 32)  # read back, not rebuilt
  assert again.num_rows == whole.num_rows


def test_pairs_packed_chunk_by_chunk_equal_the_whole(tmp_path):
  """A translation's two streams, a pair with an empty source left out, rows of either kind."""
  noise = np.random.default_rng(2)
  sources, targets = (np.concatenate([[0], np.cumsum(noise.integers(low, 50, size=999))])
                      for low in (0, 1))
  for packed in (True, False):
    whole = packing.cached_pairs(tmp_path / f'whole-{packed}', sources, targets, 32, packed)
    chunked = packing.cached_pairs(tmp_path / f'chunked-{packed}', sources, targets, 32, packed,
                                   chunk=5)
    np.testing.assert_array_equal(chunked[2], whole[2])
    np.testing.assert_array_equal(whole[2], np.flatnonzero(np.diff(sources) > 0))
    for got, expected in zip(chunked[:2], whole[:2]):
      for field in ('piece_starts', 'piece_lengths', 'row_starts'):
        np.testing.assert_array_equal(getattr(got, field), getattr(expected, field), field)
    rows = np.diff(whole[0].row_starts)
    if packed:
      fill = np.add.reduceat(np.asarray(whole[0].piece_lengths), whole[0].row_starts[:-1])
      assert rows.max() > 1 and fill.max() <= 32
    else:
      assert (rows == 1).all()
