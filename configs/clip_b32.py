"""CLIP ViT-B/32 (Radford et al. 2021) as transformers' CLIPConfig defaults describe it: a ViT-B/32
image tower at 224x224 with CLIP's pre-norm and [CLS] pooling, a causal 12-layer text tower of
width 512 over 77 positions pooled at the first EOS, both projected to 512, QuickGELU, and a
learned temperature: 151,277,313 parameters.

Its web-scale image-text data is not part of this project: this config describes the model
(--mode=describe), compiles its steps (--mode=compile) and trains on generated pairs.
"""
from transformer_jax import config_lib


def get_config(arg=None):
  config = config_lib.base_config('clip')
  config.model.update(
      width=768, num_layers=12, num_heads=12, image_size=224, patch_size=32, image_pool='cls',
      pre_norm=True, patch_bias=False, mlp='quick_gelu', norm_eps=1e-5, text_width=512,
      text_layers=12, text_heads=8, vocab_size=49408, max_len=77, text_causal=True,
      text_pool='eos', eos_id=49407, embed_dim=512, loss='softmax')
  config.data.update(name='synthetic', batch_size=256)
  return config
