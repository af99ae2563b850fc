"""Zero-shot CIFAR-10 from a small CLIP trained on CIFAR-10's own images captioned by class name,
against a ViT of the same size trained supervised on the same images; CLIP's softmax loss
(Radford et al. 2021) against SigLIP's sigmoid loss (Zhai et al. 2023) at several batch sizes.

The dual encoder is configs/clip_reference.py (image tower: width 64, 2 blocks, 4 heads, 8x8
patches of 32x32 images; causal text tower: width 64, 2 blocks; embedding 64). Its pairs are the
CIFAR-10 training images, each caption drawn per example from CAPTION_TEMPLATES filled with the
image's class name (data.captions='label'); at the end it classifies the 10,000 test images
zero-shot against the prompts of ZERO_SHOT_TEMPLATES (class embeddings averaged over them, as
CLIP does). The supervised baseline is the ViT family at the image tower's sizes, trained with
a cross-entropy head on the same images, preprocessing, optimizer and steps. Every run sees the
same number of training images (EPOCHS epochs), so a smaller batch takes more steps. SigLIP's
claim under test: the sigmoid loss is the better one at small batches.

  python experiments/clip_zero_shot.py --quick
  nice -n 5 python experiments/clip_zero_shot.py --manual_dir DIR

Writes experiments/results/clip_zero_shot/: results.json, README.md and clip_zero_shot.png
(zero-shot accuracy against the batch size).
"""
import pathlib

from matplotlib.figure import Figure

from transformer_jax import sweep

NAME = 'clip_zero_shot'
TITLE = 'Zero-shot CIFAR-10 from a small CLIP: softmax against sigmoid loss, by batch size'
ROOT = pathlib.Path(__file__).resolve().parent.parent
CLIP_CONFIG = ROOT / 'configs' / 'clip_reference.py'
VIT_CONFIG = ROOT / 'configs' / 'vit_cifar.py'
TRAIN_IMAGES = 50_000
EPOCHS = 1.5
BATCH_SIZES = (32, 128, 256)
VIT_BATCH_SIZES = (32, 128)
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


def schedule(batch_size: int, quick: bool) -> dict:
  """The steps of EPOCHS epochs at `batch_size` (3 with --quick), a tenth of them warmup."""
  steps = 3 if quick else int(EPOCHS * TRAIN_IMAGES) // batch_size
  return {'data.batch_size': batch_size, 'training.steps': steps,
          'optimizer.warmup_steps': max(steps // 10, 1), 'training.log_every': max(steps // 20, 1),
          'training.eval_every': steps, 'training.checkpoint_every': steps}


def clip_runs(quick: bool) -> list[sweep.SweepRun]:
  return sweep.product(sweep.values('model.loss', ('softmax', 'sigmoid'), 'loss'),
                       sweep.values('data.batch_size',
                                    QUICK_BATCH_SIZES if quick else BATCH_SIZES, 'batch'))


def vit_runs(quick: bool) -> list[sweep.SweepRun]:
  return sweep.product(sweep.named({'vit': {}}), sweep.values(
      'data.batch_size', QUICK_BATCH_SIZES if quick else VIT_BATCH_SIZES, 'batch'))


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
  return sweep.finish(TITLE, command, results, lambda: report(results, command), figures,
                      results_dir or f'{workdir}/results', quick)


def final(result: dict, key: str):
  """A metric of the run's last evaluation (None where it has none)."""
  return result['eval_curve'][-1].get(key) if result['eval_curve'] else None


def accuracy(result: dict) -> float | None:
  """The test accuracy: zero-shot for a dual encoder, the classifier's for the ViT."""
  key = 'eval_accuracy' if result['name'].startswith('vit') else 'eval_zero_shot_accuracy'
  return final(result, key)


def _shown(value, form='{:.1%}') -> str:
  return '-' if value is None else form.format(value)


def report(results: list[dict], command: str) -> str:
  lines = [f'# {TITLE}', '',
           'configs/clip_reference.py (image tower: width 64, 2 blocks, 4 heads, 8x8 patches of '
           '32x32 images; causal text tower: width 64, 2 blocks, character tokens; shared '
           'embedding 64) trained on the 50,000 CIFAR-10 training images, each captioned per '
           f'example by one of {len(CAPTION_TEMPLATES)} templates filled with its class name '
           f'({", ".join(repr(t) for t in CAPTION_TEMPLATES[:3])}, ...), for {EPOCHS} epochs at '
           'every batch size; then zero-shot on the 10,000 test images against class embeddings '
           f'averaged over {len(ZERO_SHOT_TEMPLATES)} prompts '
           f'({", ".join(repr(t) for t in ZERO_SHOT_TEMPLATES)}). The supervised baseline is a '
           'ViT of the image tower\'s sizes with a linear head, trained on the same images with '
           'the same preprocessing (padded random crop, flip), AdamW (peak 1e-3, a tenth warmup, '
           'cosine to 1%, weight decay 0.1) and steps. CIFAR-10 here is a JPEG q75 copy (about 2 '
           'to 3 points lower accuracy than the original images).', '',
           f'Command: `{command}`', '',
           f'Machine: 2 shared CPU cores (other jobs ran at the same time), jax 0.10.2; '
           f'{sweep.machine_seconds(results) / 60:.1f} min of training over {len(results)} runs.',
           '', '| run | batch | steps | test accuracy | top-5 | held-out loss | final '
           'temperature | status |', '|---|---|---|---|---|---|---|---|']
  for r in results:
    batch = r['overrides']['data.batch_size']
    top5 = final(r, 'eval_zero_shot_top5') or final(r, 'eval_top5_accuracy')
    temperature = final(r, 'eval_temperature')
    lines.append(f'| {r["name"]} | {batch} | {r["steps"]} | {_shown(accuracy(r))} | '
                 f'{_shown(top5)} | {_shown(r["eval_loss"], "{:.3f}")} | '
                 f'{_shown(temperature, "{:.1f}")} | {r["status"]} |')
  lines += ['', sweep.figure_markdown(NAME, 'CIFAR-10 test accuracy against the batch size after '
                                      'the same number of training images: zero-shot for each '
                                      'loss, supervised for the ViT.')]
  return '\n'.join(lines) + '\n'


def figure(results: list[dict]) -> Figure:
  """Test accuracy against the batch size: zero-shot per loss, and the supervised ViT."""
  fig = Figure(figsize=(5.5, 4))
  ax = fig.subplots()
  groups = {'softmax (CLIP)': 'loss=softmax', 'sigmoid (SigLIP)': 'loss=sigmoid',
            'supervised ViT': 'vit'}
  for label, prefix in groups.items():
    points = sorted((r['overrides']['data.batch_size'], accuracy(r)) for r in results
                    if r['name'].startswith(prefix) and accuracy(r) is not None)
    if points:
      ax.plot(*zip(*points), marker='o', label=label)
  ax.set_xscale('log', base=2)
  ax.set_xlabel('batch size')
  ax.set_ylabel('CIFAR-10 test accuracy')
  ax.legend(frameon=False)
  fig.suptitle('CIFAR-10 test accuracy after the same number of training images\n(the dual '
               'encoders zero-shot, the ViT supervised)', fontsize=10)
  return fig


def figures(payload: dict) -> dict[str, Figure]:
  """From results.json's content: the accuracy against the batch size."""
  return {NAME: figure(payload['runs'])}


def main(argv=None):
  sweep.main(NAME, run, argv, figures)


if __name__ == '__main__':
  main()
