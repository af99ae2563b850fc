"""GPT2LMHeadModel: pre-LN LayerNorm blocks, learned positions, Conv1D layers ((in, out) kernels)
with q, k and v fused into one c_attn, and the head tied to the token embedding (an lm_head of
its own where tie_word_embeddings is false).

Dropout, as transformers' GPT-2 applies it in training: attn_pdrop of the attention probabilities
is model.attention_dropout; embd_pdrop of the embeddings and resid_pdrop of each sublayer's output
are our one model.dropout_rate, so they must be equal (the hub's are 0.1); GPT-2 has no dropout
of the MLP's hidden activation (model.mlp_dropout 0)."""
from transformer_jax.convert.architecture import (NO_ABLATIONS, Architecture, HfConfig,
                                                  hf_activation)
from transformer_jax.convert.tensors import Tensor, decoder_ends, linear, norm, tied_to

__all__ = ['FIXED', 'GPT2', 'hf_config', 'model_fields', 'NAME', 'tensors']

NAME = 'GPT2LMHeadModel'
FIXED = dict(family='decoder', norm='layernorm', norm_bias=True, norm_position='pre',
             positions='learned', use_bias=True, num_kv_heads=None, scale_embeddings=False,
             mlp_dropout=0.0, **NO_ABLATIONS)
_DROPOUT_DEFAULT = 0.1  # GPT2Config's of each dropout


def model_fields(c: HfConfig) -> dict:
  c.require('scale_attn_weights', True, (True,), 'always scales attention logits by 1/sqrt(d_k)')
  c.require('scale_attn_by_inverse_layer_idx', False, (False,),
            'scales every layer\'s attention logits alike')
  c.require('add_cross_attention', False, (False,), 'has no cross-attention in a decoder-only LM')
  width = c.get('n_embd', 768)
  return dict(FIXED, width=width, num_layers=c.get('n_layer', 12), num_heads=c.get('n_head', 12),
              d_ff=c.get('n_inner', 4 * width), vocab_size=c.get('vocab_size', 50257),
              max_len=c.get('n_positions', 1024), norm_eps=float(c.get('layer_norm_epsilon', 1e-5)),
              mlp=c.activation('activation_function', 'gelu_new'),
              tie_embeddings=c.get('tie_word_embeddings', True),
              dropout_rate=c.one_rate({key: c.rate(key, _DROPOUT_DEFAULT)
                                       for key in ('embd_pdrop', 'resid_pdrop')}, 'dropout_rate'),
              attention_dropout=c.rate('attn_pdrop', _DROPOUT_DEFAULT))


def hf_config(cfg) -> dict:
  return dict(n_embd=cfg.width, n_layer=cfg.num_layers, n_head=cfg.num_heads,
              n_inner=cfg.hidden_dim, vocab_size=cfg.vocab_size, n_positions=cfg.max_len,
              layer_norm_epsilon=cfg.norm_eps, activation_function=hf_activation(cfg, NAME),
              tie_word_embeddings=cfg.tie_embeddings, embd_pdrop=cfg.dropout_rate,
              resid_pdrop=cfg.dropout_rate, attn_pdrop=cfg.attention_dropout_rate)


def tensors(cfg) -> list[Tensor]:
  specs = [Tensor('transformer.wte.weight', ('embed/tokens',)),
           Tensor('transformer.wpe.weight', ('embed/positions',))]
  for i in range(cfg.num_layers):
    hf, ours = f'transformer.h.{i}', f'decoder/block_{i}'
    conv1d = dict(bias=True, transposed=False)
    specs += [*norm(f'{hf}.ln_1', f'{ours}/attn_norm'),
              *linear(f'{hf}.attn.c_attn', [f'{ours}/attn/{p}' for p in ('query', 'key', 'value')],
                      **conv1d),
              *linear(f'{hf}.attn.c_proj', f'{ours}/attn/out', num_in=2, **conv1d),
              *norm(f'{hf}.ln_2', f'{ours}/mlp_norm'),
              *linear(f'{hf}.mlp.c_fc', f'{ours}/mlp/up', **conv1d),
              *linear(f'{hf}.mlp.c_proj', f'{ours}/mlp/down', **conv1d)]
  return specs + decoder_ends(cfg, 'transformer.ln_f')


GPT2 = Architecture(
    NAME, 'gpt2', 'decoder', 'transformer', model_fields, hf_config, tensors,
    tied_to('transformer.wte.weight'),
    # The causal-mask buffers that older GPT-2 checkpoints (the hub's gpt2) still hold.
    ignored=(r'transformer\.h\.\d+\.attn\.(bias|masked_bias)',))
