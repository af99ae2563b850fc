"""The optimizer: AdamW with warmup and cosine decay, clipping, and a weight-decay mask."""
import jax
import optax

from transformer_jax.errors import ConfigError
from transformer_jax.models.registry import EMBEDDING_NAMES

__all__ = ['decay_mask', 'learning_rate_schedule', 'make_optimizer']


def learning_rate_schedule(opt, total_steps: int) -> optax.Schedule:
  """Linear warmup, learning_rate * (step + 1) / warmup_steps at steps 0 .. warmup_steps - 1, so
  that the first update is a real one (a warmup from 0 would waste it), then cosine decay to
  min_lr_ratio * learning_rate (or constant) from step warmup_steps."""
  warmup = lambda step: opt.learning_rate * (step + 1) / opt.warmup_steps
  if opt.schedule == 'constant':
    after = optax.constant_schedule(opt.learning_rate)
  elif opt.schedule == 'cosine':
    after = optax.cosine_decay_schedule(opt.learning_rate,
                                        max(total_steps - opt.warmup_steps, 1), opt.min_lr_ratio)
  else:
    raise ConfigError(f'Unknown optimizer.schedule {opt.schedule!r}: use "cosine" or "constant".')
  if not opt.warmup_steps:
    return after
  return optax.join_schedules([warmup, after], [opt.warmup_steps])


def decay_mask(params, opt):
  """True for parameters that weight decay applies to: matmul kernels always; norms, biases and
  embeddings only where the config asks."""
  def decays(path, _):
    names = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
    if names[0] in EMBEDDING_NAMES:
      return opt.decay_embeddings
    return names[-1] == 'kernel' or opt.decay_norms_and_biases
  return jax.tree_util.tree_map_with_path(decays, params)


def make_optimizer(opt, total_steps: int) -> tuple[optax.GradientTransformation, optax.Schedule]:
  schedule = learning_rate_schedule(opt, total_steps)
  adamw = optax.adamw(schedule, b1=opt.b1, b2=opt.b2, eps=opt.eps,
                      weight_decay=opt.weight_decay, mask=lambda p: decay_mask(p, opt))
  if opt.grad_clip_norm:
    return optax.chain(optax.clip_by_global_norm(opt.grad_clip_norm), adamw), schedule
  return adamw, schedule
