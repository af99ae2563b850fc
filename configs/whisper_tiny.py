"""Whisper (Radford et al. 2022) at the sizes of OpenAI's checkpoints: `tiny` (default; 37,760,640
parameters) or `base` (72,593,920), the counts transformers gives WhisperForConditionalGeneration
(its fixed encoder position table included). 30 s windows of 80 Mel bins, 448 decoder positions,
the multilingual vocabulary's 51,865 rows; data.name='audiofolder' with data.audio_dir=DIR trains
on a folder (generated tones by default). Import OpenAI's weights with
configs/from_hf.py:path=DIR instead of training these from scratch.

It trains with Whisper's recipe (Radford et al. 2022, section 2.4 and the appendix's tables of
training hyperparameters and learning rates): AdamW with beta1 0.9, beta2 0.98, epsilon 1e-6
and weight decay 0.1, gradients clipped to a global norm of 1, a linear warmup over 2048
updates to 1.5e-3 (tiny) or 1e-3 (base), then a linear decay to 0 at the last step, no
dropout. Where it differs: the paper trains 2^20 updates of 256 segments,
here training.steps = 100,000 of data.batch_size = 16 (the decay ends at whatever
training.steps is); which parameters its weight decay spares is unpublished (here the norms,
biases and embeddings, optimizer.decay_* keys).

  python launch.py --config configs/whisper_tiny.py:size=base --mode=describe
"""
from transformer_jax import config_lib
from transformer_jax.models import styles

SIZES = {'tiny': dict(width=384, num_layers=4, num_heads=6),
         'base': dict(width=512, num_layers=6, num_heads=8)}


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, size='tiny', smoke=False)
  config = config_lib.base_config('whisper')
  config.model.update(styles.STYLES['whisper'])
  config.model.update(vocab_size=51865, num_mels=80, num_frames=3000, max_len=448,
                      **SIZES[arg.size])
  config.data.update(name='synthetic', seq_len=448, batch_size=16, eval_examples=64)
  config.optimizer.update(learning_rate=1.5e-3 if arg.size == 'tiny' else 1e-3,
                          warmup_steps=2048, schedule='linear', b1=0.9, b2=0.98, eps=1e-6,
                          weight_decay=0.1, grad_clip_norm=1.0)
  config.training.update(steps=100000, log_every=100, eval_every=5000, checkpoint_every=5000,
                         logits_chunk=128)
  return config_lib.smoke(config) if arg.smoke else config
