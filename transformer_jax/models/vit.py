"""Vision transformer: patch tokens, optional [CLS], learned 1-D positions, encoder blocks."""
import flax.linen as nn
import jax.numpy as jnp

from transformer_jax.layers import BlockStack, Linear, PatchEmbed, make_norm, resize_position_grid


def num_tokens(cfg) -> int:
  """Patches, plus one for the [CLS] token."""
  return cfg.num_patches + (cfg.pool == 'cls')


def resize_positions(params, new_image_size: int, cfg):
  """Parameters for images of `new_image_size` (same patch size): the position grid resized
  bicubically, the [CLS] row kept. Build the model with model.image_size=new_image_size."""
  new_grid = new_image_size // cfg.patch_size
  pos = resize_position_grid(params['pos_embed'], new_grid, int(cfg.pool == 'cls'))
  return {**params, 'pos_embed': pos}


class ViT(nn.Module):
  """images (B, H, W, C) -> float32 class logits (B, num_classes).

  pool='cls' prepends a learned [CLS] token and classifies its final vector; pool='mean'
  averages the patch vectors (no [CLS] token). The head starts at zero, as in big_vision.
  """
  cfg: 'ModelConfig'

  @nn.compact
  def __call__(self, images, *, deterministic=True):
    cfg = self.cfg
    x = PatchEmbed(cfg.patch_size, cfg.width, cfg.compute_dtype, cfg.weight_dtype,
                   name='patch_embed')(images)
    if cfg.pool == 'cls':
      cls = self.param('cls_token', nn.with_logical_partitioning(nn.initializers.zeros,
                                                                 (None, 'embed')),
                       (1, cfg.width), cfg.weight_dtype)
      x = jnp.concatenate([jnp.broadcast_to(cls.astype(x.dtype), (x.shape[0], 1, cfg.width)), x], 1)
    if cfg.positions == 'learned':
      pos = self.param('pos_embed', nn.with_logical_partitioning(
          nn.initializers.normal(cfg.embed_init_std), ('positions', 'embed')),
                       (num_tokens(cfg), cfg.width), cfg.weight_dtype)
      if pos.shape[0] != x.shape[1]:
        raise ValueError(
            f'Images of {images.shape[1]}x{images.shape[2]} give {x.shape[1]} tokens but the '
            f'position table has {pos.shape[0]} rows: set model.image_size to the image size, '
            'or resize the table with transformer_jax.models.vit.resize_positions.')
      x = x + pos.astype(x.dtype)[None]
    x = nn.Dropout(cfg.dropout_rate)(x, deterministic=deterministic)
    x = BlockStack(cfg, cfg.num_layers, name='encoder')(x, deterministic=deterministic)
    if cfg.final_norm:
      x = make_norm(cfg, 'final_norm')(x)
    representation = x[:, 0] if cfg.pool == 'cls' else x.mean(axis=1)
    return Linear((cfg.num_classes,), ('embed', 'classes'), use_bias=True,
                  dtype=cfg.compute_dtype, param_dtype=cfg.weight_dtype, init_std=0.0,
                  out_dtype=jnp.float32, name='head')(representation)
