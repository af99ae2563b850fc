"""A GPT-2 style character model of TinyShakespeare after nanoGPT's shakespeare-char
(karpathy/nanoGPT, config/train_shakespeare_char.py): LayerNorm, GELU MLP (4D), learned
positions, a tied unembedding, the residual projections initialized N(0, 0.02 / sqrt(2L)).
  python launch.py --config configs/gpt_shakespeare.py:recipe=nanogpt --workdir /tmp/gpt \
      --config.data.manual_dir=DIR

recipe='' (default): nanoGPT's GPU config half as wide for a CPU (6 blocks, width 192, 6 heads,
context 256, batch 64, dropout 0.2, biases, 5,000 steps).

recipe=nanogpt: the CPU run of nanoGPT's README, point by point (`python train.py
config/train_shakespeare_char.py --device=cpu --compile=False --eval_iters=20 --log_interval=1
--block_size=64 --batch_size=12 --n_layer=4 --n_head=4 --n_embd=128 --max_iters=2000
--lr_decay_iters=2000 --dropout=0.0`), which reports a validation loss of 1.88:

setting        nanoGPT                                 here
-------------  --------------------------------------  ------------------------------------------
model          n_layer 4, n_head 4, n_embd 128         num_layers 4, num_heads 4, width 128
context        block_size 64                           seq_len 64, max_len 64
batch          batch_size 12, no accumulation          batch_size 12
parameters     804,096 (it prints 0.80M: 795,904       804,096
               without wpe)
biases         bias=False: no Linear or LayerNorm      use_bias=False, norm_bias=False
               bias
norm           LayerNorm eps 1e-5 before each          norm='layernorm', norm_eps 1e-5,
               sublayer, and ln_f                      norm_position='pre' (a final norm)
MLP            4D, nn.GELU() (exact)                   d_ff 4D, mlp='gelu' (exact)
positions      learned wpe                             positions='learned'
head           lm_head tied to wte                     tie_embeddings=True
dropout        0.0                                     dropout_rate 0.0
init           Linear and Embedding N(0, 0.02);        init_std 0.02, embed_init_std 0.02;
               c_proj N(0, 0.02 / sqrt(2 n_layer))     scale_residual_init: the attention's
                                                       out and the MLP's down kernels
                                                       N(0, 0.02 / sqrt(8))
optimizer      torch AdamW, betas (0.9, 0.99),         name='adamw', b1 0.9, b2 0.99, eps 1e-8
               eps 1e-8
weight decay   0.1 on every tensor of 2+ dims (wte,    weight_decay 0.1, decay_embeddings=True,
               wpe, kernels), none on LayerNorm        decay_norms_and_biases=False
clipping       global norm 1.0                         grad_clip_norm 1.0
rate           1e-3, cosine to min_lr 1e-4 at 2,000    learning_rate 1e-3, cosine to
                                                       min_lr_ratio 0.1 at 2,000
warmup         lr (it + 1) / 101 for it < 100          lr (step + 1) / 100 for step < 100
                                                       (the peak one step earlier: 1% apart)
steps          2,000 updates (its loop then takes a    steps 2,000
               2,001st after the last evaluation)
data           the 65 characters of input.txt; the     name='tiny_shakespeare', vocab_size 65;
               first 90% (1,003,854) for training,     the same split
               the last 10% (111,540) held out
windows        starts torch.randint(len - 64)          starts uniform in [0, len - 64), drawn
                                                       by NumPy (another stream)
evaluation     every 250: 20 batches of 12 random      every 250: the whole held-out 10%, the
               held-out windows (an estimate)          1,742 windows of 64 that tile it
                                                       (eval_batch_size 134: 13 batches)
precision      float32                                 float32

Where it cannot match: the warmup's first hundred rates (above), the draws of the init and of
the batches (another generator), and the held-out loss (the whole split here against an
estimate from 240 random windows there; experiments/nanogpt_speedrun.py scores nanoGPT's own
trained model on the whole split too).

recipe=speedrun: the least wall time on a 2-core CPU to a held-out 1.88 over the same split
and characters (experiments/results/nanogpt_speedrun/README.md): recipe=nanogpt with Muon
(0.04; AdamW at 3e-3 on the embeddings and norms), a 25-step warmup, 3 blocks, batch 32 and
300 steps.
"""
from transformer_jax import config_lib
from transformer_jax.errors import ConfigError
from transformer_jax.models import styles

RECIPES = ('', 'nanogpt', 'speedrun')
# 13 batches of 134 tile the 1,742 held-out windows of 64 characters (all but the last 51).
EVAL_BATCH = 134


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, recipe='', smoke=False)
  if arg.recipe not in RECIPES:
    raise ConfigError(f'gpt_shakespeare.py: recipe={arg.recipe!r} is not one of '
                      f'{list(RECIPES)}.')
  config = config_lib.base_config('decoder')
  config.model.update(styles.STYLES['gpt2'])
  # TinyShakespeare's 65 characters; the model's vocabulary follows the data's.
  config.data.update(name='tiny_shakespeare', vocab_size=65)
  config.optimizer.update(learning_rate=1e-3, warmup_steps=100, min_lr_ratio=0.1, b2=0.99)
  if arg.recipe == '':
    config.model.update(width=192, num_layers=6, num_heads=6, max_len=256, dropout_rate=0.2)
    config.data.update(seq_len=256, batch_size=64)
    config.training.update(steps=5000, log_every=50, eval_every=500, checkpoint_every=500)
  else:
    _nanogpt_cpu(config)
  if arg.recipe == 'speedrun':
    _speedrun(config)
  return config_lib.smoke(config) if arg.smoke else config


def _nanogpt_cpu(config):
  """nanoGPT's README CPU run (the table above)."""
  config.model.update(width=128, num_layers=4, num_heads=4, max_len=64, mlp='gelu',
                      use_bias=False, norm_bias=False, dropout_rate=0.0)
  config.data.update(seq_len=64, batch_size=12, eval_batch_size=EVAL_BATCH)
  config.optimizer.update(decay_embeddings=True, grad_clip_norm=1.0)
  config.training.update(steps=2000, log_every=50, eval_every=250, checkpoint_every=2000)


def _speedrun(config):
  """The record (experiments/results/nanogpt_speedrun): Muon on the blocks' matrices (Keller
  Jordan's modded-nanogpt) at 0.04 and AdamW on the rest at 3e-3 after a 25-step warmup, 3
  blocks instead of 4, and 300 steps of 32 windows against 2,000 of 12: 9,600 windows, 40% of
  nanoGPT's 24,000. Held out at seeds 0 and 1 in the search: 1.827, 1.832."""
  config.model.update(num_layers=3)
  config.optimizer.update(name='muon', muon_learning_rate=0.04, learning_rate=3e-3,
                          warmup_steps=25)
  config.data.update(batch_size=32)
  # Logged where evaluated, so that no evaluation falls inside a window of timed steps.
  config.training.update(steps=300, log_every=25, eval_every=25, checkpoint_every=300)
