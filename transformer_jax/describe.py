"""`--mode=describe`: parameters by part, FLOPs per token and KV-cache bytes of a config."""
from transformer_jax import accounting, models


def describe(config) -> str:
  cfg = models.model_config(config.model)
  analytic, counted = accounting.param_counts(cfg), accounting.counted_params(cfg)
  if analytic != counted:
    raise AssertionError(f'Analytic parameter count {analytic} differs from the initialized '
                         f'tree {counted}: the accounting and the modules disagree.')
  total = counted['total']
  lines = [f'{cfg.family} model: {total:,} parameters (analytic count = initialized tree)',
           f'  {"part":<10} {"parameters":>14} {"share":>7}']
  for part in accounting.PARTS:
    lines.append(f'  {part:<10} {counted[part]:>14,} {counted[part] / total:>7.1%}')
  seq_len = None if cfg.family == 'vit' else config.data.get('seq_len') or cfg.max_len
  flops = accounting.flops_per_token(cfg, seq_len)
  unit = 'image' if cfg.family == 'vit' else f'token at T={seq_len}'
  lines.append(f'FLOPs per {unit}: forward {flops["forward"]:,.0f}, training '
               f'{flops["train"]:,.0f} (attention matrices {flops["attention_share"]:.1%})')
  if cfg.family in ('decoder', 'encoder_decoder'):
    source = seq_len if cfg.family == 'encoder_decoder' else None
    for dtype in sorted({cfg.dtype, 'bfloat16'}):
      cache = accounting.kv_cache_bytes(cfg, seq_len, dtype=dtype, source_len=source)
      lines.append(f'KV cache per sequence of {seq_len} tokens in {dtype}: {cache:,} bytes '
                   f'({cfg.kv_heads} of {cfg.num_heads} heads cached)')
  else:
    lines.append('KV cache: none (no causal mask, nothing can be reused between steps)')
  return '\n'.join(lines)
