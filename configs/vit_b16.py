"""ViT-B/16 (Dosovitskiy et al. 2020) at 224x224 with a 1000-class head: 86,567,656 parameters.

Its ImageNet input pipeline is not part of this project: this config describes the model
(--mode=describe) and receives converted weights.
"""
from transformer_jax import config_lib
from transformer_jax.models import styles, vit


def get_config(arg=None):
  config = config_lib.base_config('vit')
  config.model.update(styles.STYLES['vit'])
  config.model.update(image_size=224, num_classes=1000,
                      **vit.variant('B/16'))
  return config
