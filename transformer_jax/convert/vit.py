"""ViTForImageClassification: pre-LN LayerNorm blocks, a [CLS] token and learned positions,
the patch convolution stored (D, C, P, P) for NCHW images (ours is (P, P, C, D) for NHWC),
and a linear classifier on the final [CLS] vector.

Dropout, as transformers' ViT applies it in training: hidden_dropout_prob of the embeddings (the
patches, [CLS] and positions) and of each sublayer's output before its residual add is
model.dropout_rate, attention_probs_dropout_prob of the attention probabilities
model.attention_dropout; ViT has no dropout of the MLP's hidden activation (model.mlp_dropout 0)."""
from transformer_jax.convert.architecture import (NO_ABLATIONS, Architecture, HfConfig,
                                                  hf_activation)
from transformer_jax.convert.tensors import Array, Tensor, linear, norm

__all__ = ['FIXED', 'hf_config', 'model_fields', 'NAME', 'square', 'tensors', 'VIT']

NAME = 'ViTForImageClassification'
FIXED = dict(family='vit', norm='layernorm', norm_bias=True, norm_position='pre',
             positions='learned', use_bias=True, num_kv_heads=None, pool='cls', mlp_dropout=0.0,
             **NO_ABLATIONS)


def square(c: HfConfig, key: str, default: int) -> int:
  """A size HF may give as one number or as (height, width)."""
  value = c.get(key, default)
  if isinstance(value, int):
    return value
  return c.check(key, tuple(value), ((value[0], value[0]),), 'takes square images and patches')[0]


def model_fields(c: HfConfig) -> dict:
  c.require('qkv_bias', True, (True,), 'gives q, k and v a bias whenever other layers have one')
  labels = c.get('id2label', {})
  return dict(FIXED, width=c.get('hidden_size', 768), num_layers=c.get('num_hidden_layers', 12),
              num_heads=c.get('num_attention_heads', 12), d_ff=c.get('intermediate_size', 3072),
              norm_eps=float(c.get('layer_norm_eps', 1e-12)),
              mlp=c.activation('hidden_act', 'gelu'),
              image_size=square(c, 'image_size', 224), patch_size=square(c, 'patch_size', 16),
              num_channels=c.get('num_channels', 3),
              num_classes=len(labels) if labels else c.get('num_labels', 2),
              dropout_rate=c.rate('hidden_dropout_prob', 0.0),
              attention_dropout=c.rate('attention_probs_dropout_prob', 0.0))


def hf_config(cfg) -> dict:
  return dict(hidden_size=cfg.width, num_hidden_layers=cfg.num_layers,
              num_attention_heads=cfg.num_heads, intermediate_size=cfg.hidden_dim,
              layer_norm_eps=cfg.norm_eps, hidden_act=hf_activation(cfg, NAME), qkv_bias=True,
              image_size=cfg.image_size, patch_size=cfg.patch_size,
              num_channels=cfg.num_channels, hidden_dropout_prob=cfg.dropout_rate,
              attention_probs_dropout_prob=cfg.attention_dropout_rate,
              id2label={str(i): f'LABEL_{i}' for i in range(cfg.num_classes)},
              label2id={f'LABEL_{i}': i for i in range(cfg.num_classes)})


def tensors(cfg) -> list[Tensor]:
  patches = 'vit.embeddings.patch_embeddings.projection'
  specs = [Tensor('vit.embeddings.cls_token', ('cls_token',), Array(lead=1)),
           Tensor('vit.embeddings.position_embeddings', ('pos_embed',), Array(lead=1)),
           Tensor(f'{patches}.weight', ('patch_embed/conv/kernel',), Array(perm=(3, 2, 0, 1))),
           Tensor(f'{patches}.bias', ('patch_embed/conv/bias',))]
  for i in range(cfg.num_layers):
    hf, ours = f'vit.encoder.layer.{i}', f'encoder/block_{i}'
    specs += norm(f'{hf}.layernorm_before', f'{ours}/attn_norm')
    for name in ('query', 'key', 'value'):
      specs += linear(f'{hf}.attention.attention.{name}', f'{ours}/attn/{name}', bias=True)
    specs += [*linear(f'{hf}.attention.output.dense', f'{ours}/attn/out', bias=True, num_in=2),
              *norm(f'{hf}.layernorm_after', f'{ours}/mlp_norm'),
              *linear(f'{hf}.intermediate.dense', f'{ours}/mlp/up', bias=True),
              *linear(f'{hf}.output.dense', f'{ours}/mlp/down', bias=True)]
  return specs + norm('vit.layernorm', 'final_norm') + linear('classifier', 'head', bias=True)


VIT = Architecture(NAME, 'vit', 'vit', 'vit', model_fields, hf_config, tensors,
                   tied=lambda cfg: {},
                   # ViTModel's pooler, which a checkpoint of the bare model may hold.
                   ignored=(r'vit\.pooler\..*',))
