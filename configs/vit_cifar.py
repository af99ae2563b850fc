"""A ViT on CIFAR-10 (32x32), sized by `variant`: NAME/PATCH with NAME in XS, Ti, S, M, B, L.

  python launch.py --config configs/vit_cifar.py:variant=S/4 --workdir /tmp/vit \
      --config.data.manual_dir=DIR
Ti/4 (width 192, 4x4 patches, a [CLS] token): 65 tokens, a patch embedding of 9,408 parameters
and positions of 12,480. Training: AdamW, cosine with warmup, label smoothing 0.1, crop-and-flip
augmentation, 100 epochs.
"""
from transformer_jax import config_lib
from transformer_jax.models import styles, vit

STEPS_PER_EPOCH = 50_000 // 128


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, variant='Ti/4', smoke=False)
  config = config_lib.base_config('vit')
  config.model.update(styles.STYLES['vit'])
  config.model.update(image_size=32, num_classes=10,
                      **vit.variant(arg.variant))
  config.data.update(name='cifar10', batch_size=128, eval_batch_size=500)
  config.optimizer.update(learning_rate=1e-3, warmup_steps=5 * STEPS_PER_EPOCH, b2=0.999,
                          weight_decay=0.05)
  config.training.update(steps=100 * STEPS_PER_EPOCH, label_smoothing=0.1, log_every=50,
                         eval_every=5 * STEPS_PER_EPOCH, checkpoint_every=5 * STEPS_PER_EPOCH)
  return config_lib.smoke(config) if arg.smoke else config
