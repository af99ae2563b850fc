"""The ViT of seed 002 on CIFAR-10: the language model's blocks (RMSNorm, SwiGLU, no biases)
without the causal mask, 4x4 patches, learned positions, mean pooling: 802,826 parameters."""
from transformer_jax import config_lib


def get_config(arg=None):
  config = config_lib.base_config()
  config.model.update(config_lib.STYLES['llama'])
  config.model.update(family='vit', positions='learned', pool='mean', image_size=32,
                      patch_size=4, num_classes=10, width=128, num_layers=4, num_heads=4)
  return config
