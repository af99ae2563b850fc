"""`--mode=describe`: the model's shape, parameters by part, FLOPs per token, KV-cache bytes, and
the memory plan per device on the run's mesh."""
import jax

from transformer_jax import accounting, memory, model_config, models, targets
from transformer_jax.train import sharding
from transformer_jax.settings import MeshSettings, TrainingSettings

__all__ = ['describe', 'device_memory', 'memory_lines', 'shape']


def shape(cfg) -> str:
  """'4 blocks, width 128, 4 heads (2 key-value), patch 4 (ViT-Ti/4)': what sizes the model."""
  family = models.registry.get(cfg.family)
  blocks = f'{cfg.num_layers} blocks'
  if family.decoding == 'encoder_decoder':
    blocks = f'{cfg.num_layers} + {cfg.decoder_layers} blocks'
  heads = f'{cfg.num_heads} heads'
  if cfg.kv_heads != cfg.num_heads:
    heads += f' ({cfg.kv_heads} key-value)'
  text = f'{blocks}, width {cfg.width}, {heads}, MLP {cfg.mlp} {cfg.hidden_dim}'
  if family.unit == 'image':
    text += f', {cfg.image_size}x{cfg.image_size} images in patches of {cfg.patch_size}'
    named = [name for name, size in models.vit.VIT_SIZES.items()
             if size == (cfg.width, cfg.num_layers, cfg.num_heads)]
    text += f' (ViT-{named[0]}/{cfg.patch_size})' if named else ''
  return text


def describe(config) -> str:
  """What --mode=describe prints: for this machine's devices, or with compile.target for that
  target's (its platform's kernel, dtype and plan on its number of chips, of its memory)."""
  target = targets.target(config.compile.target) if config.compile.target else None
  platform = target.platform if target else jax.devices()[0].platform
  cfg = models.model_config(config.model)
  dtype_reason = model_config.compute_dtype_of(cfg.dtype, platform)[1]
  cfg = cfg.on(platform)
  family = models.registry.get(cfg.family)
  analytic, counted = accounting.param_counts(cfg), accounting.counted_params(cfg)
  if analytic != counted:
    raise AssertionError(f'Analytic parameter count {analytic} differs from the initialized '
                         f'tree {counted}: the accounting and the modules disagree.')
  total = counted['total']
  lines = [f'{cfg.family} model: {shape(cfg)}',
           f'{total:,} parameters (analytic count = initialized tree)',
           f'  {"part":<10} {"parameters":>14} {"share":>7}']
  for part in accounting.PARTS:
    if counted[part] or part != 'other':
      lines.append(f'  {part:<10} {counted[part]:>14,} {counted[part] / total:>7.1%}')
  kernel = models.attention_kernel(cfg, platform)
  lines.append(f'Attention kernel: {kernel.name} ({kernel.reason})')
  lines.append(f'Compute dtype: {cfg.dtype} ({dtype_reason}); parameters in {cfg.param_dtype}')
  seq_len = config.data.get('seq_len') or cfg.max_len if family.unit == 'token' else None
  flops = accounting.flops_per_token(cfg, seq_len)
  unit = f'token at T={seq_len}' if family.unit == 'token' else family.unit
  lines.append(f'FLOPs per {unit}: forward {flops["forward"]:,.0f}, training '
               f'{flops["train"]:,.0f} (attention matrices {flops["attention_share"]:.1%})')
  if family.decoding:
    for dtype in sorted({cfg.dtype, 'bfloat16'}):
      cache = memory.kv_cache_bytes(cfg, seq_len, dtype)
      lines.append(f'KV cache per sequence of {seq_len} tokens in {dtype}: {cache:,} bytes '
                   f'({cfg.kv_heads} of {cfg.num_heads} heads cached)')
  else:
    lines.append('KV cache: none (no causal mask, nothing can be reused between steps)')
  return '\n'.join(lines + memory_lines(config, cfg, platform, target))


def _size(num_bytes: float) -> str:
  return f'{num_bytes / 2**30:.2f} GiB' if num_bytes >= 2**30 else f'{num_bytes / 2**20:.1f} MiB'


def device_memory(config, target=None) -> float | None:
  """Bytes of one device: training.device_memory_gb, else the target's, else what JAX reports
  (GPUs, TPUs)."""
  memory_gb = TrainingSettings.of(config.training).device_memory_gb
  if memory_gb:
    return memory_gb * 1e9
  if target is not None:
    return target.chip.memory_bytes
  stats = jax.local_devices()[0].memory_stats() or {}
  return stats.get('bytes_limit')


def memory_lines(config, cfg, platform: str | None = None, target=None) -> list[str]:
  """The per-device plan of the train step (and a decoding cache) on the run's mesh and rules,
  as XLA compiles it for `platform` (default: this machine's devices'), over the devices of
  `target` (a targets.Target) or of this machine."""
  platform = platform or jax.devices()[0].platform
  sizes = sharding.mesh_sizes(MeshSettings.of(config.mesh), target and target.num_devices)
  plan = memory.plan(config, sizes, cfg, platform)
  tokens = models.registry.get(cfg.family).unit == 'token'
  mesh = ' x '.join(f'{axis}={size}' for axis, size in sizes.items())
  lines = [f'Memory per device on {plan.devices} devices ({mesh}, rule set '
           f'{config.rule_set!r}), batch {config.data.batch_size}'
           + (f' x {config.data.seq_len}' if tokens else '')
           + f', remat {cfg.remat_policy}{", scanned" if cfg.scan_layers else ""}, as '
           f'XLA:{platform.upper()} compiles it:']
  parts = [('parameters', plan.params), ('optimizer state', plan.optimizer),
           ('gradients', plan.gradients), ('gathered weights (FSDP)', plan.gathered),
           ('batch', plan.batch), ('activations (estimate)', plan.activations)]
  lines += [f'  {name:<24} {_size(value):>12}' for name, value in parts if value or
            name.startswith(('parameters', 'activations'))]
  total, limit = plan.train_total, device_memory(config, target)
  verdict = ('' if limit is None else f': {"fits" if total <= limit else "does NOT fit"} in '
             f'{_size(limit)} ({total / limit:.0%})')
  lines.append(f'  {"train step total":<24} {_size(total):>12}{verdict}')
  if plan.kv_cache is not None:
    lines.append(f'  {"KV cache per sequence":<24} {_size(plan.kv_cache):>12} (decoding '
                 f'{config.data.seq_len} tokens)')
  cautions = memory.caveats(cfg, platform, plan)
  return lines + [f'  Caution: {caveat}' for caveat in cautions]
