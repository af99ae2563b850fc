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

__all__ = ['ClassificationAsTextTask', 'make_classification_as_text', 'pair_arrays',
           'TextToTextSettings', 'TokenPairsTask']


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


def pair_arrays(sources: list[list[int]], targets: list[list[int]], seq_len: int, pad_id: int,
                start_id: int, target_len: int | None = None) -> dict:
  """seq2seq.Seq2SeqTask's arrays of token pairs whose sources fit seq_len and targets
  target_len (default seq_len; EOS included where the task puts one): each side padded with
  pad_id to its length, 'input_valid' and 'weights' over their tokens, and the decoder's inputs,
  start_id then the targets but their last."""
  count, target_len = len(sources), target_len or seq_len
  inputs = np.full((count, seq_len), pad_id, np.int32)
  target_rows = np.full((count, target_len), pad_id, np.int32)
  for row, (source, target) in enumerate(zip(sources, targets)):
    inputs[row, :len(source)], target_rows[row, :len(target)] = source, target
  lengths = lambda side: np.asarray([len(ids) for ids in side], np.int64).reshape(-1, 1)
  start = np.full((count, 1), start_id, np.int32)
  return {'inputs': inputs, 'input_valid': np.arange(seq_len) < lengths(sources),
          'decoder_inputs': np.concatenate([start, target_rows[:, :-1]], axis=1),
          'targets': target_rows,
          'weights': (np.arange(target_len) < lengths(targets)).astype(np.float32)}


class TokenPairsTask:
  """The batches of tokenized text-to-text pairs (train, held_out: (sources, targets) of each
  split, pair_arrays's rows; the decoder starts from BOS, PAD where the tokenizer has none, as
  T5 starts), the targets padded to `target_len` (default seq_len). Training example k is pair
  permutation(seed, k // N)[k % N] of the N training pairs; held-out pairs are read in order.
  `generation_metrics`: the greedy exact match of the first `exact_match_examples` held-out
  targets, decoding up to `decoded_len` tokens (default: the targets' length)."""

  def __init__(self, tokenizer, train: tuple[list, list], held_out: tuple[list, list], *,
               seq_len: int, seed: int, exact_match_examples: int,
               decoded_len: int | None = None, target_len: int | None = None):
    self.vocab, self.token_bytes = tokenizer, tokenizer.token_bytes
    self.seq_len, self.seed = seq_len, seed
    self.decoded_len = decoded_len or target_len or seq_len
    pad_id, start_id = tokenizer.pad_id or 0, decoder_start_id(tokenizer)
    self.train, self.held_out = (pair_arrays(*pairs, seq_len, pad_id, start_id, target_len)
                                 for pairs in (train, held_out))
    self.num_eval_examples = len(self.held_out['inputs'])
    self.exact_match_examples = min(exact_match_examples, self.num_eval_examples)
    self.info = {'vocab_size': tokenizer.size, 'seq_len': seq_len,
                 'num_train_pairs': len(self.train['inputs'])}

  def train_batch(self, step: int, batch_size: int, rows: slice) -> dict:
    pairs = rng.shuffled(self.seed, step, batch_size, rows, len(self.train['inputs']))
    return {key: value[pairs] for key, value in self.train.items()}

  def eval_examples(self, indices) -> dict:
    return {key: value[np.asarray(indices)] for key, value in self.held_out.items()}

  def generation_metrics(self, generate, batch_size: int) -> dict:
    """{'eval_exact_match': the share of the first exact_match_examples held-out pairs whose
    greedy output is their target (without its EOS)} ({} for none)."""
    count = self.exact_match_examples
    if not count:
      return {}
    outputs = seq2seq.decode_held_out(generate, self.eval_examples, count, batch_size,
                                      self.vocab, self.decoded_len)
    targets, weights = self.held_out['targets'][:count], self.held_out['weights'][:count]
    references = [row[:int(length) - 1].tolist() for row, length in
                  zip(targets, weights.sum(axis=1))]
    return {'eval_exact_match': seq2seq.exact_match(outputs, references)}


class ClassificationAsTextTask(TokenPairsTask):
  """The batches of the module docstring from (texts, labels) of the two splits."""

  def __init__(self, train, held_out, tokenizer, *, words: list[str], prefix: str, seq_len: int,
               seed: int, exact_match_examples: int):
    encoded = [tokenizer.encode(word) for word in words]
    longest = max(len(word) for word in encoded)
    if longest + 1 > seq_len:
      raise ConfigError(f'A label word of {longest} tokens and its EOS do not fit data.seq_len='
                        f'{seq_len}: raise it, or give shorter data.label_words.')

    def pairs(texts: list[str], labels: np.ndarray) -> tuple[list, list]:
      sources = [ids[:seq_len - 1] + [tokenizer.eos_id]
                 for ids in tokenizer.encode_batch([prefix + text for text in texts])]
      return sources, [encoded[label] + [tokenizer.eos_id] for label in labels]

    super().__init__(tokenizer, pairs(*train), pairs(*held_out), seq_len=seq_len, seed=seed,
                     exact_match_examples=exact_match_examples, decoded_len=longest + 1)
    self.info['label_words'] = words
