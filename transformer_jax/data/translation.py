"""Translation pairs for the encoder-decoder: any TFDS dataset whose records are a Translation
feature (wmt14_translate/de-en, wmt_t2t_translate/de-en, ted_hrlr_translate/pt_to_en, ...)
prepared in data.tfds_data_dir, from data.source_language to data.target_language (default: as
the config name reads, 'de-en' from de to en, 'pt_to_en' from pt to en).

One tokenizer serves both sides: data.tokenizer 'bpe' (trained on both sides of the training
pairs, cached as text_data caches it), a tokenizer.json with EOS, or the run's saved one.
Each side of each split is tokenized once into a token file (token_files), each text followed
by EOS (as T5's inputs and targets end, and transformers' `tokenizer(source, text_target=target)`
of T5's tokenizer), and the pairs' rows are laid out once beside them (packing.cached_pairs),
memory-mapped like the tokens. A pair whose source is empty is left out.

Batches are Seq2SeqTask's: 'inputs' (the source and its EOS, cut to seq_len: a source that long
loses its EOS), 'input_valid', 'targets' (the target and its EOS, cut likewise),
'decoder_inputs' (the decoder's start token, BOS or else PAD as T5's, then targets[:-1]) and
'weights' (1.0 on the target and its EOS). data.task_prefix, T5's
'translate German to English: ', puts its tokens before each source, unpacked (the whole cut to
seq_len); it is encoded on its own, so where a tokenizer would split the prefix and the source
joined otherwise, the ids differ from transformers' `tokenizer(prefix + source)`.
With data.packing, the pairs fill rows of seq_len tokens in both streams, in corpus order, a new
row starting where either side would overflow (a side longer than seq_len is first cut to
seq_len, as above); 'input_valid' gives way to 'input_segment_ids', 'input_positions',
'target_segment_ids' and 'target_positions': segment k of a row's targets translates segment k
of its inputs, and 0 is padding, which carries no weight.

Training example k is row permutation(seed, k // R)[k % R] of the R training rows (pairs, or
packed rows); held-out rows are read in order. `generation_metrics` scores the translations
(greedy, or beam search as config.eval says) of the first data.bleu_examples held-out pairs with
sacrebleu's corpus BLEU against their reference texts, and by exact match.
"""
import dataclasses
import itertools
import re

import numpy as np
import sacrebleu

from transformer_jax.data import corpus as corpus_lib
from transformer_jax.data import (packing, rng, seq2seq, sources, text_data, text_to_text,
                                  token_files)
from transformer_jax.data import tokenizer as tokenizer_lib
from transformer_jax.data.settings import DataPart, DataSettings, register_part
from transformer_jax.data.corpus import TextSettings
from transformer_jax.data.vocab import decoder_start_id
from transformer_jax.errors import ConfigError
from transformer_jax.ranges import Range

__all__ = ['bleu', 'languages', 'make_translation_task', 'TranslationTask']

# A config name that says the direction: 'de-en' (WMT's), 'pt_to_en' (ted_hrlr_translate's).
_DIRECTION = re.compile(r'([a-z]+)(?:-|_to_)([a-z]+)')
_NEEDS_EOS = ('An encoder-decoder writes each translation up to EOS, which the {} tokenizer '
              "lacks: use data.tokenizer='bpe' (a byte-level BPE trained on both sides) or a "
              'tokenizer.json that has one.')


@register_part
@dataclasses.dataclass(frozen=True)
class TranslationSettings(DataPart):
  """The keys of config.data that a TFDS translation dataset reads."""
  PART = 'translation'
  # The languages translated from and to; None: as the config name says ('de-en': de to en,
  # 'pt_to_en': pt to en).
  source_language: str | None = None
  target_language: str | None = None
  bleu_examples: int = 256  # held-out pairs decoded for eval_bleu at each evaluation; 0: none

  RANGES = {'bleu_examples': Range(0, integer=True)}


def make_translation_task(settings: DataSettings, seed: int, *, vocab_size: int | None,
                          tokenizer_dir: str | None) -> 'TranslationTask':
  """The pairs of the TFDS translation dataset data.name (settings: DataSettings);
  vocab_size: a trained BPE's size where data.vocab_size is unset (the model's)."""
  name = settings.name
  source, target = languages(settings, name)
  train, held_out = ([_side(settings, name, key, language) for language in (source, target)]
                     for key in ('train_split', 'eval_split'))
  saved = tokenizer_dir and tokenizer_lib.saved(tokenizer_dir)
  text_settings, own = settings.part(TextSettings), settings.part(TranslationSettings)
  if text_settings.tokenizer == 'chars' and not saved:  # before reading every text for nothing
    raise ConfigError(_NEEDS_EOS.format("data.tokenizer='chars'"))
  tokenizer = text_data.resolve_tokenizer(settings, _both(*train), _both(*held_out), mask=False,
                                          separated=True, vocab_size=vocab_size,
                                          saved_dir=tokenizer_dir)
  if tokenizer.eos_id is None:
    raise ConfigError(_NEEDS_EOS.format(tokenizer.kind))
  prefix = settings.part(text_to_text.TextToTextSettings).task_prefix
  if prefix and text_settings.packing:
    raise ConfigError(f'data.task_prefix={prefix!r} goes before each unpacked source: set '
                      'data.packing=False, or leave data.task_prefix unset.')
  root = text_settings.token_dir or token_files.default_root()

  def tokenized(sides):
    return tuple(token_files.tokenized(side, tokenizer, root, tokenizer.eos_id) for side in sides)
  return TranslationTask(tokenized(train), tokenized(held_out), tokenizer,
                         seq_len=settings.seq_len, seed=seed, packed=text_settings.packing,
                         bleu_examples=own.bleu_examples, references=held_out[1],
                         languages=(source, target),
                         prefix_ids=tokenizer.encode(prefix) if prefix else [])


def languages(settings: DataSettings, name: str) -> tuple[str, str]:
  """(source, target): data.source_language and data.target_language, by default the direction
  the config name says; each one of the dataset's languages."""
  available = sources.translation_languages(name, settings.tfds_data_dir)
  if available is None:
    raise ConfigError(f'data.name={name!r} is not one of {sorted(seq2seq.TASKS)} nor a TFDS '
                      'translation dataset (records of a Translation feature): give one such as '
                      'ted_hrlr_translate/pt_to_en or wmt14_translate/de-en.')
  direction = _DIRECTION.fullmatch(name.partition('/')[2])
  own = settings.part(TranslationSettings)
  source = own.source_language or (direction and direction[1])
  target = own.target_language or (direction and direction[2])
  for key, language in (('source_language', source), ('target_language', target)):
    if language not in available:
      given = f'={language!r} is not one of them' if language else ' is unset'
      raise ConfigError(f'{name} translates between the languages {list(available)}; data.{key}'
                        f'{given}: set --config.data.source_language and '
                        '--config.data.target_language to two of them.')
  if source == target:
    raise ConfigError(f'data.source_language and data.target_language are both {source!r}: set '
                      f'them to two of the languages {list(available)}.')
  return source, target


def _side(settings: DataSettings, name: str, key: str, language: str) -> corpus_lib.Corpus:
  """One language of the split data.`key`: its texts as documents, named after the language."""
  side = corpus_lib.tfds_split(settings, name, key, text_key=language)
  return dataclasses.replace(side, name=f'{name.replace("/", "-")}.{language}')


def _both(source: corpus_lib.Corpus, target: corpus_lib.Corpus) -> corpus_lib.Corpus:
  """The texts of both sides of a split, the sources first: what one shared BPE trains on."""
  return corpus_lib.Corpus(
      f'{source.name}-{target.name.rpartition(".")[2]}', source.split,
      lambda: itertools.chain(source.documents(), target.documents()),
      {'sides': [source.identity, target.identity]})


def bleu(hypotheses: list[str], references: list[str]) -> float:
  """sacrebleu's corpus BLEU (0..100, its default 13a tokenization) of one reference each."""
  return sacrebleu.corpus_bleu(hypotheses, [references]).score


@dataclasses.dataclass(frozen=True)
class _Split:
  """A split's token files and its rows: row r holds the pairs row_starts[r] .. row_starts[r+1]-1
  of both Packings (each pair one piece, cut to seq_len); `kept`: the pairs' record indices."""
  source_tokens: np.ndarray
  target_tokens: np.ndarray
  sources: packing.Packing
  targets: packing.Packing
  kept: np.ndarray

  @property
  def num_rows(self) -> int:
    return self.sources.num_rows


def _split(files, seq_len: int, packed: bool) -> _Split:
  source, target = files
  if source.num_documents != target.num_documents:
    raise ValueError(f'{source.directory} holds {source.num_documents} sources but '
                     f'{target.directory} {target.num_documents} targets.')
  layout = f'pairs-{target.directory.name}-{seq_len}-{"packed" if packed else "rows"}'
  sources, targets, kept = packing.cached_pairs(source.directory / layout, source.starts,
                                                target.starts, seq_len, packed, empty=1)
  if not len(kept):
    raise ConfigError(f'No pair of {source.directory.name} has a source: give a split with text '
                      '(data.train_split, data.eval_split).')
  return _Split(source.tokens, target.tokens, sources, targets, kept)


class TranslationTask:
  """The batches of the module docstring, from the token files (source, target) of the
  training and held-out splits, and BLEU and exact match of decoded translations."""

  def __init__(self, train, held_out, tokenizer, *, seq_len: int, seed: int, packed: bool,
               bleu_examples: int, references: corpus_lib.Corpus, languages: tuple[str, str],
               prefix_ids=()):
    self.vocab, self.token_bytes = tokenizer, tokenizer.token_bytes
    self.prefix_ids = np.asarray(prefix_ids, np.int32)
    self.seq_len, self.seed, self.packed = seq_len, seed, packed
    self.pad_id = tokenizer.pad_id or 0
    self.train = _split(train, seq_len, packed)
    self.held_out = _split(held_out, seq_len, packed)
    self.eval_pairs = _split(held_out, seq_len, packed=False) if packed else self.held_out
    self.num_eval_examples = self.held_out.num_rows
    kept = self.eval_pairs.kept[:bleu_examples]
    texts = list(itertools.islice(references.documents(), int(kept[-1]) + 1)) if len(kept) else []
    self.references = [texts[i] for i in kept]  # the reference translations BLEU compares with
    self.info = {'vocab_size': tokenizer.size, 'seq_len': seq_len, 'tokenizer': tokenizer.kind,
                 'languages': list(languages), 'num_train_pairs': len(self.train.kept),
                 'num_train_rows': self.train.num_rows, 'bleu_examples': len(kept)}

  def train_batch(self, step: int, batch_size: int, rows: slice) -> dict:
    return self._batch(self.train, rng.shuffled(self.seed, step, batch_size, rows,
                                                self.train.num_rows), self.packed)

  def eval_examples(self, indices: np.ndarray) -> dict:
    return self._batch(self.held_out, [int(i) for i in indices], self.packed)

  def _batch(self, split: _Split, rows: list[int], packed: bool) -> dict:
    settings = dict(start_id=decoder_start_id(self.vocab), pad_id=self.pad_id)
    source = packing.packed_rows(split.sources, split.source_tokens, rows, self.seq_len,
                                 **settings)
    target = packing.packed_rows(split.targets, split.target_tokens, rows, self.seq_len,
                                 **settings)
    batch = {'inputs': source['tokens'], 'decoder_inputs': target['previous'],
             'targets': target['tokens'],
             'weights': (target['segment_ids'] > 0).astype(np.float32)}
    if not packed:
      return self._prefixed({**batch, 'input_valid': source['segment_ids'] > 0})
    return {**batch, 'input_segment_ids': source['segment_ids'],
            'input_positions': source['positions'], 'target_segment_ids': target['segment_ids'],
            'target_positions': target['positions']}

  def _prefixed(self, batch: dict) -> dict:
    """The unpacked batch with the task prefix's ids before each source, cut to seq_len."""
    if not self.prefix_ids.size:
      return batch
    rows = len(batch['inputs'])
    before = lambda values, prefix: np.concatenate(
        [np.broadcast_to(prefix, (rows, self.prefix_ids.size)), values], axis=1)[:, :self.seq_len]
    return {**batch, 'inputs': before(batch['inputs'], self.prefix_ids),
            'input_valid': before(batch['input_valid'], True)}

  def generation_metrics(self, generate, batch_size: int) -> dict:
    """{'eval_bleu', 'eval_exact_match'} of the translations of the first held-out pairs (data.
    bleu_examples of them; {} for none); generate as seq2seq.decode_held_out's."""
    count = len(self.references)
    if not count:
      return {}
    pairs = lambda rows: self._batch(self.eval_pairs, rows, packed=False)
    outputs = seq2seq.decode_held_out(generate, pairs, count, batch_size, self.vocab,
                                      self.seq_len)
    hypotheses = [self.vocab.decode(output) for output in outputs]
    return {'eval_bleu': bleu(hypotheses, self.references),
            'eval_exact_match': seq2seq.exact_match(hypotheses, self.references)}
