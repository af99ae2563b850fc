"""Files and folders written whole or not at all: a reader never sees a part of one; the user's
cache, where such files are kept between runs."""
import json
import os
import pathlib
import shutil
from typing import Callable

__all__ = ['completed', 'user_cache', 'write_atomically']


def user_cache(name: str) -> str:
  """The folder `name` of the user's cache: $TRANSFORMER_JAX_CACHE/name, else
  ~/.cache/transformer_jax/name (tokenized corpora, XLA's memory figures)."""
  cache = os.environ.get('TRANSFORMER_JAX_CACHE', os.path.expanduser('~/.cache/transformer_jax'))
  return os.path.join(cache, name)


def write_atomically(path: pathlib.Path, text: str) -> None:
  """`path` holds all of `text` or what it held before, never a part."""
  partial = path.with_name(f'.{path.name}.{os.getpid()}.partial')
  partial.write_text(text, encoding='utf-8')
  os.replace(partial, path)


def completed(directory, write: Callable[[pathlib.Path], dict]) -> dict:
  """The info.json of `directory`, written first where the folder is not complete: write(folder)
  fills a temporary folder and returns its info, and the folder is renamed into place. An
  interrupted write leaves nothing that is read, and the next call redoes it; where another
  process finished the same folder first, theirs is kept."""
  directory = pathlib.Path(directory)
  if not (directory / 'info.json').is_file():
    partial = directory.with_name(f'.{directory.name}.{os.getpid()}.partial')
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
      info = write(partial)
    except BaseException:
      shutil.rmtree(partial, ignore_errors=True)
      raise
    (partial / 'info.json').write_text(json.dumps(info))
    try:
      os.rename(partial, directory)
    except OSError:  # another process finished it first: theirs is as good
      shutil.rmtree(partial, ignore_errors=True)
  return json.loads((directory / 'info.json').read_text())
