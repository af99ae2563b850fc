"""Tokenizers: characters (data.vocab.Vocab), a byte-level BPE trained on the training documents,
or any Hugging Face tokenizer.json (GPT-2's, LLaMA's, one's own), behind one interface.

Every tokenizer has `size`, `encode(text) -> ids` (the text's own ids, no special token),
`decode(ids) -> text` (special tokens dropped, stopping at EOS), the ids of its special tokens
where it has them (`pad_id`, `bos_id`, `eos_id`, `mask_id`; None where not), `text_bos` (the BOS
it puts before a text of its own accord, None where it puts none), `token_bytes` (the UTF-8
bytes each id stands for, 0 for special tokens, which is what bits per byte divide by), a
`fingerprint` that changes with any id, and `save(directory)`; `saved(directory)` reads back
either kind.

Special tokens are the task's to write, once: a tokenizer.json's post-processor adds its own
(Whisper's `<|startoftranscript|> <|notimestamps|> $A <|endoftext|>`, T5's `$A </s>`, LLaMA's
`<s> $A`), which `encode` leaves out (`add_special_tokens=False`), so that a task's prompt, EOS
or sentinels are never doubled. The one thing of the post-processor a task may rely on is
`text_bos`, and says so where it does (a language model's documents).
"""
import functools
import hashlib
import json
import os
import pathlib
import re
from typing import Iterable

import numpy as np
import tokenizers

from transformer_jax.data import files
from transformer_jax.data import vocab as vocab_lib
from transformer_jax.data.vocab import Vocab
from transformer_jax.errors import ConfigError

__all__ = ['BPE_SPECIALS', 'HFTokenizer', 'save', 'saved', 'sentinel', 'sentinel_count',
           'train_bpe']

# The special tokens of a trained BPE, ids 0..3, so that one vocabulary serves every family.
BPE_SPECIALS = (vocab_lib.PAD, vocab_lib.BOS, vocab_lib.EOS, vocab_lib.MASK)
# How the special tokens are spelled in the tokenizer.json files researchers bring, most common
# first: ours, GPT-2's, LLaMA 1/2's (SentencePiece), LLaMA 3's, BERT's, CLIP's.
_SPECIAL_NAMES = {
    'pad_id': (vocab_lib.PAD, '[PAD]', '<|pad|>'),
    'bos_id': (vocab_lib.BOS, '<s>', '<|begin_of_text|>', '[CLS]', '<|startoftext|>'),
    'eos_id': (vocab_lib.EOS, '<|endoftext|>', '</s>', '<|end_of_text|>', '[SEP]'),
    'mask_id': (vocab_lib.MASK, '[MASK]'),
}
_HF_FILE = 'tokenizer.json'
_BYTE_FALLBACK = re.compile(r'<0x[0-9A-Fa-f]{2}>')


class HFTokenizer:
  """A `tokenizers.Tokenizer` (no transformers needed). `encode` leaves out what its
  post-processor adds (the module docstring); `decode` stops at EOS and drops special tokens."""

  def __init__(self, tokenizer: tokenizers.Tokenizer, eos_id: int | None = None):
    self._tokenizer = tokenizer
    specials = {token.content for token in tokenizer.get_added_tokens_decoder().values()
                if token.special}
    for attribute, names in _SPECIAL_NAMES.items():
      found = [tokenizer.token_to_id(name) for name in names if name in specials]
      setattr(self, attribute, found[0] if found else None)
    if eos_id is not None:
      self.eos_id = eos_id
    self.kind = 'tokenizer.json'

  @classmethod
  def from_file(cls, path, key: str = 'data.tokenizer', eos_id: int | None = None):
    """A tokenizer.json file, or a directory holding one (a Hugging Face checkpoint's)."""
    file = pathlib.Path(path)
    if file.is_dir():
      file = file / _HF_FILE
    if not file.is_file():
      raise ConfigError(f'{key}={path}: no tokenizer.json there; give the path of a tokenizer.json '
                        'or of a Hugging Face checkpoint directory holding one (data.tokenizer '
                        "also takes 'chars' or 'bpe').")
    try:
      tokenizer = tokenizers.Tokenizer.from_file(str(file))
    except Exception as error:  # the package raises bare Exceptions for malformed files
      raise ConfigError(f'{key}={path}: {file} is not a tokenizer.json that the tokenizers '
                        f'package reads ({str(error).splitlines()[0]}).') from None
    return cls(tokenizer, eos_id)

  @property
  def size(self) -> int:
    return self._tokenizer.get_vocab_size()

  def id_of(self, token: str) -> int | None:
    """The id of `token` (a special token's spelling, such as '<|startoftranscript|>'), or None."""
    return self._tokenizer.token_to_id(token)

  @functools.cached_property
  def text_bos(self) -> int | None:
    """The special token the post-processor puts first, before the text (LLaMA's BOS, BERT's
    [CLS], CLIP's <|startoftext|>, Whisper's <|startoftranscript|>), or None where it puts the
    text first or there is none (GPT-2's, T5's, a trained BPE)."""
    processor = json.loads(self._tokenizer.to_str()).get('post_processor')
    for step in filter(None, (processor or {}).get('processors') or [processor]):  # a Sequence's
      if step['type'] in ('BertProcessing', 'RobertaProcessing'):
        return step['cls'][1]  # (token, id)
      if step['type'] == 'TemplateProcessing' and 'SpecialToken' in step['single'][0]:
        return step['special_tokens'][step['single'][0]['SpecialToken']['id']]['ids'][0]
    return None

  def encode(self, text: str) -> list[int]:
    """The ids of `text` alone, without the special tokens the post-processor adds."""
    return self._tokenizer.encode(text, add_special_tokens=False).ids

  def encode_batch(self, texts: list[str]) -> list[list[int]]:
    """`encode` of each text, in parallel."""
    return [encoding.ids for encoding in
            self._tokenizer.encode_batch(texts, add_special_tokens=False)]

  def decode(self, ids) -> str:
    ids = [int(i) for i in ids]
    if self.eos_id is not None and self.eos_id in ids:
      ids = ids[:ids.index(self.eos_id)]
    return self._tokenizer.decode(ids, skip_special_tokens=True)

  @functools.cached_property
  def token_bytes(self) -> np.ndarray:
    """int32 (size,): the UTF-8 bytes of each token's text; 0 for special tokens.

    Byte-level BPE (GPT-2's) is exact. SentencePiece-style vocabularies (LLaMA's) count a byte
    fallback token <0xNN> as one byte and the meta-space ▁ as the space it stands for, so
    the space their pre-tokenizer prepends to a text counts one byte the text does not have.
    """
    byte_level = json.loads(self._tokenizer.to_str()).get('decoder') or {}
    byte_level = 'ByteLevel' in json.dumps(byte_level)
    special = {i for i, token in self._tokenizer.get_added_tokens_decoder().items()
               if token.special}
    counts = np.zeros(self.size, np.int32)
    for i in range(self.size):
      token = self._tokenizer.id_to_token(i)
      if i in special or token is None:
        continue
      if byte_level:  # one character per byte (GPT-2's byte-to-unicode table)
        counts[i] = len(token)
      elif _BYTE_FALLBACK.fullmatch(token):  # SentencePiece's byte fallback
        counts[i] = 1
      else:
        counts[i] = len(token.replace('\u2581', ' ').encode('utf-8'))
    return counts

  @functools.cached_property
  def fingerprint(self) -> str:
    return hashlib.sha256(self._tokenizer.to_str().encode()).hexdigest()[:16]

  def save(self, directory) -> None:
    files.write_atomically(pathlib.Path(directory) / _HF_FILE,
                           self._tokenizer.to_str(pretty=True))


def sentinel(index: int) -> str:
  """The name of T5's sentinel `index` (<extra_id_0> is the top id of the vocabulary)."""
  return f'<extra_id_{index}>'


def sentinel_count(tokenizer) -> int:
  """How many sentinels the tokenizer has where span corruption puts them: <extra_id_i> at id
  size - 1 - i for i = 0, 1, ... (T5's tokenizer.json has 100; characters have none)."""
  if not isinstance(tokenizer, HFTokenizer):
    return 0
  count = 0
  while tokenizer._tokenizer.token_to_id(sentinel(count)) == tokenizer.size - 1 - count:
    count += 1
  return count


def train_bpe(documents: Iterable[str], vocab_size: int, sentinels: int = 0) -> HFTokenizer:
  """A byte-level BPE (GPT-2's pre-tokenization) of `vocab_size` ids trained on `documents`:
  PAD, BOS, EOS, MASK are ids 0..3, then the 256 bytes, then the merges, then `sentinels`
  special tokens <extra_id_N> at the top ids, <extra_id_0> the last (T5's span corruption). A
  corpus too small for every merge gives fewer ids; the sentinels are still the top ones."""
  minimum = len(BPE_SPECIALS) + 256 + sentinels
  if vocab_size < minimum:
    reserved = f' and {sentinels} sentinels' if sentinels else ''
    raise ConfigError(f'data.vocab_size={vocab_size} is too small for a byte-level BPE: it needs '
                      f'at least {minimum} ids (the 256 bytes, {len(BPE_SPECIALS)} special '
                      f'tokens{reserved}).')
  tokenizer = tokenizers.Tokenizer(tokenizers.models.BPE())
  tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
  tokenizer.decoder = tokenizers.decoders.ByteLevel()
  trainer = tokenizers.trainers.BpeTrainer(
      vocab_size=vocab_size - sentinels, special_tokens=list(BPE_SPECIALS), show_progress=False,
      initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
  tokenizer.train_from_iterator(documents, trainer)
  tokenizer.add_special_tokens([sentinel(i) for i in reversed(range(sentinels))])
  return HFTokenizer(tokenizer)


def saved(directory) -> 'HFTokenizer | Vocab | None':
  """The tokenizer saved in `directory` (a run's workdir/tokenizer), or None."""
  directory = pathlib.Path(directory)
  if (directory / _HF_FILE).is_file():
    return HFTokenizer.from_file(directory / _HF_FILE)
  if (directory / vocab_lib.CHARS_FILE).is_file():
    return Vocab.load(directory / vocab_lib.CHARS_FILE)
  return None


def save(tokenizer, directory) -> None:
  """Writes `tokenizer` into `directory` (created), as saved() reads it back."""
  os.makedirs(directory, exist_ok=True)
  tokenizer.save(directory)
