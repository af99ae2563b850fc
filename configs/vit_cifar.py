"""A ViT trained from scratch on CIFAR-10 (32x32), sized by `variant`: NAME/PATCH with NAME in
XS, Ti, S, M, B, L; `epochs` sets the budget, `recipe` the augmentation.

  python launch.py --config configs/vit_cifar.py:variant=Ti/4,epochs=200 --workdir /tmp/vit \
      --config.data.manual_dir=DIR

recipe='strong' (the default) is the recipe of from-scratch ViTs on small datasets: RandAugment
(Cubuk et al. 2019, 2 ops at magnitude 9) after the padded random crop and flip, mixup (Zhang et
al. 2018, alpha 0.8) or CutMix (Yun et al. 2019, alpha 1.0) on each pair of images, label
smoothing 0.1, AdamW with 5 warmup epochs (a tenth of a shorter run) and cosine decay to 1% of
the peak, 200 epochs. It is
built to reach the published from-scratch figure of about 91% test accuracy (omihub777/ViT-CIFAR:
91.0% with a 6.3M-parameter ViT of 7 blocks, width 384, 8x8 patches, 200 epochs of AutoAugment
and label smoothing); that 200-epoch run has not been made with this code. recipe='basic' is the
crop-and-flip recipe alone (no RandAugment, no mixing), which learns faster at a short budget.
Ti/4 (width 192, 4x4 patches, a [CLS] token): 65 tokens, a patch embedding of 9,408 parameters
and positions of 12,480.
"""
from transformer_jax import config_lib
from transformer_jax.models import styles, vit

TRAIN_IMAGES = 50_000
BATCH_SIZE = 128
# CIFAR-10's training-set channel means and standard deviations, in pixel units.
CIFAR10_MEAN, CIFAR10_STD = (125.3, 123.0, 113.9), (63.0, 62.1, 66.7)
NORMALIZE = f'normalize({CIFAR10_MEAN}, {CIFAR10_STD})'
RECIPES = {
    'strong': dict(pp_train=f'decode|random_crop(32, pad=4)|flip_lr|randaug(2, 9)|{NORMALIZE}',
                   mixup_alpha=0.8, cutmix_alpha=1.0),
    'basic': dict(pp_train=f'decode|random_crop(32, pad=4)|flip_lr|{NORMALIZE}',
                  mixup_alpha=0.0, cutmix_alpha=0.0),
}


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, variant='Ti/4', epochs=200, recipe='strong', smoke=False)
  if arg.recipe not in RECIPES:
    raise ValueError(f'recipe={arg.recipe!r} is not one of {sorted(RECIPES)}.')
  config = config_lib.base_config('vit')
  config.model.update(styles.STYLES['vit'])
  config.model.update(image_size=32, num_classes=10, **vit.variant(arg.variant))
  config.data.update(name='cifar10', batch_size=BATCH_SIZE, eval_batch_size=500,
                     pp_eval=f'decode|{NORMALIZE}', **RECIPES[arg.recipe])
  epoch, steps = TRAIN_IMAGES // BATCH_SIZE, arg.epochs * (TRAIN_IMAGES // BATCH_SIZE)
  # 5 warmup epochs, or a tenth of a shorter run.
  config.optimizer.update(learning_rate=1e-3, warmup_steps=min(5 * epoch, steps // 10),
                          b2=0.999, weight_decay=0.05, min_lr_ratio=0.01)
  every = max(arg.epochs // 20, 1) * epoch
  config.training.update(steps=steps, label_smoothing=0.1, log_every=50, eval_every=every,
                         checkpoint_every=every)
  return config_lib.smoke(config) if arg.smoke else config
