"""DiT-XL/2 (Peebles & Xie 2023): class-conditional ImageNet 256x256 in the latents of a VAE
(32x32x4), patches of 2, learned sigma, 1,000 classes and the null class: 675,129,632
parameters, the fixed position table among them as DiT's code counts it. The paper's recipe
(DiT's train.py, github.com/facebookresearch/DiT): DiT's initialization (model.init=
'xavier_uniform': models.py's initialize_weights), AdamW at 1e-4 without weight decay or
gradient clipping, batch 256, EMA 0.9999, the linear schedule of 1,000 steps, the noise's MSE
plus the variational bound with the mean held fixed. The EMA's decay warms up as diffusers'
EMAModel's (training.ema_warmup: min(0.9999, (1 + t) / (10 + t))) where DiT's starts at the
initial weights: past about 200k of the 400k steps the two are the same average;
--config.training.ema_warmup=False is DiT's.

  python launch.py --config configs/dit_xl2.py --mode=describe
  python launch.py --config configs/dit_xl2.py --mode=compile --config.compile.target=v5e:2x2 \
      --config.rule_set=fsdp --config.model.remat_policy=full

(10.39 GiB per chip of 15.75 with remat full; 15.29 GiB, 97%, without remat.)

Training it needs ImageNet's VAE latents as an image dataset of 32x32x4 arrays; this codebase
has no VAE, so --mode=sample refuses latents.
"""
from transformer_jax import config_lib
from transformer_jax.models import dit


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, variant='XL/2')
  config = config_lib.base_config('dit')
  config.model.update(image_size=32, num_channels=4, num_classes=1000, learn_sigma=True,
                      **dit.variant(arg.variant))
  config.data.update(name='imagenet2012', batch_size=256, augment=False)
  config.optimizer.update(learning_rate=1e-4, warmup_steps=0, schedule='constant', b2=0.999,
                          weight_decay=0.0, grad_clip_norm=0.0)
  config.training.update(steps=400_000, ema_decay=0.9999, log_every=100, eval_every=50_000,
                         checkpoint_every=50_000)
  return config
