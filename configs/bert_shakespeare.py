"""A BERT-style masked character model of TinyShakespeare: post-LN, GELU, learned positions,
embedding LayerNorm, token types, tied MLM head; 15% of positions selected (80/10/10).
The vocabulary is the 65 characters plus [MASK]; with `:tokenizer=bpe`, a byte-level BPE of
2,048 ids trained on the training text (PAD, BOS, EOS, MASK and the 256 bytes among them).
  python launch.py --config configs/bert_shakespeare.py --workdir /tmp/bert \
      --config.data.manual_dir=DIR
On a corpus of documents, packed into rows with segment ids so that no token attends across
documents (any TFDS text dataset, or JSONL files):
  python launch.py --config configs/bert_shakespeare.py:tokenizer=bpe --workdir /tmp/bert \
      --config.data.name=jsonl --config.data.path='corpus/*.jsonl' --config.data.packing=True
"""
from transformer_jax import config_lib
from transformer_jax.models import styles


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, smoke=False, tokenizer='chars')
  config = config_lib.base_config('encoder')
  config.model.update(styles.STYLES['bert'])
  config.model.update(width=128, num_layers=4, num_heads=4, max_len=128, dropout_rate=0.1)
  # TinyShakespeare's 65 characters and [MASK], or a BPE of 2,048 ids; the model follows.
  config.data.update(name='tiny_shakespeare', seq_len=128, batch_size=32, tokenizer=arg.tokenizer,
                     vocab_size=66 if arg.tokenizer == 'chars' else 2048)
  config.optimizer.update(learning_rate=1e-3, warmup_steps=200, b2=0.999, weight_decay=0.01)
  config.training.update(steps=3000, log_every=50, eval_every=500, checkpoint_every=500)
  return config_lib.smoke(config) if arg.smoke else config
