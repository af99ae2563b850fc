"""Classification as text (Raffel et al. 2020, section 2.4): a TFDS dataset whose records hold a
Text feature (data.text_key) and a ClassLabel (data.label_key): imdb_reviews, glue/sst2,
ag_news_subset, ..., cast as pairs of text for the encoder-decoder. A run chooses it with
data.task='text_classification_as_text'.

The inputs are data.task_prefix followed by the record's text (data.text_key), cut to leave room
for EOS, then EOS; the targets the label's word, then EOS: the ClassLabel's name, or the word
data.label_words gives it ('negative,positive': one per class, in the label's order). The
decoder starts from BOS (PAD where the tokenizer has none, as T5 starts). One tokenizer serves
both: data.tokenizer (a BPE trained on the training texts, a tokenizer.json, or the run's own;
fine-tuning from a pre-trained run passes that run's tokenizer.json).

Batches are seq2seq.Seq2SeqTask's ('inputs', 'input_valid', 'decoder_inputs', 'targets',
'weights'), every row of data.seq_len tokens. Training example k is record
permutation(seed, k // N)[k % N] of the N training records; held-out records (data.eval_split)
are read in order. `generation_metrics`: the greedy exact match of the first
data.exact_match_examples held-out labels (the share of reviews whose decoded word is the
label's: the classification accuracy).
"""
import dataclasses

import numpy as np

from transformer_jax.data import corpus as corpus_lib
from transformer_jax.data import images, rng, seq2seq, sources, text_data
from transformer_jax.data.settings import DataPart, DataSettings, register_part
from transformer_jax.data.vocab import decoder_start_id
from transformer_jax.errors import ConfigError

__all__ = ['ClassificationAsTextTask', 'make_classification_as_text', 'TextToTextSettings']


@register_part
@dataclasses.dataclass(frozen=True)
class TextToTextSettings(DataPart):
  """The keys of config.data that text-to-text tasks read."""
  PART = 'text_to_text'
  task_prefix: str = ''  # before each input text, as T5's 'sst2 sentence: '
  label_words: str | None = None  # comma-separated, one per class; None: the ClassLabel's names


def label_words(settings: TextToTextSettings, names: list[str]) -> list[str]:
  """The target word of each class: data.label_words, else the ClassLabel's `names`."""
  if settings.label_words is None:
    return names
  words = [word.strip() for word in settings.label_words.split(',')]
  if len(words) != len(names) or not all(words):
    raise ConfigError(f'data.label_words={settings.label_words!r} gives {len(words)} words for '
                      f'{len(names)} classes {names}: give one non-empty word per class, '
                      'comma-separated, in that order.')
  return words


def make_classification_as_text(settings: DataSettings, seed: int, tokenizer_dir,
                                vocab_size: int | None = None,
                                **unused) -> 'ClassificationAsTextTask':
  """The task of the module docstring for the TFDS dataset data.name."""
  del unused
  own = settings.part(TextToTextSettings)
  text_key = settings.part(corpus_lib.TextSettings).text_key
  label_key = settings.part(images.ImageSettings).label_key  # data.label_key
  names = sources.class_names(settings.name, settings.tfds_data_dir, label_key)
  splits = [sources.open_text_split(settings.name, data_dir=settings.tfds_data_dir, key=key,
                                    split=getattr(settings, key), text_key=text_key)[0]
            for key in ('train_split', 'eval_split')]
  (train_texts, train_labels), (held_out_texts, held_out_labels) = (
      _records(source, text_key, label_key) for source in splits)
  train, held_out = (corpus_lib.Corpus(settings.name, split, lambda texts=texts: iter(texts),
                                       {'texts': len(texts)})
                     for split, texts in (('train', train_texts), ('held_out', held_out_texts)))
  tokenizer = text_data.resolve_tokenizer(settings, train, held_out, mask=False, separated=True,
                                          vocab_size=vocab_size, saved_dir=tokenizer_dir)
  if tokenizer.eos_id is None:
    raise ConfigError(f'Text-to-text pairs end with EOS, which the {tokenizer.kind} tokenizer '
                      "lacks: use data.tokenizer='bpe' or a tokenizer.json with </s> or <eos>.")
  return ClassificationAsTextTask(
      (train_texts, train_labels), (held_out_texts, held_out_labels), tokenizer,
      words=label_words(own, names), prefix=own.task_prefix, seq_len=settings.seq_len,
      seed=seed, exact_match_examples=settings.part(seq2seq.Seq2SeqSettings).exact_match_examples)


def _records(source, text_key: str, label_key: str) -> tuple[list[str], np.ndarray]:
  """Every record's text and label of a TFDS data source."""
  texts, labels = [], []
  for start in range(0, len(source), 1024):
    for record in source.__getitems__(list(range(start, min(start + 1024, len(source))))):
      text = record[text_key]
      texts.append(text.decode('utf-8') if isinstance(text, bytes) else str(text))
      labels.append(int(record[label_key]))
  return texts, np.asarray(labels, np.int64)


class ClassificationAsTextTask:
  """The batches of the module docstring from (texts, labels) of the two splits."""

  def __init__(self, train, held_out, tokenizer, *, words: list[str], prefix: str, seq_len: int,
               seed: int, exact_match_examples: int):
    self.vocab, self.token_bytes = tokenizer, tokenizer.token_bytes
    self.seq_len, self.seed, self.prefix = seq_len, seed, prefix
    self.pad_id = tokenizer.pad_id or 0
    self.start_id = decoder_start_id(tokenizer)
    self.words = [tokenizer.encode(word) for word in words]
    longest = max(len(word) for word in self.words)
    if longest + 1 > seq_len:
      raise ConfigError(f'A label word of {longest} tokens and its EOS do not fit data.seq_len='
                        f'{seq_len}: raise it, or give shorter data.label_words.')
    self.train, self.held_out = self._pairs(*train), self._pairs(*held_out)
    self.held_out_labels = np.asarray(held_out[1])
    self.num_eval_examples = len(self.held_out['inputs'])
    self.exact_match_examples = min(exact_match_examples, self.num_eval_examples)
    self.info = {'vocab_size': tokenizer.size, 'seq_len': seq_len, 'label_words': words,
                 'num_train_pairs': len(self.train['inputs'])}

  def _pairs(self, texts: list[str], labels: np.ndarray) -> dict:
    count = len(texts)
    inputs, targets = (np.full((count, self.seq_len), self.pad_id, np.int32) for _ in range(2))
    lengths = np.zeros((count, 2), np.int64)  # of each row's input and target
    for row, ids in enumerate(self.vocab.encode_batch([self.prefix + text for text in texts])):
      source = ids[:self.seq_len - 1] + [self.vocab.eos_id]
      target = self.words[labels[row]] + [self.vocab.eos_id]
      inputs[row, :len(source)], targets[row, :len(target)] = source, target
      lengths[row] = len(source), len(target)
    positions = np.arange(self.seq_len)
    start = np.full((count, 1), self.start_id, np.int32)
    return {'inputs': inputs, 'input_valid': positions < lengths[:, :1],
            'decoder_inputs': np.concatenate([start, targets[:, :-1]], axis=1),
            'targets': targets, 'weights': (positions < lengths[:, 1:]).astype(np.float32)}

  def train_batch(self, step: int, batch_size: int, rows: slice) -> dict:
    records = rng.shuffled(self.seed, step, batch_size, rows, len(self.train['inputs']))
    return {key: value[records] for key, value in self.train.items()}

  def eval_examples(self, indices) -> dict:
    return {key: value[np.asarray(indices)] for key, value in self.held_out.items()}

  def generation_metrics(self, generate, batch_size: int) -> dict:
    """{'eval_exact_match': the share of the first data.exact_match_examples held-out records
    whose greedy output is their label's word} ({} for none)."""
    count = self.exact_match_examples
    if not count:
      return {}
    outputs = seq2seq.decode_held_out(generate, self.eval_examples, count, batch_size,
                                      self.vocab, max(len(word) for word in self.words) + 1)
    references = [self.words[label] for label in self.held_out_labels[:count]]
    return {'eval_exact_match': seq2seq.exact_match(outputs, references)}
