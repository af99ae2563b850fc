"""A corpus tokenized once into files on disk, memory-mapped and read by index.

`tokenized(corpus, tokenizer, root)` writes `root/NAME-SPLIT-KEY/` with `tokens.bin` (the ids of
every document one after another, uint16 where the vocabulary fits, else uint32), `starts.bin`
(int64: where each document starts, then the total) and `info.json`. KEY hashes the corpus's
identity, the tokenizer's fingerprint, the special tokens put around each document and the
FORMAT, so a changed file, tokenizer or encoding never reuses stale tokens. The folder is
written under a temporary name and renamed when complete: an interrupted tokenization leaves
nothing that is read, and is redone. Memory holds one chunk of documents, and a packing of the
documents (data.packing) is written beside them in the same way.
"""
import hashlib
import json
import logging
import pathlib
import time

import numpy as np

from transformer_jax.data import files
from transformer_jax.data.corpus import Corpus
from transformer_jax.errors import ConfigError

__all__ = ['default_root', 'TokenFile', 'tokenized']

log = logging.getLogger(__name__)

# Bumped when the layout or the encoding changes, so old folders are never misread. 3: the
# documents without the special tokens of a tokenizer.json's post-processor.
FORMAT = 3
_CHUNK = 1024  # documents tokenized at a time (in parallel by the tokenizers package)


def default_root() -> str:
  """$TRANSFORMER_JAX_CACHE/tokens, else ~/.cache/transformer_jax/tokens."""
  return files.user_cache('tokens')


class TokenFile:
  """The tokens of one tokenized split: `tokens` (memory-mapped), `starts` (num_documents + 1)."""

  def __init__(self, directory):
    self.directory = pathlib.Path(directory)
    self.info = json.loads((self.directory / 'info.json').read_text())
    self.tokens = np.memmap(self.directory / 'tokens.bin', dtype=self.info['dtype'], mode='r',
                            shape=(self.info['num_tokens'],))
    self.starts = np.memmap(self.directory / 'starts.bin', dtype=np.int64, mode='r',
                            shape=(self.info['num_documents'] + 1,))

  @property
  def num_documents(self) -> int:
    return len(self.starts) - 1

  def __len__(self) -> int:
    return len(self.tokens)


def _dtype(vocab_size: int):
  return np.uint16 if vocab_size <= np.iinfo(np.uint16).max + 1 else np.uint32


def _key(corpus: Corpus, tokenizer, separator: int | None, bos: int | None) -> str:
  described = json.dumps({'format': FORMAT, 'corpus': corpus.identity, 'separator': separator,
                          'bos': bos, 'tokenizer': tokenizer.fingerprint}, sort_keys=True)
  return hashlib.sha256(described.encode()).hexdigest()[:16]


def tokenized(corpus: Corpus, tokenizer, root, separator: int | None,
              bos: int | None = None) -> TokenFile:
  """The token file of `corpus` with `tokenizer` under `root`, tokenizing it first where no
  complete one exists. Each document is its text's ids (`tokenizer.encode`: no special token of
  the tokenizer's own) after `bos` and before `separator` (None: nothing)."""
  key = _key(corpus, tokenizer, separator, bos)
  name = corpus.name.replace('/', '_')  # a TFDS config: wiki40b/en
  directory = pathlib.Path(root) / f'{name}-{corpus.split}-{key}'
  files.completed(directory, lambda folder: _write(corpus, tokenizer, folder, separator, bos))
  return TokenFile(directory)


def _write(corpus: Corpus, tokenizer, directory: pathlib.Path, separator: int | None,
           bos: int | None) -> dict:
  dtype = _dtype(tokenizer.size)
  before, after = ([] if token is None else [token] for token in (bos, separator))
  encode = getattr(tokenizer, 'encode_batch', lambda texts: [tokenizer.encode(t) for t in texts])
  documents, total, num_bytes, began, shown = 0, 0, 0, time.monotonic(), time.monotonic()
  with open(directory / 'tokens.bin', 'wb') as out, open(directory / 'starts.bin', 'wb') as at:
    at.write(np.zeros(1, np.int64).tobytes())
    for texts in _chunks(corpus.documents()):
      lengths = []
      for ids in encode(texts):
        ids = np.asarray(before + ids + after, dtype)
        out.write(ids.tobytes())
        lengths.append(len(ids))
      at.write((total + np.cumsum(lengths, dtype=np.int64)).tobytes())
      total, documents = total + sum(lengths), documents + len(texts)
      num_bytes += sum(len(text.encode('utf-8')) for text in texts)
      if time.monotonic() - shown > 10:
        shown = time.monotonic()
        _log_progress(corpus, documents, total, num_bytes, shown - began)
  if num_bytes == 0:
    raise ConfigError(f'The {corpus.split} split of {corpus.name} holds no text: give a corpus '
                      'with documents (data.path, data.eval_path, data.train_split, ...).')
  _log_progress(corpus, documents, total, num_bytes, time.monotonic() - began)
  return {'dtype': np.dtype(dtype).name, 'num_tokens': total, 'num_documents': documents,
          'num_bytes': num_bytes, 'corpus': corpus.identity, 'tokenizer': tokenizer.fingerprint,
          'seconds': round(time.monotonic() - began, 3)}


def _chunks(documents):
  chunk = []
  for document in documents:
    chunk.append(document)
    if len(chunk) == _CHUNK:
      yield chunk
      chunk = []
  if chunk:
    yield chunk


def _log_progress(corpus: Corpus, documents: int, tokens: int, num_bytes: int, seconds: float):
  seconds = max(seconds, 1e-9)
  log.info('Tokenized %s/%s: %d documents, %d tokens, %.1f MB of text (%.2f MB/s, %.0f '
           'tokens/s).', corpus.name, corpus.split, documents, tokens, num_bytes / 1e6,
           num_bytes / 1e6 / seconds, tokens / seconds)
