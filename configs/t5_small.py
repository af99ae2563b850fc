"""T5-small (Raffel et al. 2020): 6 + 6 pre-norm blocks, D = 512, 8 heads of 64, ReLU hidden
2048, relative position biases (32 buckets up to distance 128, one table per stack), no biases,
unscaled attention logits, a vocabulary of 32,128 shared by encoder, decoder and the tied head
(its input scaled by D^-0.5): 60,506,624 parameters, as transformers' T5ForConditionalGeneration
counts them.

get_config('v1_1'): T5 1.1 small: 8 + 8 blocks, 6 heads of 64 (384 wide in D = 512), gated-GELU
hidden 1024, an untied head: 76,961,152 parameters. Dropout wherever T5 drops (the embeddings,
the attention probabilities, so that 'auto' runs the reference attention kernel in training,
the feed-forward activation, each sublayer's output and each stack's final-norm output): 0.1 for
T5 1.0, which pre-trained with it, 0 for T5 1.1, which pre-trained without ("Dropout was turned
off in pre-training (quality win). Dropout should be re-enabled during fine-tuning.", the
google/t5-v1_1-small model card; T5X's small_c4_pretrain.gin: DROPOUT_RATE = 0.0).

Pre-training follows T5's recipe as T5X runs it (t5x/configs/runs/pretrain.gin,
t5x/examples/t5/t5_1_1/base.gin): Adafactor with T5X's settings (decay rate 0.8, factored second
moments, updates clipped to an RMS of 1 and scaled by the parameters' RMS, epsilon 1e-30, no
momentum, no weight decay, no gradient clipping; train.optim.scale_by_adafactor), the inverse
square-root rate 1 / sqrt(max(step, 10^4)) (T5X's 'constant * rsqrt_decay', base rate 1), a
z-loss of 1e-4 * log(Z)^2 per target token, batches of 128 pairs of 512 input and 114 target
tokens (section 3.1.2; T5X's small_c4_pretrain.gin: targets of 114 for inputs of 512,
data.span_targets_length's default) for 2^19 steps, and the summed loss divided by a fixed
factor, batch size x target length (Mesh TF's normalisation, which the released checkpoints
trained with; T5X's pretrain.gin divides by nothing, the same Adafactor update up to its
epsilon).
get_config('finetune'): T5's fine-tuning (section 3.1.2; t5x/configs/runs/finetune.gin):
Adafactor at a constant rate of 1e-3 for 2^18 steps, dropout 0.1, and the loss divided by
2048 x 114 = 233,472 as T5X divides it when fine-tuning the released T5 and T5 1.1 checkpoints
(t5x/examples/t5/t5_1_1/examples/small_wmt_finetune.gin), which pre-trained at batch 2048.

Where it differs: the released checkpoints pre-trained for 10^6 steps at batch 2048 (section
3.7), here the paper's baseline 2^19 at 128; T5X packs its pairs into rows, here each row is one
corrupted window (data.packing packs them); T5X's Adafactor factors a kernel of three axes (a
query's embed x heads x head_dim) whatever its sizes, here only where both sides reach 128, as a
matrix (every one of T5-small's); a fine-tuning run starts Adafactor's second moments afresh,
where T5X restores the pre-training ones.

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

BATCH_SIZE, TARGET_LENGTH = 128, 114  # section 3.1.2; 114 targets for 512 corrupted inputs
RELEASED_BATCH_SIZE = 2048  # the released checkpoints' pre-training batch (section 3.7)


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, v1_1=False, finetune=False)
  config = config_lib.base_config('encoder_decoder')
  if arg.v1_1:
    config.model.update(styles.STYLES['t5_v1_1'])
    config.model.update(width=512, num_layers=8, num_decoder_layers=8, num_heads=6,
                        head_width=64, d_ff=1024)
  else:
    config.model.update(styles.STYLES['t5'])
    config.model.update(width=512, num_layers=6, num_decoder_layers=6, num_heads=8, d_ff=2048)
  pretraining_dropout = 0.0 if arg.v1_1 else 0.1
  config.model.update(vocab_size=32128, dropout_rate=0.1 if arg.finetune else pretraining_dropout,
                      max_len=512)
  config.data.update(seq_len=512, batch_size=BATCH_SIZE)
  config.optimizer.update(name='adafactor', weight_decay=0.0, grad_clip_norm=0.0)
  config.training.update(z_loss=1e-4, logits_chunk=128)
  if arg.finetune:
    config.optimizer.update(schedule='constant', learning_rate=1e-3, warmup_steps=0)
    config.training.update(steps=2 ** 18,
                           loss_normalizing_factor=float(RELEASED_BATCH_SIZE * TARGET_LENGTH))
  else:
    config.optimizer.update(schedule='rsqrt', learning_rate=1.0, warmup_steps=10_000)
    config.training.update(steps=2 ** 19,
                           loss_normalizing_factor=float(BATCH_SIZE * TARGET_LENGTH))
  return config
