"""The image-folder layout of torchvision's `ImageFolder` and of Hugging Face's `imagefolder`
(the datasets library's folder-based builder), read as an image-classification dataset: a folder
per split, in it a folder per class, the class folder's images (in subfolders too) its examples.

  DIR/train/<class>/<image>   DIR/<data.train_split> trains
  DIR/test/<class>/<image>    held out: DIR/<data.eval_split>; unset, DIR/test where there is
  DIR/validation/...          one, else DIR/validation (the rule of a TFDS dataset's splits, and
                              of an audiofolder's); neither: the last tenth of each class's
                              training images, by name

Class i is the i-th of the training folder's class folders in sorted order, torchvision's rule.
An image is a file whose extension is one of torchvision's (IMAGE_EXTENSIONS, any case); other
files and hidden ones are not read. A split's records take the classes in turn (the first image
of each class, then the second, ...), so that the first N held-out images, which an evaluation of
fewer than all of them reads, spread over the classes. Records are read by index, as the file's
bytes, which the `decode` op decodes, so memory does not grow with the folder.

Opening the folder checks, and refuses in one line naming the folder or file and the fix: a
DIR that is not a folder or holds no split folder; data.train_split or data.eval_split naming a
folder that is not there; split folders none of which is held out (a `dev` beside `train`); a
held-out class folder the training folder lacks; a class folder without images; an image whose
header Pillow cannot read (Image.open reads it without decoding the pixels).
"""
import logging
import os
import pathlib
import time

from PIL import Image, UnidentifiedImageError

from transformer_jax.data import sources
from transformer_jax.errors import ConfigError, UserError

__all__ = ['FolderSource', 'IMAGE_EXTENSIONS', 'open_folder']

log = logging.getLogger(__name__)

IMAGE_EXTENSIONS = ('.jpg', '.jpeg', '.png', '.ppm', '.bmp', '.pgm', '.tif', '.tiff', '.webp')
TRAIN = 'train'  # data.train_split's default
HELD_OUT = ('test', 'validation')  # data.eval_split unset: the first there is held out
LAYOUT = ('an image folder is DIR/train/<class>/<image> beside DIR/test/<class>/<image> (or '
          'DIR/validation/...), or DIR/train alone (the last tenth of each class held out)')


class FolderSource:
  """The images of a split, read like a TFDS data source: [i] -> {'image': the file's bytes,
  'label': its class}."""

  def __init__(self, paths: list[str], labels: list[int]):
    self.paths, self.labels = paths, labels

  def __len__(self) -> int:
    return len(self.paths)

  def __getitem__(self, index: int) -> dict:
    return {'image': pathlib.Path(self.paths[index]).read_bytes(), 'label': self.labels[index]}

  def __getitems__(self, indices: list[int]) -> list[dict]:
    return [self[index] for index in indices]


def open_folder(directory: str, *, train_split: str,
                eval_split: str | None) -> sources.ImageDataset:
  """The training and held-out images of the image folder `directory` (data.image_dir), each
  file's header checked; a UserError naming the first bad folder or file."""
  started = time.perf_counter()
  root = pathlib.Path(directory)
  if not root.is_dir():
    raise ConfigError(f'data.image_dir={directory} is not a folder: {LAYOUT}.')
  splits = _folders(root)
  for key, name in (('train_split', train_split), ('eval_split', eval_split)):
    if name is not None and name not in splits:
      raise ConfigError(f'data.{key}={name!r}: {root} has no split folder {name}; its folders: '
                        f'{", ".join(splits) or "none"} ({LAYOUT}).')
  held_name = eval_split or next(
      (name for name in HELD_OUT if name in splits and name != train_split), None)
  if held_name == train_split:
    raise ConfigError(f'data.eval_split={held_name!r} is the training folder too: hold out '
                      'another folder, or unset it to hold out a tenth of each class.')
  classes = _folders(root / train_split)
  if not classes:
    raise UserError(f'{root / train_split} has no class folders: {LAYOUT}.')
  train = [_images(root / train_split / name, label) for label, name in enumerate(classes)]
  if held_name is None:
    others = [name for name in splits if name != train_split]
    if others:
      raise ConfigError(f'{root} has the split folder {others[0]} beside {train_split}, and no '
                        f'{" or ".join(HELD_OUT)}: set data.eval_split={others[0]} to hold it out.')
    cut = [len(files) - max(1, len(files) // 10) for files in train]
    train, held_out = ([files[:c] for files, c in zip(train, cut)],
                       [files[c:] for files, c in zip(train, cut)])
    summary = f'{train_split}/ trains, the last tenth of each of its classes is held out'
  else:
    held_classes = _folders(root / held_name)
    unknown = sorted(set(held_classes) - set(classes))
    if unknown:
      raise UserError(f'{root / held_name / unknown[0]} is a class the training folder '
                      f'{root / train_split} lacks (its classes: {", ".join(classes)}): name '
                      'the held-out class folders as the training ones.')
    held_out = [_images(root / held_name / name, classes.index(name)) for name in held_classes]
    summary = f'{train_split}/ trains, {held_name}/ is held out'
  train, held_out = _source(train), _source(held_out)
  log.info('Image folder %s: %s; %d classes, %d training and %d held-out images, headers checked '
           'in %.2f s.', directory, summary, len(classes), len(train), len(held_out),
           time.perf_counter() - started)
  return sources.ImageDataset('imagefolder', train, held_out, len(classes),
                              (train_split, held_name or f'{train_split} (last tenth)'),
                              tuple(classes))


def _folders(folder: pathlib.Path) -> list[str]:
  """The sorted names of the folders in `folder`, hidden ones left out."""
  with os.scandir(folder) as entries:
    return sorted(entry.name for entry in entries
                  if entry.is_dir() and not entry.name.startswith('.'))


def _images(folder: pathlib.Path, label: int) -> list[tuple[str, int]]:
  """(path, label) of each image under `folder` (in subfolders too), sorted by path, each
  file's header read."""
  paths = sorted(str(path) for path in folder.rglob('*')
                 if path.suffix.lower() in IMAGE_EXTENSIONS and path.is_file()
                 and not any(part.startswith('.') for part in path.relative_to(folder).parts))
  if not paths:
    raise UserError(f'The class folder {folder} holds no images (files ending in '
                    f'{", ".join(IMAGE_EXTENSIONS)}): add its images, or remove the folder.')
  for path in paths:
    try:
      with Image.open(path):
        pass
    except (UnidentifiedImageError, OSError) as error:
      raise UserError(f'{path} is not an image Pillow reads ({error}): replace or remove '
                      'it.') from None
  return [(path, label) for path in paths]


def _source(classes: list[list[tuple[str, int]]]) -> FolderSource:
  """The images of every class, the classes in turn: by their rank in their class, then class."""
  ranked = sorted((rank, label, example) for label, files in enumerate(classes)
                  for rank, example in enumerate(files))
  examples = [example for _, _, example in ranked]
  return FolderSource([path for path, _ in examples], [label for _, label in examples])
