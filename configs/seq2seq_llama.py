"""A modern encoder-decoder (pre-LN RMSNorm, SwiGLU, RoPE, GQA, no biases) on a synthetic
string task."""
from transformer_jax import config_lib


def get_config(arg=None):
  config = config_lib.base_config()
  config.model.update(config_lib.STYLES['llama'])
  config.model.update(family='encoder_decoder', vocab_size=32, width=128, num_layers=3,
                      num_decoder_layers=3, num_heads=4, num_kv_heads=2, max_len=64,
                      tie_embeddings=True)
  config.data.seq_len = 32
  return config
