"""Whisper's convolutional stem: log-Mel frames into the encoder's width, at half the frame rate."""
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer_jax.layers.mlp import ACTIVATIONS

__all__ = ['AudioStem', 'stem_frames']

KERNEL = 3


def stem_frames(num_frames: int) -> int:
  """The positions the stem makes of `num_frames` frames: ceil(num_frames / 2)."""
  return (num_frames + 1) // 2


class AudioStem(nn.Module):
  """Two 1-D convolutions of kernel 3 over time, each followed by the exact GELU, the second of
  stride 2 (Radford et al. 2022, section 2.2; openai/whisper model.py's conv1 and conv2): frames
  (B, F, mels) -> (B, ceil(F / 2), features).

    stem = AudioStem(features=384)
    x = stem.apply(stem.init(rng, mel), mel)  # mel (B, 3000, 80) -> (B, 1500, 384)

  Both pad one frame on each side, as Whisper's do, so that the first keeps F frames. Kernels
  are (3, in, out), drawn LeCun-normal; biases start at zero.
  """
  features: int
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, frames: jax.Array) -> jax.Array:
    """frames (B, F, mels) float -> (B, ceil(F / 2), features) in `dtype`."""
    conv = lambda stride, name: nn.Conv(
        self.features, (KERNEL,), strides=(stride,), padding=((1, 1),), dtype=self.dtype,
        param_dtype=self.param_dtype,
        kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(),
                                                 (None, 'channels', 'embed')),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ('embed',)), name=name,
        conv_general_dilated=_convolution)
    gelu = ACTIVATIONS['gelu']
    x = gelu(conv(1, 'conv1')(frames.astype(self.dtype)))
    return gelu(conv(2, 'conv2')(x))


def _convolution(frames, kernel, window_strides, padding, **unused):
  """The stem's convolution (frames (B, F, C), kernel (K, C, D), channel-last; flax's
  conv_general_dilated), its gradients taken as products over the frames' windows: XLA:CPU
  compiles a convolution's gradients inside a loop (the microbatches of
  training.grad_accum_steps) to a generic loop nest, 100-300x as slow as outside one
  (jax-ml/jax#12868: whisper-tiny's step at batch 8 in two microbatches took 58 s against
  9.8 s in one), while products run alike in and out of loops. The forward pass stays the
  convolution, faster than the windows' product at these sizes."""
  del unused  # no dilation, one group, no precision setting: as AudioStem builds it
  return _product_gradients(frames, kernel, tuple(window_strides), tuple(map(tuple, padding)))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _product_gradients(frames, kernel, window_strides, padding):
  return jax.lax.conv_general_dilated(frames, kernel, window_strides, padding,
                                      dimension_numbers=('NWC', 'WIO', 'NWC'))


def _product_gradients_fwd(frames, kernel, window_strides, padding):
  return _product_gradients(frames, kernel, window_strides, padding), (frames, kernel)


def _product_gradients_bwd(window_strides, padding, residuals, d_out):
  """dK = windows^T dY; dX: dY K^T, each window's share added back at its frames."""
  frames, kernel = residuals
  (stride,), ((low, high),) = window_strides, padding
  taps, channels, features = kernel.shape
  padded = jnp.pad(frames, ((0, 0), (low, high), (0, 0)))
  span = stride * (d_out.shape[1] - 1) + 1  # the padded frames one tap's window reads
  windows = jnp.concatenate([padded[:, tap:tap + span:stride] for tap in range(taps)], -1)
  d_kernel = jnp.einsum('bnw,bnd->wd', windows, d_out).reshape(kernel.shape)
  d_windows = jnp.einsum('bnd,wd->bnw', d_out, kernel.reshape(-1, features))
  zero = jnp.zeros((), d_out.dtype)
  d_padded = sum(jax.lax.pad(d_windows[..., tap * channels:(tap + 1) * channels], zero,
                             ((0, 0, 0), (tap, padded.shape[1] - tap - span, stride - 1),
                              (0, 0, 0)))
                 for tap in range(taps))
  d_frames = d_padded[:, low:low + frames.shape[1]]
  return d_frames.astype(frames.dtype), d_kernel.astype(kernel.dtype)


_product_gradients.defvjp(_product_gradients_fwd, _product_gradients_bwd)
