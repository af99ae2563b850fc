"""A BERT-style masked character model of TinyShakespeare: post-LN, GELU, learned positions,
embedding LayerNorm, token types, tied MLM head."""
from transformer_jax import config_lib


def get_config(arg=None):
  config = config_lib.base_config()
  config.model.update(config_lib.STYLES['bert'])
  config.model.update(family='encoder', vocab_size=68, width=128, num_layers=4, num_heads=4,
                      max_len=128)
  config.data.seq_len = 128
  return config
