"""Patch-size sweep of a ViT on CIFAR-10, and the position-grid resize of Dosovitskiy et al. 2020.

Patch sizes 2, 4, 8 and 16 at a fixed width (64), depth (4 blocks) and head count (4): the blocks
of configs/vit_cifar.py (pre-LN, GELU, learned positions, [CLS]) narrowed so that patch size 2
(257 tokens) fits a CPU budget. Every run sees the same training images (the same seed, order
and augmentation; AdamW, cosine schedule with a 10% warmup, label smoothing 0.1). For each
size: tokens, parameters and FLOPs per image from the accounting module (the attention matrices
separately), images per second measured by the training loop, the compiled train step's memory
from XLA's memory analysis, and accuracy on the 10,000 test images.

The resize: the patch-4 model, trained on 32x32 images, evaluated on the test images upsampled
bilinearly to 64x64 (a 16x16 grid of patches, 257 tokens). Its 8x8 grid of learned positions no
longer fits; with the resize (transformer_jax.models.vit.resize_positions: bicubic, [CLS] row
kept) against two ways of doing without: dropping the patch positions (zeros; [CLS] kept), or the
old 65 rows first and zeros after (a table loaded as far as it goes).

The CIFAR-10 copy on this machine is JPEG q75: accuracies are about 2 to 3 points lower than on
the original images.

  python experiments/patch_sweep.py --quick
  nice -n 19 python experiments/patch_sweep.py \\
      --manual_dir DIR --tfds_data_dir TFDS_DIR

Writes experiments/results/patch_sweep/: results.json, README.md and the plots accuracy against
patch size, FLOPs against tokens, accuracy against FLOPs, and the resize.
"""
import os
import pathlib

import jax
import jax.numpy as jnp
import matplotlib.ticker
import numpy as np
from matplotlib.figure import Figure

from transformer_jax import accounting, config_lib, models, sweep, train
from transformer_jax.models import vit
from transformer_jax.train import loop, sharding, step as step_lib

NAME = 'patch_sweep'
TITLE = 'Patch-size sweep: ViT on CIFAR-10'
CONFIG = pathlib.Path(__file__).resolve().parent.parent / 'configs' / 'vit_cifar.py'
PATCHES = (2, 4, 8, 16)
STEPS = 200  # of batch 128: 25,600 training images, about half an epoch
# The crop-and-flip recipe (configs/vit_cifar.py:recipe=basic): a strong augmentation would
# only slow learning at this budget.
BASIC = {f'data.{key}': value for key, value in
         config_lib.from_file(CONFIG, 'recipe=basic').data.items()
         if key in ('pp_train', 'mixup_alpha', 'cutmix_alpha')}
FULL = {**BASIC, 'model.width': 64, 'model.num_layers': 4, 'model.num_heads': 4,
        'optimizer.warmup_steps': STEPS // 10, 'training.steps': STEPS,
        'training.log_every': 10, 'training.eval_every': STEPS,
        'training.checkpoint_every': STEPS, 'data.eval_batch_size': 400}
QUICK = {'data.name': 'synthetic', 'model.image_size': 16,
         'data.pp_train': None, 'data.pp_eval': None,
         'model.width': 32, 'model.num_layers': 1, 'data.batch_size': 16,
         'data.eval_batch_size': 16, 'data.eval_steps': 2, 'optimizer.warmup_steps': 2,
         'training.steps': 6, 'training.log_every': 2, 'training.eval_every': 6,
         'training.checkpoint_every': 6}
QUICK_PATCHES = (2, 4, 8)
RESIZE_PATCH = 4  # the run whose position grid is resized
JPEG_NOTE = ('CIFAR-10 here is a JPEG q75 copy of the test and train images: accuracies are '
             'about 2 to 3 points lower than on the original images.')


def sweep_runs(quick: bool) -> list[sweep.SweepRun]:
  return sweep.values('model.patch_size', QUICK_PATCHES if quick else PATCHES, 'patch')


def run_config(spec: sweep.SweepRun, quick: bool = False, data: dict | None = None):
  """The config of one run of the sweep; `data`: where the dataset comes from."""
  return sweep.config_for(spec, CONFIG, FULL, QUICK if quick else {}, data or {})


def run(quick: bool = False, workdir: str = f'/tmp/transformer_jax_experiments/{NAME}',
        results_dir: str | None = None, data: dict | None = None,
        command: str = 'patch_sweep.run()', vmap: bool = False) -> dict:
  """Trains (or reads back) every run, measures, resizes, writes the results folder."""
  make_config = lambda r: run_config(r, quick, data)
  runs = sweep_runs(quick)
  results = sweep.run_all(runs, make_config, workdir, vmap=vmap)
  for r, spec in zip(results, runs):
    config = make_config(spec)
    r.update(costs(config), step_memory_bytes=step_memory(config))
  resize_run = next(s for s in runs if dict(s.overrides)['model.patch_size'] == RESIZE_PATCH)
  config = make_config(resize_run)
  resize = resize_accuracies(config, f'{workdir}/{resize_run.dirname}',
                             2 * config.model.image_size)
  return sweep.finish(TITLE, command, results, lambda: report(results, resize, command), figures,
                      results_dir or f'{workdir}/results', quick, resize=resize)


def costs(config) -> dict:
  """Tokens, parameters and forward FLOPs per image, from the accounting module."""
  cfg = models.model_config(config.model)
  flops = accounting.forward_flops(cfg)
  return {'width': cfg.width, 'blocks': cfg.num_layers, 'heads': cfg.num_heads,
          'batch_size': config.data.batch_size,
          'tokens': vit.num_tokens(cfg), 'params': accounting.param_counts(cfg)['total'],
          'forward_flops': flops['total'], 'attention_flops': flops['attention'],
          'dense_flops': flops['dense'], 'training_flops_per_image': 3 * flops['total'],
          'training_images': config.training.steps * config.data.batch_size}


def step_memory(config) -> int:
  """Bytes the compiled train step needs: arguments + outputs + temporaries, less the donated
  (aliased) state, from XLA's memory analysis of the step the training loop compiles."""
  run = train.build_run(config)
  step = run.train_step
  batch = sharding.global_batch(run.data.train_batch(0), run.mesh)
  stats = step.lower(run.abstract_state, batch).compile().memory_analysis()
  return int(stats.argument_size_in_bytes + stats.output_size_in_bytes
             + stats.temp_size_in_bytes - stats.alias_size_in_bytes)


def position_variants(params, cfg, image_size: int) -> dict[str, dict]:
  """The trained parameters for `image_size` images: the grid resized, and two ways without."""
  pos = params['pos_embed']
  prefix = int(cfg.pool == 'cls')
  rows = prefix + (image_size // cfg.patch_size) ** 2
  return {
      'resized grid (bicubic)': vit.resize_positions(params, image_size, cfg),
      'no resize: patch positions dropped': {**params, 'pos_embed': jnp.concatenate(
          [pos[:prefix], jnp.zeros((rows - prefix, pos.shape[1]), pos.dtype)])},
      'no resize: old rows first, zeros after': {**params, 'pos_embed': jnp.concatenate(
          [pos, jnp.zeros((rows - pos.shape[0], pos.shape[1]), pos.dtype)])},
  }


def resize_accuracies(config, workdir: str, image_size: int) -> dict:
  """Test accuracy at the training resolution and, on upsampled images, per position table."""
  run, trained, _ = train.restore_trained(config, workdir)
  family = run.family
  native = loop.evaluate_params(run, step_lib.make_eval_step(
      run.model, family, run.mesh, run.state_sharding.params), trained)
  larger = config.model.copy_and_resolve_references()
  larger.image_size = image_size
  eval_step = step_lib.make_eval_step(models.build(larger), family, run.mesh,
                                      run.state_sharding.params)
  upsample = jax.jit(lambda images: jax.image.resize(
      images, (images.shape[0], image_size, image_size, images.shape[3]), 'bilinear'),
                     out_shardings=sharding.batch_sharding(run.mesh))
  upsampled_step = lambda params, batch: eval_step(
      params, {**batch, 'image': upsample(batch['image'])})
  out = {'train_size': config.model.image_size, 'eval_size': image_size,
         'data_source': run.data.info['source'],
         'accuracy': {f'{config.model.image_size}x{config.model.image_size} (as trained)':
                      native['eval_accuracy']}}
  for name, params in position_variants(trained, run.model_config, image_size).items():
    params = jax.device_put(params, run.state_sharding.params)
    metrics = loop.evaluate_params(run, upsampled_step, params)
    out['accuracy'][f'{image_size}x{image_size}, {name}'] = metrics['eval_accuracy']
  return out


def report(results: list[dict], resize: dict, command: str) -> str:
  r0 = results[0]
  lines = [f'# {TITLE}', '',
           f'Width {r0["width"]}, {r0["blocks"]} blocks, {r0["heads"]} heads, [CLS] token, pre-LN; '
           f'{r0["steps"]} steps of batch {r0["batch_size"]} ({r0["training_images"]:,} training '
           'images, the same for every patch size).', '',
           f'**{JPEG_NOTE}**' if 'jpeg' in resize['data_source'] else
           f'Images: {resize["data_source"]}.', '',
           f'Command: `{command}`', '',
           f'Machine time: {sweep.machine_seconds(results) / 60:.1f} min of training and '
           f'evaluation over {len(results)} runs (the memory analysis and the resize evaluation '
           'not counted).',
           '', '| patch | tokens | parameters | forward GFLOPs / image | attention matrices | '
           'images / s (training) | train step memory (MB) | test accuracy |',
           '|---|---|---|---|---|---|---|---|']
  for r in results:
    lines.append(
        f'| {r["overrides"]["model.patch_size"]} | {r["tokens"]} | {r["params"]:,} | '
        f'{r["forward_flops"] / 1e9:.4f} | {r["attention_flops"] / r["forward_flops"]:.1%} | '
        f'{r["examples_per_sec"]:.0f} | {r["step_memory_bytes"] / 2**20:.1f} | '
        f'{r["eval_accuracy"]:.2%} |')
  lines += ['', 'FLOPs: the accounting module (2 per multiply-add; attention matrices 4·T·D per '
            'token and layer over T keys); training costs 3 times the forward pass. Images per '
            'second: the median over the training loop\'s logged windows (the first left out), '
            f'on {device_description()}, with the load average at {r0["load_average_start"]:.1f} '
            'when the first run started: other jobs share the cores, so read them as ratios. '
            'Memory: arguments + outputs + temporaries − donated buffers of the compiled train '
            'step (XLA\'s memory_analysis), not the process\'s peak.', '',
            sweep.figure_markdown('accuracy_vs_patch', 'Test accuracy against the patch size, '
                                  'after the same training images.'), '',
            sweep.figure_markdown('flops_vs_tokens', 'Forward FLOPs per image against the tokens '
                                  'per image: in all, in the dense layers (weights) and in the '
                                  'attention matrices.'), '',
            sweep.figure_markdown('accuracy_vs_flops', 'Test accuracy against the training '
                                  'FLOPs.'), '',
            f'## Position-grid resize (patch {RESIZE_PATCH}, trained at {resize["train_size"]}x'
            f'{resize["train_size"]})', '',
            f'Test images upsampled bilinearly to {resize["eval_size"]}x{resize["eval_size"]}; no '
            'fine-tuning. "Without" the resize the trained table has too few rows; two ways to run '
            'anyway: drop the patch positions (zeros, [CLS] row kept), or load the old rows first '
            'and zeros after.', '', '| evaluation | test accuracy |', '|---|---|']
  lines += [f'| {name} | {accuracy:.2%} |' for name, accuracy in resize['accuracy'].items()]
  lines += ['', sweep.figure_markdown('resize', 'Test accuracy at twice the training resolution, '
                                      'each way of meeting the larger position grid.')]
  return '\n'.join(lines) + '\n'


def device_description() -> str:
  kind = jax.devices()[0].device_kind
  cores = f' ({os.cpu_count()} cores)' if jax.default_backend() == 'cpu' else ''
  return f'{jax.device_count()} {kind} device(s){cores}'


def plots(results: list[dict], resize: dict) -> dict[str, Figure]:
  patches = [r['overrides']['model.patch_size'] for r in results]
  accuracy = [100 * r['eval_accuracy'] for r in results]
  flops = np.array([r['forward_flops'] for r in results], float)
  tokens = np.array([r['tokens'] for r in results], float)
  figures = {}

  figure = Figure(figsize=(5, 3.6))
  ax = figure.subplots()
  ax.plot(patches, accuracy, 'o-', color='#2563eb')
  ax.set_xscale('log', base=2)
  ax.set_xticks(patches, [str(p) for p in patches])
  ax.set(xlabel='patch size (pixels)', ylabel='test accuracy (%)',
         title='Accuracy after the same training images')
  figures['accuracy_vs_patch'] = figure

  figure = Figure(figsize=(5.5, 4))
  ax = figure.subplots()
  for key, label, marker in (('forward_flops', 'total', 'o'),
                             ('dense_flops', 'dense (weights)', 's'),
                             ('attention_flops', 'attention matrices', '^')):
    ax.loglog(tokens, [r[key] for r in results], marker + '-', label=label)
  for patch, t, f in zip(patches, tokens, flops):
    ax.annotate(f'P={patch}', (t, f), textcoords='offset points', xytext=(4, 4), fontsize=8)
  ax.set_xticks(tokens, [str(int(t)) for t in tokens])
  ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
  ax.set(xlabel='tokens per image (patches + [CLS])', ylabel='forward FLOPs per image',
         title='Dense cost grows as T, attention as T²')
  ax.legend(frameon=False, fontsize=8)
  figures['flops_vs_tokens'] = figure

  figure = Figure(figsize=(5, 3.6))
  ax = figure.subplots()
  ax.semilogx(3 * flops * results[0]['training_images'], accuracy, 'o-', color='#2563eb')
  for patch, x, y in zip(patches, 3 * flops * results[0]['training_images'], accuracy):
    ax.annotate(f'P={patch}', (x, y), textcoords='offset points', xytext=(4, -10), fontsize=8)
  ax.set(xlabel='training FLOPs (same images for every patch size)', ylabel='test accuracy (%)',
         title='Accuracy against compute')
  figures['accuracy_vs_flops'] = figure

  figure = Figure(figsize=(6.5, 2.8))
  ax = figure.subplots()
  names = list(resize['accuracy'])[::-1]
  ax.barh(names, [100 * resize['accuracy'][n] for n in names], color='#9ca3af')
  ax.set(xlabel='test accuracy (%)', title='Evaluating at twice the training resolution')
  figures['resize'] = figure
  return figures


def figures(payload: dict) -> dict[str, Figure]:
  """From results.json's content: `plots`."""
  return plots(payload['runs'], payload['resize'])


def main(argv=None):
  sweep.main(NAME, run, argv, figures)


if __name__ == '__main__':
  main()
