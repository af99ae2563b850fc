"""SigLIP B/16 at 224x224 (Zhai et al. 2023), as transformers' SiglipModel of that checkpoint's
sizes: a ViT-B/16 image tower with a bias in its patch embedding and the multihead attention
pooling head, a bidirectional 12-layer text tower of width 768 over 64 positions pooled at its
last one through a linear head, no projections, tanh-approximated GELU, LayerNorm eps 1e-6, and
the sigmoid loss's learned temperature and bias (t' = log 10, b = -10): 203,155,970 parameters.

Its web-scale image-text data is not part of this project: this config describes the model
(--mode=describe), compiles its steps (--mode=compile) and trains on generated pairs.
"""
from transformer_jax import config_lib


def get_config(arg=None):
  config = config_lib.base_config('clip')
  config.model.update(
      width=768, num_layers=12, num_heads=12, image_size=224, patch_size=16, image_pool='map',
      pre_norm=False, patch_bias=True, mlp='gelu_tanh', norm_eps=1e-6, text_width=768,
      text_layers=12, text_heads=12, vocab_size=32000, max_len=64, text_causal=False,
      text_pool='last', text_head=True, embed_dim=0, loss='sigmoid')
  config.data.update(name='synthetic', batch_size=256)
  return config
