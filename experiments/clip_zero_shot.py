"""Zero-shot CIFAR-10 from a small CLIP trained on CIFAR-10's own images captioned by class name,
against a ViT of the same size trained supervised on the same images; CLIP's softmax loss
(Radford et al. 2021) against SigLIP's sigmoid loss (Zhai et al. 2023) at batch 32, 128 and 512.

The dual encoder is configs/clip_reference.py (image tower: width 64, 2 blocks, 4 heads, 8x8
patches of 32x32 images; causal text tower: width 64, 2 blocks; embedding 64). Its pairs are the
CIFAR-10 training images, each caption drawn per example from CAPTION_TEMPLATES filled with the
image's class name (data.captions='label'); each evaluation classifies the 10,000 test images
zero-shot against the prompts of ZERO_SHOT_TEMPLATES (class embeddings averaged over them, as
CLIP does). The supervised baseline is the ViT family at the image tower's sizes, trained at
batch 128 with a cross-entropy head on the same images, preprocessing and optimizer, and scored
on every test image.

What it measures: test accuracy against training images seen, to a plateau. Every run sees the
same images, EPOCHS epochs rounded down to 16 x 12,288 = 196,608 (a quarter epoch in whole steps
of the largest batch), so a smaller batch takes more steps (6,144 at 32, 384 at 512), each with
a tenth warmup and a cosine to 1% of the peak; every run evaluates after each 12,288 images, so
the 16 points of each curve lie at the same images seen for every batch size (the contrastive
loss depends on the batch: a batch of B pairs holds B - 1 negatives per image). The report
gives each run's final and best accuracy and, to tell a plateau from a curve still climbing, the
mean of its last quarter (4 evaluations) and its gain over that quarter. SigLIP's claim under
test: the sigmoid loss is the better one at small batches.

  python experiments/clip_zero_shot.py --quick
  nice -n 5 python experiments/clip_zero_shot.py --manual_dir DIR

Time on 2 CPU cores (an Intel Xeon): 33 min for the 7 runs, evaluations included, measured
with the project's test suite running beside the first six.

Writes experiments/results/clip_zero_shot/: results.json, README.md, clip_zero_shot_curves.png
(test accuracy against images seen, a panel per loss, a line per batch size) and
clip_zero_shot.png (the final accuracy against the batch size).
"""
import pathlib
import statistics

import matplotlib
from matplotlib.figure import Figure
from matplotlib.ticker import PercentFormatter

from transformer_jax import config_lib, sweep

NAME = 'clip_zero_shot'
CURVES = f'{NAME}_curves'
TITLE = 'Zero-shot CIFAR-10 from a small CLIP: softmax against sigmoid loss, by batch size'
ROOT = pathlib.Path(__file__).resolve().parent.parent
CLIP_CONFIG = ROOT / 'configs' / 'clip_reference.py'
VIT_CONFIG = ROOT / 'configs' / 'vit_cifar.py'
TRAIN_IMAGES = 50_000
CHANCE = 1 / 10  # CIFAR-10's ten classes
EPOCHS = 4
EVALS_PER_EPOCH = 4
BATCH_SIZES = (32, 128, 512)
VIT_BATCH_SIZE = 128
LOSSES = {'softmax': 'softmax (CLIP)', 'sigmoid': 'sigmoid (SigLIP)'}
CAPTION_TEMPLATES = ('a photo of a {}.', 'a blurry picture of the {}.', 'a close-up of a {}.',
                     'a small {} in the picture.', 'this is a {}', 'a cropped photo of the {}.',
                     'my {}.', 'a low resolution image of a {}.')
ZERO_SHOT_TEMPLATES = ('a photo of a {}.', 'a blurry photo of a {}.', 'a photo of the small {}.',
                       'a low resolution photo of the {}.')
PP_TRAIN = 'decode|random_crop(32, pad=4)|flip_lr|value_range(-1, 1)'
PP_EVAL = 'decode|value_range(-1, 1)'
TOWER = {'model.width': 64, 'model.num_layers': 2, 'model.num_heads': 4, 'model.d_ff': 256,
         'model.patch_size': 8, 'model.image_size': 32, 'model.mlp': 'quick_gelu',
         'model.dtype': 'float32'}
SHARED = {'data.name': 'cifar10', 'data.pp_train': PP_TRAIN, 'data.pp_eval': PP_EVAL,
          'data.eval_batch_size': 250, 'data.eval_steps': 8,
          'optimizer.learning_rate': 1e-3, 'optimizer.weight_decay': 0.1, 'optimizer.b2': 0.999,
          'optimizer.min_lr_ratio': 0.01, 'training.label_smoothing': 0.0}
CLIP = {'data.captions': 'label', 'data.caption_templates': CAPTION_TEMPLATES,
        'eval.zero_shot_dataset': 'cifar10', 'eval.zero_shot_templates': ZERO_SHOT_TEMPLATES}
# The ViT is scored on every test image, as the zero-shot classification is.
VIT = {**TOWER, 'model.num_classes': 10, 'data.mixup_alpha': 0.0, 'data.cutmix_alpha': 0.0,
       'data.eval_steps': -1}
QUICK = {'data.name': 'synthetic', 'data.pp_train': None, 'data.pp_eval': None,
         'data.eval_batch_size': 16, 'data.eval_steps': 1, 'data.eval_examples': 32,
         'eval.zero_shot_dataset': None, 'model.num_layers': 1}
QUICK_BATCH_SIZES = (8, 16)
QUICK_EVALS = 2


def batch_sizes(quick: bool) -> tuple[int, ...]:
  return QUICK_BATCH_SIZES if quick else BATCH_SIZES


def images_per_eval(quick: bool) -> int:
  """The training images between two evaluations: a quarter epoch rounded down to whole steps
  of the largest batch, so that every batch size evaluates after the same images (with --quick,
  one step of the largest batch)."""
  largest = max(batch_sizes(quick))
  return largest if quick else TRAIN_IMAGES // EVALS_PER_EPOCH // largest * largest


def schedule(batch_size: int, quick: bool) -> dict:
  """EPOCHS * EVALS_PER_EPOCH evaluations (QUICK_EVALS with --quick), the last at the last
  step, `images_per_eval` apart; a tenth of the steps warmup."""
  every, rest = divmod(images_per_eval(quick), batch_size)
  if rest:
    raise ValueError(f'Batch {batch_size} does not divide the {images_per_eval(quick)} images '
                     'between evaluations: choose batch sizes that divide the largest.')
  steps = every * (QUICK_EVALS if quick else EPOCHS * EVALS_PER_EPOCH)
  return {'data.batch_size': batch_size, 'training.steps': steps,
          'optimizer.warmup_steps': max(steps // 10, 1), 'training.log_every': max(every // 2, 1),
          'training.eval_every': every, 'training.checkpoint_every': steps}


def clip_runs(quick: bool) -> list[sweep.SweepRun]:
  return sweep.product(sweep.values('model.loss', tuple(LOSSES), 'loss'),
                       sweep.values('data.batch_size', batch_sizes(quick), 'batch'))


def vit_runs(quick: bool) -> list[sweep.SweepRun]:
  batch = max(QUICK_BATCH_SIZES) if quick else VIT_BATCH_SIZE
  return sweep.product(sweep.named({'vit': {}}), sweep.values('data.batch_size', (batch,),
                                                               'batch'))


def run(quick: bool = False, workdir: str = f'/tmp/transformer_jax_experiments/{NAME}',
        results_dir: str | None = None, data: dict | None = None,
        command: str = 'clip_zero_shot.run()', vmap: bool = False) -> dict:
  """Trains (or reads back) every run, writes the results folder, returns table and figures."""
  del vmap  # the runs differ in shapes: nothing to vmap
  quick_overrides = QUICK if quick else {}

  def config(run_, file, *own):
    batch = dict(run_.overrides)['data.batch_size']
    return sweep.config_for(run_, file, SHARED, *own, schedule(batch, quick), quick_overrides,
                            data or {})
  results = sweep.run_all(clip_runs(quick), lambda r: config(r, CLIP_CONFIG, TOWER, CLIP),
                          workdir)
  results += sweep.run_all(vit_runs(quick), lambda r: config(r, VIT_CONFIG, VIT), workdir)
  machine = sweep.machine()
  return sweep.finish(TITLE, command, results, lambda: report(results, command, machine),
                      figures, results_dir or f'{workdir}/results', quick, machine=machine)


def loss(result: dict) -> str | None:
  """The dual encoder's loss (None for the ViT)."""
  return result['overrides'].get('model.loss')


def is_vit(result: dict) -> bool:
  return loss(result) is None


def batch_size(result: dict) -> int:
  return result['overrides']['data.batch_size']


def accuracy_key(result: dict) -> str:
  """The test accuracy's metric: zero-shot for a dual encoder, the classifier's for the ViT."""
  return 'eval_accuracy' if is_vit(result) else 'eval_zero_shot_accuracy'


def final(result: dict, key: str):
  """A metric of the run's last evaluation (None where it has none)."""
  return result['eval_curve'][-1].get(key) if result['eval_curve'] else None


def accuracy(result: dict) -> float | None:
  return final(result, accuracy_key(result))


def curve(result: dict) -> tuple[list, list]:
  """(training images seen, test accuracy) at each of the run's evaluations."""
  steps, accuracies = sweep.series(result['eval_curve'], accuracy_key(result))
  return [step * batch_size(result) for step in steps], accuracies


def best(result: dict) -> tuple[float, int] | tuple[None, None]:
  """(the highest test accuracy of the run's evaluations, the images seen when it was reached;
  the first such evaluation)."""
  images, accuracies = curve(result)
  if not accuracies:
    return None, None
  top = max(accuracies)
  return top, images[accuracies.index(top)]


def last_quarter(result: dict) -> tuple[float, float] | tuple[None, None]:
  """(the mean test accuracy of the last quarter of the run's evaluations, the accuracy gained
  over that quarter: the last evaluation's less the one a quarter before it). None for a run
  with fewer than 4 evaluations."""
  accuracies = curve(result)[1]
  quarter = len(accuracies) // 4
  if not quarter:
    return None, None
  return (statistics.mean(accuracies[-quarter:]),
          accuracies[-1] - accuracies[-1 - quarter])


def _shown(value, form='{:.1%}') -> str:
  return '-' if value is None else form.format(value)


def _points(gain: float | None) -> str:
  """An accuracy difference in percentage points."""
  return '-' if gain is None else f'{100 * gain:+.1f} points'


def _epochs(images: int) -> str:
  return f'{images:,} images ({images / TRAIN_IMAGES:.2f} epochs)'


def report(results: list[dict], command: str, machine: dict) -> str:
  model = config_lib.from_file(CLIP_CONFIG).model
  images = max(r['steps'] * batch_size(r) for r in results)
  evaluations = max(len(curve(r)[0]) for r in results)
  loads = [r[key] for r in results for key in ('load_average_start', 'load_average_end')]
  lines = [
      f'# {TITLE}', '',
      f'configs/clip_reference.py (image tower: width {TOWER["model.width"]}, '
      f'{TOWER["model.num_layers"]} blocks, {TOWER["model.num_heads"]} heads, '
      f'{TOWER["model.patch_size"]}x{TOWER["model.patch_size"]} patches of '
      f'{TOWER["model.image_size"]}x{TOWER["model.image_size"]} images; causal text tower: width '
      f'{model.text_width}, {model.text_layers} blocks, character tokens; shared embedding '
      f'{model.embed_dim}) trained on the {TRAIN_IMAGES:,} CIFAR-10 training images, each '
      f'captioned per example by one of {len(CAPTION_TEMPLATES)} templates filled with its class '
      f'name ({", ".join(repr(t) for t in CAPTION_TEMPLATES[:3])}, ...), with the softmax loss '
      '(CLIP) or the sigmoid loss (SigLIP), for the same number of training images at every '
      f'batch size: {_epochs(images)}; {evaluations} evaluation{"s" * (evaluations != 1)} a run, '
      'at the same images seen for every batch size, each classifying the 10,000 test images '
      'zero-shot against class embeddings averaged over '
      f'{len(ZERO_SHOT_TEMPLATES)} prompts ({", ".join(repr(t) for t in ZERO_SHOT_TEMPLATES)}). '
      'The supervised baseline is a ViT of the image tower\'s sizes with a linear head, trained '
      'with the same preprocessing (padded random crop, flip), AdamW (peak '
      f'{SHARED["optimizer.learning_rate"]:g}, a tenth warmup, cosine to '
      f'{SHARED["optimizer.min_lr_ratio"]:.0%}, weight decay '
      f'{SHARED["optimizer.weight_decay"]:g}), training images and evaluation points, and scored '
      'on every test image. CIFAR-10 here is a JPEG q75 copy (about 2 to 3 points lower accuracy '
      'than the original images). Chance is '
      f'{CHANCE:.0%}. One seed per setting.', '',
      f'Command: `{command}`', '',
      f'Machine: {machine["cpu"]}, {machine["cores"]} cores (load average {min(loads):.1f} to '
      f'{max(loads):.1f} at the runs\' starts and ends), jax {machine["jax"]};'
      f' {sweep.machine_seconds(results) / 60:.1f} min of training and evaluation over '
      f'{len(results)} runs.', '',
      'Test top-1: zero-shot for the dual encoders, the classifier\'s for the ViT; best: the '
      'highest of the run\'s evaluations and the training images seen when it was reached.', '',
      '| run | batch | steps | test top-1 | top-5 | best top-1 (images seen) | held-out loss | '
      'final temperature | final bias | status |', '|---|---|---|---|---|---|---|---|---|---|']
  for r in results:
    top5 = final(r, 'eval_zero_shot_top5') or final(r, 'eval_top5_accuracy')
    top, seen = best(r)
    lines.append(
        f'| {r["name"]} | {batch_size(r)} | {r["steps"]} | {_shown(accuracy(r))} | '
        f'{_shown(top5)} | {_shown(top)}{"" if seen is None else f" ({seen:,})"} | '
        f'{_shown(r["eval_loss"], "{:.3f}")} | {_shown(final(r, "eval_temperature"), "{:.1f}")} |'
        f' {_shown(final(r, "eval_bias"), "{:.2f}")} | {r["status"]} |')
  lines += ['', '## What the recipe reaches', '', reaches(results), '',
            '| run | mean test top-1 over the last quarter | gain over the last quarter |',
            '|---|---|---|']
  for r in results:
    mean, gain = last_quarter(r)
    lines.append(f'| {r["name"]} | {_shown(mean)} | {_points(gain)} |')
  lines += ['', sweep.figure_markdown(CURVES, 'CIFAR-10 test accuracy against the training '
                                      'images seen: zero-shot for each loss and batch size, the '
                                      'supervised ViT dashed, chance dotted.'),
            '', sweep.figure_markdown(NAME, 'CIFAR-10 test accuracy against the batch size after '
                                      'the same number of training images: zero-shot for each '
                                      'loss, supervised for the ViT.')]
  return '\n'.join(lines) + '\n'


def reaches(results: list[dict]) -> str:
  """One paragraph from the results: the last quarter's mean accuracy of the best dual encoder
  and of the ViT, and how the last quarter's gains compare."""
  means = [(last_quarter(r)[0], r) for r in results if last_quarter(r)[0] is not None]
  scored = [(mean, r) for mean, r in means if not is_vit(r)]
  if not scored:
    return 'No dual encoder has the 4 evaluations a last quarter needs.'
  quarter = len(curve(scored[0][1])[1]) // 4
  mean, top = max(scored, key=lambda pair: pair[0])
  gains = [last_quarter(r)[1] for _, r in scored]
  text = (f'Mean of the last quarter of training (its last {quarter} evaluations): the best dual '
          f'encoder, {top["name"]}, reaches {mean:.1%} zero-shot top-1 (the dual encoders: '
          f'{min(scored, key=lambda pair: pair[0])[0]:.1%} to {mean:.1%})')
  for vit_mean, vit in means:
    if is_vit(vit):
      text += f'; the supervised {vit["name"]} {vit_mean:.1%}'
  return (f'{text}; chance {CHANCE:.0%}. Over that quarter the dual encoders\' top-1 moved by '
          f'{_points(min(gains))} to {_points(max(gains))} (the last evaluation\'s less the one '
          f'{quarter} before it).')


def _percent_axis(ax) -> None:
  ax.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
  ax.axhline(CHANCE, color='0.5', linestyle=':', linewidth=1, label=f'chance ({CHANCE:.0%})')


def curves_figure(results: list[dict]) -> Figure:
  """Test accuracy against the training images seen: a panel per loss, a colour per batch size,
  the supervised ViT dashed in both."""
  fig = Figure(figsize=(10, 4))
  axes = fig.subplots(1, len(LOSSES), sharey=True)
  sizes = sorted({batch_size(r) for r in results if not is_vit(r)})
  colours = {b: matplotlib.colormaps['viridis'](0.85 * i / max(len(sizes) - 1, 1))
             for i, b in enumerate(sizes)}
  # The dual encoders first, the ViT after them: the legend's order.
  ordered = sorted(results, key=lambda r: (is_vit(r), batch_size(r)))
  for ax, (panel, title) in zip(axes, LOSSES.items()):
    for r in ordered:
      images, accuracies = curve(r)
      epochs = [seen / TRAIN_IMAGES for seen in images]
      if is_vit(r):
        ax.plot(epochs, accuracies, color='k', linestyle='--', marker='.',
                label=f'supervised ViT, batch {batch_size(r)}')
      elif loss(r) == panel:
        ax.plot(epochs, accuracies, color=colours[batch_size(r)], marker='o', markersize=3,
                label=f'batch {batch_size(r)}')
    _percent_axis(ax)
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(f'training images seen (epochs of {TRAIN_IMAGES:,})')
    ax.legend(frameon=False, fontsize=8, loc='lower right')
  axes[0].set_ylabel('CIFAR-10 test top-1')
  fig.suptitle('CIFAR-10 test accuracy during training (the dual encoders zero-shot, the ViT '
               'supervised)', fontsize=10)
  return fig


def figure(results: list[dict]) -> Figure:
  """Test accuracy against the batch size: zero-shot per loss, and the supervised ViT."""
  fig = Figure(figsize=(5.5, 4))
  ax = fig.subplots()
  for group, label in {**LOSSES, None: 'supervised ViT'}.items():
    points = sorted((batch_size(r), accuracy(r)) for r in results
                    if loss(r) == group and accuracy(r) is not None)
    if points:
      ax.plot(*zip(*points), marker='o', label=label,
              **({'color': 'k', 'linestyle': '--'} if group is None else {}))
  _percent_axis(ax)
  ax.set_xscale('log', base=2)
  ax.set_xlabel('batch size')
  ax.set_ylabel('CIFAR-10 test top-1')
  ax.legend(frameon=False)
  fig.suptitle('CIFAR-10 test accuracy after the same number of training images\n(the dual '
               'encoders zero-shot, the ViT supervised)', fontsize=10)
  return fig


def figures(payload: dict) -> dict[str, Figure]:
  """From results.json's content: the accuracy against the images seen, and the final accuracy
  against the batch size."""
  return {CURVES: curves_figure(payload['runs']), NAME: figure(payload['runs'])}


def main(argv=None):
  sweep.main(NAME, run, argv, figures)


if __name__ == '__main__':
  main()
