"""The transformer block (pre-LN or post-LN, optional cross-attention, ablations) and its stack."""
import functools
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer_jax.layers import axes
from transformer_jax.layers.norms import RMSNorm

NORM_POSITIONS = ('pre', 'post')
REMAT_POLICIES = {
    'none': None,  # keep every activation for the backward pass
    'full': None,  # save nothing: recompute the whole block in the backward pass
    'dots': jax.checkpoint_policies.checkpoint_dots,
    'dots_no_batch': jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
}

ModuleFactory = Callable[..., nn.Module]  # called with name=..., e.g. functools.partial(MLP, ...)


class Block(nn.Module):
  """pre-LN:  x = x + f(norm(x)) for f in (attention, [cross-attention], mlp);
  post-LN: x = norm(x + f(x)).

    block = Block(attention=functools.partial(Attention, num_heads=4, head_dim=32),
                  mlp=functools.partial(MLP, hidden=512, activation='swiglu'))
    y = block.apply(params, x, mask, positions)

  `attention`, `mlp`, `cross_attention` and `norm` are module factories, called with the
  sublayer's name ('attn', 'cross_attn', 'mlp'; norms '<sublayer>_norm'): pass your own module to
  try a new sublayer. `cross_attention` None: a block without one; `norm` None: no norms. The
  ablations keep a sublayer's place but make it write nothing: use_attention=False or
  use_mlp=False adds zero to the residual stream (a post-LN block still normalizes there), and
  use_residual=False drops the `x +` of every sublayer.
  """
  attention: ModuleFactory
  mlp: ModuleFactory
  norm: ModuleFactory | None = RMSNorm
  cross_attention: ModuleFactory | None = None
  norm_position: str = 'pre'
  use_attention: bool = True
  use_mlp: bool = True
  use_residual: bool = True
  dropout_rate: float = 0.0
  deterministic: bool = True
  scanned: bool = False  # under nn.scan the block returns (carry, None)

  def __post_init__(self):
    if self.norm_position not in NORM_POSITIONS:
      raise ValueError(f'Unknown norm_position {self.norm_position!r}: use "pre" or "post".')
    if not 0 <= self.dropout_rate < 1:
      raise ValueError(f'dropout_rate={self.dropout_rate} must be in [0, 1).')
    super().__post_init__()

  @nn.compact
  def __call__(self, x, mask=None, positions=None, encoded=None, cross_mask=None,
               cache_index=None):
    x = axes.constrain(x, axes.EMBED)  # the residual stream between blocks
    attend = lambda h: self.attention(name='attn')(h, mask=mask, positions=positions,
                                                   cache_index=cache_index)
    x = self._sublayer(x, attend, 'attn', self.use_attention)
    if self.cross_attention is not None:
      cross = lambda h: self.cross_attention(name='cross_attn')(
          h, encoded, mask=cross_mask, cache_index=cache_index)
      x = self._sublayer(x, cross, 'cross_attn', self.use_attention)
    x = axes.constrain(self._sublayer(x, self.mlp(name='mlp'), 'mlp', self.use_mlp), axes.EMBED)
    return (x, None) if self.scanned else x

  def _sublayer(self, x, fn, name, present):
    norm = (lambda h: h) if self.norm is None else self.norm(name=f'{name}_norm')
    if self.norm_position == 'pre':
      y = fn(norm(x)) if present else jnp.zeros_like(x)
      y = nn.Dropout(self.dropout_rate)(y, deterministic=self.deterministic)
      return x + y if self.use_residual else y
    y = fn(x) if present else jnp.zeros_like(x)
    y = nn.Dropout(self.dropout_rate)(y, deterministic=self.deterministic)
    return norm(x + y if self.use_residual else y)


class BlockStack(nn.Module):
  """`num_layers` blocks, unrolled (block_0, block_1, ...) or stacked with nn.scan (`scan`:
  'layers', with a leading layer axis, so that compile time does not grow with depth), each
  rematerialized by `remat_policy` (a key of REMAT_POLICIES).

  `block` is the Block class with its arguments bound: functools.partial(Block, attention=...,
  mlp=...).
  """
  block: Any
  num_layers: int
  scan: bool = False
  remat_policy: str = 'none'

  def __post_init__(self):
    if not (isinstance(self.block, functools.partial) and isinstance(self.block.func, type)
            and issubclass(self.block.func, nn.Module)):
      raise ValueError('BlockStack.block must be a module class with its arguments bound by '
                       'functools.partial, such as functools.partial(Block, attention=..., '
                       'mlp=...).')
    if self.remat_policy not in REMAT_POLICIES:
      raise ValueError(f'Unknown remat_policy {self.remat_policy!r}: use one of '
                       f'{list(REMAT_POLICIES)}.')
    if self.num_layers < 1:
      raise ValueError(f'num_layers={self.num_layers} must be at least 1.')
    super().__post_init__()

  @nn.compact
  def __call__(self, x, mask=None, positions=None, encoded=None, cross_mask=None,
               cache_index=None, deterministic=True):
    block = self.block.func
    if self.remat_policy != 'none':
      block = nn.remat(block, policy=REMAT_POLICIES[self.remat_policy], prevent_cse=not self.scan)
    bound = dict(self.block.keywords, deterministic=deterministic)
    args = (mask, positions, encoded, cross_mask, cache_index)
    if self.scan:
      stack = nn.scan(block, variable_axes={'params': 0, 'cache': 0},
                      split_rngs={'params': True, 'dropout': True},
                      in_axes=(nn.broadcast,) * len(args), length=self.num_layers,
                      metadata_params={nn.PARTITION_NAME: 'layers'})
      x, _ = stack(*self.block.args, **bound, scanned=True, name='layers')(x, *args)
      return x
    for i in range(self.num_layers):
      x = block(*self.block.args, **bound, name=f'block_{i}')(x, *args)
    return x
