"""WhisperForConditionalGeneration: the convolutional stem, fixed sinusoidal encoder positions
(stored in the checkpoint, as HF's embed_positions), pre-LN blocks with the exact GELU and no key
bias, learned decoder positions, and proj_out tied to the decoder's token embedding. HF's
input_features are (mels, frames); ours are (frames, mels).

Dropout, as transformers' Whisper applies it in training: dropout of the embeddings (each
stack's, with their positions) and of each sublayer's output before its residual add is
model.dropout_rate, attention_dropout of the self- and cross-attention probabilities
model.attention_dropout, activation_dropout of the MLP's hidden activation model.mlp_dropout;
Whisper drops nothing after a stack's final norm (model.final_dropout 0). encoder_layerdrop and
decoder_layerdrop (skipping whole layers in training) have no setting here and are not read."""
from transformer_jax.convert.architecture import (NO_ABLATIONS, Architecture, CheckpointError,
                                                  HfConfig, hf_activation)
from transformer_jax.convert.tensors import Array, Tensor, linear, norm

__all__ = ['FIXED', 'hf_config', 'model_fields', 'NAME', 'tensors', 'WHISPER']

NAME = 'WhisperForConditionalGeneration'
FIXED = dict(family='whisper', norm='layernorm', norm_eps=1e-5, norm_bias=True,
             norm_position='pre', positions='learned', use_bias=True, key_bias=False,
             num_kv_heads=None, scale_embeddings=False, tie_embeddings=True, final_dropout=0.0,
             **NO_ABLATIONS)
# transformers' WhisperConfig defaults (the multilingual vocabulary's ids), which a config.json
# without these keys takes.
SPECIAL_IDS = dict(pad_token_id=50256, bos_token_id=50256, eos_token_id=50256,
                   decoder_start_token_id=50257)


def _same(c: HfConfig, encoder_key: str, decoder_key: str, default: int) -> int:
  """A size our blocks share between the encoder and the decoder."""
  value = c.get(encoder_key, default)
  return c.check(decoder_key, c.get(decoder_key, default), (value,),
                 f'gives the encoder and the decoder one {encoder_key.split("_", 1)[1]}')


def model_fields(c: HfConfig) -> dict:
  c.require('scale_embedding', False, (False,), 'adds Whisper\'s token rows unscaled')
  c.require('tie_word_embeddings', True, (True,), 'ties proj_out to the token embedding')
  return dict(FIXED, width=c.get('d_model', 384), num_layers=c.get('encoder_layers', 4),
              num_decoder_layers=c.get('decoder_layers', 4),
              num_heads=_same(c, 'encoder_attention_heads', 'decoder_attention_heads', 6),
              d_ff=_same(c, 'encoder_ffn_dim', 'decoder_ffn_dim', 1536),
              vocab_size=c.get('vocab_size', 51865), num_mels=c.get('num_mel_bins', 80),
              num_frames=2 * c.get('max_source_positions', 1500),
              max_len=c.get('max_target_positions', 448),
              mlp=c.activation('activation_function', 'gelu'),
              dropout_rate=c.rate('dropout', 0.0),
              attention_dropout=c.rate('attention_dropout', 0.0),
              mlp_dropout=c.rate('activation_dropout', 0.0))


def hf_config(cfg) -> dict:
  if cfg.num_frames % 2:
    raise CheckpointError(f'{NAME} reads an even number of frames (twice max_source_positions), '
                          f'not model.num_frames={cfg.num_frames}.')
  return dict(d_model=cfg.width, encoder_layers=cfg.num_layers,
              decoder_layers=cfg.decoder_layers, encoder_attention_heads=cfg.num_heads,
              decoder_attention_heads=cfg.num_heads, encoder_ffn_dim=cfg.hidden_dim,
              decoder_ffn_dim=cfg.hidden_dim, vocab_size=cfg.vocab_size,
              num_mel_bins=cfg.num_mels, max_source_positions=cfg.source_positions,
              max_target_positions=cfg.max_len, activation_function=hf_activation(cfg, NAME),
              scale_embedding=False, tie_word_embeddings=True, dropout=cfg.dropout_rate,
              attention_dropout=cfg.attention_dropout_rate, activation_dropout=cfg.mlp_dropout_rate,
              **_special_ids(cfg))


def _special_ids(cfg) -> dict:
  """Whisper's special-token ids where the vocabulary holds them. A smaller vocabulary's pad,
  BOS and EOS are null (none), as transformers would otherwise take the defaults and refuse a
  padding row past the table; its decoder_start_token_id (an int to transformers) keeps the
  default, used only by HF's generate."""
  fits = lambda value: value < cfg.vocab_size
  ids = {key: value if fits(value) else None for key, value in SPECIAL_IDS.items()
         if key != 'decoder_start_token_id' or fits(value)}
  if ids['pad_token_id'] is None:
    ids['begin_suppress_tokens'] = None
  return ids


def _attention(hf: str, ours: str) -> list[Tensor]:
  return [*linear(f'{hf}.q_proj', f'{ours}/query', bias=True),
          *linear(f'{hf}.k_proj', f'{ours}/key', bias=False),
          *linear(f'{hf}.v_proj', f'{ours}/value', bias=True),
          *linear(f'{hf}.out_proj', f'{ours}/out', bias=True, num_in=2)]


def _mlp(hf: str, ours: str) -> list[Tensor]:
  return [*linear(f'{hf}.fc1', f'{ours}/mlp/up', bias=True),
          *linear(f'{hf}.fc2', f'{ours}/mlp/down', bias=True),
          *norm(f'{hf}.final_layer_norm', f'{ours}/mlp_norm')]


def tensors(cfg) -> list[Tensor]:
  conv = Array(perm=(2, 1, 0))  # ours (3, in, out); torch's Conv1d (out, in, 3)
  specs = [Tensor(f'model.encoder.{name}.weight', (f'stem/{name}/kernel',), conv)
           for name in ('conv1', 'conv2')]
  specs += [Tensor(f'model.encoder.{name}.bias', (f'stem/{name}/bias',))
            for name in ('conv1', 'conv2')]
  specs += [Tensor('model.encoder.embed_positions.weight', ('pos_embed',)),
            Tensor('model.decoder.embed_tokens.weight', ('embed/tokens',)),
            Tensor('model.decoder.embed_positions.weight', ('embed/positions',)),
            *norm('model.encoder.layer_norm', 'encoder_norm'),
            *norm('model.decoder.layer_norm', 'decoder_norm')]
  for i in range(cfg.num_layers):
    hf, ours = f'model.encoder.layers.{i}', f'encoder/block_{i}'
    specs += [*_attention(f'{hf}.self_attn', f'{ours}/attn'),
              *norm(f'{hf}.self_attn_layer_norm', f'{ours}/attn_norm'), *_mlp(hf, ours)]
  for i in range(cfg.decoder_layers):
    hf, ours = f'model.decoder.layers.{i}', f'decoder/block_{i}'
    specs += [*_attention(f'{hf}.self_attn', f'{ours}/attn'),
              *norm(f'{hf}.self_attn_layer_norm', f'{ours}/attn_norm'),
              *_attention(f'{hf}.encoder_attn', f'{ours}/cross_attn'),
              *norm(f'{hf}.encoder_attn_layer_norm', f'{ours}/cross_attn_norm'), *_mlp(hf, ours)]
  return specs


WHISPER = Architecture(
    NAME, 'whisper', 'whisper', 'model', model_fields, hf_config, tensors,
    lambda cfg: {'proj_out.weight': 'model.decoder.embed_tokens.weight'})
