"""The reference character LM on TinyShakespeare, with its reference training.

A LLaMA-style decoder (Touvron et al. 2023): 4 pre-norm blocks, width 128, 4 heads, RMSNorm,
SwiGLU (341 hidden), RoPE, no biases, untied head: 803,712 parameters. AdamW (0.9, 0.95), weight
decay 0.1 on every parameter, constant learning rate 3e-3, batch 32 of 64 characters, 600 steps.
Initialized like the same model in PyTorch with its default initializers: embedding rows
N(0, 1), dense kernels N(0, 0.05^2) (PyTorch's U(+-1/sqrt(128)) has standard deviation 0.051).
  python launch.py --config configs/llama_shakespeare.py --workdir /tmp/llama \
      --config.data.manual_dir=DIR
"""
from transformer_jax import config_lib
from transformer_jax.models import styles


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, smoke=False)
  config = config_lib.base_config('decoder')
  config.model.update(styles.STYLES['llama'])
  config.model.update(width=128, num_layers=4, num_heads=4, max_len=1024, init_std=0.05,
                      embed_init_std=1.0)
  # TinyShakespeare's 65 characters; the model's vocabulary follows the data's.
  config.data.update(name='tiny_shakespeare', vocab_size=65, seq_len=64, batch_size=32)
  config.optimizer.update(learning_rate=3e-3, schedule='constant', warmup_steps=0,
                          weight_decay=0.1, decay_norms_and_biases=True, decay_embeddings=True,
                          grad_clip_norm=0.0)
  config.training.update(steps=600, log_every=50, eval_every=200, checkpoint_every=200)
  return config_lib.smoke(config) if arg.smoke else config
