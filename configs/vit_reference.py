"""The reference ViT on CIFAR-10: the blocks of the reference language model
(configs/llama_shakespeare.py: RMSNorm, SwiGLU, no biases) without the causal mask and RoPE, 4x4
patches, learned positions, mean pooling, no [CLS] token: 802,826 parameters. Trained with the
crop-and-flip recipe of configs/vit_cifar.py (recipe=basic), for `epochs` epochs."""
import pathlib

from transformer_jax import config_lib
from transformer_jax.models import styles


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, epochs=100, recipe='basic', smoke=False)
  config = config_lib.from_file(pathlib.Path(__file__).with_name('vit_cifar.py'),
                                f'epochs={arg.epochs},recipe={arg.recipe}')
  config.model.update(styles.of('llama', 'vit'))
  config.model.update(positions='learned', pool='mean', image_size=32,
                      patch_size=4, num_classes=10, width=128, num_layers=4, num_heads=4)
  return config_lib.smoke(config) if arg.smoke else config
