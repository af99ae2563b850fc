"""Character vocabularies: text <-> ids, with the special tokens each family needs."""
import dataclasses
import functools
import hashlib
import json
import pathlib

import numpy as np

from transformer_jax.data import files

__all__ = ['CHARS_FILE', 'decoder_start_id', 'Vocab']

PAD, BOS, EOS, MASK = '<pad>', '<bos>', '<eos>', '<mask>'
SPECIALS = (PAD, BOS, EOS, MASK)
CHARS_FILE = 'chars.json'  # a saved Vocab, in a run's workdir/tokenizer


def decoder_start_id(tokenizer) -> int:
  """The token an encoder-decoder's decoder starts from, before the first target token, in
  training (the targets shifted right) and in decoding alike: the tokenizer's BOS, else its PAD
  (0 where it has none), as T5 starts (decoder_start_token_id = pad_token_id = 0; T5's
  tokenizer has no BOS)."""
  if tokenizer.bos_id is not None:
    return tokenizer.bos_id
  return tokenizer.pad_id or 0


@dataclasses.dataclass(frozen=True)
class Vocab:
  """One token per id: characters, and special tokens (PAD, BOS, EOS, MASK) that text never
  encodes to. `decode` drops PAD and BOS and stops at the first EOS, so a generated sequence
  decodes to its text."""
  tokens: tuple[str, ...]

  def __post_init__(self):
    if len(set(self.tokens)) != len(self.tokens):
      raise ValueError(f'Duplicate tokens in the vocabulary: {self.tokens}.')
    object.__setattr__(self, '_ids', {token: i for i, token in enumerate(self.tokens)})

  kind = 'chars'
  text_bos = None  # no BOS of its own before a text (tokenizer.HFTokenizer's may have one)

  @classmethod
  def of_text(cls, text: str, mask: bool = False, eos: bool = False) -> 'Vocab':
    """The sorted characters of `text` from id 0 (the PyTorch reference's ids), then EOS (the
    end of each document of a corpus) and MASK where asked (so the ids below them are exactly
    the characters)."""
    return cls(tuple(sorted(set(text))) + ((EOS,) if eos else ()) + ((MASK,) if mask else ()))

  @classmethod
  def load(cls, path) -> 'Vocab':
    return cls(tuple(json.loads(pathlib.Path(path).read_text(encoding='utf-8'))['tokens']))

  def save(self, directory) -> None:
    files.write_atomically(pathlib.Path(directory) / CHARS_FILE,
                     json.dumps({'tokens': list(self.tokens)}, ensure_ascii=False))

  @functools.cached_property
  def token_bytes(self) -> np.ndarray:
    """int32 (size,): the UTF-8 bytes of each id's character; 0 for special tokens."""
    return np.array([0 if token in SPECIALS else len(token.encode('utf-8'))
                     for token in self.tokens], np.int32)

  @functools.cached_property
  def fingerprint(self) -> str:
    return hashlib.sha256(json.dumps(self.tokens).encode()).hexdigest()[:16]

  @classmethod
  def seq2seq(cls, alphabet: str) -> 'Vocab':
    """PAD=0, BOS=1, EOS=2, then the symbols of `alphabet` in its order."""
    return cls((PAD, BOS, EOS) + tuple(alphabet))

  @property
  def size(self) -> int:
    return len(self.tokens)

  @property
  def pad_id(self) -> int | None:
    return self._ids.get(PAD)

  @property
  def bos_id(self) -> int | None:
    return self._ids.get(BOS)

  @property
  def eos_id(self) -> int | None:
    return self._ids.get(EOS)

  @property
  def mask_id(self) -> int | None:
    return self._ids.get(MASK)

  def encode(self, text: str) -> list[int]:
    unknown = sorted(set(text) - self._ids.keys())
    if unknown:
      raise ValueError(f'Characters outside the vocabulary: {unknown}.')
    return [self._ids[char] for char in text]

  def decode(self, ids) -> str:
    out = []
    for i in ids:
      token = self.tokens[int(i)]
      if token == EOS:
        break
      if token not in (PAD, BOS):
        out.append(token)
    return ''.join(out)

