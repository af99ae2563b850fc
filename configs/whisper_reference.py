"""A small Whisper that trains on this machine: 1 s windows (100 frames) of 40 Mel bins, 2 + 2
blocks of width 64, on generated tones whose transcript is their digit (data.name='synthetic';
'audiofolder' with data.audio_dir=DIR reads a folder of short clips instead)."""
from transformer_jax import config_lib
from transformer_jax.models import styles


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, steps=300, smoke=False)
  config = config_lib.base_config('whisper')
  config.model.update(styles.STYLES['whisper'])
  # 13 ids: PAD, BOS, EOS and the digits (a folder's transcripts have more: set its count).
  config.model.update(vocab_size=13, width=64, num_layers=2, num_decoder_layers=2, num_heads=4,
                      num_mels=40, num_frames=100, max_len=16, dtype='float32')
  config.data.update(name='synthetic', seq_len=8, batch_size=16, eval_batch_size=16,
                     eval_examples=64, wer_examples=64)
  # 20 warmup steps, or a tenth of a shorter run (a warmup past the run is refused).
  config.optimizer.update(learning_rate=2e-3, warmup_steps=min(20, arg.steps // 10))
  config.training.update(steps=arg.steps, log_every=25, eval_every=arg.steps,
                         checkpoint_every=arg.steps)
  return config_lib.smoke(config) if arg.smoke else config
