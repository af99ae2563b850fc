"""A small pixel-space DiT for 32x32 images that trains on this machine (4,201,440 parameters):
DiT-S's blocks narrowed to width 192 and 6 blocks (3 heads), patches of 4 (64 tokens), learned
sigma, the linear schedule of 1,000 steps, labels dropped 10% of the time for guidance. Images
in [-1, 1] with a random flip, from CIFAR-10 (data.name=cifar10, the default) or generated
images (--config.data.name=synthetic).

It trains as DiT's train.py (Peebles & Xie 2023, github.com/facebookresearch/DiT): DiT's
initialization (model.init='xavier_uniform': models.py's initialize_weights), AdamW at 1e-4
without weight decay or gradient clipping, a constant rate, the loss of its diffusion (the
noise's MSE plus the variational bound with the mean held fixed), an EMA of 0.9999. Where it
differs: the batch (128, not 256), the model's size, and the EMA's decay, which warms up as
diffusers' EMAModel does (training.ema_warmup: min(0.9999, (1 + t) / (10 + t))), so that a
run of any length evaluates and samples an average of its own recent steps (DiT's EMA starts
at the initial weights, right for its 400k steps only).

  python launch.py --config configs/dit_reference.py --workdir /tmp/dit
  python launch.py --config configs/dit_reference.py --workdir /tmp/dit --mode=sample \
      --config.sample.guidance_scale=4 --config.sample.sampler=ddim --config.sample.steps=50
"""
from transformer_jax import config_lib


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, steps=20_000, smoke=False)
  config = config_lib.base_config('dit')
  config.model.update(image_size=32, num_channels=3, patch_size=4, width=192, num_layers=6,
                      num_heads=3, num_classes=10, learn_sigma=True, class_dropout=0.1)
  config.data.update(name='cifar10', batch_size=128, eval_batch_size=500, augment=False,
                     pp_train='decode|flip_lr|value_range(-1, 1)',
                     pp_eval='decode|value_range(-1, 1)')
  config.optimizer.update(learning_rate=1e-4, warmup_steps=0, schedule='constant', b2=0.999,
                          weight_decay=0.0, grad_clip_norm=0.0)
  config.training.update(steps=arg.steps, ema_decay=0.9999, ema_warmup=True, log_every=100,
                         eval_every=max(arg.steps // 10, 1),
                         checkpoint_every=max(arg.steps // 10, 1))
  config.sample.update(num_samples=16, steps=250, sampler='ddpm', guidance_scale=1.0)
  return config_lib.smoke(config) if arg.smoke else config
