"""BERT-base (uncased) shape: |V| = 30,522, 512 positions, 2 token types, D = 768, 12 post-LN
blocks, 12 heads, MLM head tied to the embedding: 109,514,298 parameters.

It trains with BERT's pre-training recipe (Devlin et al. 2019, appendix A.2; google-research/bert
optimization.py): Adam with beta1 0.9, beta2 0.999, epsilon 1e-6, decoupled weight decay 0.01 on
every parameter but the LayerNorms' and the biases (the embeddings decayed), gradients clipped
to a global norm of 1, a peak rate of 1e-4 reached by a linear warmup over 10,000 steps and
decayed linearly to 0 at 10^6 steps, dropout 0.1. Where it differs: BERT's Adam has no bias
correction (optax's does), and its linear decay runs from step 0 with the warmup overriding it
(a rate of 0.99 x 1e-4 at the end of the warmup; here 1e-4, decaying from there: train.optim.
learning_rate_schedule); BERT's batches are 256 sequences, of 128 tokens for 90% of the steps
and 512 for the rest (here data.seq_len is 512 throughout, data.batch_size the data's).

Its WordPiece data pipeline is not part of this project: this config describes the model
(--mode=describe) and receives converted weights; training it needs a data.name of your own.
"""
from transformer_jax import config_lib
from transformer_jax.models import styles


def get_config(arg=None):
  config = config_lib.base_config('encoder')
  config.model.update(styles.STYLES['bert'])
  config.model.update(vocab_size=30522, width=768, num_layers=12, num_heads=12,
                      max_len=512, dropout_rate=0.1)
  config.data.seq_len = 512
  config.optimizer.update(schedule='linear', learning_rate=1e-4, warmup_steps=10_000, b1=0.9,
                          b2=0.999, eps=1e-6, weight_decay=0.01, decay_embeddings=True,
                          grad_clip_norm=1.0)
  config.training.steps = 1_000_000
  return config
