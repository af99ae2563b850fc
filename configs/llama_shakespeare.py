"""The language model of seed 002 on TinyShakespeare characters.

4 pre-norm blocks, width 128, 4 heads, RMSNorm, SwiGLU (341 hidden), RoPE, no biases, untied
head: 803,712 parameters.
  python launch.py --config configs/llama_shakespeare.py --workdir /tmp/llama
"""
from transformer_jax import config_lib


def get_config(arg=None):
  config = config_lib.base_config()
  config.model.update(config_lib.STYLES['llama'])
  config.model.update(family='decoder', vocab_size=65, width=128, num_layers=4, num_heads=4,
                      max_len=64)
  config.data.seq_len = 64
  return config
