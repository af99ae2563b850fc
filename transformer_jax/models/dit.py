"""The diffusion transformer (Peebles & Xie 2023, DiT): the ViT's patch tokens of a noised image
(or latent), fixed 2-D sin-cos positions, the shared Block conditioned by adaLN-Zero on the
timestep and class embeddings, and a final adaLN layer whose zero-initialised head unpatchifies
to the predicted noise (and, with learn_sigma, the variance interpolation of Nichol & Dhariwal
2021). It trains on the 'image' task (values in [-1, 1]) with the diffusion loss of
transformer_jax.diffusion, and --mode=sample draws images with its samplers (`sample`)."""
import dataclasses
import errno
import functools
import json
import logging
import os
import shutil
import time
from typing import ClassVar
import uuid

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax import diffusion
from transformer_jax.errors import ConfigError
from transformer_jax.layers import (AdaLNZero, BlockStack, LabelEmbed, Linear, PatchEmbed,
                                    TimestepEmbed, row_blocks)
from transformer_jax.model_config import ModelConfig
from transformer_jax.models import common, registry, vit
from transformer_jax.ranges import COUNT, FRACTION, Range
from transformer_jax.settings import Settings

__all__ = ['bound_bpd', 'DiT', 'DIT_SIZES', 'DiTConfig', 'draw', 'EvalSettings', 'evaluate',
           'FAMILY', 'forward_flops', 'generate', 'grid', 'held_out', 'param_counts',
           'quarter_sums', 'sample', 'SAMPLERS', 'SampleSettings', 'schedule_of',
           'sincos_2d', 'to_uint8', 'variant']

log = logging.getLogger(__name__)
SAMPLERS = ('ddpm', 'ddim')

# DiT sizes by name: (width, depth, heads) (Peebles & Xie 2023, Table 1).
DIT_SIZES = {'S': (384, 12, 6), 'B': (768, 12, 12), 'L': (1024, 24, 16), 'XL': (1152, 28, 16)}


def variant(name: str) -> dict:
  """'XL/2' -> width, depth, heads of DiT-XL and patch size 2."""
  size, _, patch = name.partition('/')
  if size not in DIT_SIZES or not patch.isdigit():
    raise ValueError(f'DiT variant {name!r} is not NAME/PATCH with NAME in {list(DIT_SIZES)} '
                     '(for example "XL/2").')
  width, depth, heads = DIT_SIZES[size]
  return dict(width=width, num_layers=depth, num_heads=heads, patch_size=int(patch))


@dataclasses.dataclass(frozen=True)
class DiTConfig(ModelConfig):
  """A DiT's settings: the blocks, the images (or latents), the classes and the diffusion. Its
  norms are adaLN-Zero (eps norm_eps); positions are the fixed 2-D sin-cos table."""
  family: str = 'dit'
  image_size: int = 32  # of the images, or of the latents (256x256 images: 32x32x4)
  patch_size: int = 2
  num_channels: int = 4
  num_classes: int = 0  # 0: the data's; the table has one more row, the null class
  learn_sigma: bool = True  # the output's second half interpolates the variance
  class_dropout: float = 0.1  # training labels replaced by the null class, for guidance
  frequency_dim: int = 256  # sinusoidal frequencies of the timestep embedder
  noise_schedule: str = 'linear'
  diffusion_steps: int = 1000
  # DiT's choices where the shared blocks default otherwise.
  norm_eps: float = 1e-6
  mlp: str = 'gelu_tanh'
  positions: str = 'sinusoidal'
  # DiT's initialize_weights: the blocks' kernels and the patch matrix Xavier-uniform (the
  # patch bias PyTorch's Conv2d default), the timestep MLP and class table N(0, 0.02), adaLN
  # and the head zero. 'normal' draws the blocks and patches LeCun-normal (init_std None).
  init: str = 'xavier_uniform'
  init_std: float | None = None

  RANGES: ClassVar = {**ModelConfig.RANGES, 'image_size': COUNT, 'patch_size': COUNT,
                      'num_channels': COUNT, 'num_classes': Range(0, integer=True, example=10),
                      'class_dropout': FRACTION, 'frequency_dim': COUNT,
                      'diffusion_steps': COUNT}
  CHOICES: ClassVar = {**ModelConfig.CHOICES, 'noise_schedule': diffusion.SCHEDULES}

  def check(self) -> None:
    super().check()
    vit.check_patch_size(self.image_size, self.patch_size)
    if self.positions != 'sinusoidal' or self.norm_position != 'pre' or not self.use_norm:
      raise ConfigError('A DiT takes fixed 2-D sin-cos positions and pre-LN adaLN-Zero norms: '
                        'leave model.positions="sinusoidal", model.norm_position="pre" and '
                        'model.use_norm=True.')
    try:
      schedule_of(self)
    except ConfigError as error:
      raise ConfigError(f'model.noise_schedule={self.noise_schedule!r} over '
                        f'model.diffusion_steps={self.diffusion_steps} steps: {error}; the linear '
                        'schedule needs at least 21 steps.') from None

  @property
  def drops_in_training(self) -> bool:
    return super().drops_in_training or self.class_dropout > 0

  @property
  def num_patches(self) -> int:
    return (self.image_size // self.patch_size) ** 2

  @property
  def out_channels(self) -> int:
    return self.num_channels * (2 if self.learn_sigma else 1)

  @property
  def variance(self) -> str:
    """How p(x_{t-1} | x_t)'s variance is set (diffusion.VARIANCES)."""
    return 'learned_range' if self.learn_sigma else 'fixed_large'


def schedule_of(cfg: DiTConfig) -> diffusion.Schedule:
  """The training diffusion of a config."""
  return diffusion.make_schedule(cfg.noise_schedule, cfg.diffusion_steps)


def _sincos_1d(dim: int, positions: np.ndarray) -> np.ndarray:
  omega = 1.0 / 10000 ** (np.arange(dim // 2, dtype=np.float64) / (dim / 2.0))
  angles = np.einsum('m,d->md', positions.reshape(-1), omega)
  return np.concatenate([np.sin(angles), np.cos(angles)], axis=1)


def sincos_2d(dim: int, grid_size: int) -> np.ndarray:
  """DiT's (and MAE's) get_2d_sincos_pos_embed: (grid_size**2, dim) float32, row by row, the
  first half of each row the sin-cos of the column index, the second of the row index."""
  columns, rows = np.meshgrid(np.arange(grid_size, dtype=np.float32),
                              np.arange(grid_size, dtype=np.float32))
  return np.concatenate([_sincos_1d(dim // 2, columns), _sincos_1d(dim // 2, rows)],
                        axis=1).astype(np.float32)


class DiT(nn.Module):
  """(x_t (B, H, W, C), timesteps (B,) int, labels (B,) int) -> float32 (B, H, W, out_channels):
  the predicted noise, then with learn_sigma the variance interpolation in [-1, 1]. Label
  num_classes is the null class. `diffusion_losses` is the training objective of a batch."""
  cfg: DiTConfig

  @nn.compact
  def __call__(self, images, timesteps, labels, *, deterministic=True):
    cfg, dtypes = self.cfg, dict(dtype=self.cfg.compute_dtype, param_dtype=self.cfg.weight_dtype)
    dits_init = cfg.init == 'xavier_uniform'
    x = PatchEmbed(cfg.patch_size, cfg.width, initializer=cfg.init,
                   bias_init='fan_in_uniform' if dits_init else 'zeros', name='patch_embed',
                   **dtypes)(images)
    grid = cfg.image_size // cfg.patch_size
    # A parameter, as DiT counts it, but never trained: no gradient reaches it.
    positions = self.param('pos_embed', nn.with_logical_partitioning(
        lambda *_: jnp.asarray(sincos_2d(cfg.width, grid), cfg.weight_dtype),
        ('positions', 'embed')), (grid * grid, cfg.width))
    x = x + jax.lax.stop_gradient(positions).astype(x.dtype)[None]
    condition = (TimestepEmbed(cfg.width, cfg.frequency_dim, init_std=0.02, name='t_embed',
                               **dtypes)(timesteps)
                 + LabelEmbed(cfg.num_classes, cfg.width, param_dtype=cfg.weight_dtype,
                              name='y_embed')(labels).astype(cfg.compute_dtype))
    adaln = functools.partial(AdaLNZero, eps=cfg.norm_eps, **dtypes)
    block = functools.partial(common.block(cfg), norm=adaln)
    x = BlockStack(block, cfg.num_layers, scan=cfg.scan_layers, remat_policy=cfg.remat_policy,
                   name='blocks')(x, None, None, condition, deterministic=deterministic)
    x = adaln(gated=False, name='final_norm')(x, condition)
    p = cfg.patch_size
    x = Linear((p * p * cfg.out_channels,), ('embed',), ('patch',), init_std=0.0,
               out_dtype=jnp.float32, name='head', **dtypes)(x)
    x = x.reshape(x.shape[0], grid, grid, p, p, cfg.out_channels)  # (B, h, w, p, q, C)
    return x.transpose(0, 1, 3, 2, 4, 5).reshape(
        x.shape[0], grid * p, grid * p, cfg.out_channels)

  def diffusion_losses(self, images, labels, rng, *, deterministic=True):
    """The summed training terms of a batch of images in [-1, 1] (B, H, W, C) and labels (B,):
    timesteps uniform per example, labels dropped to the null class with probability
    class_dropout in training (not `deterministic`; evaluation scores the true labels, as DiT's
    LabelEmbedder drops in train mode only), and `diffusion_terms` there summed over the
    examples; 'weight' the count; 'loss_t0' .. 'loss_t3' the loss summed over the examples
    whose t fell in each quarter of the steps (t0: the least noise), 'weight_loss_t0' .. their
    counts (quarter_sums)."""
    cfg, schedule = self.cfg, schedule_of(self.cfg)
    t_rng, noise_rng, drop_rng = jax.random.split(rng, 3)
    batch = images.shape[0]
    t = jax.random.randint(t_rng, (batch,), 0, schedule.num_steps)
    noise = jax.random.normal(noise_rng, images.shape, jnp.float32)
    if not deterministic:
      dropped = jax.random.bernoulli(drop_rng, cfg.class_dropout, (batch,))
      labels = jnp.where(dropped, cfg.num_classes, labels)
    terms = self.diffusion_terms(images, labels, t, noise, deterministic=deterministic)
    return {**{name: jnp.sum(value) for name, value in terms.items()},
            **quarter_sums(terms['loss'], t, schedule.num_steps),
            'weight': jnp.asarray(batch, jnp.float32)}

  def diffusion_terms(self, images, labels, t, noise, *, deterministic=True):
    """Per example (B,), the model's diffusion.training_losses at x_t = q_sample(images, t,
    noise) given these labels: 'mse' of the predicted noise, with learn_sigma 'vb' (the bound's
    term at t with the predicted noise held fixed), 'loss' their sum (DiT's training_losses)."""
    cfg, schedule = self.cfg, schedule_of(self.cfg)
    images = images.astype(jnp.float32)
    x_t = diffusion.q_sample(schedule, images, t, noise)
    output = self(x_t, t, labels, deterministic=deterministic)
    return diffusion.training_losses(schedule, output, images, x_t, t, noise,
                                     variance=cfg.variance)

QUARTERS = 4


def quarter_sums(loss: jax.Array, t: jax.Array, num_steps: int) -> dict[str, jax.Array]:
  """The per-example loss (B,) summed by quarter of the timesteps t (B,) of a num_steps process:
  'loss_tQ' and its count 'weight_loss_tQ' for Q = 0 (t < num_steps / 4, the least noise) to 3;
  the training loop reports each over its own count (loop.means)."""
  quarter = (t * QUARTERS) // num_steps
  sums = {}
  for q in range(QUARTERS):
    mask = (quarter == q).astype(jnp.float32)
    sums[f'loss_t{q}'] = jnp.sum(loss * mask)
    sums[f'weight_loss_t{q}'] = jnp.sum(mask)
  return sums


def param_counts(cfg: DiTConfig) -> dict[str, int]:
  """By part: the fixed position table among the embeddings, as DiT's code counts it; the
  adaLN maps among the norms; the timestep MLP and the class table as 'other'."""
  d, p = cfg.width, cfg.patch_size
  blocks = common.block_params(cfg, cfg.num_layers)
  modulation = lambda parts: parts * (d * d + d)
  return common.with_total({
      **blocks,
      'norms': cfg.num_layers * 2 * modulation(3) + modulation(2),
      'embedding': cfg.num_channels * p * p * d + d + cfg.num_patches * d,
      # The conditioning: the timestep MLP and the class table.
      'other': cfg.frequency_dim * d + d + d * d + d + (cfg.num_classes + 1) * d,
      'head': (d + 1) * p * p * cfg.out_channels})


def forward_flops(cfg: DiTConfig, seq_len=None, target_len=None) -> dict[str, int]:
  """Per image, 2 FLOPs a multiply-add: the patch tokens through the patch embedding, the blocks
  and the head; the conditioning vector (timestep MLP, every adaLN map) once per image."""
  del seq_len, target_len
  d, t, p = cfg.width, cfg.num_patches, cfg.patch_size
  conditioning = cfg.frequency_dim * d + d * d + (cfg.num_layers * 6 + 2) * d * d
  dense = 2 * (t * (cfg.num_channels * p * p * d + cfg.num_layers * common.block_weights(cfg)
                    + d * p * p * cfg.out_channels) + conditioning)
  return {'dense': dense, 'attention': 4 * d * cfg.use_attention * cfg.num_layers * t * t,
          'tokens': 1}


def _example_inputs(cfg: DiTConfig, batch: int = 1, seq_len=None) -> tuple:
  del seq_len
  side = cfg.image_size
  return (jnp.zeros((batch, side, side, cfg.num_channels), jnp.float32),
          jnp.zeros((batch,), jnp.int32), jnp.zeros((batch,), jnp.int32))


def _describe(cfg: DiTConfig) -> str:
  named = [name for name, size in DIT_SIZES.items()
           if size == (cfg.width, cfg.num_layers, cfg.num_heads)]
  return (f'{cfg.image_size}x{cfg.image_size}x{cfg.num_channels} inputs in patches of '
          f'{cfg.patch_size}' + (f' (DiT-{named[0]}/{cfg.patch_size})' if named else '')
          + f', {cfg.num_classes} classes + null, {cfg.noise_schedule} schedule of '
          f'{cfg.diffusion_steps} steps' + (', learned sigma' if cfg.learn_sigma else ''))


@dataclasses.dataclass(frozen=True)
class SampleSettings(Settings):
  """The keys of config.sample for a DiT: `num_samples` images conditioned on `classes` (empty:
  0, 1, ... cycling over the classes; else cycled to num_samples), drawn by `sampler` ('ddpm':
  ancestral, 'ddim': eta 0) over `steps` respaced steps, guided with `guidance_scale` (1: none;
  Ho & Salimans 2022), from the noise of `seed`; clip_denoised clips each x_0 prediction to
  [-1, 1] (pixels, not latents)."""
  SECTION = 'sample'
  num_samples: int = 16
  classes: tuple[int, ...] = ()
  steps: int = 250
  sampler: str = 'ddpm'
  guidance_scale: float = 1.0
  seed: int = 0
  clip_denoised: bool = True

  RANGES = {'num_samples': COUNT, 'steps': COUNT, 'guidance_scale': Range(0),
            'seed': Range(0, integer=True)}
  CHOICES = {'sampler': SAMPLERS}

  def check_for(self, cfg: DiTConfig) -> None:
    """The settings' rules against the model's (run.sample calls it before reading anything):
    raises ConfigError naming the fix."""
    if self.steps > cfg.diffusion_steps:
      raise ConfigError(f'sample.steps={self.steps} is more than the {cfg.diffusion_steps} '
                        f'steps the model was trained with: set --config.sample.steps to at most '
                        f'{cfg.diffusion_steps}.')
    if self.guidance_scale != 1 and not cfg.class_dropout:
      raise ConfigError(f'sample.guidance_scale={self.guidance_scale} needs a model that learned '
                        'the null class (model.class_dropout > 0 in training): set '
                        '--config.sample.guidance_scale=1.')
    outside = [c for c in self.classes if not 0 <= c < cfg.num_classes]
    if outside:
      raise ConfigError(f'sample.classes {outside} are not classes of the model (0 to '
                        f'{cfg.num_classes - 1}).')
    if cfg.num_channels != 3:
      raise ConfigError(f'The model makes {cfg.num_channels}-channel latents, which need a '
                        'decoder this codebase does not have: sample a pixel-space DiT '
                        '(model.num_channels=3).')

  def labels(self, num_classes: int) -> np.ndarray:
    cycle = self.classes or tuple(range(num_classes))
    return np.resize(np.asarray(cycle, np.int32), self.num_samples)


def generate(model: DiT, params, labels: jax.Array, rng: jax.Array,
             settings: SampleSettings) -> jax.Array:
  """Images (B, H, W, C) in [-1, 1] conditioned on labels (B,), from the noise of `rng`: one
  sampler's lax.scan over the respaced steps (jit it to compile one program), each step one
  model call on the batch (doubled with the null class under guidance)."""
  cfg = model.cfg
  schedule = diffusion.respace(schedule_of(cfg), settings.steps)
  def model_fn(x, t, y):
    with row_blocks():
      return model.apply({'params': params}, x, t, y)
  if settings.guidance_scale != 1:
    predict = diffusion.guided_model_fn(model_fn, labels, cfg.num_classes,
                                        settings.guidance_scale)
  else:
    predict = lambda x, t: model_fn(x, t, labels)
  noise_rng, step_rng = jax.random.split(rng)
  noise = jax.random.normal(
      noise_rng, (labels.shape[0], cfg.image_size, cfg.image_size, cfg.num_channels))
  if settings.sampler == 'ddpm':
    return diffusion.ddpm_sample(schedule, predict, noise, step_rng, variance=cfg.variance,
                                 clip_denoised=settings.clip_denoised)
  return diffusion.ddim_sample(schedule, predict, noise, clip_denoised=settings.clip_denoised)


def to_uint8(images) -> np.ndarray:
  """[-1, 1] -> uint8 [0, 255], as DiT's save: (x + 1) * 127.5, rounded and clipped."""
  return np.clip(np.rint((np.asarray(images, np.float32) + 1) * 127.5), 0, 255).astype(np.uint8)


def grid(images: np.ndarray) -> np.ndarray:
  """(N, H, W, C) -> one image of ceil(sqrt(N)) columns, black where the last row is short."""
  n, h, w, c = images.shape
  columns = int(np.ceil(np.sqrt(n)))
  rows = -(-n // columns)
  padded = np.zeros((rows * columns, h, w, c), images.dtype)
  padded[:n] = images
  return padded.reshape(rows, columns, h, w, c).transpose(0, 2, 1, 3, 4).reshape(
      rows * h, columns * w, c)


def sample(model, params, step: int, wanted: 'SampleSettings', workdir: str) -> str:
  """--mode=sample: images from `params` (the workdir's latest checkpoint, its moving average
  where it keeps one), drawn in one batch (the images that an evaluation scoring as many
  samples in batches at least that large scores), written to a folder of this run's own,
  WORKDIR/samples/<time>-step<step>-<sampler>-<steps>steps-g<guidance>-seed<seed> (with -2,
  -3, ... where another run took the name first): samples.npz (images uint8 (N, H, W, 3),
  labels (N,)), sample_<i>.png each, grid.png and sample.json (config.sample and the step).
  The folder is filled under a hidden name and renamed into place whole, so that runs at the
  same time never mix their files and a killed run leaves no folder that looks complete;
  returns it."""
  from PIL import Image  # pylint: disable=import-outside-toplevel
  started = time.strftime('%Y%m%d-%H%M%S')
  labels = wanted.labels(model.cfg.num_classes)
  images = draw(model, params, labels, wanted, batch_size=len(labels))
  samples = os.path.join(workdir, 'samples')
  partial = os.path.join(samples, f'.{started}.{uuid.uuid4().hex}.partial')
  os.makedirs(partial)
  try:
    np.savez(os.path.join(partial, 'samples.npz'), images=images, labels=labels)
    for number, image in enumerate(images):
      Image.fromarray(image).save(os.path.join(partial, f'sample_{number}.png'))
    Image.fromarray(grid(images)).save(os.path.join(partial, 'grid.png'))
    with open(os.path.join(partial, 'sample.json'), 'w', encoding='utf-8') as f:
      json.dump({'step': step, **dataclasses.asdict(wanted)}, f, indent=1)
    folder = _renamed(partial, os.path.join(
        samples, f'{started}-step{step}-{wanted.sampler}-{wanted.steps}steps-'
        f'g{wanted.guidance_scale:g}-seed{wanted.seed}'))
  except BaseException:
    shutil.rmtree(partial, ignore_errors=True)
    raise
  log.info('Wrote %d samples of step %d (%s, %d steps, guidance %g) to %s.', len(images), step,
           wanted.sampler, wanted.steps, wanted.guidance_scale, folder)
  return folder


def _renamed(partial: str, name: str) -> str:
  """`partial` renamed to `name`, else to the first of name-2, name-3, ... no other folder has:
  a rename is atomic, and is refused where the name holds another run's files."""
  folder, number = name, 1
  while True:
    try:
      os.rename(partial, folder)
      return folder
    except OSError as error:
      if error.errno not in (errno.EEXIST, errno.ENOTEMPTY):
        raise
    number += 1
    folder = f'{name}-{number}'


@dataclasses.dataclass(frozen=True)
class EvalSettings(Settings):
  """The keys of config.eval for a DiT, what each evaluation adds to the held-out loss:
  bpd_examples > 0: the variational bound in bits per dimension (eval_bpd; diffusion.bpd_loop,
  ADM's calc_bpd_loop) of that many test images, at bpd_steps timesteps (0: all the model's
  diffusion steps, exact; K: step 0 and K - 1 evenly spaced others, a stratified estimate);
  sample_classifier=WORKDIR of a classifier run (a ViT trained on the real training images):
  its accuracy on config.sample's samples (eval_sample_accuracy, each sample scored against the
  class it was conditioned on) and the Fréchet distance between the features of fid_examples
  test images (0: the whole held-out split) and of the samples (eval_sample_fd), in the
  features of fid_features (transformer_jax.image_scores.FEATURES_HELP)."""
  SECTION = 'eval'
  bpd_examples: int = 0
  bpd_steps: int = 0
  sample_classifier: str = ''
  fid_features: str = 'classifier'
  fid_examples: int = 0

  RANGES = {'bpd_examples': Range(0, integer=True), 'bpd_steps': Range(0, integer=True),
            'fid_examples': Range(0, integer=True)}

  def check_for(self, cfg: DiTConfig, sample: SampleSettings) -> None:
    """The settings' rules against the model's and against the samples they score (when they
    score any): raises ConfigError naming the fix."""
    if self.scores_samples:
      sample.check_for(cfg)
    if self.bpd_examples and cfg.num_channels != 3:
      raise ConfigError('eval.bpd_examples: the bound in bits per dimension is of 8-bit pixels; '
                        'a model of latents has none: set --config.eval.bpd_examples=0.')
    if self.bpd_steps == 1:
      raise ConfigError('eval.bpd_steps=1 leaves no KL term: set 0 (all steps) or 2 or more.')

  @property
  def scores_samples(self) -> bool:
    return bool(self.sample_classifier) or self.fid_features != 'classifier'


def held_out(run, count: int) -> tuple[np.ndarray, np.ndarray]:
  """The first `count` held-out images (float32 in [-1, 1]) and labels of a run's data."""
  images, labels = [], []
  for batch in run.data.eval_batches():
    images.append(batch['image'])
    labels.append(batch['label'])
    if sum(map(len, images)) >= count:
      break
  return np.concatenate(images)[:count], np.concatenate(labels)[:count]


def bound_bpd(model: DiT, params, images: np.ndarray, labels: np.ndarray, *, steps: int = 0,
              batch_size: int = 500) -> dict[str, float]:
  """The variational bound of images (N, H, W, C) in [-1, 1] conditioned on their labels,
  averaged over the images: 'bpd' (diffusion.bpd_loop at `steps` timesteps), its 'bpd_prior'
  and 'bpd_decoder' (the t = 0 term) parts. The noise of batch i is fold_in(key(0), i)."""
  cfg = model.cfg

  @jax.jit
  def bound(params, x, y, rng):
    model_fn = lambda x_t, t: model.apply({'params': params}, x_t, t, y)
    return diffusion.bpd_loop(schedule_of(cfg), model_fn, x, rng, variance=cfg.variance,
                              steps=steps)
  sums = np.zeros(3)
  for i, start in enumerate(range(0, len(images), batch_size)):
    out = jax.device_get(bound(params, jnp.asarray(images[start:start + batch_size]),
                               jnp.asarray(labels[start:start + batch_size]),
                               jax.random.fold_in(jax.random.key(0), i)))
    sums += [out['total_bpd'].sum(), out['prior_bpd'].sum(), out['vb'][0].sum()]
  return dict(zip(('bpd', 'bpd_prior', 'bpd_decoder'), (sums / len(images)).tolist()))


def draw(model: DiT, params, labels: np.ndarray, wanted: SampleSettings,
         batch_size: int) -> np.ndarray:
  """uint8 samples (N, H, W, 3) conditioned on labels (N,), drawn by `generate` in batches of
  batch_size, batch i from fold_in(key(wanted.seed), i)."""
  generate_batch = jax.jit(functools.partial(generate, model, settings=wanted))
  return np.concatenate([
      to_uint8(generate_batch(params, jnp.asarray(labels[start:start + batch_size]),
                              jax.random.fold_in(jax.random.key(wanted.seed), i)))
      for i, start in enumerate(range(0, len(labels), batch_size))])


def evaluate(run, params) -> dict[str, float]:
  """What config.eval's bpd_examples (EvalSettings) adds to an evaluation of `params`: eval_bpd
  and its parts. The sample scores need a classifier run: image_scores.evaluate_samples."""
  wanted = run.settings.eval
  if not wanted.bpd_examples:
    return {}
  images, labels = held_out(run, wanted.bpd_examples)
  results = bound_bpd(run.model, params, images, labels, steps=wanted.bpd_steps,
                      batch_size=run.data.eval_batch_size)
  return {f'eval_{name}': value for name, value in results.items()}


FAMILY = registry.register(registry.Family(
    name='dit', module=DiT, example_inputs=_example_inputs,
    # A diffusion model has no logits: what callers of `logits` get is its output at t = 0.
    logits=lambda apply, batch: apply(batch['image'], jnp.zeros_like(batch['label']),
                                      batch['label']),
    loss=lambda apply, batch, rng, label_smoothing: apply(
        batch['image'], batch['label'], rng, method='diffusion_losses'),
    task='image', targets='label', config=DiTConfig, unit='image', check_data=vit.check_data,
    param_counts=param_counts, forward_flops=forward_flops,
    stacks=lambda cfg, seq_len=None: [
        registry.Stack('blocks', cfg.num_layers, cfg.num_patches, (cfg.num_patches,))],
    batch_shapes=vit.batch_shapes, describe=_describe, follow_data=vit.follow_data,
    # num_channels: generated stand-ins (data.name='synthetic', --mode=compile) of 4: latents.
    data_sizes=lambda cfg: {'image_size': cfg.image_size, 'num_classes': cfg.num_classes or None,
                            'num_channels': cfg.num_channels},
    sample_settings=SampleSettings, sample=sample, eval_settings=EvalSettings, evaluate=evaluate))
