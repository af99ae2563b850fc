"""Character vocabularies: text <-> ids, with the special tokens each family needs."""
import dataclasses

__all__ = ['Vocab']

PAD, BOS, EOS, MASK = '<pad>', '<bos>', '<eos>', '<mask>'


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

  @classmethod
  def of_text(cls, text: str, mask: bool = False) -> 'Vocab':
    """The sorted characters of `text` from id 0 (the PyTorch reference's ids), then MASK where
    asked (so the ids below `mask_id` are exactly the characters)."""
    return cls(tuple(sorted(set(text))) + ((MASK,) if mask else ()))

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
