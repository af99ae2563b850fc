"""Whisper (Radford et al. 2022) at the sizes of OpenAI's checkpoints: `tiny` (default; 37,760,640
parameters) or `base` (72,593,920), the counts transformers gives WhisperForConditionalGeneration
(its fixed encoder position table included). 30 s windows of 80 Mel bins, 448 decoder positions,
the multilingual vocabulary's 51,865 rows; data.name='audiofolder' with data.audio_dir=DIR trains
on a folder (generated tones by default). Import OpenAI's weights with
configs/from_hf.py:path=DIR instead of training these from scratch.

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
                          warmup_steps=2048, b2=0.98)
  config.training.update(steps=100000, log_every=100, eval_every=5000, checkpoint_every=5000)
  return config_lib.smoke(config) if arg.smoke else config
