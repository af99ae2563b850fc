"""A GPT-2 style character model of TinyShakespeare.

LayerNorm, GELU MLP (4D), learned positions, biases, tied unembedding; 6 blocks of width 192.
"""
from transformer_jax import config_lib


def get_config(arg=None):
  config = config_lib.base_config()
  config.model.update(config_lib.STYLES['gpt2'])
  config.model.update(family='decoder', vocab_size=65, width=192, num_layers=6, num_heads=6,
                      max_len=256)
  config.data.seq_len = 256
  return config
