"""The position-wise feed-forward sublayer: a GELU/ReLU MLP or SwiGLU."""
import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer_jax.layers.linear import Linear

ACTIVATIONS = {
    'gelu': lambda x: jax.nn.gelu(x, approximate=False),  # BERT, ViT
    'gelu_tanh': lambda x: jax.nn.gelu(x, approximate=True),  # GPT-2
    'relu': jax.nn.relu,  # the original transformer
}


class Mlp(nn.Module):
  """sigma(x W1 + b1) W2 + b2, or SwiGLU: (silu(x W_gate) * x W_up) W_down."""
  cfg: 'ModelConfig'

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    cfg = self.cfg
    dense = lambda features, axes, name: Linear(
        (features,), axes, use_bias=cfg.use_bias, dtype=cfg.compute_dtype,
        param_dtype=cfg.weight_dtype, init_std=cfg.init_std, name=name)
    hidden = cfg.hidden_dim
    if cfg.mlp == 'swiglu':
      gate = dense(hidden, ('embed', 'mlp'), 'gate')(x)
      up = dense(hidden, ('embed', 'mlp'), 'up')(x)
      h = jax.nn.silu(gate) * up
    else:
      h = ACTIVATIONS[cfg.mlp](dense(hidden, ('embed', 'mlp'), 'up')(x))
    return dense(cfg.width, ('mlp', 'embed'), 'down')(h)
