"""The reference DiT on CIFAR-10 at 32x32: samples at guidance 1, 2 and 4, scored by a ViT.

Two runs: the reference ViT (configs/vit_reference.py:epochs=3,recipe=basic) trained on the
real training images, the classifier of the scores; and the reference DiT
(configs/dit_reference.py: 4.2M parameters, patches of 4, learned sigma, images in [-1, 1])
for the budget a 2-core CPU allows (DIT, 4,800 steps at batch 64, about an hour alone: about 6
epochs, a small fraction of the paper's run; its samples show their class's colours and layout,
not yet objects), a checkpoint every 150 steps. Then, from the DiT's EMA
parameters: the held-out denoising loss by timestep quarter, the variational bound in bits per
dimension on BOUND_IMAGES test images at BOUND_STEPS timesteps (diffusion.bound_timesteps), and
for each guidance scale SAMPLES samples (DDIM, SAMPLE_STEPS steps, classes cycled) scored by
the ViT: accuracy against the class each was conditioned on, and the Fréchet distance between
the ViT's pre-logit features of the whole test split and of the samples (not FID: FID needs
Inception weights, image_scores says how to plug them in), with a grid image of each.

  python experiments/dit_cifar.py --quick
  nice -n 19 python experiments/dit_cifar.py --manual_dir DIR
  python experiments/dit_cifar.py --speed   # images/s of the trained DiT, DDPM-250 and DDIM-50

--dit_workdir W --vit_workdir W2 score runs trained elsewhere (launch.py) instead.

DIR holds CIFAR-10. Writes experiments/results/dit_cifar/: results.json, README.md,
grid_guidance_{1,2,4}.png and dit_cifar.png (the training curve, the held-out loss by timestep
quarter, the scores by guidance scale; `--plot_only` draws it again from results.json); from
--speed: speed.json.
"""
import dataclasses
import json
import os
import pathlib
import time

from absl import flags
import jax
import jax.numpy as jnp
from matplotlib.figure import Figure
import numpy as np
from PIL import Image

from transformer_jax import config_lib, image_scores, run as run_lib, sweep, train
from transformer_jax.models import dit
from transformer_jax.train import loop, setup
from transformer_jax.train.metrics import read_metrics

NAME = 'dit_cifar'
TITLE = 'The reference DiT on CIFAR-10: samples at guidance 1, 2 and 4, scored by a ViT'
CONFIGS = pathlib.Path(__file__).resolve().parent.parent / 'configs'
VIT = sweep.SweepRun('vit', arg='epochs=3,recipe=basic')
DIT_STEPS = 4_800
DIT = sweep.SweepRun('dit', arg=f'steps={DIT_STEPS}')
# The DiT's settings for a short run: batch 64, a higher constant rate after 100 warmup steps,
# every checkpoint kept for the trend (CHECKPOINTS_SCORED of them scored).
# The config's EMA of 0.9999 stays: its decay warms up (training.ema_warmup), so a run of any
# length samples an average of its own recent steps.
DIT_SETTINGS = {'data.batch_size': 64, 'optimizer.learning_rate': 3e-4,
                'optimizer.warmup_steps': 100,
                'training.checkpoint_every': 150, 'training.keep_checkpoints': DIT_STEPS // 150,
                'training.eval_every': DIT_STEPS,
                'training.log_every': 50, 'data.eval_steps': 2}
GUIDANCE = (1.0, 2.0, 4.0)
QUARTERS = ('[0, 250)', '[250, 500)', '[500, 750)', '[750, 1000)')  # of the 1,000 timesteps
SAMPLES, SAMPLE_STEPS, SAMPLER = 200, 50, 'ddim'
# The trend over training: at most CHECKPOINTS_SCORED of the DiT's checkpoints, evenly spaced,
# each scored on CHECKPOINT_SAMPLES samples at guidance CHECKPOINT_GUIDANCE.
CHECKPOINTS_SCORED, CHECKPOINT_SAMPLES, CHECKPOINT_GUIDANCE = 8, 100, 4.0
BOUND_IMAGES, BOUND_STEPS = 100, 50
SPEED_BATCH = 16
GRID_COLUMNS = 8
SPEEDS = (('ddpm', 250), ('ddim', 50))
QUICK_MODEL = {'model.image_size': 8, 'model.patch_size': 4, 'model.width': 16,
               'model.num_layers': 1, 'model.num_heads': 2, 'model.num_classes': 3,
               'data.name': 'synthetic', 'data.batch_size': 8, 'data.eval_batch_size': 8,
               'data.eval_steps': 2, 'data.augment': False,
               'data.pp_train': 'decode|value_range(-1, 1)',
               'data.pp_eval': 'decode|value_range(-1, 1)'}
QUICK_TRAIN = {'training.steps': 4, 'training.eval_every': 4, 'training.checkpoint_every': 4,
               'training.log_every': 2, 'optimizer.warmup_steps': 1}
_SPEED = flags.DEFINE_bool('speed', False, 'Only measure the sampling speed (images/s) of the '
                           "trained DiT, DDPM-250 and DDIM-50, into the results' speed.json.")
_DIT_DIR = flags.DEFINE_string('dit_workdir', None, 'Score this DiT run (its saved config and '
                               'latest checkpoint) instead of training one.')
_VIT_DIR = flags.DEFINE_string('vit_workdir', None, 'Score with this ViT run instead of '
                               'training one.')


@dataclasses.dataclass(frozen=True)
class Budget:
  samples: int
  sample_steps: int
  bound_images: int
  bound_steps: int
  checkpoint_samples: int


FULL, QUICK = (Budget(SAMPLES, SAMPLE_STEPS, BOUND_IMAGES, BOUND_STEPS, CHECKPOINT_SAMPLES),
               Budget(6, 3, 4, 3, 6))


def configs(quick: bool, data: dict):
  """make_config of the two runs: the ViT and the DiT (tiny on generated images with quick)."""
  def make(run: sweep.SweepRun):
    if run.name == 'vit':
      base = (QUICK_MODEL, QUICK_TRAIN) if quick else (data,)
      return sweep.config_for(run, CONFIGS / 'vit_reference.py', *base)
    base = ((QUICK_MODEL, QUICK_TRAIN) if quick
            else (DIT_SETTINGS, data))
    return sweep.config_for(run, CONFIGS / 'dit_reference.py', *base)
  return make


def restored(workdir: str):
  """(run, params, step) of the run in `workdir`, with the config it saved."""
  return train.restore_trained(config_lib.run_config(workdir), workdir)


def trained(quick: bool, workdir: str, data: dict) -> tuple[list[dict], dict]:
  """The two runs' records and workdirs: those of --dit_workdir and --vit_workdir, or the
  runs trained here (sweep.run_all) in workdir/vit and workdir/dit."""
  if _DIT_DIR.value and _VIT_DIR.value:
    dirs = {'vit': _VIT_DIR.value, 'dit': _DIT_DIR.value}
    return [{'name': name, **record(path)} for name, path in dirs.items()], dirs
  results = sweep.run_all([VIT, DIT], configs(quick, data), workdir)
  return results, {run.name: os.path.join(workdir, run.dirname) for run in (VIT, DIT)}


def record(run_dir: str) -> dict:
  """A run's last logged step, median images/s and training curve, from its metrics.jsonl."""
  rows = [row for row in read_metrics(run_dir) if 'examples_per_sec' in row]
  train_curve, _ = sweep.curves(run_dir)
  return {'steps': rows[-1]['step'], 'train_seconds': None,
          'examples_per_sec': float(np.median([row['examples_per_sec'] for row in rows[1:]])),
          'train_curve': [{k: row[k] for k in sweep.CURVE_KEYS if k in row}
                          for row in train_curve]}


def held_out_scores(run, params, budget: Budget) -> dict:
  """The held-out loss, by timestep quarter, and the bound in bits per dimension."""
  results = loop.evaluate_params(run, run.eval_step, params)
  images, labels = dit.held_out(run, budget.bound_images)
  bound = dit.bound_bpd(run.model, params, images, labels, steps=budget.bound_steps,
                        batch_size=run.data.eval_batch_size)
  return {**{k: v for k, v in results.items() if k.startswith('eval_loss')}, **bound}


@dataclasses.dataclass(frozen=True)
class RealImages:
  """The held-out images the samples are scored against, the classifier's features of them and
  its accuracy on them."""
  images: np.ndarray
  features: np.ndarray
  accuracy: float
  classifier: image_scores.Classifier

  def features_of(self, images: np.ndarray) -> np.ndarray:
    return self.features if images is self.images else self.classifier(images)[0]


def real_images(run, classifier) -> RealImages:
  images, labels = dit.held_out(run, run.data.info['num_eval_examples'])
  images = dit.to_uint8(images)
  features, predicted = classifier(images)
  return RealImages(images, features, float(np.mean(predicted == labels)), classifier)


def sample_scores(run, params, classifier, real: RealImages, budget: Budget,
                  results_dir: str) -> list[dict]:
  """Per guidance scale: samples drawn, scored by the classifier, a grid written."""
  rows = []
  for scale in GUIDANCE:
    wanted = dit.SampleSettings(num_samples=budget.samples, steps=budget.sample_steps,
                                sampler=SAMPLER, guidance_scale=scale)
    images, labels, scores = image_scores.draw_and_score(
        run, params, wanted, real.images, real.features_of, classifier)
    name = f'grid_guidance_{scale:g}'
    Image.fromarray(class_rows(images, labels)).save(os.path.join(results_dir, f'{name}.png'))
    rows.append({'guidance_scale': scale, 'grid': f'{name}.png', **scores})
  return rows


def evenly_spaced(steps: list[int], count: int) -> list[int]:
  """At most `count` of `steps`, evenly spaced, the first and the last among them."""
  if len(steps) <= count:
    return list(steps)
  return [steps[i] for i in sorted(set(np.linspace(0, len(steps) - 1, count).round().astype(int)))]


def checkpoint_scores(run, workdir: str, classifier, real: RealImages,
                      budget: Budget) -> list[dict]:
  """The trend over training: for evenly spaced checkpoints of the DiT in `workdir` (the weights
  it samples with), the held-out loss, and samples at guidance CHECKPOINT_GUIDANCE scored by the
  classifier."""
  wanted = dit.SampleSettings(num_samples=budget.checkpoint_samples, steps=budget.sample_steps,
                              sampler=SAMPLER, guidance_scale=CHECKPOINT_GUIDANCE)
  rows = []
  for step in evenly_spaced(setup.saved_steps(workdir), CHECKPOINTS_SCORED):
    params, _ = setup.saved_params(run, workdir, step)
    held_out = loop.evaluate_params(run, run.eval_step, params)
    _, _, scores = image_scores.draw_and_score(
        run, params, wanted, real.images, real.features_of, classifier)
    rows.append({'step': step, 'eval_loss': held_out['eval_loss'],
                 'sample_accuracy': scores['sample_accuracy'], 'sample_fd': scores['sample_fd']})
  return rows


def class_rows(images: np.ndarray, labels: np.ndarray) -> np.ndarray:
  """One row per class of its first GRID_COLUMNS samples (fewer where every class has fewer)."""
  classes = np.unique(labels)
  columns = min(GRID_COLUMNS, *(np.sum(labels == c) for c in classes))
  return np.concatenate([np.concatenate(list(images[labels == c][:columns]), axis=1)
                         for c in classes], axis=0)


def settings(result: dict) -> str:
  """The DiT's settings: this script's, or where the run was trained elsewhere, its own."""
  return str(DIT_SETTINGS) if result.get('train_seconds') else 'its settings below'


def minutes(result: dict) -> str:
  seconds = result.get('train_seconds')
  return f'{seconds / 60:.1f} min' if seconds else 'trained by launch.py, see below'


def report(command: str, results: list[dict], step: int, held_out: dict, vit_accuracy: float,
           rows: list[dict], trend: list[dict], budget: Budget) -> str:
  dit_run = next(r for r in results if r['name'] == 'dit')
  vit_run = next(r for r in results if r['name'] == 'vit')
  machine = sweep.machine()
  lines = [
      f'# {TITLE}', '', f'Command: `{command}`', '',
      f'Machine: {machine["cpu"]}, {machine["cores"]} cores, jax {machine["jax"]}. CIFAR-10 is a '
      'JPEG q75 copy, which costs the classifier about 2 to 3 points of accuracy against the '
      'original images.',
      '',
      f'The DiT (configs/dit_reference.py, {settings(dit_run)}) trained {step} steps '
      f'({minutes(dit_run)}, {dit_run["examples_per_sec"]:.1f} images/s median); the ViT '
      f'(configs/vit_reference.py:{VIT.arg}) {vit_run["steps"]} steps ({minutes(vit_run)}), '
      f'test accuracy {vit_accuracy:.2%} on the real test images.', '',
      '## Held-out', '',
      f'| loss | t in {" | ".join(QUARTERS)} | '
      f'bound (bits/dim, {budget.bound_images} images, {budget.bound_steps} timesteps) | '
      'prior | decoder |',
      '|---:|---:|---:|---:|---:|---:|---:|---:|',
      '| ' + ' | '.join(f'{held_out[k]:.4f}' for k in (
          'eval_loss', 'eval_loss_t0', 'eval_loss_t1', 'eval_loss_t2', 'eval_loss_t3', 'bpd',
          'bpd_prior', 'bpd_decoder')) + ' |', '',
      f'## Samples ({budget.samples} per scale, {SAMPLER.upper()}-{budget.sample_steps}, '
      'classes cycled)', '',
      '| guidance | ViT accuracy on the samples | Fréchet distance (ViT pre-logits) | grid |',
      '|---:|---:|---:|---|']
  for row in rows:
    lines.append(f'| {row["guidance_scale"]:g} | {row["sample_accuracy"]:.2%} | '
                 f'{row["sample_fd"]:.3f} | ![]({row["grid"]}) |')
  lines += ['', 'The distance is between the features of the whole test split and of the '
            f'{budget.samples} samples (a small set: the estimate is biased upward); it is not '
            'FID, which takes Inception-v3 features (see transformer_jax/image_scores.py).', '']
  lines += trend_table(trend, budget)
  shown = ['the DiT\'s training loss'] * bool(dit_run.get('train_curve')) + [
      'the held-out loss by timestep quarter', 'the ViT\'s accuracy on the samples (beside its '
      'accuracy on the real test images, and chance) and their Fréchet distance, by guidance '
      'scale']
  caption = '; '.join(shown)
  lines += [sweep.figure_markdown(NAME, caption[0].upper() + caption[1:] + '.'), '']
  return '\n'.join(lines)


def trend_table(trend: list[dict], budget: Budget) -> list[str]:
  lines = [f'## Over training ({len(trend)} checkpoints, {budget.checkpoint_samples} samples each '
           f'at guidance {CHECKPOINT_GUIDANCE:g}, {SAMPLER.upper()}-{budget.sample_steps})', '',
           '| step | held-out loss | ViT accuracy on the samples | Fréchet distance |',
           '|---:|---:|---:|---:|']
  lines += [f'| {row["step"]} | {row["eval_loss"]:.4f} | {row["sample_accuracy"]:.2%} | '
            f'{row["sample_fd"]:.3f} |' for row in trend]
  return lines + ['']


def run(quick: bool = False, workdir: str = f'/tmp/transformer_jax_experiments/{NAME}',
        results_dir: str | None = None, data: dict | None = None, command: str = '',
        vmap: bool = False) -> dict:
  del vmap
  results_dir = results_dir or f'{workdir}/results'
  os.makedirs(results_dir, exist_ok=True)
  results, dirs = trained(quick, workdir, data or {})
  if _DIT_DIR.value:  # where the runs lie means nothing elsewhere: placeholders
    command += ' --dit_workdir DIT_WORKDIR --vit_workdir VIT_WORKDIR'
  budget = QUICK if quick else FULL
  dit_run, params, step = restored(dirs['dit'])
  classifier = image_scores.load_classifier(dirs['vit'], train.restore_trained)
  held_out = held_out_scores(dit_run, params, budget)
  real = real_images(dit_run, classifier)
  vit_accuracy = real.accuracy
  rows = sample_scores(dit_run, params, classifier, real, budget, results_dir)
  trend = checkpoint_scores(dit_run, dirs['dit'], classifier, real, budget)
  return sweep.finish(TITLE, command, results,
                      lambda: report(command, results, step, held_out, vit_accuracy, rows, trend,
                                     budget),
                      figures, results_dir, quick, step=step, held_out=held_out,
                      vit_test_accuracy=vit_accuracy, samples=rows, checkpoints=trend)


def figures(payload: dict) -> dict[str, Figure]:
  """From results.json's content: the DiT's training loss (where its run's curve was kept), its
  held-out loss by timestep quarter, and the ViT's accuracy on the samples and their Fréchet
  distance by guidance scale."""
  dit_run = next(r for r in payload['runs'] if r['name'] == 'dit')
  curve = dit_run.get('train_curve') or []
  trend = payload.get('checkpoints') or []
  panels = 3 + bool(curve) + bool(trend)
  figure = Figure(figsize=(4.2 * panels, 3.8), layout='constrained')
  axes = list(figure.subplots(1, panels))
  held_out = payload['held_out']
  if curve:
    ax = axes.pop(0)
    ax.plot(*sweep.series(curve, 'loss'), color='#9ca3af', label='training (logged mean)')
    ax.plot([payload['step']], [held_out['eval_loss']], 'o', color='black', label='held-out')
    ax.set(xlabel='step', ylabel='denoising loss', yscale='log', title='Training the DiT')
    ax.legend(fontsize=8, frameon=False)
  ax = axes.pop(0)
  ax.bar(QUARTERS, [held_out[f'eval_loss_t{i}'] for i in range(len(QUARTERS))],
         color='#9ca3af')
  ax.tick_params(axis='x', labelsize=8)
  ax.axhline(held_out['eval_loss'], color='black', lw=1, ls='--', label='all timesteps')
  ax.set(xlabel='timestep t (0: least noise)', ylabel='held-out denoising loss',
         title=f'Held-out loss at step {payload["step"]}')
  ax.legend(fontsize=8, frameon=False)
  samples = payload['samples']
  scales = [row['guidance_scale'] for row in samples]
  accuracy_ax, distance_ax, *trend_axes = axes
  accuracy_ax.plot(scales, [row['sample_accuracy'] for row in samples], 'o-', color='#2563eb',
                   label='samples')
  accuracy_ax.axhline(payload['vit_test_accuracy'], color='#16a34a', ls='--',
                      label='real test images')
  accuracy_ax.axhline(1 / len(samples[0]['per_class']), color='grey', ls=':', label='chance')
  accuracy_ax.set(xlabel='guidance scale', ylabel='ViT accuracy', ylim=(0, 1), xticks=scales,
                  title='Samples classified as their class')
  accuracy_ax.legend(fontsize=8, frameon=False)
  distances = [row['sample_fd'] for row in samples]
  distance_ax.plot(scales, distances, 'o-', color='#dc2626')
  distance_ax.set(xlabel='guidance scale', ylabel='Fréchet distance (ViT pre-logits)',
                  xticks=scales, ylim=(0, 1.1 * max(distances)),
                  title='Samples against the test split')
  if trend:
    plot_trend(trend_axes[0], trend, 1 / len(samples[0]['per_class']))
  return {NAME: figure}


def plot_trend(ax, trend: list[dict], chance: float) -> None:
  """The Fréchet distance (left axis) and the ViT's accuracy (right axis) of each checkpoint's
  samples, against the step."""
  steps = [row['step'] for row in trend]
  distances = [row['sample_fd'] for row in trend]
  ax.plot(steps, distances, 'o-', color='#dc2626', label='Fréchet distance')
  ax.set(xlabel='step', ylabel='Fréchet distance (ViT pre-logits)', ylim=(0, 1.1 * max(distances)),
         title=f'Over training (guidance {CHECKPOINT_GUIDANCE:g})')
  accuracy_ax = ax.twinx()
  accuracy_ax.plot(steps, [row['sample_accuracy'] for row in trend], 's--', color='#2563eb',
                   label='ViT accuracy')
  accuracy_ax.axhline(chance, color='grey', ls=':', lw=1)
  accuracy_ax.set(ylabel='ViT accuracy on the samples', ylim=(0, 1))
  handles = ax.get_legend_handles_labels()[0] + accuracy_ax.get_legend_handles_labels()[0]
  ax.legend(handles=handles, fontsize=8, frameon=False, loc='upper center')


def speed(quick: bool, workdir: str, results_dir: str) -> dict:
  """Images/s of DDPM-250 and DDIM-50 (guidance 1) on a batch of SPEED_BATCH: one call of the
  program compiled beforehand, timed; with the load average at its end."""
  dit_run, params, _ = restored(_DIT_DIR.value or os.path.join(workdir, DIT.dirname))
  labels = jnp.arange(SPEED_BATCH) % dit_run.model_config.num_classes
  rows = []
  for sampler, steps in SPEEDS:
    wanted = dit.SampleSettings(sampler=sampler, steps=3 if quick else steps)
    draw = jax.jit(lambda p, y, key, wanted=wanted: dit.generate(dit_run.model, p, y, key,
                                                                 wanted))
    draw = draw.lower(params, labels, jax.random.key(0)).compile()
    start = time.time()
    jax.block_until_ready(draw(params, labels, jax.random.key(0)))
    seconds = time.time() - start
    rows.append({'sampler': sampler, 'steps': wanted.steps, 'batch': SPEED_BATCH,
                 'seconds': seconds, 'images_per_sec': SPEED_BATCH / seconds,
                 'load_average': os.getloadavg()[0]})
  os.makedirs(results_dir, exist_ok=True)
  pathlib.Path(results_dir, 'speed.json').write_text(json.dumps(rows, indent=1) + '\n')
  return {'speed': rows}


def main(argv=None):
  parsed = sweep.parse_flags(NAME, argv)
  if not _SPEED.value:
    sweep.main(NAME, run, argv, figures)
    return
  run_lib.configure_logging()
  print(json.dumps(speed(parsed['quick'], parsed['workdir'], parsed['results']), indent=1))


if __name__ == '__main__':
  main()
