"""A ViT on CIFAR-10 (32x32), sized by `variant`: NAME/PATCH with NAME in XS, Ti, S, M, B, L.

  python launch.py --config configs/vit_cifar.py:variant=S/4 --workdir /tmp/vit
Ti/4 is seed 000's exercise 4: 65 tokens, patch embedding 9,408, positions 12,480.
"""
from transformer_jax import config_lib


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, variant='Ti/4')
  config = config_lib.base_config()
  config.model.update(config_lib.STYLES['vit'])
  config.model.update(family='vit', image_size=32, num_classes=10,
                      **config_lib.vit_variant(arg.variant))
  return config
