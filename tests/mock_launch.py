"""launch.py with TFDS's mock data in place of prepared datasets, as a user's command runs it:
python tests/mock_launch.py --config configs/vit_i1k.py:smoke --workdir W ... (launch.py's
flags). Every split of every dataset holds MOCK_EXAMPLES random records of the dataset's own
features (images of random sizes, labels of its ClassLabel): helpers.mock_tfds."""
import pathlib
import sys

from absl import app

from helpers import mock_tfds

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
import launch  # noqa: E402  (the repository root is on the path only now)

MOCK_EXAMPLES = 48

if __name__ == '__main__':
  with mock_tfds(MOCK_EXAMPLES):
    app.run(launch.main, flags_parser=launch.parse_flags)
