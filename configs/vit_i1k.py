"""ViT-S/16 on ImageNet-1k (imagenet2012) at 224x224, after the plain-ViT baseline of Beyer et
al. 2022, "Better plain ViT baselines for ImageNet-1k" (big_vision's vit_s16_i1k config).

  python launch.py --config configs/vit_i1k.py --workdir /tmp/vit_i1k \
      --config.data.tfds_data_dir=DIR   # imagenet2012 prepared there, in array_record

Its recipe: batch 1024, 90 epochs of train[:99%] (1,268,355 images), Adam at 1e-3 with 10,000
warmup steps and cosine decay, decoupled weight decay 1e-4 (optax's AdamW multiplies its decay
by the learning rate, hence 0.1 here), gradient clipping at 1.0, inception crop + flip +
RandAugment(2, 10) to values in [-1, 1], mixup with Beta(0.2, 0.2) weights, global average
pooling, no label smoothing; held-out: the 50,000 validation images resized to 256 on the short
side and centre-cropped to 224. The paper reaches 76.5% top-1 in 90 epochs (6-7 hours on a TPU
v3-8). This model differs from theirs in two places: learned 1-D positions where they use fixed
2-D sin-cos ones, and no pre-logits layer; neither is expected to move the figure by more than a
few tenths of a point (the paper's ablations), and no run of it to completion has been made here.
"""
from transformer_jax import config_lib
from transformer_jax.models import styles, vit

TRAIN_IMAGES = 1_268_355  # train[:99%]; train[99%:] is big_vision's minival
BATCH_SIZE = 1024


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, variant='S/16', epochs=90, smoke=False)
  config = config_lib.base_config('vit')
  config.model.update(styles.STYLES['vit'])
  config.model.update(image_size=224, num_classes=1000, pool='mean', **vit.variant(arg.variant))
  config.data.update(
      name='imagenet2012', train_split='train[:99%]', eval_split='validation',
      batch_size=BATCH_SIZE, eval_batch_size=1000,
      pp_train='decode|inception_crop(224)|flip_lr|randaug(2, 10)|value_range(-1, 1)',
      pp_eval='decode|resize_small(256)|central_crop(224)|value_range(-1, 1)',
      mixup_alpha=0.2, num_threads=8, prefetch_buffer_size=8)
  config.optimizer.update(learning_rate=1e-3, warmup_steps=10_000, b2=0.999, weight_decay=0.1,
                          grad_clip_norm=1.0)
  steps = arg.epochs * TRAIN_IMAGES // BATCH_SIZE
  config.training.update(steps=steps, log_every=50, eval_every=2500, checkpoint_every=2500)
  if arg.smoke:
    config = config_lib.smoke(config)
    config.optimizer.warmup_steps = 1
  return config
