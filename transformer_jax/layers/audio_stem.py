"""Whisper's convolutional stem: log-Mel frames into the encoder's width, at half the frame rate."""
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
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ('embed',)), name=name)
    gelu = ACTIVATIONS['gelu']
    x = gelu(conv(1, 'conv1')(frames.astype(self.dtype)))
    return gelu(conv(2, 'conv2')(x))
