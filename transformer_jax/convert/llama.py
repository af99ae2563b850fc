"""LlamaForCausalLM: pre-LN RMSNorm blocks, SwiGLU, RoPE (HF's rotate_half is our half-split
rotation), grouped-query attention, an untied or tied head. Its one dropout, attention_dropout of
the attention probabilities, is model.attention_dropout; it drops nothing else in training
(model.dropout_rate and model.mlp_dropout 0)."""
from transformer_jax.convert.architecture import (ATTENTION_DROPOUT_ONLY, NO_ABLATIONS,
                                                  Architecture, HfConfig)
from transformer_jax.convert.tensors import Tensor, decoder_ends, linear, norm, tied_to

__all__ = ['FIXED', 'hf_config', 'LLAMA', 'model_fields', 'NAME', 'rope_base', 'tensors']

NAME = 'LlamaForCausalLM'
FIXED = dict(family='decoder', norm='rmsnorm', norm_position='pre', mlp='swiglu',
             positions='rope', scale_embeddings=False, **ATTENTION_DROPOUT_ONLY, **NO_ABLATIONS)


def rope_base(c: HfConfig) -> float:
  """rope_theta of the default rotation. transformers 5 writes rope_parameters; 4 wrote
  rope_theta and rope_scaling."""
  for key in ('rope_parameters', 'rope_scaling'):
    rope = c.get(key, {})
    c.check(f'{key}.rope_type', rope.get('rope_type', rope.get('type', 'default')), ('default',),
            'implements the default RoPE only (no scaling)')
  return float(c.get('rope_parameters', {}).get('rope_theta', c.get('rope_theta', 10000.0)))


def model_fields(c: HfConfig) -> dict:
  c.require('hidden_act', 'silu', ('silu',), 'builds SwiGLU on SiLU')
  width, heads = c.get('hidden_size', 4096), c.get('num_attention_heads', 32)
  c.require('head_dim', width // heads, (width // heads,), 'gives each head hidden_size / heads')
  bias = c.get('attention_bias', False)
  c.require('mlp_bias', False, (bias,), 'has one switch (model.use_bias) for every dense bias')
  return dict(FIXED, width=width, num_layers=c.get('num_hidden_layers', 32), num_heads=heads,
              num_kv_heads=c.get('num_key_value_heads', heads),
              d_ff=c.get('intermediate_size', 11008), vocab_size=c.get('vocab_size', 32000),
              max_len=c.get('max_position_embeddings', 2048),
              norm_eps=float(c.get('rms_norm_eps', 1e-6)), rope_base=rope_base(c), use_bias=bias,
              tie_embeddings=c.get('tie_word_embeddings', False),
              attention_dropout=c.rate('attention_dropout', 0.0))


def hf_config(cfg) -> dict:
  return dict(hidden_size=cfg.width, num_hidden_layers=cfg.num_layers,
              num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.kv_heads,
              head_dim=cfg.head_dim, intermediate_size=cfg.hidden_dim, vocab_size=cfg.vocab_size,
              max_position_embeddings=cfg.max_len, rms_norm_eps=cfg.norm_eps, hidden_act='silu',
              rope_parameters=dict(rope_type='default', rope_theta=cfg.rope_base),
              attention_bias=cfg.use_bias, mlp_bias=cfg.use_bias,
              tie_word_embeddings=cfg.tie_embeddings, attention_dropout=cfg.attention_dropout_rate)


def tensors(cfg) -> list[Tensor]:
  specs = [Tensor('model.embed_tokens.weight', ('embed/tokens',))]
  for i in range(cfg.num_layers):
    hf, ours = f'model.layers.{i}', f'decoder/block_{i}'
    specs += norm(f'{hf}.input_layernorm', f'{ours}/attn_norm', bias=False)
    for name, path in (('q_proj', 'query'), ('k_proj', 'key'), ('v_proj', 'value')):
      specs += linear(f'{hf}.self_attn.{name}', f'{ours}/attn/{path}', bias=cfg.use_bias)
    specs += linear(f'{hf}.self_attn.o_proj', f'{ours}/attn/out', bias=cfg.use_bias, num_in=2)
    specs += norm(f'{hf}.post_attention_layernorm', f'{ours}/mlp_norm', bias=False)
    for name in ('gate', 'up', 'down'):
      specs += linear(f'{hf}.mlp.{name}_proj', f'{ours}/mlp/{name}', bias=cfg.use_bias)
  return specs + decoder_ends(cfg, 'model.norm', norm_bias=False)


LLAMA = Architecture(
    NAME, 'llama', 'decoder', 'model', model_fields, hf_config, tensors,
    tied_to('model.embed_tokens.weight'),
    # The RoPE frequencies that older conversions saved as a buffer (recomputed from rope_theta).
    ignored=(r'model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq',))
