"""A GPT-2 style character model of TinyShakespeare (nanoGPT's shakespeare-char recipe, half as
wide for a CPU): LayerNorm, GELU MLP (4D), learned positions, biases, tied unembedding, dropout.
  python launch.py --config configs/gpt_shakespeare.py --workdir /tmp/gpt \
      --config.data.manual_dir=DIR
"""
from transformer_jax import config_lib
from transformer_jax.models import styles


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, smoke=False)
  config = config_lib.base_config('decoder')
  config.model.update(styles.STYLES['gpt2'])
  config.model.update(width=192, num_layers=6, num_heads=6, max_len=256, dropout_rate=0.2)
  # TinyShakespeare's 65 characters; the model's vocabulary follows the data's.
  config.data.update(name='tiny_shakespeare', vocab_size=65, seq_len=256, batch_size=64)
  config.optimizer.update(learning_rate=1e-3, warmup_steps=100, min_lr_ratio=0.1, b2=0.99)
  config.training.update(steps=5000, log_every=50, eval_every=500, checkpoint_every=500)
  return config_lib.smoke(config) if arg.smoke else config
