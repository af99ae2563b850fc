"""SiglipModel (Zhai et al. 2023): a ViT with a biased patch convolution, no [CLS] token and the
multihead attention pooling head; a bidirectional text transformer pooled at its last position
through a linear head; no projections, and the sigmoid loss's logit scale and bias.

transformers' torch.nn.MultiheadAttention in the pooling head stores q|k|v as one in_proj
tensor. The text pooling reads no EOS id, so eos_token_id is not a model option here (export
writes model.eos_id, where set, for the tokenizer's sake). Dropout is CLIP's (convert/clip.py):
the towers' one attention_dropout; the pooling head's attention drops nothing, in transformers'
model (torch.nn.MultiheadAttention's dropout 0) as in ours.
"""
from transformer_jax.convert import vit
from transformer_jax.convert.architecture import (NO_ABLATIONS, Architecture, CheckpointError,
                                                  HfConfig, hf_activation)
from transformer_jax.convert.clip import (SHARED_BLOCKS, attention_dropout, encoder_blocks,
                                          shared_option, towers)
from transformer_jax.convert.image_processor import ImageProcessor
from transformer_jax.convert.tensors import Array, Dense, Tensor, Vectors, linear, norm

__all__ = ['FIXED', 'hf_config', 'model_fields', 'NAME', 'PROCESSOR', 'SIGLIP', 'tensors']

NAME = 'SiglipModel'
FIXED = dict(family='clip', norm='layernorm', norm_bias=True, norm_position='pre',
             positions='learned', use_bias=True, num_kv_heads=None, image_pool='map',
             pre_norm=False, patch_bias=True, text_causal=False, text_pool='last', text_head=True,
             embed_dim=0, loss='sigmoid', **SHARED_BLOCKS, **NO_ABLATIONS)


def model_fields(c: HfConfig) -> dict:
  text, vision = towers(c)
  vision.require('vision_use_head', True, (True,), 'pools the image tower by its MAP head')
  width = vision.get('hidden_size', 768)
  text_width = text.check('text_config.hidden_size', text.get('hidden_size', 768), (width,),
                          'compares the towers without projections, so their widths must match')
  text.check('text_config.projection_size', text.get('projection_size', text_width),
             (text_width,), "maps the pooled text to the text tower's width")
  shared_option(text, vision, 'hidden_act', 'gelu_pytorch_tanh', 'activation')
  return dict(FIXED, width=width, num_layers=vision.get('num_hidden_layers', 12),
              num_heads=vision.get('num_attention_heads', 12),
              d_ff=vision.get('intermediate_size', 3072),
              image_size=vit.square(vision, 'image_size', 224),
              patch_size=vit.square(vision, 'patch_size', 16),
              num_channels=vision.get('num_channels', 3),
              mlp=text.activation('hidden_act', 'gelu_pytorch_tanh'),
              norm_eps=float(shared_option(text, vision, 'layer_norm_eps', 1e-6, 'LayerNorm eps')),
              text_width=text_width, text_layers=text.get('num_hidden_layers', 12),
              text_heads=text.get('num_attention_heads', 12),
              text_d_ff=text.get('intermediate_size', 3072),
              vocab_size=text.get('vocab_size', 32000),
              max_len=text.get('max_position_embeddings', 64),
              attention_dropout=attention_dropout(text, vision))


def hf_config(cfg) -> dict:
  if cfg.embed_dim or cfg.width != cfg.text_width:
    raise CheckpointError(f'{NAME} compares the towers without projections: set '
                          'model.embed_dim=0 and model.text_width=model.width.')
  shared = dict(hidden_act=hf_activation(cfg, NAME), layer_norm_eps=cfg.norm_eps,
                attention_dropout=cfg.attention_dropout_rate)
  return dict(
      text_config=dict(shared, hidden_size=cfg.text_width, num_hidden_layers=cfg.text_layers,
                       num_attention_heads=cfg.text_heads,
                       intermediate_size=cfg.text_config.hidden_dim, vocab_size=cfg.vocab_size,
                       max_position_embeddings=cfg.max_len, projection_size=cfg.text_width,
                       **({} if cfg.eos_id is None else {'eos_token_id': cfg.eos_id})),
      vision_config=dict(shared, hidden_size=cfg.width, num_hidden_layers=cfg.num_layers,
                         num_attention_heads=cfg.num_heads, intermediate_size=cfg.hidden_dim,
                         image_size=cfg.image_size, patch_size=cfg.patch_size,
                         num_channels=cfg.num_channels, vision_use_head=True))


def _map_head() -> list[Tensor]:
  hf, ours = 'vision_model.head', 'image/map_head'
  qkv = [f'{ours}/attn/{name}' for name in ('query', 'key', 'value')]
  return [Tensor(f'{hf}.probe', (f'{ours}/probe',), Array(lead=1)),
          Tensor(f'{hf}.attention.in_proj_weight', tuple(f'{p}/kernel' for p in qkv), Dense()),
          Tensor(f'{hf}.attention.in_proj_bias', tuple(f'{p}/bias' for p in qkv), Vectors()),
          *linear(f'{hf}.attention.out_proj', f'{ours}/attn/out', bias=True, num_in=2),
          *norm(f'{hf}.layernorm', f'{ours}/norm'),
          *linear(f'{hf}.mlp.fc1', f'{ours}/mlp/up', bias=True),
          *linear(f'{hf}.mlp.fc2', f'{ours}/mlp/down', bias=True)]


def tensors(cfg) -> list[Tensor]:
  embeddings = 'vision_model.embeddings'
  vision = [Tensor(f'{embeddings}.patch_embedding.weight', ('image/patch_embed/conv/kernel',),
                   Array(perm=(3, 2, 0, 1))),
            Tensor(f'{embeddings}.patch_embedding.bias', ('image/patch_embed/conv/bias',)),
            Tensor(f'{embeddings}.position_embedding.weight', ('image/pos_embed',)),
            *encoder_blocks('vision_model', 'image', cfg.num_layers),
            *norm('vision_model.post_layernorm', 'image/final_norm'), *_map_head()]
  text = [Tensor('text_model.embeddings.token_embedding.weight', ('text/embed/tokens',)),
          Tensor('text_model.embeddings.position_embedding.weight', ('text/embed/positions',)),
          *encoder_blocks('text_model', 'text', cfg.text_layers),
          *norm('text_model.final_layer_norm', 'text/final_norm'),
          *linear('text_model.head', 'text/head', bias=True)]
  return vision + text + [Tensor('logit_scale', ('log_temperature',), Array(lead=1)),
                          Tensor('logit_bias', ('bias',), Array(lead=1))]


# transformers' SiglipImageProcessor: the whole image resized to the image size, bicubic, to
# [-1, 1] (big_vision's resize(224)|value_range(-1, 1)); trained on the same, unaugmented.
PROCESSOR = ImageProcessor(
    'SiglipImageProcessor', lambda size: dict(
        do_resize=True, size={'height': size, 'width': size}, resample=3, do_rescale=True,
        rescale_factor=1 / 255, do_normalize=True, image_mean=(0.5,) * 3, image_std=(0.5,) * 3),
    default_to_square=False)

SIGLIP = Architecture(NAME, 'siglip', 'clip', 'siglip', model_fields, hf_config, tensors,
                      tied=lambda cfg: {},
                      ignored=(r'(text|vision)_model\.embeddings\.position_ids',),
                      image_processor=PROCESSOR)
