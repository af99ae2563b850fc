"""T5-small (Raffel et al. 2020): 6 + 6 pre-norm blocks, D = 512, 8 heads of 64, ReLU hidden
2048, relative position biases (32 buckets up to distance 128, one table per stack), no biases,
unscaled attention logits, a vocabulary of 32,128 shared by encoder, decoder and the tied head
(its input scaled by D^-0.5): 60,506,624 parameters, as transformers' T5ForConditionalGeneration
counts them.

get_config('v1_1'): T5 1.1 small: 8 + 8 blocks, 6 heads of 64 (384 wide in D = 512), gated-GELU
hidden 1024, an untied head: 76,961,152 parameters. Dropout 0.1 in both, as T5 pre-trains,
wherever T5 drops: the embeddings, the attention probabilities (so 'auto' runs the reference
attention kernel in training), the feed-forward activation, each sublayer's output and each
stack's final-norm output.

This config describes the model (--mode=describe) and receives converted weights
(configs/from_hf.py:path=DIR). It pre-trains with T5's span corruption of any text source
(data.task='span_corruption'; data/span_corruption_task.py), e.g.
  --config.data.task=span_corruption --config.data.name=tiny_shakespeare
  --config.data.tokenizer=bpe --config.data.vocab_size=32128
(a BPE whose 100 top ids are the sentinels <extra_id_N>), or with data.tokenizer the path of
T5's tokenizer.json, which has them.
"""
from transformer_jax import config_lib
from transformer_jax.models import styles


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, v1_1=False)
  config = config_lib.base_config('encoder_decoder')
  if arg.v1_1:
    config.model.update(styles.STYLES['t5_v1_1'])
    config.model.update(width=512, num_layers=8, num_decoder_layers=8, num_heads=6,
                        head_width=64, d_ff=1024)
  else:
    config.model.update(styles.STYLES['t5'])
    config.model.update(width=512, num_layers=6, num_decoder_layers=6, num_heads=8, d_ff=2048)
  config.model.update(vocab_size=32128, dropout_rate=0.1, max_len=512)
  config.data.seq_len = 512
  return config
