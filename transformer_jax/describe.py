"""`--mode=describe`: the model's shape, parameters by part, FLOPs per token, KV-cache bytes, the
memory plan per device on the run's mesh and, where the compiler is installed, XLA's own figure
of the compiled train step, whose verdict (fits or not) it gives."""
import jax

from transformer_jax import accounting, aot, memory, models, targets
from transformer_jax.settings import TrainingSettings
from transformer_jax.train import run_settings, sharding

__all__ = ['describe', 'device_memory', 'memory_lines', 'shape']


def shape(cfg, seq_len: int | None = None) -> str:
  """'4 blocks, width 128, 4 heads (2 key-value), MLP gelu 512, ...': what sizes the model, the
  blocks of each stack its family runs and what else its family says sizes it."""
  family = models.registry.get(cfg.family)
  blocks = ' + '.join(str(stack.blocks) for stack in family.stacks(cfg, seq_len or 1))
  heads = f'{cfg.num_heads} heads'
  if cfg.kv_heads != cfg.num_heads:
    heads += f' ({cfg.kv_heads} key-value)'
  extra = family.describe(cfg)
  return (f'{blocks} blocks, width {cfg.width}, {heads}, MLP {cfg.mlp} {cfg.hidden_dim}'
          + (f', {extra}' if extra else ''))


def describe(config) -> str:
  """What --mode=describe prints: for this machine's devices, or with compile.target for that
  target's (its platform's kernel, dtype and plan on its number of chips, of its memory).
  `config`: the run's RunSettings, or a config resolved here."""
  target = _target(config)
  settings = run_settings.resolve(config, target.platform if target else None)
  cfg, family = settings.model, settings.family
  analytic, counted = accounting.param_counts(cfg), accounting.counted_params(cfg)
  if analytic != counted:
    raise AssertionError(f'Analytic parameter count {analytic} differs from the initialized '
                         f'tree {counted}: the accounting and the modules disagree.')
  total = counted['total']
  seq_len = settings.data.seq_len if family.per_token else None
  lines = [f'{cfg.family} model: {shape(cfg, seq_len)}',
           f'{total:,} parameters (analytic count = initialized tree)',
           f'  {"part":<10} {"parameters":>14} {"share":>7}']
  for part in accounting.PARTS:
    if counted[part] or part != 'other':
      lines.append(f'  {part:<10} {counted[part]:>14,} {counted[part] / total:>7.1%}')
  lines.append(f'Attention kernel: {settings.kernel.name} ({settings.kernel.reason})')
  lines.append(f'Compute dtype: {cfg.dtype} ({settings.dtype_reason}); parameters in '
               f'{cfg.param_dtype}')
  flops = accounting.flops_per_token(cfg, seq_len)
  unit = f'token at T={seq_len}' if family.per_token else family.unit
  lines.append(f'FLOPs per {unit}: forward {flops["forward"]:,.0f}, training '
               f'{flops["train"]:,.0f} (attention matrices {flops["attention_share"]:.1%})')
  if family.decoding:
    decoded = settings.data.seq_len
    source = memory.encoder_positions(cfg, decoded)
    over = f' over {source} encoder positions' if source not in (None, decoded) else ''
    for dtype in sorted({cfg.dtype, 'bfloat16'}):
      cache = memory.kv_cache_bytes(cfg, decoded, dtype)
      lines.append(f'KV cache per sequence of {decoded} tokens{over} in {dtype}: {cache:,} bytes '
                   f'({cfg.kv_heads} of {cfg.num_heads} heads cached)')
  else:
    lines.append('KV cache: none (no causal mask, nothing can be reused between steps)')
  return '\n'.join(lines + memory_lines(settings, target))


def _target(config):
  target = config.compile.target
  return targets.target(target) if target else None


def _size(num_bytes: float) -> str:
  return f'{num_bytes / 2**30:.2f} GiB' if num_bytes >= 2**30 else f'{num_bytes / 2**20:.1f} MiB'


def device_memory(training: TrainingSettings, target=None) -> float | None:
  """Bytes of one device: training.device_memory_gb, else the target's, else what JAX reports
  (GPUs, TPUs)."""
  if training.device_memory_gb:
    return training.device_memory_gb * 1e9
  if target is not None:
    return target.chip.memory_bytes
  stats = jax.local_devices()[0].memory_stats() or {}
  return stats.get('bytes_limit')


def memory_lines(settings, target=None) -> list[str]:
  """The per-device plan of the train step (and a decoding cache) of a run's resolved settings
  on its mesh and rules, over the devices of `target` (a targets.Target) or of this machine;
  beside it XLA's figure of the compiled step (aot.train_step_memory) and the verdict by it,
  where the settings ask for it (compile.xla_memory) and the compiler is installed; else the
  plan's verdict and how far plans of its kind held (memory.accuracy)."""
  platform, cfg, data = settings.platform, settings.model, settings.data
  sizes = sharding.mesh_sizes(settings.mesh, target and target.num_devices)
  plan = memory.plan(settings, sizes)
  tokens = settings.family.per_token
  mesh = ' x '.join(f'{axis}={size}' for axis, size in sizes.items())
  lines = [f'Memory per device on {plan.devices} devices ({mesh}, rule set '
           f'{settings.rule_set!r}), batch {data.batch_size}'
           + (f' x {data.seq_len}' if tokens else '')
           + f', remat {cfg.remat_policy}{", scanned" if cfg.scan_layers else ""}, as '
           f'XLA:{platform.upper()} compiles it:']
  parts = [('parameters', plan.params), ('optimizer state', plan.optimizer),
           ('gradients', plan.gradients), ('gathered weights (FSDP)', plan.gathered),
           ('batch', plan.batch), ('activations (estimate)', plan.activations)]
  lines += [f'  {name:<24} {_size(value):>12}' for name, value in parts if value or
            name.startswith(('parameters', 'activations'))]
  limit, compiler = device_memory(settings.training, target), f'XLA:{platform.upper()}'
  xla, why_none = _xla_memory(settings, target, limit)
  if xla is None:  # the plan's verdict, and how far plans of its kind held
    lines.append(f'  {"train step total":<24} {_size(plan.train_total):>12}'
                 f'{_verdict(plan.train_total, limit)}{", by the plan" if limit else ""}')
    accurate, accuracy = memory.accuracy(cfg, platform, plan)
    notes = [f'No {compiler} figure: {why_none}; the plan is an estimate.',
             f'{accuracy[0].upper()}{accuracy[1:]}.' if accurate else f'Caution: {accuracy}.']
  else:
    total = xla.xla_bytes['total']
    lines.append(f'  {"train step total":<24} {_size(plan.train_total):>12}' + (
        '' if xla.refused else
        f' (the plan: {plan.train_total / xla.xla_bytes["buffers"]:.2f}x XLA\'s buffers)'))
    compiled = f'  {"compiled by " + compiler:<24} '
    if xla.refused:  # too big to compile: XLA:TPU's need, by its out-of-memory error
      lines.append(compiled + (f'{_size(total):>12}' if total else 'more than it holds') +
                   f': does NOT fit{f" in {_size(limit)}" if limit else ""} ({compiler} refused '
                   'to compile it, out of memory)')
    else:
      lines.append(compiled + f'{_size(total):>12}{_verdict(total, limit)}')
    skip = 'compile.xla_memory=False skips the compile'
    notes = [f'From the cache (compiled in {xla.compile_seconds:.1f} s before; {skip}).'
             if xla.cached else f'Compiled in {xla.compile_seconds:.1f} s and cached: '
             f'describing this step again compiles nothing ({skip}).']
  if plan.kv_cache is not None:
    lines.append(f'  {"KV cache per sequence":<24} {_size(plan.kv_cache):>12} (decoding '
                 f'{data.seq_len} tokens)')
  return lines + [f'  {note}' for note in notes]


def _verdict(total: float, limit: float | None) -> str:
  if limit is None:
    return ''
  return f': {"fits" if total <= limit else "does NOT fit"} in {_size(limit)} ({total / limit:.0%})'


def _xla_memory(settings, target, limit) -> tuple:
  """(XLA's memory of the run's compiled train step for `target` or this machine, an
  aot.StepMemory, else None; why there is none). A machine that states no memory to fit in
  (a CPU, without training.device_memory_gb) has no verdict to settle: its describe stays the
  instant plan rather than a compile of minutes for a large model."""
  if not settings.compile.xla_memory:
    return None, 'compile.xla_memory=False skips the compile'
  if limit is None:
    return None, ('this machine states no memory to fit in (set training.device_memory_gb, or '
                  'compile.target, to have the step compiled and judged)')
  if target is not None and target.missing:
    return None, f"{target.missing} is not installed (pip install -e '.[compile]')"
  xla = aot.train_step_memory(settings, target and target.devices)
  if xla.xla_bytes is None:
    return None, f'XLA:{settings.platform.upper()} reports no memory analysis'
  return xla, None
