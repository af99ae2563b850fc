"""The Transformer base model of Vaswani et al. 2017, "Attention is all you need", on WMT 2014
English-German: 6 + 6 post-LN blocks, D = 512, 8 heads, ReLU hidden 2048, dropout 0.1,
sinusoidal positions, one embedding shared by source, target and output, scaled by sqrt(D) on
the way in: 60,915,712 parameters (the paper's 65M with its 37,000 ids); a byte-level BPE of
32,768 ids trained on both sides of the training pairs; Adam with b1 0.9, b2 0.98, eps 1e-9 and
4,000 warmup steps; rows of 256 tokens packed with pairs, 96 rows a batch (about 25,000 source
and 25,000 target tokens, the paper's batch), 100,000 steps. BLEU (sacrebleu, greedy decoding)
of the first data.bleu_examples pairs of newstest2014 at every evaluation, beside the loss.

wmt14_translate is prepared with TensorFlow (its builder needs it), once, in array_record:

  tfds build wmt14_translate/de-en --file_format=array_record --data_dir=DIR
  python launch.py --config configs/wmt_transformer.py --workdir /tmp/wmt \
      --config.data.tfds_data_dir=DIR

Any other TFDS translation dataset prepared there works the same way, e.g.
--config.data.name=ted_hrlr_translate/pt_to_en --config.data.source_language=pt
--config.data.target_language=en.

Where this differs from the paper: the learning rate warms up to 7e-4 (the paper's peak,
D^-0.5 * 4000^-0.5) and then follows a cosine decay, not the inverse square root; BLEU is of
greedy decoding, not a beam of 4 with a length penalty, and on detokenized text (sacrebleu), not
on tokenized text. No run of it to completion has been made here (the paper:
27.3 BLEU after 100,000 steps, 12 hours on 8 P100s).

get_config('smoke'): a model of width 64 on rows of 32 tokens, 3 steps, BLEU of 8 pairs.
"""
from transformer_jax import config_lib
from transformer_jax.models import styles

# The paper's peak learning rate: D^-0.5 * min(step^-0.5, step * warmup^-1.5) at step = warmup.
PEAK_LEARNING_RATE = 512 ** -0.5 * 4000 ** -0.5


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, smoke=False)
  config = config_lib.base_config('encoder_decoder')
  config.model.update(styles.STYLES['transformer'])
  config.model.update(width=512, num_layers=6, num_decoder_layers=6,
                      num_heads=8, d_ff=2048, dropout_rate=0.1, max_len=256)
  config.data.update(name='wmt14_translate/de-en', source_language='en', target_language='de',
                     train_split='train', eval_split='test', tokenizer='bpe', vocab_size=32768,
                     packing=True, seq_len=256, batch_size=96, eval_batch_size=64,
                     bleu_examples=256, num_threads=8, prefetch_buffer_size=8)
  config.optimizer.update(learning_rate=PEAK_LEARNING_RATE, warmup_steps=4000, b1=0.9, b2=0.98,
                          eps=1e-9, weight_decay=0.0)
  config.training.update(steps=100_000, label_smoothing=0.1, log_every=100, eval_every=5000,
                         checkpoint_every=5000, logits_chunk=128)
  if arg.smoke:
    config = config_lib.smoke(config)
    config.model.update(width=64, num_heads=4, d_ff=128, max_len=32)
    config.data.update(vocab_size=512, seq_len=32, bleu_examples=8)
    config.optimizer.warmup_steps = 1
  return config
