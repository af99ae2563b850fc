"""Classification as text: a TFDS dataset's texts and labels (tfds.testing.mock_data's random
records of the real builders' features) as prefixed inputs and label-word targets, scored by
exact match, and a tiny T5 fine-tuned on it from a span-corruption run's checkpoint."""
import numpy as np
import tokenizers
import pytest

import helpers
import train_helpers
from test_span_corruption_task import t5_config
from transformer_jax import data, run
from transformer_jax.data import sources
from transformer_jax.errors import ConfigError
from transformer_jax.train import metrics

NUM_EXAMPLES = 24


def make(name='imdb_reviews', **options):
  settings = {'name': name, 'task': 'text_classification_as_text', 'tokenizer': 'bpe',
              'vocab_size': 300, 'seq_len': 24, 'batch_size': 4, **options}
  return data.make_data(settings, 'seq2seq', seed=0)


def held_out_records(name, text_key):
  """The mock's held-out (text, label) records, read straight from TFDS."""
  source, _ = sources.open_text_split(name, data_dir=None, key='eval_split', split=None,
                                      text_key=text_key)
  records = [source[i] for i in range(len(source))]
  texts = [r[text_key].decode('utf-8') if isinstance(r[text_key], bytes) else r[text_key]
           for r in records]
  return texts, [int(r['label']) for r in records]


@pytest.mark.parametrize('name,text_key,names', [
    ('imdb_reviews', 'text', ['neg', 'pos']),
    ('ag_news_subset', 'description', ['World', 'Sports', 'Business', 'Sci/Tech'])])
def test_records_become_the_prefix_and_text_then_the_label_word(name, text_key, names):
  with helpers.mock_tfds(NUM_EXAMPLES):
    dataset = make(name, text_key=text_key, task_prefix='sentiment: ')
    texts, labels = held_out_records(name, text_key)
  vocab, task = dataset.vocab, dataset.task
  batch = task.eval_examples(np.arange(NUM_EXAMPLES))
  for row in range(NUM_EXAMPLES):
    inputs = batch['inputs'][row][batch['input_valid'][row]].tolist()
    targets = batch['targets'][row][batch['weights'][row] > 0].tolist()
    assert inputs[-1] == vocab.eos_id and targets[-1] == vocab.eos_id
    whole = vocab.encode('sentiment: ' + texts[row])
    assert inputs[:-1] == whole[:len(inputs) - 1]  # cut to leave room for EOS
    assert len(inputs) == min(len(whole) + 1, 24)
    assert vocab.decode(targets[:-1]) == names[labels[row]]
  np.testing.assert_array_equal(batch['decoder_inputs'][:, 0], vocab.bos_id)
  np.testing.assert_array_equal(batch['decoder_inputs'][:, 1:], batch['targets'][:, :-1])
  assert dataset.train_batch(0)['inputs'].shape == (4, 24)


def test_given_label_words_replace_the_class_names_and_exact_match_scores_them():
  with helpers.mock_tfds(NUM_EXAMPLES):
    task = make(label_words='bad, good', exact_match_examples=10).task
    _, labels = held_out_records('imdb_reviews', 'text')
  vocab = task.vocab
  good = vocab.encode('good')

  def always_good(prompt_tokens, max_new_tokens, eos_id, **unused):
    assert max_new_tokens == max(len(vocab.encode('bad')), len(good)) + 1
    row = (good + [eos_id] * max_new_tokens)[:max_new_tokens]
    return np.tile(row, (len(prompt_tokens), 1))
  metrics = task.generation_metrics(always_good, batch_size=4)
  assert metrics['eval_exact_match'] == pytest.approx(np.mean(np.asarray(labels[:10]) == 1))


@pytest.mark.parametrize('options,message', [
    ({'label_words': 'a,b,c'}, r"gives 3 words for 2 classes \['neg', 'pos'\]"),
    ({'label_key': 'text'}, "no ClassLabel feature of that name; its ClassLabel features: "
                            r"\['label'\]"),
    ({'label_words': 'no,yes', 'seq_len': 1}, 'do not fit data.seq_len=1'),
])
def test_settings_the_dataset_cannot_serve_fail_in_one_line(options, message):
  with helpers.mock_tfds(NUM_EXAMPLES), pytest.raises(ConfigError, match=message) as error:
    make(**options)
  assert '\n' not in str(error.value)


@pytest.mark.slow
def test_a_t5_fine_tunes_on_classification_as_text_from_a_span_corruption_run(tmp_path, caplog):
  """Two steps of span corruption on a text file, then two of imdb_reviews as text from that
  checkpoint, with its tokenizer: the fine-tuned run starts from the pre-trained parameters."""
  text = tmp_path / 'corpus.txt'
  text.write_text(' '.join(np.random.default_rng(0).choice(['to', 'be', 'or', 'not'], 3000)))
  pretrain = tmp_path / 'pretrain'
  config = t5_config(str(text), steps=2)
  config.training.checkpoint_every = 2
  run.run(config, str(pretrain), 'train')
  finetune = t5_config(str(text), steps=2)
  finetune.data.update(name='imdb_reviews', task='text_classification_as_text',
                       task_prefix='sentiment: ', tokenizer=str(pretrain / 'tokenizer' /
                                                                 'tokenizer.json'),
                       exact_match_examples=8, eval_steps=1)
  finetune.init_from_checkpoint = str(pretrain)
  with helpers.mock_tfds(NUM_EXAMPLES), caplog.at_level('INFO'):
    run.run(finetune, str(tmp_path / 'finetune'), 'train')
  assert f'Starting from the parameters of {pretrain} at step 2' in caplog.text
  losses = train_helpers.losses(tmp_path / 'finetune')
  assert sorted(losses) == [1, 2] and all(np.isfinite(list(losses.values())))
  evaluated = [row for row in metrics.read_metrics(tmp_path / 'finetune')
               if 'eval_exact_match' in row]
  assert 0 <= evaluated[-1]['eval_exact_match'] <= 1


def test_exact_match_decodes_from_pad_with_a_tokenizer_without_bos(tmp_path):
  """T5's tokenizer has no BOS, and T5 starts its decoder from PAD (decoder_start_token_id 0):
  the training targets are shifted by it, and held-out decoding starts from it too."""
  words = tokenizers.Tokenizer(tokenizers.models.WordLevel(
      {token: i for i, token in enumerate(['<pad>', '</s>', '<unk>', 'neg', 'pos'])},
      unk_token='<unk>'))
  words.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
  words.add_special_tokens(['<pad>', '</s>', '<unk>'])
  words.save(str(tmp_path / 'tokenizer.json'))
  with helpers.mock_tfds(NUM_EXAMPLES):
    task = make(tokenizer=str(tmp_path / 'tokenizer.json'), vocab_size=None,
                exact_match_examples=10).task
    _, labels = held_out_records('imdb_reviews', 'text')
  vocab = task.vocab
  assert (vocab.pad_id, vocab.eos_id, vocab.bos_id) == (0, 1, None)
  np.testing.assert_array_equal(task.eval_examples(np.arange(4))['decoder_inputs'][:, 0], 0)
  prompts = []

  def always_pos(prompt_tokens, max_new_tokens, eos_id, **unused):
    prompts.append(np.asarray(prompt_tokens))
    return np.tile([4, eos_id], (len(prompt_tokens), 1))
  metrics = task.generation_metrics(always_pos, batch_size=4)
  assert all(np.array_equal(p, np.zeros((4, 1))) for p in prompts) and len(prompts) == 3
  assert metrics['eval_exact_match'] == pytest.approx(np.mean(np.asarray(labels[:10]) == 1))
