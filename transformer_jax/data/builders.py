"""The project's own TFDS builders: CIFAR-10 and TinyShakespeare prepared without TensorFlow.

TFDS's stock `cifar10` and `tiny_shakespeare` builders need TensorFlow to prepare (tf.io.gfile,
tf.image.encode_png). These write the same features and splits as the stock ones, in array_record,
with numpy and Pillow only, so one reader serves both. They register under names of their own,
`transformer_jax_cifar10` and `transformer_jax_tiny_shakespeare`: registering the stock names
would clash with TFDS's registry, and a JPEG copy written as `cifar10` into a shared data dir
would pass for the real dataset. `sources` reads a stock-prepared dataset first.
"""
import io
import tarfile

from etils import epath
import numpy as np
from PIL import Image
import tensorflow_datasets as tfds

__all__ = [
    'binary_images', 'CIFAR10_BINARY', 'CIFAR10_CLASSES', 'CIFAR10_JPEG', 'CIFAR10_URL',
    'find_cifar10_binary', 'find_cifar10_jpeg', 'find_shakespeare', 'jpeg_images',
    'SHAKESPEARE_FILE', 'SHAKESPEARE_URL', 'SPLITS', 'stock_splits', 'TransformerJaxCifar10',
    'TransformerJaxTinyShakespeare']

CIFAR10_CLASSES = ('airplane', 'automobile', 'bird', 'cat', 'deer', 'dog', 'frog', 'horse', 'ship',
                   'truck')
CIFAR10_URL = 'https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz'
CIFAR10_BINARY = 'cifar-10-binary.tar.gz'
CIFAR10_JPEG = 'cifar10-jpeg-q75.tar.gz'
SHAKESPEARE_URL = ('https://raw.githubusercontent.com/karpathy/char-rnn/master/data/'
                   'tinyshakespeare/input.txt')
SHAKESPEARE_FILE = 'input.txt'
SPLITS = ('train', 'test')
# The binary archive's members: 10,000 records of one label byte and 3,072 pixel bytes each.
_BINARY_MEMBERS = {'train': [f'cifar-10-batches-bin/data_batch_{i}.bin' for i in range(1, 6)],
                   'test': ['cifar-10-batches-bin/test_batch.bin']}
_UrlInfo = tfds.download.checksums.UrlInfo


def find_cifar10_binary(manual_dir) -> epath.Path | None:
  """The official archive cifar-10-binary.tar.gz in `manual_dir`, if there."""
  path = manual_dir and epath.Path(manual_dir) / CIFAR10_BINARY
  return path if path and path.exists() else None


def find_cifar10_jpeg(manual_dir) -> epath.Path | None:
  """`manual_dir` itself where it holds the layout train/<class>/*.jpg and test/<class>/*.jpg
  for every class, else the archive cifar10-jpeg-q75.tar.gz in it, if there."""
  if not manual_dir:
    return None
  root = epath.Path(manual_dir)
  if all((root / split / name).is_dir() for split in SPLITS for name in CIFAR10_CLASSES):
    return root
  archive = root / CIFAR10_JPEG
  return archive if archive.exists() else None


def find_shakespeare(manual_dir) -> epath.Path | None:
  path = manual_dir and epath.Path(manual_dir) / SHAKESPEARE_FILE
  return path if path and path.exists() else None


def _optional_manual_dir(dl_manager) -> epath.Path | None:
  """The manual dir, or None where none was given or it is empty (TFDS asserts on both)."""
  try:
    return dl_manager.manual_dir
  except AssertionError:
    return None


class TransformerJaxCifar10(tfds.core.GeneratorBasedBuilder):
  """CIFAR-10 with the stock features (id, image, label) and splits (train 50,000, test 10,000).

  Config `original`: the official binary archive, from the manual dir or else downloaded, parsed
  with numpy (never unpickled). Config `jpeg_q75`: a JPEG quality-75 copy from the manual dir;
  not bit-exact, it costs about 2 to 3 points of test accuracy, and its name says so wherever
  it is prepared.
  """
  VERSION = tfds.core.Version('1.0.0')
  BUILDER_CONFIGS = [
      tfds.core.BuilderConfig(name='original', description='The official binary archive.'),
      tfds.core.BuilderConfig(name='jpeg_q75', description=(
          'A JPEG quality-75 copy: not bit-exact, about 2 to 3 points lower test accuracy.')),
  ]
  MANUAL_DOWNLOAD_INSTRUCTIONS = f"""
      Config `original`: put the official {CIFAR10_BINARY} ({CIFAR10_URL}) in the manual dir.
      Config `jpeg_q75`: put the layout train/<class>/NNNN.jpg and test/<class>/NNNN.jpg in the
      manual dir, or the archive {CIFAR10_JPEG} holding it; classes in label order:
      {' '.join(CIFAR10_CLASSES)}."""
  # Checks a download; the manual archive is found by name instead (see _split_generators).
  url_infos = {CIFAR10_URL: _UrlInfo(
      size=170052171, filename=None,
      checksum='c4a38c50a1bc5f3a1c5537f2155ab9d68f9f25eb1ed8d9ddda3db29a59bca1dd')}

  def _info(self):
    return tfds.core.DatasetInfo(
        builder=self,
        description=self.builder_config.description,
        features=tfds.features.FeaturesDict({
            'id': tfds.features.Text(),
            'image': tfds.features.Image(shape=(32, 32, 3)),
            'label': tfds.features.ClassLabel(names=CIFAR10_CLASSES),
        }),
        supervised_keys=('image', 'label'),
        homepage='https://www.cs.toronto.edu/~kriz/cifar.html',
    )

  def _split_generators(self, dl_manager):
    if self.builder_config.name == 'original':
      source = (find_cifar10_binary(_optional_manual_dir(dl_manager))
                or dl_manager.download(CIFAR10_URL))
    else:
      source = find_cifar10_jpeg(dl_manager.manual_dir)
      if source is None:
        raise FileNotFoundError(f'No CIFAR-10 JPEG layout in {dl_manager.manual_dir}:'
                                f'{self.MANUAL_DOWNLOAD_INSTRUCTIONS}')
    return {split: self._generate_examples(source, split) for split in SPLITS}

  def _generate_examples(self, source, split):
    read = binary_images if self.builder_config.name == 'original' else jpeg_images
    for example_id, image, label in read(epath.Path(source), split):
      yield example_id, {'id': example_id, 'image': image, 'label': label}


def binary_images(archive: epath.Path, split: str):
  """(id, PIL image, label) of `split` in the official binary archive, in the archive's order."""
  with archive.open('rb') as file, tarfile.open(fileobj=file) as tar:
    index = 0
    for member in _BINARY_MEMBERS[split]:
      records = np.frombuffer(tar.extractfile(member).read(), np.uint8).reshape(-1, 1 + 3 * 32 * 32)
      images = records[:, 1:].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)  # planes -> HWC
      for label, image in zip(records[:, 0], images):
        yield f'{split}_{index:05d}', Image.fromarray(image), int(label)
        index += 1


def jpeg_images(source: epath.Path, split: str):
  """(path, PIL image, label) of `split` in the JPEG layout, a directory or a .tar.gz of it."""
  for name, data in (_layout_files(source, split) if source.is_dir()
                     else _archive_files(source, split)):
    image = Image.open(io.BytesIO(data)).convert('RGB')
    if image.size != (32, 32):
      raise ValueError(f'{name} in {source} is {image.size[0]}x{image.size[1]}, not 32x32.')
    yield name, image, CIFAR10_CLASSES.index(name.split('/')[1])


def _layout_files(root: epath.Path, split: str):
  for name in CIFAR10_CLASSES:
    for path in sorted((root / split / name).glob('*.jpg')):
      yield f'{split}/{name}/{path.name}', path.read_bytes()


def _archive_files(archive: epath.Path, split: str):
  """Members <split>/<class>/<file>.jpg, under any leading folders, in the archive's order."""
  with archive.open('rb') as file, tarfile.open(fileobj=file) as tar:
    for member in tar:
      parts = member.name.split('/')[-3:]
      if (member.isfile() and len(parts) == 3 and parts[0] == split
          and parts[1] in CIFAR10_CLASSES and parts[2].endswith('.jpg')):
        yield '/'.join(parts), tar.extractfile(member).read()


class TransformerJaxTinyShakespeare(tfds.core.GeneratorBasedBuilder):
  """TinyShakespeare with the stock feature (`text`) and splits: train is the first 90% of the
  characters (the reference character LM's training text), validation and test the next 5%
  each."""
  VERSION = tfds.core.Version('1.0.0')
  MANUAL_DOWNLOAD_INSTRUCTIONS = f'Put {SHAKESPEARE_FILE} ({SHAKESPEARE_URL}) in the manual dir.'
  url_infos = {SHAKESPEARE_URL: _UrlInfo(
      size=1115394, filename=None,
      checksum='86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed')}

  def _info(self):
    return tfds.core.DatasetInfo(
        builder=self,
        features=tfds.features.FeaturesDict({'text': tfds.features.Text()}),
        homepage='https://github.com/karpathy/char-rnn/blob/master/data/tinyshakespeare/input.txt',
    )

  def _split_generators(self, dl_manager):
    path = (find_shakespeare(_optional_manual_dir(dl_manager))
            or dl_manager.download(SHAKESPEARE_URL))
    text = epath.Path(path).read_bytes().decode('utf-8')  # bytes: newlines stay as they are
    return {split: self._generate_examples(split, part)
            for split, part in zip(('train', 'validation', 'test'), stock_splits(text))}

  def _generate_examples(self, split, text):
    yield split, {'text': text}


def stock_splits(text: str) -> tuple[str, str, str]:
  """The stock builder's 90/5/5 split of the characters."""
  train_end = int(len(text) * 0.9)
  rest = text[train_end:]
  validation_end = int(len(rest) * 0.5)
  return text[:train_end], rest[:validation_end], rest[validation_end:]
