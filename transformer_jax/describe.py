"""`--mode=describe`: the model's shape, parameters by part, FLOPs per token and KV-cache bytes."""
from transformer_jax import accounting, config_lib, models


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
    named = [name for name, size in config_lib.VIT_SIZES.items()
             if size == (cfg.width, cfg.num_layers, cfg.num_heads)]
    text += f' (ViT-{named[0]}/{cfg.patch_size})' if named else ''
  return text


def describe(config) -> str:
  cfg = models.model_config(config.model)
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
  seq_len = config.data.get('seq_len') or cfg.max_len if family.unit == 'token' else None
  flops = accounting.flops_per_token(cfg, seq_len)
  unit = f'token at T={seq_len}' if family.unit == 'token' else family.unit
  lines.append(f'FLOPs per {unit}: forward {flops["forward"]:,.0f}, training '
               f'{flops["train"]:,.0f} (attention matrices {flops["attention_share"]:.1%})')
  if family.decoding:
    source = seq_len if family.decoding == 'encoder_decoder' else None
    for dtype in sorted({cfg.dtype, 'bfloat16'}):
      cache = accounting.kv_cache_bytes(cfg, seq_len, dtype=dtype, source_len=source)
      lines.append(f'KV cache per sequence of {seq_len} tokens in {dtype}: {cache:,} bytes '
                   f'({cfg.kv_heads} of {cfg.num_heads} heads cached)')
  else:
    lines.append('KV cache: none (no causal mask, nothing can be reused between steps)')
  return '\n'.join(lines)
