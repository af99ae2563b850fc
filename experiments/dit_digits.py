"""A small DiT on handwritten digits: class-conditional samples that a classifier recognises.

The data: scikit-learn's 1,797 8x8 digits (sklearn.datasets.load_digits, 17 grey levels, shipped
inside the package: nothing is downloaded), written as grey PNGs into an image folder,
DIR/train/<digit>/NNNN.png and DIR/test/<digit>/NNNN.png (every fifth image held out: 1,437 and
360), which both runs read as any user's folder (data.name=imagefolder), upsampled to 16x16 by
their preprocessing.

Two runs: a ViT (configs/vit_reference.py at 16x16 in patches of 4, VIT_SETTINGS) trained on
the real training images, the classifier of the scores; and the DiT of configs/dit_digits.py,
whose evaluations during training score DURING samples (DDIM-50, guidance 4) with that
classifier, so that the curve of their accuracy and Fréchet distance shows the trend. Then, from
the DiT's EMA at the last step: the held-out loss by timestep quarter, and for each sampler
(DDIM-50, DDPM-250) and guidance scale (1, 4) SAMPLES samples, classes cycled, scored by the
ViT: the share it puts in the class each was conditioned on, and the Fréchet distance between
the ViT's pre-logit features of the held-out images and of the samples, beside the same
distance for SAMPLES real training images (real against real: the floor at that count). Not
FID: FID needs Inception weights (transformer_jax/image_scores.py says how to plug them in).

  python experiments/dit_digits.py --quick
  nice -n 5 python experiments/dit_digits.py
  python experiments/dit_digits.py --folder_only --image_dir DIR   # only write the folder

--image_dir (default WORKDIR/digits) is where the folder is written, or read where it already
holds the digits. Writes experiments/results/dit_digits/: results.json, README.md,
dit_digits.png (the training curves, the held-out loss by quarter, the scores by guidance and
sampler) and samples.png (the held-out images and each sampler's and scale's samples, one row
per digit); `--plot_only` draws both again from results.json.
"""
import base64
import dataclasses
import io
import os
import pathlib
import shutil
import uuid

from absl import flags
from matplotlib.figure import Figure
import numpy as np
from PIL import Image

from transformer_jax import config_lib, image_scores, sweep, train
from transformer_jax.models import dit

NAME = 'dit_digits'
TITLE = 'A small DiT on handwritten digits: class-conditional samples a classifier recognises'
CONFIGS = pathlib.Path(__file__).resolve().parent.parent / 'configs'
PREPROCESS = 'decode|resize(16)|value_range(-1, 1)'
VIT = sweep.SweepRun('vit', arg='recipe=basic')
DIT = sweep.SweepRun('dit')
VIT_STEPS = 1_000
# The reference ViT at 16x16: 16 patches of 4; random crops of the padded image (a digit shifted
# by up to 2 pixels), no flip; its cosine schedule over VIT_STEPS (about 90 epochs).
VIT_SETTINGS = {'model.image_size': 16, 'model.patch_size': 4, 'training.steps': VIT_STEPS,
                'optimizer.warmup_steps': 100, 'training.eval_every': VIT_STEPS // 4,
                'training.checkpoint_every': VIT_STEPS, 'training.log_every': 100,
                'data.pp_train': 'decode|resize(16)|random_crop(16, pad=2)|value_range(-1, 1)',
                'data.pp_eval': PREPROCESS, 'data.eval_batch_size': 360}
DURING = 100  # samples each of the DiT's evaluations scores
DIT_SETTINGS = {'sample.num_samples': DURING, 'sample.sampler': 'ddim', 'sample.steps': 50,
                'sample.guidance_scale': 4.0}
EVALUATIONS = 8  # of the DiT during training
SAMPLERS = (('ddim', 50), ('ddpm', 250))
GUIDANCE = (1.0, 4.0)
QUARTERS = ('[0, 250)', '[250, 500)', '[500, 750)', '[750, 1000)')  # of the 1,000 timesteps
SAMPLES = 200  # per sampler and scale: 20 per class
GRID_COLUMNS = 8
HELD_OUT_EVERY = 5  # every fifth digit is held out
CLASSES = 10
QUICK_MODEL = {'model.width': 16, 'model.num_layers': 1, 'model.num_heads': 2,
               'data.batch_size': 8, 'data.eval_batch_size': 8, 'data.eval_steps': 1}
QUICK_TRAIN = {'training.steps': 4, 'training.eval_every': 4, 'training.checkpoint_every': 4,
               'training.log_every': 2, 'optimizer.warmup_steps': 1}
QUICK_SAMPLES = {'sample.num_samples': CLASSES, 'sample.steps': 3}
_IMAGE_DIR = flags.DEFINE_string('image_dir', None, 'The image folder of the digits: written '
                                 'there unless it already holds them. Default: WORKDIR/digits.')
_FOLDER_ONLY = flags.DEFINE_bool('folder_only', False, 'Only write the image folder.')


@dataclasses.dataclass(frozen=True)
class Budget:
  samples: int
  steps: dict  # sampler -> respaced steps


FULL, QUICK = Budget(SAMPLES, dict(SAMPLERS)), Budget(2 * CLASSES, {'ddim': 3, 'ddpm': 3})


def write_digits(folder: str) -> str:
  """scikit-learn's digits as grey PNGs in an image folder, DIR/train/<digit>/NNNN.png and
  DIR/test/<digit>/NNNN.png (NNNN: the index in load_digits; every HELD_OUT_EVERY-th held
  out), levels 0..16 scaled to 0..255. Written under another name and renamed whole; a folder
  already there is kept."""
  from sklearn.datasets import load_digits  # pylint: disable=import-outside-toplevel
  if os.path.isdir(folder):
    return folder
  digits = load_digits()
  partial = f'{folder}.{uuid.uuid4().hex}.partial'
  try:
    for index, (pixels, label) in enumerate(zip(digits.images, digits.target)):
      split = 'test' if index % HELD_OUT_EVERY == 0 else 'train'
      path = pathlib.Path(partial, split, str(label), f'{index:04d}.png')
      path.parent.mkdir(parents=True, exist_ok=True)
      Image.fromarray(np.rint(pixels * 255 / 16).astype(np.uint8), mode='L').save(path)
    os.rename(partial, folder)
  finally:
    shutil.rmtree(partial, ignore_errors=True)
  return folder


def configs(quick: bool, image_dir: str, vit_dir: str):
  """make_config of the two runs; the DiT's evaluations score samples with the ViT of vit_dir."""
  folder = {'data.name': 'imagefolder', 'data.image_dir': image_dir}

  def make(run: sweep.SweepRun):
    tiny = (QUICK_MODEL, QUICK_TRAIN) if quick else ()
    if run.name == 'vit':
      return sweep.config_for(run, CONFIGS / 'vit_reference.py', VIT_SETTINGS, folder, *tiny)
    dit_settings = {**DIT_SETTINGS, 'eval.sample_classifier': vit_dir}
    if not quick:
      dit_settings['training.eval_every'] = (
          config_lib.from_file(CONFIGS / 'dit_digits.py').training.steps // EVALUATIONS)
    return sweep.config_for(run, CONFIGS / 'dit_digits.py', dit_settings, folder, *tiny,
                            QUICK_SAMPLES if quick else {})
  return make


def encoded(image: np.ndarray) -> str:
  """A uint8 image as a base64 PNG: how results.json keeps the grids that samples.png shows."""
  buffer = io.BytesIO()
  Image.fromarray(image).save(buffer, format='PNG')
  return base64.b64encode(buffer.getvalue()).decode('ascii')


def decoded(text: str) -> np.ndarray:
  return np.asarray(Image.open(io.BytesIO(base64.b64decode(text))))


def class_rows(images: np.ndarray, labels: np.ndarray) -> dict:
  """{'grid_png': one row per class of its first GRID_COLUMNS images (fewer where a class has
  fewer), 'grid_classes': the class of each row}."""
  classes = np.unique(labels)
  columns = min(GRID_COLUMNS, *(np.sum(labels == c) for c in classes))
  grid = np.concatenate([np.concatenate(list(images[labels == c][:columns]), axis=1)
                         for c in classes], axis=0)
  return {'grid_png': encoded(grid), 'grid_classes': classes.tolist()}


def real_images(run, count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """uint8 (all held-out images, their labels, the first `count` training images), each as
  the run preprocesses its held-out images (data.pp_eval)."""
  images, labels = dit.held_out(run, run.data.info['num_eval_examples'])
  task = run.data.task
  train_images = np.stack([task.pp_eval(record['image'], None)
                           for record in task.train.__getitems__(list(range(count)))])
  return dit.to_uint8(images), labels, dit.to_uint8(train_images)


def sample_scores(run, params, classifier, budget: Budget) -> tuple[list[dict], dict]:
  """Per sampler and guidance scale: samples drawn, scored, their grid; and the scores of real
  training images against the held-out ones (real against real), with the held-out grid."""
  real, real_labels, train_images = real_images(run, budget.samples)
  real_features = classifier(real)[0]
  features = lambda images: real_features if images is real else classifier(images)[0]
  reference = {'real_fd': image_scores.score_samples(train_images, None, real, features)[
                   'sample_fd'],
               'held_out_accuracy': float(np.mean(classifier(real)[1] == real_labels)),
               'held_out_images': len(real), 'train_images': len(train_images),
               **class_rows(real, real_labels)}
  rows = []
  for sampler, _ in SAMPLERS:
    for scale in GUIDANCE:
      wanted = dit.SampleSettings(num_samples=budget.samples, steps=budget.steps[sampler],
                                  sampler=sampler, guidance_scale=scale)
      images, labels, scores = image_scores.draw_and_score(run, params, wanted, real, features,
                                                           classifier)
      rows.append({'sampler': sampler, 'steps': wanted.steps, 'guidance_scale': scale,
                   **class_rows(images, labels), **scores})
  return rows, reference


def percent(value: float) -> str:
  return f'{value:.1%}'


def report(command: str, payload: dict) -> str:
  vit_run, dit_run = (next(r for r in payload['runs'] if r['name'] == name)
                      for name in ('vit', 'dit'))
  held_out, reference = payload['held_out'], payload['reference']
  during = payload['during']
  lines = [
      f'# {TITLE}', '', f'Command: `{command}`', '',
      f'Machine: {payload["machine"]["cpu"]}, {payload["machine"]["cores"]} cores, shared with '
      'other jobs (load average '
      f'{dit_run["load_average_start"]:.1f} when the DiT started, {dit_run["load_average_end"]:.1f}'
      f' when it ended, {payload["machine"]["load_average_end"]:.1f} after sampling), jax '
      f'{payload["machine"]["jax"]}.', '',
      'Data: scikit-learn\'s 1,797 8x8 digits as an image folder (data.name=imagefolder), '
      f'1,437 training and 360 held-out images (every {HELD_OUT_EVERY}th), upsampled to 16x16.',
      '',
      f'The DiT (configs/dit_digits.py, {dit_run["steps"]} steps, '
      f'{dit_run["train_seconds"] / 60:.1f} min with its {EVALUATIONS} evaluations, '
      f'{dit_run["examples_per_sec"]:.0f} images/s median); the ViT classifier '
      f'(configs/vit_reference.py:{VIT.arg} with {VIT_SETTINGS}) {vit_run["steps"]} steps '
      f'({vit_run["train_seconds"] / 60:.1f} min), {percent(reference["held_out_accuracy"])} '
      f'on the {reference["held_out_images"]} held-out images.', '',
      f'## Held-out loss by timestep quarter (the EMA at step {payload["step"]})', '',
      f'| all | t in {" | ".join(QUARTERS)} |', '|---:|---:|---:|---:|---:|',
      '| ' + ' | '.join(f'{held_out[k]:.4f}' for k in (
          'eval_loss', 'eval_loss_t0', 'eval_loss_t1', 'eval_loss_t2', 'eval_loss_t3')) + ' |',
      '', f'## Samples ({payload["budget"]["samples"]} per row, classes cycled)', '',
      '| sampler | guidance | ViT accuracy | Fréchet distance (ViT pre-logits) | seconds |',
      '|---|---:|---:|---:|---:|']
  for row in payload['samples']:
    lines.append(f'| {row["sampler"].upper()}-{row["steps"]} | {row["guidance_scale"]:g} | '
                 f'{percent(row["sample_accuracy"])} | {row["sample_fd"]:.2f} | '
                 f'{row["sample_seconds"]:.0f} |')
  lines += [
      f'| real training images | - | - | {reference["real_fd"]:.2f} | - |', '',
      f'Chance is {percent(1 / CLASSES)}. The distances are between the features of the '
      f'{reference["held_out_images"]} held-out images and of {reference["train_images"]} '
      'images (samples, or real training images: the floor at that count); not FID, which '
      'takes Inception-v3 features.', '',
      'Accuracy per digit (DDPM-250 and DDIM-50 at guidance 4 and 1):', '',
      '| sampler | guidance | ' + ' | '.join(str(c) for c in range(CLASSES)) + ' |',
      '|---|---:|' + '---:|' * CLASSES]
  for row in payload['samples']:
    # Keyed by int when fresh, by str once read back from results.json.
    per_class = {int(c): accuracy for c, accuracy in row['per_class'].items()}
    lines.append(f'| {row["sampler"].upper()}-{row["steps"]} | {row["guidance_scale"]:g} | '
                 + ' | '.join(f'{per_class[c]:.0%}' if c in per_class else '-'
                              for c in range(CLASSES)) + ' |')
  evaluations = [r for r in dit_run['eval_curve'] if 'eval_sample_accuracy' in r]
  lines += ['', f'## During training ({during["samples"]} samples, {during["sampler"].upper()}-'
            f'{during["steps"]}, guidance {during["guidance_scale"]:g}, at each evaluation)', '',
            '| step | held-out loss | ViT accuracy | Fréchet distance |', '|---:|---:|---:|---:|']
  lines += [f'| {r["step"]} | {r["eval_loss"]:.4f} | {percent(r["eval_sample_accuracy"])} | '
            f'{r["eval_sample_fd"]:.2f} |' for r in evaluations]
  lines += ['', sweep.figure_markdown(
      NAME, 'The training loss and the held-out loss by timestep quarter over training; the '
      'held-out loss by quarter at the last step; the samples\' ViT accuracy and Fréchet '
      'distance over training, and at the end by guidance scale for each sampler (beside '
      'chance, the ViT\'s accuracy on the held-out images and the real-against-real '
      'distance).'), '',
      sweep.figure_markdown('samples', 'Held-out images and samples of each sampler and guidance '
                            f'scale, one row per digit (0 at the top), the first {GRID_COLUMNS} '
                            'of each.'), '']
  return '\n'.join(lines)


def plotted_grid(ax, grid: dict, title: str) -> None:
  """A class_rows grid, each row labelled with its class."""
  image, classes = decoded(grid['grid_png']), grid['grid_classes']
  ax.imshow(image, interpolation='nearest')
  height = image.shape[0] / len(classes)
  ax.set_yticks([(row + 0.5) * height for row in range(len(classes))], map(str, classes))
  ax.set_xticks([])
  ax.set_title(title, fontsize=9)


def figures(payload: dict) -> dict[str, Figure]:
  """From results.json's content: dit_digits (curves and scores) and samples (the grids)."""
  dit_run = next(r for r in payload['runs'] if r['name'] == 'dit')
  reference, samples = payload['reference'], payload['samples']
  figure = Figure(figsize=(13.5, 7.6), layout='constrained')
  (curve_ax, quarter_ax, during_ax), (fd_during_ax, accuracy_ax, distance_ax) = figure.subplots(
      2, 3)
  curve_ax.plot(*sweep.series(dit_run['train_curve'], 'loss'), color='#9ca3af',
                label='training (logged mean)')
  colours = ('#1d4ed8', '#0891b2', '#16a34a', '#ca8a04')
  for i, (quarter, colour) in enumerate(zip(QUARTERS, colours)):
    curve_ax.plot(*sweep.series(dit_run['eval_curve'], f'eval_loss_t{i}'), 'o-', ms=3,
                  color=colour, label=f'held-out, t in {quarter}')
  curve_ax.set(xlabel='step', ylabel='denoising loss', yscale='log', title='Training the DiT')
  curve_ax.legend(fontsize=7, frameon=False)
  held_out = payload['held_out']
  quarter_ax.bar(QUARTERS, [held_out[f'eval_loss_t{i}'] for i in range(len(QUARTERS))],
                 color='#9ca3af')
  quarter_ax.axhline(held_out['eval_loss'], color='black', lw=1, ls='--', label='all timesteps')
  quarter_ax.tick_params(axis='x', labelsize=8)
  quarter_ax.set(xlabel='timestep t (0: least noise)', ylabel='held-out denoising loss',
                 title=f'Held-out loss at step {payload["step"]}')
  quarter_ax.legend(fontsize=8, frameon=False)
  during = payload['during']
  label = f'{during["sampler"].upper()}-{during["steps"]}, guidance {during["guidance_scale"]:g}'
  during_ax.plot(*sweep.series(dit_run['eval_curve'], 'eval_sample_accuracy'), 'o-',
                 color='#2563eb', label=label)
  fd_during_ax.plot(*sweep.series(dit_run['eval_curve'], 'eval_sample_fd'), 'o-',
                    color='#dc2626', label=label)
  for ax in (during_ax, accuracy_ax):
    ax.axhline(reference['held_out_accuracy'], color='#16a34a', ls='--',
               label='held-out images')
    ax.axhline(1 / CLASSES, color='grey', ls=':', label='chance')
    ax.set(ylabel='ViT accuracy', ylim=(0, 1.02))
  for ax in (fd_during_ax, distance_ax):
    ax.axhline(reference['real_fd'], color='#16a34a', ls='--', label='real training images')
    ax.set(ylabel='Fréchet distance (ViT pre-logits)', yscale='log')
  during_ax.set(xlabel='step', title=f'Samples classified as their class ({during["samples"]})')
  fd_during_ax.set(xlabel='step', title='Samples against the held-out images')
  for sampler, marker in (('ddim', 'o-'), ('ddpm', 's--')):
    rows = [row for row in samples if row['sampler'] == sampler]
    name = f'{sampler.upper()}-{rows[0]["steps"]}'
    scales = [row['guidance_scale'] for row in rows]
    accuracy_ax.plot(scales, [row['sample_accuracy'] for row in rows], marker, label=name)
    distance_ax.plot(scales, [row['sample_fd'] for row in rows], marker, label=name)
  for ax in (accuracy_ax, distance_ax):
    ax.set(xlabel='guidance scale', xticks=GUIDANCE)
  accuracy_ax.set_title(f'At step {payload["step"]} ({payload["budget"]["samples"]} samples)')
  distance_ax.set_title(f'At step {payload["step"]}')
  for ax in (during_ax, fd_during_ax, accuracy_ax, distance_ax):
    ax.legend(fontsize=7, frameon=False)
  grids = Figure(figsize=(2.1 * (1 + len(samples)), 3.2), layout='constrained')
  axes = grids.subplots(1, 1 + len(samples))
  plotted_grid(axes[0], reference, 'held-out images')
  for ax, row in zip(axes[1:], samples):
    plotted_grid(ax, row, f'{row["sampler"].upper()}-{row["steps"]}, guidance '
                 f'{row["guidance_scale"]:g}\n{percent(row["sample_accuracy"])} recognised')
  return {NAME: figure, 'samples': grids}


def run(quick: bool = False, workdir: str = f'/tmp/transformer_jax_experiments/{NAME}',
        results_dir: str | None = None, data: dict | None = None, command: str = '',
        vmap: bool = False) -> dict:
  del data, vmap  # the data is the folder this script writes
  results_dir = results_dir or f'{workdir}/results'
  image_dir = write_digits(_IMAGE_DIR.value or os.path.join(workdir, 'digits'))
  if _FOLDER_ONLY.value:
    return {'image_dir': image_dir}
  if _IMAGE_DIR.value:  # where the folder lies means nothing elsewhere: a placeholder
    command = command.replace(_IMAGE_DIR.value, 'DIR')
  dirs = {run.name: os.path.join(workdir, run.dirname) for run in (VIT, DIT)}
  results = sweep.run_all([VIT, DIT], configs(quick, image_dir, dirs['vit']), workdir)
  budget = QUICK if quick else FULL
  dit_run, params, step = train.restore_trained(config_lib.run_config(dirs['dit']), dirs['dit'])
  classifier = image_scores.load_classifier(dirs['vit'], train.restore_trained)
  rows, reference = sample_scores(dit_run, params, classifier, budget)
  held_out = next(r for r in results if r['name'] == 'dit')['eval_curve'][-1]
  sample = dit_run.settings.sample
  payload = {
      'step': step, 'held_out': held_out, 'reference': reference, 'samples': rows,
      'budget': dataclasses.asdict(budget),
      'during': {'samples': sample.num_samples, 'sampler': sample.sampler, 'steps': sample.steps,
                 'guidance_scale': sample.guidance_scale},
      'machine': {**sweep.machine(), 'load_average_end': os.getloadavg()[0]}}
  return sweep.finish(TITLE, command, results, lambda: report(command, {'runs': results,
                                                                        **payload}),
                      figures, results_dir, quick, **payload)


def main(argv=None):
  sweep.main(NAME, run, argv, figures)


if __name__ == '__main__':
  main()
