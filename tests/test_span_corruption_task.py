"""The span-corruption data task: a text source's windows corrupted into the encoder-decoder's
batches, sentinels at the top of the vocabulary, batches a pure function of (seed, step), a
tiny T5 trained on it, and its refused settings."""
import json

import jax
import numpy as np
import pytest
import tokenizers

import helpers
import train_helpers
from transformer_jax import data, models, run, train
from transformer_jax.data import rng, span_corruption, span_corruption_task
from transformer_jax.data import tokenizer as tokenizer_lib
from transformer_jax.errors import ConfigError
from transformer_jax.models import styles
from transformer_jax.train import losses

WORDS = 'the quick brown fox jumps over a lazy dog and runs far away into the dark woods'.split()


@pytest.fixture(scope='module')
def text_file(tmp_path_factory):
  generator = np.random.default_rng(0)
  path = tmp_path_factory.mktemp('text') / 'corpus.txt'
  path.write_text(' '.join(generator.choice(WORDS, 5000)))
  return str(path)


@pytest.fixture(scope='module')
def jsonl_file(tmp_path_factory):
  """300 documents of 1 to 60 words: most shorter than a window, some cut into two."""
  generator = np.random.default_rng(1)
  texts = [' '.join(generator.choice(WORDS, generator.integers(1, 60))) for _ in range(300)]
  path = tmp_path_factory.mktemp('jsonl') / 'corpus.jsonl'
  path.write_text(''.join(json.dumps({'text': text}) + '\n' for text in texts))
  return str(path)


def make(text_file, seed=1, process_index=0, process_count=1, family_task='seq2seq', **options):
  name = 'jsonl' if text_file.endswith('.jsonl') else 'text_file'
  settings = {'name': name, 'path': text_file, 'tokenizer': 'bpe', 'vocab_size': 400,
              'num_sentinels': 20, 'seq_len': 32, 'batch_size': 8, 'task': 'span_corruption',
              **options}
  return data.make_data(settings, family_task, seed=seed, process_index=process_index,
                        process_count=process_count)


def merge(inputs, targets, first_sentinel, eos):
  """The window back from one row's valid inputs and targets: each sentinel of the inputs
  replaced by the tokens that follow it in the targets."""
  assert inputs[-1] == eos and targets[-1] == eos
  spans, current = {}, None
  for token in targets[:-1].tolist():
    if token >= first_sentinel:
      current = spans.setdefault(token, [])
    else:
      current.append(token)
  merged = []
  for token in inputs[:-1].tolist():
    merged.extend(spans.pop(token) if token >= first_sentinel else [token])
  assert not spans
  return merged


def rows_of(batch):
  """Each row's valid inputs and targets."""
  for row in range(len(batch['inputs'])):
    yield (batch['inputs'][row][batch['input_valid'][row]],
           batch['targets'][row][batch['weights'][row] > 0])


def test_a_batch_merges_back_into_its_windows_of_the_text(text_file):
  dataset = make(text_file)
  task, vocab = dataset.task, dataset.vocab
  assert (task.raw_length, task.targets_length) == span_corruption.raw_length(32) == (34, 8)
  first_sentinel = vocab.size - 20
  text = open(text_file).read()
  step, batch = 3, dataset.train_batch(3)
  windows = rng.shuffled(1, step, 8, slice(None), task.num_train_windows)
  for (inputs, targets), window in zip(rows_of(batch), windows):
    raw = task.window(task.train_ids, window)
    assert merge(inputs, targets, first_sentinel, vocab.eos_id) == raw.tolist()
    assert vocab.decode(raw) in text
    assert targets[0] == vocab.size - 1  # <extra_id_0>, the top id
    noise, spans = span_corruption.noise_span_counts(task.raw_length, 0.15, 3.0)
    assert (len(inputs), len(targets)) == (task.raw_length - noise + spans + 1, noise + spans + 1)
  np.testing.assert_array_equal(batch['decoder_inputs'][:, 0], vocab.bos_id)
  np.testing.assert_array_equal(batch['decoder_inputs'][:, 1:], batch['targets'][:, :-1])
  held_out = task.eval_examples(np.arange(4))
  for row, (inputs, targets) in enumerate(rows_of(held_out)):
    raw = task.window(task.eval_ids, row).tolist()
    assert merge(inputs, targets, first_sentinel, vocab.eos_id) == raw


def segments_of(batch, row):
  """Each segment's (inputs, targets, decoder_inputs) in a packed row, and both sides'
  positions."""
  for segment in range(1, batch['input_segment_ids'][row].max() + 1):
    source = batch['input_segment_ids'][row] == segment
    target = batch['target_segment_ids'][row] == segment
    yield (batch['inputs'][row][source], batch['targets'][row][target],
           batch['decoder_inputs'][row][target],
           (batch['input_positions'][row][source], batch['target_positions'][row][target]))


def test_packed_rows_hold_windows_of_single_documents_corrupted_as_matching_segments(
    jsonl_file):
  dataset = make(jsonl_file, packing=True)
  task, vocab = dataset.task, dataset.vocab
  texts = [json.loads(line)['text'] for line in open(jsonl_file)]
  batch = dataset.train_batch(3)
  assert 'input_valid' not in batch and batch['inputs'].shape == (8, 32)
  assert batch['targets'].shape == (8, task.targets_length)
  assert batch['input_segment_ids'].max() > 1  # short documents share rows
  rows = rng.shuffled(1, 3, 8, slice(None), task.num_train_windows)
  windows = task.train_windows
  for r, row in enumerate(rows):
    pieces = range(windows.row_starts[row], windows.row_starts[row + 1])
    segments = list(segments_of(batch, r))
    assert len(segments) == len(pieces)
    for (inputs, targets, previous, positions), piece in zip(segments, pieces):
      start = int(windows.piece_starts[piece])
      raw = task.train_ids[start:start + int(windows.piece_lengths[piece])].tolist()
      assert 2 <= len(raw) <= task.raw_length
      assert merge(inputs, targets, vocab.size - 20, vocab.eos_id) == raw
      assert any(vocab.decode(raw) in text for text in texts)  # within one document
      assert (len(inputs), len(targets)) == span_corruption.corrupted_lengths(len(raw), 0.15, 3)
      assert previous.tolist() == [vocab.bos_id, *targets[:-1].tolist()]
      for side in positions:
        np.testing.assert_array_equal(side, np.arange(len(side)))
  # Padding (segment 0) carries no weight.
  np.testing.assert_array_equal(batch['weights'], batch['target_segment_ids'] > 0)


def _pair_losses(model, family, params, batch, segment_ids) -> np.ndarray:
  """The summed cross-entropy of each (row, segment) of the batch's targets, in order."""
  def token_losses(params, batch):
    logits, targets, weights = losses.logits_targets_weights(model, family, params, batch)
    return losses.cross_entropy(logits, targets) * weights
  token = np.asarray(jax.jit(token_losses)(params, batch))
  return np.array([token[row][segment_ids[row] == segment].sum() for row in range(len(token))
                   for segment in range(1, segment_ids[row].max() + 1)])


def test_packing_leaves_each_pairs_loss_unchanged_with_relative_position_biases(
    jsonl_file, rng):
  """Each packed pair's loss against the same pair alone in a row of its own, by a tiny T5
  whose relative biases (buckets of distance up to 20) see every distance a row holds."""
  dataset = make(jsonl_file, packing=True)
  batch = dataset.train_batch(1)
  cfg = helpers.tiny('encoder_decoder', **styles.STYLES['t5'], vocab_size=400, max_len=32,
                     relative_buckets=16, relative_max_distance=20, dtype='float32')
  model, family = models.build(cfg), models.family_of(cfg)
  params = helpers.init(cfg, rng)
  alone = {key: [] for key in ('inputs', 'targets', 'decoder_inputs', 'input_valid')}
  for row in range(len(batch['inputs'])):
    for inputs, targets, previous, _ in segments_of(batch, row):
      for key, tokens, like in (('inputs', inputs, 'inputs'), ('targets', targets, 'targets'),
                                ('decoder_inputs', previous, 'targets')):
        alone[key].append(np.zeros_like(batch[like][row]))
        alone[key][-1][:len(tokens)] = tokens
      alone['input_valid'].append(np.arange(batch['inputs'].shape[1]) < len(inputs))
  alone = {key: np.stack(rows) for key, rows in alone.items()}
  alone['weights'] = (alone['decoder_inputs'] != 0).astype(np.float32)  # BOS is 1, pad 0
  expected = _pair_losses(model, family, params, alone, alone['weights'].astype(np.int32))
  packed = _pair_losses(model, family, params, batch, batch['target_segment_ids'])
  assert len(expected) == batch['input_segment_ids'].max(axis=1).sum() > len(batch['inputs'])
  np.testing.assert_allclose(packed, expected, rtol=1e-5)
  # Read as one pair per row (no segments), the pairs attend across each other: the test can
  # fail.
  crossing = {key: value for key, value in batch.items() if 'segment_ids' not in key
              and 'positions' not in key}
  crossing['input_valid'] = batch['input_segment_ids'] > 0
  unsegmented = _pair_losses(model, family, params, crossing, batch['target_segment_ids'])
  assert np.abs(unsegmented - expected).max() > 1e-3 * np.abs(expected).max()


def test_trained_bpe_reserves_the_top_ids_for_sentinels():
  bpe = tokenizer_lib.train_bpe([' '.join(WORDS)] * 10, 300, sentinels=5)
  assert bpe.size == 300 and tokenizer_lib.sentinel_count(bpe) == 5
  assert [bpe._tokenizer.id_to_token(i) for i in (299, 295)] == ['<extra_id_0>', '<extra_id_4>']
  text = ' '.join(WORDS)
  assert max(bpe.encode(text)) < 295 and bpe.decode(bpe.encode(text)) == text
  assert tokenizer_lib.sentinel_count(tokenizer_lib.train_bpe([text], 300)) == 0


@pytest.mark.parametrize('packing', [False, True])
def test_a_fixed_seed_gives_the_same_batches_on_a_rerun_at_a_resumed_step_and_in_shares(
    text_file, jsonl_file, packing):
  source = jsonl_file if packing else text_file
  first, again, other = (make(source, packing=packing, seed=seed) for seed in (1, 1, 2))
  for key, value in first.train_batch(7).items():
    np.testing.assert_array_equal(value, again.train_batch(7)[key])
  resumed = next(again.train_iterator(start_step=7))
  np.testing.assert_array_equal(resumed['targets'], first.train_batch(7)['targets'])
  assert not np.array_equal(other.train_batch(7)['inputs'], first.train_batch(7)['inputs'])
  # Each example is keyed by its index in the run: two processes' shares make the same batch.
  shares = [make(source, packing=packing, process_index=p, process_count=2).train_batch(7)
            for p in (0, 1)]
  np.testing.assert_array_equal(np.concatenate([s['inputs'] for s in shares]),
                                first.train_batch(7)['inputs'])
  np.testing.assert_array_equal(first.task.eval_examples(np.arange(4))['targets'],
                                other.task.eval_examples(np.arange(4))['targets'])


def t5_tokenizer_json(path, sentinels: int) -> str:
  """A tokenizer.json laid out as T5's: <pad> 0, </s> 1, <unk> 2, the words, then the
  sentinels <extra_id_N> .. <extra_id_0> at the top ids; no BOS."""
  vocab = {token: i for i, token in enumerate(['<pad>', '</s>', '<unk>', *sorted(set(WORDS))])}
  model = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token='<unk>'))
  model.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
  model.add_special_tokens(['<pad>', '</s>', '<unk>'])
  model.add_special_tokens([tokenizer_lib.sentinel(i) for i in reversed(range(sentinels))])
  model.save(str(path))
  return str(path)


def test_a_tokenizer_json_brings_its_sentinels_and_the_decoder_starts_with_pad(
    text_file, tmp_path):
  path = t5_tokenizer_json(tmp_path / 'tokenizer.json', sentinels=8)
  dataset = make(text_file, tokenizer=path, vocab_size=None)
  vocab = dataset.vocab
  assert (vocab.pad_id, vocab.eos_id, vocab.bos_id) == (0, 1, None)
  batch = dataset.train_batch(0)
  np.testing.assert_array_equal(batch['decoder_inputs'][:, 0], 0)
  for inputs, targets in rows_of(batch):
    assert targets[0] == vocab.size - 1 and merge(inputs, targets, vocab.size - 8, 1)


@pytest.mark.parametrize('options,message', [
    ({'tokenizer': 'chars', 'vocab_size': None}, 'has 0'),
    ({'num_sentinels': 1}, 'num_sentinels=2 or more'),
    ({'span_targets_length': 5}, 'span_targets_length=5 is shorter than the 8'),
    ({'seq_len': 2000, 'num_sentinels': 120}, 'held-out text has .* fewer than one window'),
])
def test_settings_the_task_cannot_serve_fail_in_one_line(text_file, options, message):
  with pytest.raises(ConfigError, match=message) as error:
    make(text_file, **options)
  assert '\n' not in str(error.value)


def test_a_tokenizer_without_room_for_the_sentinels_fails_naming_the_fix(text_file, tmp_path):
  path = t5_tokenizer_json(tmp_path / 'tokenizer.json', sentinels=1)
  with pytest.raises(ConfigError, match=r"needs 2 sentinels.*has 1: use data.tokenizer='bpe'"):
    make(text_file, tokenizer=path, vocab_size=None)


@pytest.mark.parametrize('options,message', [
    ({'noise_density': 0.0}, 'data.noise_density'), ({'noise_density': 1.0}, 'data.noise_density'),
    ({'mean_noise_span_length': 0.5}, 'data.mean_noise_span_length'),
])
def test_bad_corruption_settings_fail_when_the_config_resolves(options, message):
  config = t5_config('unused.txt', steps=1)
  config.data.update(options)
  with pytest.raises(ConfigError, match=message) as error:
    train.resolve(config, 'cpu')
  assert '\n' not in str(error.value)


def test_a_task_chosen_for_the_wrong_family_is_refused(text_file):
  with pytest.raises(ConfigError, match=r"makes 'seq2seq' batches.*trains on 'next_token'"):
    make(text_file, family_task='next_token')
  with pytest.raises(ConfigError, match='Unknown data.task'):
    make(text_file, task='spans')
  assert data.pipeline.chosen_task('seq2seq', None) == 'seq2seq'
  assert span_corruption_task.SpanCorruptionSettings.PART in data.settings.parts()


def t5_config(path, steps):
  """configs/t5_small.py shrunk: 2 + 2 blocks of width 32, its vocabulary the data's BPE, its
  Adafactor at T5's rate of 0.01 from the first step."""
  config = helpers.load_config(helpers.ROOT / 'configs' / 't5_small.py')
  config.model.update(width=32, num_layers=2, num_decoder_layers=2, num_heads=4, d_ff=64,
                      vocab_size=0, max_len=32, dropout_rate=0.0)
  config.data.update(name='text_file', path=path, task='span_corruption', tokenizer='bpe',
                     vocab_size=400, num_sentinels=20, seq_len=32, batch_size=8,
                     eval_batch_size=8, eval_steps=1)
  config.optimizer.update(learning_rate=0.01, warmup_steps=1)
  config.training.update(steps=steps, log_every=1, eval_every=steps, checkpoint_every=1000)
  return config


def test_a_t5_run_reads_span_corruption_and_follows_its_vocabulary(text_file):
  built = train.build_run(t5_config(text_file, steps=1))
  assert isinstance(built.data.task, span_corruption_task.SpanCorruptionTask)
  # The corpus has fewer merges than data.vocab_size=400 asks: the sentinels are its top ids,
  # and the model keeps the 400 the data stated.
  assert built.settings.model.vocab_size == 400 > built.data.vocab.size
  assert tokenizer_lib.sentinel_count(built.data.vocab) == 20


@pytest.mark.slow
def test_a_tiny_t5_trains_on_span_corruption_of_a_text_file(text_file, tmp_path):
  run.run(t5_config(text_file, steps=4), str(tmp_path), 'train')
  losses = train_helpers.losses(tmp_path)
  assert sorted(losses) == [1, 2, 3, 4] and all(np.isfinite(list(losses.values())))
  saved = json.loads((tmp_path / 'tokenizer' / 'tokenizer.json').read_text())
  assert any(token['content'] == '<extra_id_0>' for token in saved['added_tokens'])
