"""GPT-2 small: |V| = 50,257, context 1024, D = 768, 12 blocks, 12 heads: 124,439,808 parameters."""
from transformer_jax import config_lib


def get_config(arg=None):
  config = config_lib.base_config()
  config.model.update(config_lib.STYLES['gpt2'])
  config.model.update(family='decoder', vocab_size=50257, width=768, num_layers=12,
                      num_heads=12, max_len=1024)
  config.data.seq_len = 1024
  return config
