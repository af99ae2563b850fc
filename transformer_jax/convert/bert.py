"""BertForMaskedLM: post-LN LayerNorm blocks, token, position and token-type embeddings with a
LayerNorm, and the MLM head (dense + activation + LayerNorm, the decoder tied to the token
embedding, an output bias). BERT's pooler and next-sentence head are not part of it. BertModel,
the same without the MLM head, is read (not written) as a headless architecture: a dual
encoder's text tower starts from it (LiT, Zhai et al. 2022).

Dropout, as transformers' BERT applies it in training: hidden_dropout_prob of the embeddings
(after their LayerNorm) and of each sublayer's output before its residual add is
model.dropout_rate, attention_probs_dropout_prob of the attention probabilities
model.attention_dropout; BERT has no dropout of the MLP's hidden activation (model.mlp_dropout
0). classifier_dropout belongs to the classification heads, which BertForMaskedLM has not."""
from transformer_jax.convert.architecture import (NO_ABLATIONS, Architecture, HfConfig,
                                                  hf_activation)
from transformer_jax.convert.tensors import Tensor, linear, norm

__all__ = ['BERT', 'BERT_MODEL', 'FIXED', 'hf_config', 'model_fields', 'NAME', 'tensors', 'tied']

NAME = 'BertForMaskedLM'
FIXED = dict(family='encoder', norm='layernorm', norm_bias=True, norm_position='post',
             positions='learned', use_bias=True, num_kv_heads=None, embed_norm=True,
             scale_embeddings=False, mlp_dropout=0.0, **NO_ABLATIONS)


def model_fields(c: HfConfig) -> dict:
  c.require('position_embedding_type', 'absolute', ('absolute',),
            'adds absolute learned positions (no relative-position attention)')
  c.require('is_decoder', False, (False,), 'lets every token of an encoder see every token')
  c.require('add_cross_attention', False, (False,), 'has no cross-attention in an encoder')
  return dict(FIXED, width=c.get('hidden_size', 768), num_layers=c.get('num_hidden_layers', 12),
              num_heads=c.get('num_attention_heads', 12), d_ff=c.get('intermediate_size', 3072),
              vocab_size=c.get('vocab_size', 30522), max_len=c.get('max_position_embeddings', 512),
              type_vocab_size=c.get('type_vocab_size', 2),
              norm_eps=float(c.get('layer_norm_eps', 1e-12)),
              mlp=c.activation('hidden_act', 'gelu'),
              tie_embeddings=c.get('tie_word_embeddings', True),
              dropout_rate=c.rate('hidden_dropout_prob', 0.1),
              attention_dropout=c.rate('attention_probs_dropout_prob', 0.1))


def hf_config(cfg) -> dict:
  return dict(hidden_size=cfg.width, num_hidden_layers=cfg.num_layers,
              num_attention_heads=cfg.num_heads, intermediate_size=cfg.hidden_dim,
              vocab_size=cfg.vocab_size, max_position_embeddings=cfg.max_len,
              type_vocab_size=cfg.type_vocab_size, layer_norm_eps=cfg.norm_eps,
              hidden_act=hf_activation(cfg, NAME), position_embedding_type='absolute',
              tie_word_embeddings=cfg.tie_embeddings, hidden_dropout_prob=cfg.dropout_rate,
              attention_probs_dropout_prob=cfg.attention_dropout_rate)


def tensors(cfg) -> list[Tensor]:
  embed = 'bert.embeddings'
  specs = [Tensor(f'{embed}.word_embeddings.weight', ('embed/tokens',)),
           Tensor(f'{embed}.position_embeddings.weight', ('embed/positions',)),
           Tensor(f'{embed}.token_type_embeddings.weight', ('embed/types',)),
           *norm(f'{embed}.LayerNorm', 'embed_norm')]
  for i in range(cfg.num_layers):
    hf, ours = f'bert.encoder.layer.{i}', f'encoder/block_{i}'
    for name in ('query', 'key', 'value'):
      specs += linear(f'{hf}.attention.self.{name}', f'{ours}/attn/{name}', bias=True)
    specs += [*linear(f'{hf}.attention.output.dense', f'{ours}/attn/out', bias=True, num_in=2),
              *norm(f'{hf}.attention.output.LayerNorm', f'{ours}/attn_norm'),
              *linear(f'{hf}.intermediate.dense', f'{ours}/mlp/up', bias=True),
              *linear(f'{hf}.output.dense', f'{ours}/mlp/down', bias=True),
              *norm(f'{hf}.output.LayerNorm', f'{ours}/mlp_norm')]
  head = 'cls.predictions'
  specs += [*linear(f'{head}.transform.dense', 'head/transform', bias=True),
            *norm(f'{head}.transform.LayerNorm', 'head/norm'),
            Tensor(f'{head}.bias', ('head/bias',))]
  if not cfg.tie_embeddings:
    specs += linear(f'{head}.decoder', 'head/decoder', bias=False)
  return specs


def tied(cfg) -> dict[str, str]:
  decoder = {'cls.predictions.decoder.bias': 'cls.predictions.bias'}
  if cfg.tie_embeddings:
    decoder['cls.predictions.decoder.weight'] = 'bert.embeddings.word_embeddings.weight'
  return decoder


def _body_tensors(cfg) -> list[Tensor]:
  return [spec for spec in tensors(cfg) if spec.name.startswith('bert.')]


# What checkpoints saved from BertForPreTraining (the hub's bert-base-uncased) also hold.
_IGNORED = (r'bert\.pooler\..*', r'cls\.seq_relationship\..*', r'bert\.embeddings\.position_ids')
BERT = Architecture(NAME, 'bert', 'encoder', 'bert', model_fields, hf_config, tensors, tied,
                    ignored=_IGNORED)
BERT_MODEL = Architecture('BertModel', 'bert', 'encoder', 'bert', model_fields, hf_config,
                          _body_tensors, lambda cfg: {}, ignored=_IGNORED, headless=True)
