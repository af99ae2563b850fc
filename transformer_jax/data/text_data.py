"""A text task from config.data: the corpus, its tokenizer, its token files, windows or packed
rows. The tokenizer is the run's saved one where there is one (so a resumed run, `eval` and
`sample` read the ids it trained on), else data.tokenizer: 'chars', 'bpe' (trained on the
training documents, cached beside the token files) or a tokenizer.json path.

A language model's documents (a corpus of several; one running text has neither token) are
each the tokenizer's own BOS where it puts one before a text (`text_bos`: LLaMA's <s>, BERT's
[CLS]), the text's ids, then EOS: LLaMA's pre-training stream `<s> doc </s> <s> doc </s>` (as
torchtitan's `encode(bos=True, eos=True)` makes it), GPT-2's `doc <|endoftext|> doc
<|endoftext|>` (its one token both ends and starts a document), and for a trained BPE or the
characters, which put no BOS, `doc EOS doc EOS`. Packed next-token rows read each document's
first token after BOS, else EOS (text.PackedNextTokenTask), so their documents hold none.
"""
import hashlib
import json
import logging
import os

import numpy as np

from transformer_jax.data import corpus as corpus_lib
from transformer_jax.data import seq2seq, text, token_files
from transformer_jax.data import tokenizer as tokenizer_lib
from transformer_jax.data.vocab import Vocab
from transformer_jax.data.corpus import TextSettings
from transformer_jax.data.settings import DataSettings
from transformer_jax.errors import ConfigError

__all__ = ['make_text_task', 'resolve_tokenizer', 'TextSettings']

log = logging.getLogger(__name__)



def make_text_task(settings: DataSettings, task: str, seed: int, *, vocab_size: int | None,
                   tokenizer_dir: str | None):
  """The 'next_token' or 'masked' task of data.name `settings.name`; vocab_size: a trained
  BPE's size where data.vocab_size is unset (the model's)."""
  text_settings = settings.part(TextSettings)
  name, seq_len, packed = settings.name, settings.seq_len, text_settings.packing
  mask = task == 'masked'
  if name == 'synthetic':
    alphabet = settings.part(seq2seq.GeneratedSettings).alphabet
    train_text, held_out_text = text.synthetic_text(alphabet, settings.eval_examples, seq_len)
    vocab = Vocab.of_text(train_text + held_out_text, mask=mask)
    train, held_out = (np.array(vocab.encode(t), np.int32) for t in (train_text, held_out_text))
    return _windows(task, train, held_out, vocab, settings, seed)
  train, held_out = corpus_lib.open_corpus(settings, name)
  tokenizer = resolve_tokenizer(settings, train, held_out, mask=mask,
                                separated=packed or not train.single, vocab_size=vocab_size,
                                saved_dir=tokenizer_dir)
  separator = bos = None
  if not train.single:
    if tokenizer.eos_id is None:
      raise ConfigError(f'The {tokenizer.kind} tokenizer has no EOS token to end each document '
                        'of the corpus with: use one that has (</s>, <|endoftext|>, <eos>).')
    separator = tokenizer.eos_id
    if not (packed and task == 'next_token'):  # the module docstring
      bos = tokenizer.text_bos
  root = text_settings.token_dir or token_files.default_root()
  train_tokens, held_out_tokens = (token_files.tokenized(c, tokenizer, root, separator, bos)
                                   for c in (train, held_out))
  if not packed:
    return _windows(task, train_tokens.tokens, held_out_tokens.tokens, tokenizer, settings, seed)
  if tokenizer.bos_id is None and tokenizer.eos_id is None:
    raise ConfigError('data.packing starts each document after a BOS or EOS token, which this '
                      f'{tokenizer.kind} tokenizer lacks: use data.tokenizer=bpe.')
  if mask:
    return text.PackedMaskedTask(train_tokens, held_out_tokens, tokenizer, seq_len=seq_len,
                                 seed=seed, probability=text_settings.mlm_probability)
  return text.PackedNextTokenTask(train_tokens, held_out_tokens, tokenizer, seq_len=seq_len,
                                  seed=seed)


def _windows(task: str, train, held_out, tokenizer, settings: DataSettings, seed: int):
  if task == 'next_token':
    return text.NextTokenTask(train, held_out, tokenizer, seq_len=settings.seq_len, seed=seed)
  return text.MaskedTask(train, held_out, tokenizer, seq_len=settings.seq_len, seed=seed,
                         probability=settings.part(TextSettings).mlm_probability)


def resolve_tokenizer(settings: DataSettings, train: corpus_lib.Corpus,
                      held_out: corpus_lib.Corpus, *, mask: bool, separated: bool,
                      vocab_size: int | None, saved_dir: str | None, sentinels: int = 0):
  """The run's saved tokenizer, else data.tokenizer's: characters of `train` and `held_out`
  (with EOS where `separated`, MASK where `mask`), a BPE trained on `train` (with `sentinels`
  at its top ids), or a tokenizer.json."""
  saved = tokenizer_lib.saved(saved_dir) if saved_dir else None
  if saved is not None:
    log.info('Tokenizer: the run\'s own, %s (%d ids).', saved_dir, saved.size)
    return saved
  text_settings = settings.part(TextSettings)
  kind = text_settings.tokenizer
  if kind == 'bpe':
    return _trained_bpe(text_settings, train, text_settings.vocab_size or vocab_size, sentinels)
  if kind == 'chars':
    everything = ''.join(d for c in (train, held_out) for d in c.documents())
    tokenizer = Vocab.of_text(everything, mask=mask, eos=separated)
  else:
    tokenizer = tokenizer_lib.HFTokenizer.from_file(os.path.expanduser(kind))
  stated = text_settings.vocab_size
  if stated and tokenizer.size > stated:
    raise ConfigError(f'The {tokenizer.kind} tokenizer of the data has {tokenizer.size} ids but '
                      f'data.vocab_size={stated}: set --config.data.vocab_size={tokenizer.size}, '
                      'or leave it unset.')
  return tokenizer


def _trained_bpe(settings: TextSettings, train: corpus_lib.Corpus, vocab_size: int | None,
                 sentinels: int):
  """A BPE of `vocab_size` ids (`sentinels` of them reserved) trained on the training documents,
  once: it is kept in the token root, keyed by the documents and the sizes."""
  if not vocab_size:
    raise ConfigError("data.tokenizer='bpe' trains a vocabulary of data.vocab_size ids: set "
                      '--config.data.vocab_size (or model.vocab_size).')
  sizes = {'size': vocab_size, **({'sentinels': sentinels} if sentinels else {})}
  described = json.dumps({'corpus': train.identity, 'name': train.name, **sizes},
                         sort_keys=True)
  key = hashlib.sha256(described.encode()).hexdigest()[:16]
  directory = os.path.join(settings.token_dir or token_files.default_root(),
                           f'bpe-{train.name.replace("/", "_")}-{key}')
  cached = tokenizer_lib.saved(directory)
  if cached is not None:
    return cached
  log.info('Training a byte-level BPE of %d ids on the %s training documents.', vocab_size,
           train.name)
  trained = tokenizer_lib.train_bpe(train.documents(), vocab_size, sentinels)
  tokenizer_lib.save(trained, directory)
  return trained
