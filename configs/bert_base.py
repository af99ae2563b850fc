"""BERT-base (uncased) shape: |V| = 30,522, 512 positions, 2 token types, D = 768, 12 post-LN
blocks, 12 heads, MLM head tied to the embedding: 109,514,298 parameters.

Its WordPiece data pipeline is not part of this project: this config describes the model
(--mode=describe) and receives converted weights; training it needs a data.name of your own.
"""
from transformer_jax import config_lib
from transformer_jax.models import styles


def get_config(arg=None):
  config = config_lib.base_config('encoder')
  config.model.update(styles.STYLES['bert'])
  config.model.update(vocab_size=30522, width=768, num_layers=12, num_heads=12,
                      max_len=512)
  config.data.seq_len = 512
  return config
