"""The transformer block (pre-LN or post-LN, optional cross-attention, ablations) and its stack."""
import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer_jax.layers.attention import Attention
from transformer_jax.layers.mlp import Mlp
from transformer_jax.layers.norms import make_norm

REMAT_POLICIES = {
    'full': None,  # save nothing: recompute the whole block in the backward pass
    'dots': jax.checkpoint_policies.checkpoint_dots,
    'dots_no_batch': jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
}


class Block(nn.Module):
  """pre-LN:  x = x + f(norm(x)) for f in (attention, [cross-attention], MLP);
  post-LN: x = norm(x + f(x)).

  Ablations (seed 002): a removed sublayer writes nothing (adds zero to the stream), no norm
  makes every norm the identity, and no residual drops the `x +` of every sublayer.
  """
  cfg: 'ModelConfig'
  has_cross_attention: bool = False
  deterministic: bool = True
  scanned: bool = False  # under nn.scan the block returns (carry, None)

  @nn.compact
  def __call__(self, x, mask, positions, encoded=None, cross_mask=None, cache_index=None):
    cfg = self.cfg
    attend = lambda h: Attention(cfg, name='attn')(h, mask=mask, positions=positions,
                                                   cache_index=cache_index)
    x = self._sublayer(x, attend, 'attn', cfg.use_attention)
    if self.has_cross_attention:
      cross = lambda h: Attention(cfg, is_cross=True, name='cross_attn')(
          h, encoded, mask=cross_mask, cache_index=cache_index)
      x = self._sublayer(x, cross, 'cross_attn', cfg.use_attention)
    x = self._sublayer(x, Mlp(cfg, name='mlp'), 'mlp', cfg.use_mlp)
    return (x, None) if self.scanned else x

  def _sublayer(self, x, fn, name, present):
    cfg = self.cfg
    if cfg.norm_position == 'pre':
      y = fn(make_norm(cfg, f'{name}_norm')(x)) if present else jnp.zeros_like(x)
      y = nn.Dropout(cfg.dropout_rate)(y, deterministic=self.deterministic)
      return x + y if cfg.use_residual else y
    y = fn(x) if present else jnp.zeros_like(x)
    y = nn.Dropout(cfg.dropout_rate)(y, deterministic=self.deterministic)
    return make_norm(cfg, f'{name}_norm')(x + y if cfg.use_residual else y)


class BlockStack(nn.Module):
  """`num_layers` blocks, unrolled (block_0, block_1, ...) or stacked with nn.scan ('layers', with
  a leading layer axis), each optionally rematerialized with the configured policy."""
  cfg: 'ModelConfig'
  num_layers: int
  has_cross_attention: bool = False

  @nn.compact
  def __call__(self, x, mask=None, positions=None, encoded=None, cross_mask=None,
               cache_index=None, deterministic=True):
    cfg = self.cfg
    block = Block
    if cfg.remat_policy != 'none':
      block = nn.remat(Block, policy=REMAT_POLICIES[cfg.remat_policy], prevent_cse=not cfg.scan_layers)
    args = (mask, positions, encoded, cross_mask, cache_index)
    if cfg.scan_layers:
      stack = nn.scan(block, variable_axes={'params': 0, 'cache': 0},
                      split_rngs={'params': True, 'dropout': True},
                      in_axes=(nn.broadcast,) * len(args), length=self.num_layers,
                      metadata_params={nn.PARTITION_NAME: 'layers'})
      x, _ = stack(cfg, self.has_cross_attention, deterministic, scanned=True, name='layers')(x, *args)
      return x
    for i in range(self.num_layers):
      x = block(cfg, self.has_cross_attention, deterministic, name=f'block_{i}')(x, *args)
    return x
