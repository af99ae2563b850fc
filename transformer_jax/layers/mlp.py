"""The position-wise feed-forward sublayer: a GELU/ReLU/QuickGELU MLP, or a gated one (SwiGLU,
GeGLU)."""
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax.layers import axes
from transformer_jax.layers.linear import Linear

__all__ = ['ACTIVATIONS', 'GATED', 'KINDS', 'MLP']

_SQRT_HALF = np.float32(np.sqrt(0.5))
_PDF_SCALE = np.float32(1 / np.sqrt(2 * np.pi))


@jax.custom_jvp
def gelu(x):
  """The exact GELU, x * Phi(x) = x (1 + erf(x / sqrt 2)) / 2 (Hendrycks & Gimpel 2016), in
  PyTorch's form (torch.nn.GELU). Its derivative, Phi(x) + x phi(x), is written out: from
  jax.nn.gelu's erfc form XLA:CPU computes the activation in three passes over the array and
  its gradient in more (about 5% of a small GPT's step)."""
  return x * (0.5 + 0.5 * jax.lax.erf(x * _SQRT_HALF))


@gelu.defjvp
def _gelu_jvp(primals, tangents):
  (x,), (tangent,) = primals, tangents
  cdf = 0.5 + 0.5 * jax.lax.erf(x * _SQRT_HALF)
  return x * cdf, tangent * (cdf + x * _PDF_SCALE * jnp.exp(-0.5 * x * x))


ACTIVATIONS = {
    'gelu': gelu,  # BERT, ViT
    'gelu_tanh': lambda x: jax.nn.gelu(x, approximate=True),  # GPT-2
    'relu': jax.nn.relu,  # the original transformer
    # x * sigmoid(1.702 x), the sigmoid approximation of GELU (Hendrycks & Gimpel 2016) that
    # OpenAI's CLIP checkpoints were trained with (Radford et al. 2021)
    'quick_gelu': lambda x: x * jax.nn.sigmoid(1.702 * x),
}
# Gated units (Shazeer 2020): the activation of a gate times a second projection.
GATED = {
    'swiglu': jax.nn.silu,  # LLaMA
    'gated-gelu': lambda x: jax.nn.gelu(x, approximate=True),  # T5 1.1 (transformers' gelu_new)
}
KINDS = (*ACTIVATIONS, *GATED)  # every value of MLP.activation


class MLP(nn.Module):
  """activation(x W_up + b) W_down + b, or a gated unit (GATED): SwiGLU
  (silu(x W_gate) * x W_up) W_down, or T5 1.1's gated GELU (gelu_tanh(x W_gate) * x W_up) W_down.

    mlp = MLP(hidden=512, activation='swiglu')
    y = mlp.apply(mlp.init(rng, x), x)  # x (..., D) -> (..., out_features or D)

  `activation` is one of KINDS; `initializer` (Linear's INITS) draws the kernels N(0, init_std)
  (LeCun normal where init_std is None) or Xavier-uniform, the down projection's times
  `out_init_gain` (GPT-2's 1 / sqrt(N) for the N residual branches of a stack). `dropout_rate`
  drops the hidden activation (after the activation or the gate's product, before the down
  projection: T5's) where the call is not `deterministic`, with the 'dropout' rng.
  """
  hidden: int
  activation: str = 'gelu'
  out_features: int | None = None  # None: the input's width
  use_bias: bool = True
  init_std: float | None = 0.02
  initializer: str = 'normal'
  out_init_gain: float = 1.0  # times the down projection's initial draw
  dropout_rate: float = 0.0  # of the hidden activation, in training
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  def __post_init__(self):
    if self.activation not in KINDS:
      raise ValueError(f'Unknown MLP activation {self.activation!r}: use one of {list(KINDS)}.')
    if self.hidden < 1:
      raise ValueError(f'MLP hidden={self.hidden} must be at least 1.')
    if not 0 <= self.dropout_rate < 1:
      raise ValueError(f'MLP dropout_rate={self.dropout_rate} must be in [0, 1).')
    super().__post_init__()

  @nn.compact
  def __call__(self, x: jax.Array, deterministic: bool = True) -> jax.Array:
    """x (..., D) -> (..., out_features or D), in `dtype`; deterministic False drops the hidden
    activation at `dropout_rate`."""
    dense = lambda features, in_axis, out_axis, name, gain=1.0: Linear(
        (features,), (in_axis,), (out_axis,), use_bias=self.use_bias, init_std=self.init_std,
        init_gain=gain, initializer=self.initializer, dtype=self.dtype,
        param_dtype=self.param_dtype, name=name)
    if self.activation in GATED:
      gate = dense(self.hidden, 'embed', 'mlp', 'gate')(x)
      h = GATED[self.activation](gate) * dense(self.hidden, 'embed', 'mlp', 'up')(x)
    else:
      h = ACTIVATIONS[self.activation](dense(self.hidden, 'embed', 'mlp', 'up')(x))
    h = nn.Dropout(self.dropout_rate)(axes.constrain(h, axes.MLP), deterministic=deterministic)
    return dense(self.out_features or x.shape[-1], 'mlp', 'embed', 'down', self.out_init_gain)(h)
