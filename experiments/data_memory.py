"""Resident memory of a run that streams its images from disk, for datasets of two sizes.

  python experiments/data_memory.py --data_dir /tmp/synthetic_tfds --workdir /tmp/data_memory
Prepares synthetic_images/png32_50000 and png32_500000 (experiments/image_datasets.py: 32x32
PNG images in array_record, a builder of this script's own; a few minutes for the larger one),
trains the reference ViT (configs/vit_reference.py, batch 128) for --steps steps on each through
launch.py in a fresh process, evaluating once on the 1,000 test images, and prints that
process's peak resident memory (ru_maxrss) beside the dataset's size on disk. A benchmark, not a
test: it prints figures.
"""
import json
import pathlib
import sys

from absl import app, flags

import image_datasets
from peak_memory import peak_rss_mib

ROOT = pathlib.Path(__file__).resolve().parent.parent
_DATA_DIR = flags.DEFINE_string('data_dir', None, 'Where to prepare the synthetic datasets.',
                                required=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Parent of the runs\' workdirs.', required=True)
_SIZES = flags.DEFINE_list('sizes', ['50000', '500000'], 'Training images of each dataset.')
_STEPS = flags.DEFINE_integer('steps', 200, 'Training steps of each run.')


def main(argv):
  del argv
  rows = []
  for size in map(int, _SIZES.value):
    name = image_datasets.prepare(f'png32_{size}', _DATA_DIR.value)
    files = (pathlib.Path(_DATA_DIR.value) / name).rglob('*-train.array_record-*')
    disk = sum(path.stat().st_size for path in files) / 2**20
    workdir = pathlib.Path(_WORKDIR.value) / f'png32_{size}'
    if workdir.exists():  # a resumed run would measure nothing
      raise app.UsageError(f'{workdir} exists: give a new --workdir.')
    command = [sys.executable, str(ROOT / 'launch.py'), f'--config={ROOT}/configs/vit_reference.py',
               f'--workdir={workdir}', f'--config.data.name={name}',
               f'--config.data.tfds_data_dir={_DATA_DIR.value}',
               f'--config.training.steps={_STEPS.value}', '--config.optimizer.warmup_steps=10',
               f'--config.training.eval_every={_STEPS.value}',
               f'--config.training.checkpoint_every={_STEPS.value}',
               '--config.data.eval_batch_size=500']
    rss = peak_rss_mib(command)
    rows.append({'train_images': size, 'disk_mib': round(disk, 1), 'peak_rss_mib': round(rss, 1)})
    print(json.dumps(rows[-1]), flush=True)
  print('| training images | on disk | peak resident memory of the run |')
  print('|---:|---:|---:|')
  for row in rows:
    print(f'| {row["train_images"]:,} | {row["disk_mib"]:,.0f} MiB | '
          f'{row["peak_rss_mib"]:,.0f} MiB |')


if __name__ == '__main__':
  app.run(main)
