"""CLIPModel (Radford et al. 2021): a ViT with a pre-norm and a bias-free patch convolution, a
causal text transformer pooled at its first EOS, bias-free projections and the logit scale.

config.json nests the towers' options (text_config, vision_config); both towers share the
activation and the LayerNorm eps here. transformers pools the text at the highest id of each
row (not the first EOS) when eos_token_id is 2, as configs written before it had an EOS id do:
that is the first EOS of OpenAI's vocabulary, whose EOS is its last id, so eos_id is read as
vocab_size - 1 there.

Dropout: transformers' CLIP (and SigLIP) drop the attention probabilities only, at each tower's
attention_dropout: model.attention_dropout, which our towers share, so the two must be equal.
Nothing else drops (model.dropout_rate and model.mlp_dropout 0): the `dropout` that older
configs hold is applied nowhere in transformers' model, so it is not read.
"""
from transformer_jax.convert.architecture import (ATTENTION_DROPOUT_ONLY, NO_ABLATIONS,
                                                  Architecture, CheckpointError, HfConfig,
                                                  hf_activation)
from transformer_jax.convert.image_processor import OPENAI_MEAN, OPENAI_STD, ImageProcessor
from transformer_jax.convert.tensors import Array, Tensor, Vectors, linear, norm

__all__ = ['attention_dropout', 'CLIP', 'encoder_blocks', 'FIXED', 'hf_config', 'model_fields',
           'NAME', 'PROCESSOR', 'SHARED_BLOCKS', 'shared_option', 'tensors', 'towers']

NAME = 'CLIPModel'
# Both towers' blocks alike, the text tower without BERT's ends (a LiT tower from a BERT has
# them, which neither CLIPModel nor SiglipModel holds), dropping attention probabilities only.
SHARED_BLOCKS = dict(text_norm_position=None, text_norm_eps=None, text_mlp=None,
                     text_embed_norm=False, text_type_vocab_size=0, text_pad_id=None,
                     **ATTENTION_DROPOUT_ONLY)
FIXED = dict(family='clip', norm='layernorm', norm_bias=True, norm_position='pre',
             positions='learned', use_bias=True, num_kv_heads=None, image_pool='cls',
             pre_norm=True, patch_bias=False, text_causal=True, text_pool='eos', text_head=False,
             loss='softmax', bias=None, **SHARED_BLOCKS, **NO_ABLATIONS)
_LEGACY_EOS = 2  # transformers' marker of a config from before eos_token_id was read


def towers(c: HfConfig) -> tuple[HfConfig, HfConfig]:
  """config.json's text_config and vision_config."""
  return (HfConfig(c.architecture, c.get('text_config', {})),
          HfConfig(c.architecture, c.get('vision_config', {})))


def shared_option(text: HfConfig, vision: HfConfig, key: str, default, what: str):
  """Option `key` of the text tower, failing where the vision tower's differs: our towers share
  every block option but their sizes."""
  value = text.get(key, default)
  return vision.check(f'vision_config.{key}', vision.get(key, default), (value,),
                      f'gives both towers one {what}')


def attention_dropout(text: HfConfig, vision: HfConfig) -> float:
  """model.attention_dropout: the one attention_dropout of the towers' configs."""
  rates = {f'{name}_config.attention_dropout': tower.rate('attention_dropout', 0.0)
           for name, tower in (('text', text), ('vision', vision))}
  return text.one_rate(rates, 'attention_dropout')


def model_fields(c: HfConfig) -> dict:
  text, vision = towers(c)
  vocab_size = text.get('vocab_size', 49408)
  eos = text.get('eos_token_id', _LEGACY_EOS)
  return dict(FIXED, width=vision.get('hidden_size', 768),
              num_layers=vision.get('num_hidden_layers', 12),
              num_heads=vision.get('num_attention_heads', 12),
              d_ff=vision.get('intermediate_size', 3072),
              image_size=vision.get('image_size', 224), patch_size=vision.get('patch_size', 32),
              num_channels=vision.get('num_channels', 3),
              mlp=text.activation('hidden_act', 'quick_gelu'),
              norm_eps=float(shared_option(text, vision, 'layer_norm_eps', 1e-5, 'LayerNorm eps')),
              text_width=text.get('hidden_size', 512),
              text_layers=text.get('num_hidden_layers', 12),
              text_heads=text.get('num_attention_heads', 8),
              text_d_ff=text.get('intermediate_size', 2048), vocab_size=vocab_size,
              max_len=text.get('max_position_embeddings', 77),
              eos_id=vocab_size - 1 if eos == _LEGACY_EOS else eos,
              embed_dim=c.get('projection_dim', 512),
              attention_dropout=attention_dropout(text, vision))


def hf_config(cfg) -> dict:
  if not cfg.embed_dim:
    raise CheckpointError(f'{NAME} projects both towers: set model.embed_dim.')
  act = hf_activation(cfg, NAME)
  shared = dict(hidden_act=act, layer_norm_eps=cfg.norm_eps,
                attention_dropout=cfg.attention_dropout_rate)
  return dict(
      projection_dim=cfg.embed_dim,
      text_config=dict(shared, hidden_size=cfg.text_width, num_hidden_layers=cfg.text_layers,
                       num_attention_heads=cfg.text_heads,
                       intermediate_size=cfg.text_config.hidden_dim, vocab_size=cfg.vocab_size,
                       max_position_embeddings=cfg.max_len, eos_token_id=cfg.eos_id),
      vision_config=dict(shared, hidden_size=cfg.width, num_hidden_layers=cfg.num_layers,
                         num_attention_heads=cfg.num_heads, intermediate_size=cfg.hidden_dim,
                         image_size=cfg.image_size, patch_size=cfg.patch_size,
                         num_channels=cfg.num_channels))


def encoder_blocks(hf: str, ours: str, num: int) -> list[Tensor]:
  """The `num` layers of HF's encoder under `hf` (CLIP's and SigLIP's) as our blocks under
  `ours`."""
  specs = []
  for i in range(num):
    layer, block = f'{hf}.encoder.layers.{i}', f'{ours}/encoder/block_{i}'
    specs += norm(f'{layer}.layer_norm1', f'{block}/attn_norm')
    for name in ('q', 'k', 'v'):
      specs += linear(f'{layer}.self_attn.{name}_proj',
                      f'{block}/attn/{dict(q="query", k="key", v="value")[name]}', bias=True)
    specs += [*linear(f'{layer}.self_attn.out_proj', f'{block}/attn/out', bias=True, num_in=2),
              *norm(f'{layer}.layer_norm2', f'{block}/mlp_norm'),
              *linear(f'{layer}.mlp.fc1', f'{block}/mlp/up', bias=True),
              *linear(f'{layer}.mlp.fc2', f'{block}/mlp/down', bias=True)]
  return specs


def tensors(cfg) -> list[Tensor]:
  embeddings = 'vision_model.embeddings'
  vision = [Tensor(f'{embeddings}.class_embedding', ('image/cls_token',), Vectors()),
            Tensor(f'{embeddings}.patch_embedding.weight', ('image/patch_embed/conv/kernel',),
                   Array(perm=(3, 2, 0, 1))),
            Tensor(f'{embeddings}.position_embedding.weight', ('image/pos_embed',)),
            *norm('vision_model.pre_layrnorm', 'image/pre_norm'),
            *encoder_blocks('vision_model', 'image', cfg.num_layers),
            *norm('vision_model.post_layernorm', 'image/final_norm')]
  text = [Tensor('text_model.embeddings.token_embedding.weight', ('text/embed/tokens',)),
          Tensor('text_model.embeddings.position_embedding.weight', ('text/embed/positions',)),
          *encoder_blocks('text_model', 'text', cfg.text_layers),
          *norm('text_model.final_layer_norm', 'text/final_norm')]
  return (vision + text + linear('visual_projection', 'image_projection', bias=False)
          + linear('text_projection', 'text_projection', bias=False)
          + [Tensor('logit_scale', ('log_temperature',))])


# transformers' CLIPImageProcessor: the shorter side to the image size, bicubic, its centre crop,
# OpenAI's statistics; weights trained by open_clip's RandomResizedCrop(scale=(0.9, 1.0)).
PROCESSOR = ImageProcessor(
    'CLIPImageProcessor', lambda size: dict(
        do_resize=True, size={'shortest_edge': size}, resample=3, do_center_crop=True,
        crop_size={'height': size, 'width': size}, do_rescale=True, rescale_factor=1 / 255,
        do_normalize=True, image_mean=OPENAI_MEAN, image_std=OPENAI_STD),
    default_to_square=False, train_crop=(90, 100))

CLIP = Architecture(NAME, 'clip', 'clip', 'clip', model_fields, hf_config, tensors,
                    tied=lambda cfg: {},
                    ignored=(r'(text|vision)_model\.embeddings\.position_ids',),
                    image_processor=PROCESSOR)
