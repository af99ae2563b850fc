"""A checkpoint's tokenizer.json as the vocabulary `decode.sample_text` takes."""
import pathlib

import tokenizers

from transformer_jax.convert.directory import read_config

__all__ = ['Tokenizer']


class Tokenizer:
  """Text <-> ids with the `tokenizers` package (no transformers): `encode` adds the special
  tokens HF's tokenizer adds to a prompt (LLaMA's BOS), `decode` drops them. `eos_id`, where
  generation stops, is config.json's eos_token_id (the first, where it lists several)."""

  def __init__(self, path):
    file = pathlib.Path(path) / 'tokenizer.json'
    if not file.is_file():
      raise FileNotFoundError(f'{file} does not exist: sampling text needs the checkpoint\'s '
                              'tokenizer.json (save_pretrained of its fast tokenizer writes it).')
    self._tokenizer = tokenizers.Tokenizer.from_file(str(file))
    eos = read_config(path).get('eos_token_id')
    self.eos_id = eos[0] if isinstance(eos, list) else eos

  @property
  def size(self) -> int:
    return self._tokenizer.get_vocab_size()

  def encode(self, text: str) -> list[int]:
    return self._tokenizer.encode(text).ids

  def decode(self, ids) -> str:
    return self._tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)
