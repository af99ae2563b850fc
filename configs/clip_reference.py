"""A small CLIP (Radford et al. 2021) that trains on this machine in minutes: a ViT of width 64
over 32x32 images in patches of 8 and a causal text tower of width 64 over 32 character tokens,
projected to 64, on generated pairs (data.image_text: class-coloured images captioned by
templates naming the class). `loss=sigmoid` trains it with SigLIP's loss instead (Zhai et al.
2023); `smoke` shrinks it to a seconds-long run.
"""
from transformer_jax import config_lib


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, steps=300, loss='softmax', smoke=False)
  config = config_lib.base_config('clip')
  config.model.update(
      width=64, num_layers=2, num_heads=4, image_size=32, patch_size=8, mlp='quick_gelu',
      text_width=64, text_layers=2, text_heads=4, max_len=32, embed_dim=64,
      # The character vocabulary (data.image_text: PAD, BOS, EOS, then printable ASCII) has 98
      # ids and EOS is 2: set here, so that describe and compile, which read no data, know them;
      # the data checks they agree.
      vocab_size=98, eos_id=2,
      loss=arg.loss,
      dtype='float32')
  config.data.update(name='synthetic', batch_size=64, eval_batch_size=64, eval_examples=256,
                     tokenizer='chars')
  # 20 warmup steps, or a tenth of a shorter run (a warmup past the run is refused).
  config.optimizer.update(learning_rate=1e-3, warmup_steps=min(20, arg.steps // 10),
                          weight_decay=0.1)
  config.training.update(steps=arg.steps, log_every=50, eval_every=arg.steps,
                         checkpoint_every=arg.steps)
  if arg.smoke:
    config.training.update(steps=4, log_every=2, eval_every=4, checkpoint_every=4)
    config.optimizer.warmup_steps = 1
    config.data.update(batch_size=16, eval_batch_size=16, eval_examples=32)
  return config
