"""GPT-2 small: |V| = 50,257, context 1024, D = 768, 12 blocks, 12 heads: 124,439,808 parameters.

GPT-2's BPE tokenizer is not part of this project: this config trains the model on
TinyShakespeare characters (ids 0..64 of its 50,257-row table), which exercises the full model at
its real size; weights converted from a real checkpoint are the way to use it for text.
"""
from transformer_jax import config_lib
from transformer_jax.models import styles


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, smoke=False)
  config = config_lib.base_config('decoder')
  config.model.update(styles.STYLES['gpt2'])
  config.model.update(vocab_size=50257, width=768, num_layers=12,
                      num_heads=12, max_len=1024, dtype='bfloat16')
  config.data.update(name='tiny_shakespeare', seq_len=1024, batch_size=32)
  config.optimizer.update(learning_rate=6e-4, warmup_steps=200, min_lr_ratio=0.1)
  config.training.update(steps=5000, log_every=20, eval_every=500, checkpoint_every=500)
  return config_lib.smoke(config) if arg.smoke else config
