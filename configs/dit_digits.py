"""A small DiT for handwritten digits that a 2-core CPU trains in about an hour: scikit-learn's
8x8 digits (1,797 images of 17 grey levels, sklearn.datasets.load_digits: the test part of
Alpaydin & Kaynak's UCI optical-digits set) read from an image folder and upsampled to 16x16.

  python experiments/dit_digits.py --folder_only --image_dir DIR   # DIR/train/<digit>/*.png ...
  python launch.py --config configs/dit_digits.py --workdir W --config.data.image_dir=DIR
  python launch.py --config configs/dit_digits.py --workdir W --config.data.image_dir=DIR \
      --mode=sample --config.sample.guidance_scale=4   # a 10x10 grid, one digit per column

The model is DiT-S's block at width 192 and 6 blocks (3 heads), as configs/dit_reference.py,
over a 16x16 image in patches of 4 (16 tokens): learned sigma, the linear schedule of 1,000
steps, labels dropped 10% of the time for guidance. Grey images are decoded as RGB (three equal
channels), as the sampler and the scores take images; one channel would save only the patch
embedding's and the last layer's widths. No flip: a mirrored digit is another shape.

It trains as DiT's train.py (Peebles & Xie 2023, github.com/facebookresearch/DiT) trains, as
dit_reference.py does: DiT's initialization, AdamW without weight decay or gradient clipping,
a constant rate, the loss of its diffusion, an EMA of 0.9999 that warms up (diffusers'
EMAModel: min(0.9999, (1 + t) / (10 + t))). Where it differs from DiT, for 1,437 training
images and a run of about an hour: the learning rate, 1e-3 after 100 warmup steps (DiT: 1e-4,
no warmup), and the batch of 128 (DiT: 256). What else was tried is in
experiments/results/dit_digits/README.md.
"""
import pathlib

from transformer_jax import config_lib

IMAGE_SIZE = 16
PREPROCESS = f'decode|resize({IMAGE_SIZE})|value_range(-1, 1)'  # Pillow's bilinear 8 -> 16


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, steps=4_000, smoke=False)
  config = config_lib.from_file(pathlib.Path(__file__).with_name('dit_reference.py'),
                                f'steps={arg.steps}')
  config.model.update(image_size=IMAGE_SIZE, patch_size=4, width=192, num_layers=6,
                      num_heads=3, num_classes=10)
  config.data.update(name='imagefolder', batch_size=128, eval_batch_size=360,
                     pp_train=PREPROCESS, pp_eval=PREPROCESS)
  config.optimizer.update(learning_rate=1e-3, warmup_steps=100)
  config.training.update(log_every=50)
  config.sample.update(num_samples=100)
  return config_lib.smoke(config) if arg.smoke else config
