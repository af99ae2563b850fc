"""Inputs into vectors: tokens, positions (learned, sinusoidal, RoPE), image patches, [CLS]."""
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax.kernels.contraction import contract, int8_product
from transformer_jax.layers.linear import INITS, xavier_uniform

__all__ = [
    'apply_rope', 'BIAS_INITS', 'default_positions', 'PatchEmbed', 'POSITION_EMBEDDINGS',
    'resize_position_grid', 'sinusoidal', 'SINUSOIDAL_LAYOUTS', 'TextEmbed']


POSITION_EMBEDDINGS = ('learned', 'sinusoidal', 'none')
BIAS_INITS = ('zeros', 'fan_in_uniform')  # PatchEmbed's


class TextEmbed(nn.Module):
  """Token rows E[s] (times sqrt(width) where `scale`), plus position rows ('learned': a table
  of `max_len` rows; 'sinusoidal'; 'none', as for RoPE, which acts in the attention) and
  token-type rows where `type_vocab_size` > 0.

    embed = TextEmbed(vocab_size=65, width=128, positions='none')
    x = embed.apply(params, ids, positions)  # ids, positions (B, T) -> (B, T, width)
    logits = embed.apply(params, x, method='attend')  # the tied unembedding x E^T, float32

  Learned positions clip negative positions (the left padding of a decoding batch, never seen
  by a real token) to row 0. A token table of int8 rows with their 'tokens_scale'
  (`quantization.int8_params`) is read as rows times scales, and its unembedding is the int8
  product (`kernels.contraction.int8_product`).
  """
  vocab_size: int
  width: int
  positions: str = 'learned'
  max_len: int | None = None
  type_vocab_size: int = 0
  scale: bool = False
  init_std: float = 0.02
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  def __post_init__(self):
    if self.positions not in POSITION_EMBEDDINGS:
      raise ValueError(f'Unknown positions {self.positions!r}: use one of '
                       f'{list(POSITION_EMBEDDINGS)}.')
    if self.positions == 'learned' and not (self.max_len or 0) >= 1:
      raise ValueError('Learned positions need max_len, the rows of their table.')
    if self.vocab_size < 1 or self.width < 1:
      raise ValueError(f'TextEmbed needs vocab_size >= 1 and width >= 1, not {self.vocab_size} '
                       f'and {self.width}.')
    super().__post_init__()

  def setup(self):
    table = lambda name, rows, axis: self.param(
        name, nn.with_logical_partitioning(nn.initializers.normal(self.init_std),
                                           (axis, 'embed')), (rows, self.width), self.param_dtype)
    self.tokens = table('tokens', self.vocab_size, 'vocab')
    self.token_scales = (self.get_variable('params', 'tokens_scale')
                         if self.has_variable('params', 'tokens_scale') else None)
    if self.positions == 'learned':
      self.position_table = table('positions', self.max_len, 'positions')
    if self.type_vocab_size:
      self.types = table('types', self.type_vocab_size, 'types')

  def __call__(self, ids, positions, token_types=None):
    """ids (B, T) int, positions (B, T) int, token_types (B, T) int or None (type 0) ->
    (B, T, width) in `dtype`."""
    x = jnp.take(self.tokens, ids, axis=0).astype(jnp.float32)
    if self.token_scales is not None:
      x = x * jnp.take(self.token_scales, ids, axis=0)[..., None]
    if self.scale:
      x = x * np.sqrt(self.width).astype(np.float32)
    if self.positions == 'learned':
      x = x + jnp.take(self.position_table, jnp.maximum(positions, 0), axis=0)
    elif self.positions == 'sinusoidal':
      x = x + sinusoidal(positions, self.width)
    if self.type_vocab_size:
      types = jnp.zeros_like(ids) if token_types is None else token_types
      x = x + jnp.take(self.types, types, axis=0)
    return x.astype(self.dtype)

  def attend(self, x):
    """x (..., width) -> float32 logits (..., vocab_size): the tied unembedding x E^T."""
    if self.token_scales is not None:
      return int8_product(x, self.tokens, self.token_scales, 1)
    return contract(x.astype(self.dtype), self.tokens.astype(self.dtype).T, 1, jnp.float32)


def default_positions(batch: int, length: int, offset=0) -> jax.Array | np.ndarray:
  """(batch, length): every row at offset, offset + 1, ... A traced offset (a decoding step's
  cache index) gives a traced array; any other a NumPy one, constants when tracing, so that
  RoPE's rotations are constants too (see apply_rope)."""
  if isinstance(offset, jax.Array):
    return jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32) + offset, (batch, length))
  return np.broadcast_to(np.arange(length, dtype=np.int32) + offset, (batch, length))


SINUSOIDAL_LAYOUTS = ('interleaved', 'sin_cos')


def sinusoidal(positions: jax.Array, width: int, base: float = 10000.0,
               layout: str = 'interleaved') -> jax.Array:
  """Fixed sinusoidal positions (..., width) float32 of integer `positions` (...).

  'interleaved' (Vaswani et al. 2017): PE[p, 2i] = sin(p / base^(2i/D)), PE[p, 2i+1] =
  cos(p / base^(2i/D)). 'sin_cos' (Whisper's encoder, Radford et al. 2022; tensor2tensor's timing
  signal): the D/2 sines, then the D/2 cosines, of p / base^(i/(D/2 - 1)), the frequencies
  spanning 1 to 1/base exactly.
  """
  if layout not in SINUSOIDAL_LAYOUTS:
    raise ValueError(f'Unknown sinusoidal layout {layout!r}: use one of '
                     f'{list(SINUSOIDAL_LAYOUTS)}.')
  if layout == 'sin_cos':
    if width % 2 or width < 4:
      raise ValueError(f"The 'sin_cos' layout needs an even width of at least 4, not {width}.")
    half = width // 2
    inv_freq = np.exp(-np.log(base) / (half - 1) * np.arange(half)).astype(np.float32)
  else:
    inv_freq = base ** (-np.arange(0, width, 2, dtype=np.float32) / width)
  angles = (positions.astype(jnp.float32)[..., None]
            * inv_freq.reshape((1,) * positions.ndim + (-1,)))
  if layout == 'sin_cos':
    return jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)
  interleaved = jnp.stack([jnp.sin(angles), jnp.cos(angles)], axis=-1)
  return interleaved.reshape(positions.shape + (-1,))[..., :width]


def apply_rope(x: jax.Array, positions, base: float = 10000.0) -> jax.Array:
  """Rotary positions, half-split convention: rotate (x[:h], x[h:]) pairwise by p * base^(-i/h).

  x: (B, T, heads, head_dim); positions: (B, T), or (1, T) shared by every row. Computed in
  float32. Positions given as a NumPy array (known when tracing, such as 0..T-1 in training)
  make the rotations constants of (1 | B, T) rows, computed once on the host: from traced
  positions XLA:CPU fuses the cosines and sines into each product that uses them and recomputes
  them there (the reference LM's train step: 3% longer). Compiled for a TPU, the constants move
  no more bytes (experiments/results/bench_train).
  """
  half = x.shape[-1] // 2
  inv_freq = base ** (-np.arange(half, dtype=np.float32) / half)
  xp = np if isinstance(positions, np.ndarray) else jnp
  if xp is np and (positions == positions[:1]).all():
    positions = positions[:1]  # one row of constants, broadcast over the batch
  angles = positions.astype(np.float32)[:, :, None, None] * inv_freq.reshape(1, 1, 1, -1)
  cos, sin = xp.cos(angles), xp.sin(angles)
  x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
  return jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1).astype(x.dtype)


class PatchEmbed(nn.Module):
  """Non-overlapping P x P patches (Dosovitskiy et al. 2020), each mapped by one shared matrix
  plus bias (`use_bias`).

  A convolution with kernel = stride = P and no padding is that map: its (P, P, C, D) kernel
  flattened in (row, column, channel) order is the (P*P*C, D) patch matrix. The grid is read row
  by row into (B, num_patches, D). `initializer` draws that matrix LeCun-normal ('normal') or
  Xavier-uniform over its fans P*P*C and D ('xavier_uniform': DiT's, which initializes the
  convolution "like nn.Linear"); `bias_init` 'zeros', or 'fan_in_uniform': U(+-1 / sqrt(P*P*C)),
  PyTorch's default for a Conv2d's bias, which DiT's initialization leaves as it is.
  """
  patch_size: int
  features: int
  use_bias: bool = True  # CLIP's patch embedding has none (Radford et al. 2021)
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32
  initializer: str = 'normal'
  bias_init: str = 'zeros'

  def __post_init__(self):
    if self.initializer not in INITS or self.bias_init not in BIAS_INITS:
      raise ValueError(f'PatchEmbed initializer={self.initializer!r}, bias_init='
                       f'{self.bias_init!r}: use one of {list(INITS)} and one of '
                       f'{list(BIAS_INITS)}.')
    super().__post_init__()

  @nn.compact
  def __call__(self, images: jax.Array) -> jax.Array:
    """images (B, H, W, C) -> (B, H/P * W/P, features), patches read row by row."""
    p = self.patch_size
    fan_in = p * p * images.shape[-1]
    draw_kernel = (xavier_uniform(fan_in, self.features) if self.initializer == 'xavier_uniform'
                   else nn.initializers.lecun_normal())
    bound = fan_in ** -0.5
    draw_bias = ((lambda key, shape, dtype: jax.random.uniform(key, shape, dtype, -bound, bound))
                 if self.bias_init == 'fan_in_uniform' else nn.initializers.zeros)
    conv = nn.Conv(
        self.features, (p, p), strides=(p, p), padding='VALID', use_bias=self.use_bias,
        dtype=self.dtype,
        param_dtype=self.param_dtype,
        kernel_init=nn.with_logical_partitioning(draw_kernel, (None, None, 'channels', 'embed')),
        bias_init=nn.with_logical_partitioning(draw_bias, ('embed',)), name='conv',
        conv_general_dilated=_patch_product)
    grid = conv(images.astype(self.dtype))  # (B, H/P, W/P, D)
    return grid.reshape(grid.shape[0], -1, grid.shape[-1])


def _patch_product(images, kernel, window_strides, padding, **unused):
  """PatchEmbed's convolution (channel-last images, a (P, P, C, D) kernel of stride P, no
  padding) as what it is: the product of the images' patches (B, H/P, W/P, P*P*C) by the
  (P*P*C, D) patch matrix. XLA:CPU compiles the convolution's gradient inside a loop (the
  microbatches of training.grad_accum_steps) to a generic loop nest, 100x as slow as outside
  one (jax-ml/jax#12868; ViT-B/16's patches at batch 16: 0.11 s for two microbatches unrolled,
  11 s in a scan); the product takes 0.08-0.1 s in both. Alone it is 1.1-1.2x as fast as the
  convolution at ViT-B/16's size and 3x at CLIP B/32's at batch 64, forward and backward; in
  CLIP's whole step the two are level within the noise."""
  del window_strides, padding, unused  # P and no padding, as PatchEmbed builds the convolution
  b, h, w, c = images.shape
  p = kernel.shape[0]
  patches = images.reshape(b, h // p, p, w // p, p, c).transpose(0, 1, 3, 2, 4, 5)
  return _patch_matrix_product(patches.reshape(b, h // p, w // p, p * p * c),
                               kernel.reshape(-1, kernel.shape[-1]))


@jax.custom_vjp
def _patch_matrix_product(x, kernel):
  """x (..., K) @ kernel (K, D), whose backward pass takes dY as it comes: left to itself,
  XLA:CPU fuses the transpose that the kernel's gradient reads into the fusion that sums dY
  over every residual branch, which then writes column by column (CLIP B/32's patches at batch
  64: 1.1 s for a 10 MB dY)."""
  return x @ kernel


def _patch_matrix_product_fwd(x, kernel):
  return x @ kernel, (x, kernel)


def _patch_matrix_product_bwd(residuals, d_out):
  x, kernel = residuals
  d_out = jax.lax.optimization_barrier(d_out)
  d_kernel = jnp.einsum('...k,...d->kd', x, d_out)
  return d_out @ kernel.T, d_kernel


_patch_matrix_product.defvjp(_patch_matrix_product_fwd, _patch_matrix_product_bwd)


def resize_position_grid(posemb: jax.Array, new_grid: int, num_prefix_tokens: int = 1) -> jax.Array:
  """Bicubically resizes a ViT's (prefix + g*g, D) position table to (prefix + new_grid**2, D).

  The prefix rows ([CLS]) are kept as they are; the patch rows are reshaped to their 2-D grid,
  interpolated, and read back row by row: the 2-D interpolation of pre-trained position
  embeddings with which Dosovitskiy et al. (2020, section 3.2) fine-tune at a higher resolution.
  """
  prefix, grid = posemb[:num_prefix_tokens], posemb[num_prefix_tokens:]
  old = int(round(grid.shape[0] ** 0.5))
  if old * old != grid.shape[0]:
    raise ValueError(f'{grid.shape[0]} position rows after {num_prefix_tokens} prefix row(s) do '
                     'not form a square grid: pass the right num_prefix_tokens.')
  grid = grid.reshape(old, old, -1).astype(jnp.float32)
  resized = jax.image.resize(grid, (new_grid, new_grid, grid.shape[-1]), method='bicubic')
  resized = resized.reshape(new_grid * new_grid, -1).astype(posemb.dtype)
  return jnp.concatenate([prefix, resized], axis=0)
