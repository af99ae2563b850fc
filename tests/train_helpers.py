"""Small training configs and readers of a run's metrics, for the training tests."""

from transformer_jax import config_lib
from transformer_jax.models import styles
from transformer_jax.train import checkpoint, metrics, setup

TINY_MODELS = {
    'decoder': dict(family='decoder', vocab_size=32, max_len=16, **styles.STYLES['llama']),
    'encoder': dict(family='encoder', vocab_size=32, max_len=16, **styles.STYLES['bert']),
    'encoder_decoder': dict(family='encoder_decoder', vocab_size=32, max_len=16,
                            **styles.STYLES['transformer']),
    'vit': dict(family='vit', image_size=8, patch_size=4, num_classes=4,
                **styles.STYLES['vit']),
}


def small_config(family='decoder', steps=6, **overrides):
  """A seconds-long run on the synthetic source: width 32, 2 blocks, global batch 16."""
  config = config_lib.base_config(family)
  config.model.update(width=32, num_layers=2, num_heads=4, **TINY_MODELS[family])
  config.data.update(name='synthetic', seq_len=16, batch_size=16, eval_batch_size=16, eval_steps=2)
  config.optimizer.update(learning_rate=3e-3, warmup_steps=min(2, steps))
  config.training.update(steps=steps, log_every=1, eval_every=1000, checkpoint_every=1000)
  for key, value in overrides.items():
    section, _, name = key.rpartition('.')
    (config[section] if section else config)[name] = value
  return config


def training_rows(workdir):
  """{step: metrics} of the training rows of workdir/metrics.jsonl (later rows win)."""
  return {row['step']: row for row in metrics.read_metrics(workdir) if 'loss' in row}


def losses(workdir):
  return {step: row['loss'] for step, row in sorted(training_rows(workdir).items())}


def get_config(arg=None):
  """So that launch.py can run these configs: --config tests/train_helpers.py:decoder."""
  return small_config(arg or 'decoder')


def started(config, workdir):
  """(the Run of `config`, its state restored from workdir/checkpoints or initialized)."""
  run_ = setup.build_run(config)
  checkpoints = checkpoint.Checkpoints(str(workdir / 'checkpoints'), 3)
  state = setup.restore_or_init(run_, checkpoints, str(workdir))
  checkpoints.close()
  return run_, state
