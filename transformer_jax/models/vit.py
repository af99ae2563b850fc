"""Vision transformer: patch tokens, optional [CLS], learned 1-D positions, encoder blocks, and a
pooling of them ([CLS], mean, or big_vision's multihead attention pooling); its settings and its
sizes by name (ViT-Ti, S, B, ...)."""
import dataclasses
from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer_jax.errors import ConfigError
from transformer_jax.layers import Linear, PatchEmbed, axes, resize_position_grid
from transformer_jax.model_config import ModelConfig
from transformer_jax.models import common, registry
from transformer_jax.ranges import COUNT, Range

__all__ = [
    'batch_shapes', 'check_data', 'check_patch_size', 'FAMILY', 'forward_flops', 'MapHead',
    'num_tokens', 'param_counts', 'POOLS', 'resize_positions', 'variant', 'ViT', 'VIT_SIZES',
    'ViTConfig']

POOLS = ('cls', 'mean', 'map')
# ViT sizes by name: (width, depth, heads).
VIT_SIZES = {'XS': (128, 6, 4), 'Ti': (192, 12, 3), 'S': (384, 12, 6), 'M': (512, 12, 8),
             'B': (768, 12, 12), 'L': (1024, 24, 16)}


def variant(name: str) -> dict:
  """'S/4' -> width, depth, heads of ViT-S and patch size 4."""
  size, _, patch = name.partition('/')
  if size not in VIT_SIZES or not patch.isdigit():
    raise ValueError(f'ViT variant {name!r} is not NAME/PATCH with NAME in '
                     f'{list(VIT_SIZES)} (for example "S/4").')
  width, depth, heads = VIT_SIZES[size]
  return dict(width=width, num_layers=depth, num_heads=heads, patch_size=int(patch))


@dataclasses.dataclass(frozen=True)
class ViTConfig(ModelConfig):
  """A ViT's settings: the blocks, the images and the classes."""
  family: str = 'vit'
  image_size: int = 32
  patch_size: int = 4
  num_channels: int = 3
  num_classes: int = 0  # 0: the data's classes
  # 'cls' prepends a [CLS] token; 'mean' averages the patch tokens; 'map' pools them by
  # attention from a learned probe (MapHead)
  pool: str = 'cls'
  pre_norm: bool = False  # a norm after the patch and position embeddings (CLIP's ViTs)
  patch_bias: bool = True  # the patch embedding's bias (CLIP's has none)

  RANGES: ClassVar = {**ModelConfig.RANGES, 'image_size': COUNT, 'patch_size': COUNT,
                      'num_channels': COUNT, 'num_classes': Range(0, integer=True, example=10)}
  CHOICES: ClassVar = {**ModelConfig.CHOICES, 'pool': POOLS}

  def check(self) -> None:
    super().check()
    check_patch_size(self.image_size, self.patch_size)
    if self.positions not in ('learned', 'none'):
      raise ConfigError(f'A ViT takes learned 1-D positions or none, not {self.positions!r}: '
                        'set model.positions to "learned" or "none".')

  @property
  def num_patches(self) -> int:
    return (self.image_size // self.patch_size) ** 2


def num_tokens(cfg) -> int:
  """Patches, plus one for the [CLS] token."""
  return cfg.num_patches + (cfg.pool == 'cls')


def resize_positions(params, new_image_size: int, cfg):
  """Parameters for images of `new_image_size` (same patch size): the position grid resized
  bicubically, the [CLS] row kept. Build the model with model.image_size=new_image_size."""
  new_grid = new_image_size // cfg.patch_size
  pos = resize_position_grid(params['pos_embed'], new_grid, int(cfg.pool == 'cls'))
  return {**params, 'pos_embed': pos}


class MapHead(nn.Module):
  """Multihead attention pooling (Lee et al. 2019; big_vision's MAPHead, SigLIP's image head):
  a learned probe attends over the tokens, then a residual MLP on its normed output.

  x (B, T, D) -> (B, D). `attention` and `mlp` are the Attention and MLP classes with their
  arguments bound (common.attention(cfg, cross=True), an MLP); `norm` a norm class.
  """
  attention: Any
  mlp: Any
  norm: Any
  param_dtype: Any = jnp.float32

  @classmethod
  def of(cls, cfg: ModelConfig, **kwargs) -> 'MapHead':
    return cls(common.attention(cfg, cross=True), common.mlp(cfg), common.norm(cfg),
               cfg.weight_dtype, **kwargs)

  @nn.compact
  def __call__(self, x):
    width = x.shape[-1]
    probe = self.param('probe', nn.with_logical_partitioning(
        nn.initializers.xavier_uniform(), (None, 'embed')), (1, width), self.param_dtype)
    probe = jnp.broadcast_to(probe.astype(x.dtype)[None], (x.shape[0], 1, width))
    y = self.attention(name='attn')(probe, x)
    y = y + self.mlp(name='mlp')(self.norm(name='norm')(y))
    return axes.constrain(y[:, 0], None)


class ViT(nn.Module):
  """images (B, H, W, C) -> float32 class logits (B, num_classes).

  pool='cls' prepends a learned [CLS] token and classifies its final vector; pool='mean'
  averages the patch vectors (no [CLS] token). The head starts at zero, as in big_vision.
  `encode` gives the pooled representation (B, width), for a head of your own.
  """
  cfg: ViTConfig

  def setup(self):
    cfg = self.cfg
    self.patch_embed = PatchEmbed(cfg.patch_size, cfg.width, cfg.patch_bias, cfg.compute_dtype,
                                  cfg.weight_dtype)
    if cfg.pool == 'cls':
      self.cls_token = self.param('cls_token', nn.with_logical_partitioning(
          nn.initializers.zeros, (None, 'embed')), (1, cfg.width), cfg.weight_dtype)
    if cfg.positions == 'learned':
      self.pos_embed = self.param('pos_embed', nn.with_logical_partitioning(
          nn.initializers.normal(cfg.embed_init_std), ('positions', 'embed')),
                                  (num_tokens(cfg), cfg.width), cfg.weight_dtype)
    self.pre_norm = common.norm(cfg)() if cfg.pre_norm else None
    self.dropout = nn.Dropout(cfg.dropout_rate)
    self.encoder = common.stack(cfg, cfg.num_layers)
    self.final_norm = common.norm(cfg)() if cfg.final_norm else None
    self.map_head = MapHead.of(cfg) if cfg.pool == 'map' else None
    if cfg.num_classes:  # none in a tower of a model of its own (models.clip)
      self.head = Linear((cfg.num_classes,), ('embed',), ('classes',), use_bias=True,
                         init_std=0.0, dtype=cfg.compute_dtype, param_dtype=cfg.weight_dtype,
                         out_dtype=jnp.float32)

  def encode(self, images, *, deterministic=True):
    """The pooled representation (B, width): the [CLS] vector, the mean of the patches', or
    their attention pooling."""
    cfg = self.cfg
    x = self.patch_embed(images)
    if cfg.pool == 'cls':
      cls = jnp.broadcast_to(self.cls_token.astype(x.dtype), (x.shape[0], 1, cfg.width))
      x = jnp.concatenate([cls, x], axis=1)
    if cfg.positions == 'learned':
      if self.pos_embed.shape[0] != x.shape[1]:
        raise ValueError(
            f'Images of {images.shape[1]}x{images.shape[2]} give {x.shape[1]} tokens but the '
            f'position table has {self.pos_embed.shape[0]} rows: set model.image_size to the '
            'image size, or resize the table with transformer_jax.models.vit.resize_positions.')
      x = x + self.pos_embed.astype(x.dtype)[None]
    if self.pre_norm is not None:
      x = self.pre_norm(x)
    x = self.encoder(self.dropout(x, deterministic=deterministic), deterministic=deterministic)
    if self.final_norm is not None:
      x = self.final_norm(x)
    if cfg.pool == 'map':
      return self.map_head(x)
    return x[:, 0] if cfg.pool == 'cls' else x.mean(axis=1)

  def __call__(self, images, *, deterministic=True):
    """images (B, H, W, C) -> float32 logits (B, num_classes)."""
    return self.head(self.encode(images, deterministic=deterministic))


def follow_data(cfg: ViTConfig, sizes: dict, source: str) -> ViTConfig:
  """model.num_classes, unset (0), takes the data's; one set must equal it."""
  found = sizes.get('num_classes')
  if not found or found == cfg.num_classes:
    return cfg
  if cfg.num_classes:
    raise ConfigError(f'{source} has {found} classes but model.num_classes={cfg.num_classes}: '
                      'leave model.num_classes unset (0) to follow the data, or set '
                      f'--config.model.num_classes={found}.')
  return dataclasses.replace(cfg, num_classes=found)


def check_patch_size(image_size: int, patch_size: int) -> None:
  """Raises ConfigError unless model.patch_size divides model.image_size, naming those that do."""
  if image_size % patch_size:
    raise ConfigError(f'model.patch_size={patch_size} does not divide model.image_size='
                      f'{image_size}: choose a patch size from '
                      f'{[d for d in range(1, image_size + 1) if image_size % d == 0]}'
                      ' or resize the images.')


def check_data(info: dict, cfg: ViTConfig) -> None:
  height, width, channels = info['image_shape']
  if (height, width, channels) != (cfg.image_size, cfg.image_size, cfg.num_channels):
    raise ConfigError(f'The preprocessed images are {height}x{width}x{channels} but the model '
                      f'takes model.image_size={cfg.image_size}, model.num_channels='
                      f'{cfg.num_channels}: set --config.model.image_size={height}, or end '
                      f'data.pp_train and data.pp_eval in images of {cfg.image_size}.')


def param_counts(cfg: ViTConfig) -> dict[str, int]:
  """By part; a MapHead's attention, norm and MLP count with those of the blocks, its probe as
  'other'."""
  d, cls, map_head = cfg.width, cfg.pool == 'cls', cfg.pool == 'map'
  blocks = common.block_params(cfg, cfg.num_layers)
  norms = common.norm_params(cfg) * (cfg.final_norm + cfg.pre_norm + map_head)
  return common.with_total({
      'attention': blocks['attention'] + common.attention_params(cfg) * map_head,
      'mlp': blocks['mlp'] + common.mlp_params(cfg) * map_head,
      'norms': blocks['norms'] + norms, 'other': d * map_head,
      'embedding': (cfg.num_channels * cfg.patch_size ** 2 * d + d * cfg.patch_bias + d * cls
                    + num_tokens(cfg) * d * (cfg.positions == 'learned')),
      'head': d * cfg.num_classes + cfg.num_classes})


def forward_flops(cfg: ViTConfig, seq_len=None, target_len=None) -> dict[str, int]:
  """Per image: seq_len is the patch count (+1 for [CLS]) whatever is passed."""
  del seq_len, target_len
  d, patches, t = cfg.width, cfg.num_patches, num_tokens(cfg)
  dense = 2 * (patches * cfg.num_channels * cfg.patch_size ** 2 * d
               + t * cfg.num_layers * common.block_weights(cfg) + d * cfg.num_classes)
  return {'dense': dense, 'attention': 4 * common.attention_width(cfg) * cfg.num_layers * t * t,
          'tokens': 1}


def batch_shapes(cfg: ViTConfig, batch_size: int, seq_len=None) -> dict:
  """A batch of the 'image' task: images (B, side, side, channels) and integer labels; any
  family with a ViT's image settings reads it (DiT, CLIP's image tower)."""
  del seq_len
  side = cfg.image_size
  return {'image': jax.ShapeDtypeStruct((batch_size, side, side, cfg.num_channels), jnp.float32),
          'label': jax.ShapeDtypeStruct((batch_size,), jnp.int32)}


def _describe(cfg: ViTConfig) -> str:
  named = [name for name, size in VIT_SIZES.items()
           if size == (cfg.width, cfg.num_layers, cfg.num_heads)]
  return (f'{cfg.image_size}x{cfg.image_size} images in patches of {cfg.patch_size}'
          + (f' (ViT-{named[0]}/{cfg.patch_size})' if named else ''))


FAMILY = registry.register(registry.Family(
    name='vit', module=ViT,
    example_inputs=lambda cfg, batch=1, seq_len=None: (jnp.zeros(
        (batch, cfg.image_size, cfg.image_size, cfg.num_channels), jnp.float32),),
    logits=lambda apply, batch: apply(batch['image']), task='image', targets='label',
    config=ViTConfig, classification=True, unit='image', check_data=check_data,
    param_counts=param_counts, forward_flops=forward_flops,
    stacks=lambda cfg, seq_len=None: [
        registry.Stack('encoder', cfg.num_layers, num_tokens(cfg), (num_tokens(cfg),))],
    batch_shapes=batch_shapes, describe=_describe, follow_data=follow_data,
    data_sizes=lambda cfg: {'image_size': cfg.image_size, 'num_classes': cfg.num_classes or None}))
