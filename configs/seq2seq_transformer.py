"""The original transformer (Vaswani et al. 2017) layout, small, on a synthetic string task:
post-LN, ReLU, sinusoidal positions, one shared tied embedding, cross-attention in every
decoder block."""
from transformer_jax import config_lib


def get_config(arg=None):
  config = config_lib.base_config()
  config.model.update(config_lib.STYLES['transformer'])
  config.model.update(family='encoder_decoder', vocab_size=32, width=128, num_layers=3,
                      num_decoder_layers=3, num_heads=4, max_len=64)
  config.data.seq_len = 32
  return config
