"""A modern encoder-decoder (pre-LN RMSNorm, SwiGLU, RoPE, GQA, no biases) on a synthetic
string task (`task`: reverse or sort the input letters; PAD, BOS, EOS and 26 letters)."""
from transformer_jax import config_lib
from transformer_jax.models import styles


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, task='reverse', smoke=False)
  config = config_lib.base_config('encoder_decoder')
  config.model.update(styles.STYLES['llama'])
  config.model.update(vocab_size=29, width=128, num_layers=3,
                      num_decoder_layers=3, num_heads=4, num_kv_heads=2, max_len=64,
                      tie_embeddings=True)
  config.data.update(name=f'seq2seq_{arg.task}', seq_len=32, batch_size=64,
                     exact_match_examples=256)
  config.optimizer.update(learning_rate=1e-3, warmup_steps=200, b2=0.98)
  config.training.update(steps=2000, log_every=50, eval_every=500, checkpoint_every=500)
  return config_lib.smoke(config) if arg.smoke else config
