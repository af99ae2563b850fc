"""T5ForConditionalGeneration (Raffel et al. 2020), T5 1.0 and T5 1.1: the encoder-decoder in
its T5 style (models/styles.py): pre-norm RMS norms without bias, no dense biases, unscaled
attention logits, one relative position bias table per stack (held by the first block's
self-attention in HF), a ReLU (1.0) or gated-GELU (1.1) MLP, and one embedding shared by the
encoder and the decoder.

The head takes two settings from HF, which transformers merges into one flag:
- whether lm_head has weights of its own: transformers ties it to the embedding unless the
  checkpoint holds an lm_head.weight that differs, so it is untied here where the checkpoint
  holds one and config.json does not scale the output (T5 1.1); a T5 1.0 checkpoint that saved
  the tied head twice is tied, its copy checked equal to the embedding;
- whether the decoder's output is scaled by d_model^-0.5 before it (T5 1.0): config.json's
  tie_word_embeddings (absent: true), or scale_decoder_outputs where transformers 5 wrote it
  (it also writes tie_word_embeddings: true for every T5). Ours: model.scale_tied_head.

config.json's dropout_rate is model.dropout_rate, which the T5 style applies everywhere T5
drops (attention_dropout, mlp_dropout and final_dropout None follow it).
"""
from transformer_jax.convert.architecture import (NO_ABLATIONS, Architecture, CheckpointError,
                                                  HfConfig)
from transformer_jax.convert.tensors import Tensor, linear, norm
from transformer_jax.models import styles

__all__ = ['FIXED', 'hf_config', 'model_fields', 'NAME', 'T5', 'tensors', 'tied']

NAME = 'T5ForConditionalGeneration'
# HF's feed_forward_proj, which is our model.mlp, and the names of HF's MLP kernels for our
# gate, up and down projections (wi_0 goes through the activation, wi_1 does not).
MLP_KERNELS = {'relu': (('wi', 'up'), ('wo', 'down')),
               'gated-gelu': (('wi_0', 'gate'), ('wi_1', 'up'), ('wo', 'down'))}
_HEAD_SETTINGS = ('mlp', 'tie_embeddings', 'scale_tied_head')
FIXED = dict({k: v for k, v in styles.STYLES['t5'].items() if k not in _HEAD_SETTINGS},
             family='encoder_decoder', num_kv_heads=None, **NO_ABLATIONS)
EMBEDDING, HEAD = 'shared.weight', 'lm_head.weight'


def _scales_output(c: HfConfig) -> bool:
  return bool(c.get('scale_decoder_outputs', c.get('tie_word_embeddings', True)))


def _tied(c: HfConfig) -> bool:
  """Whether the head is the embedding (see the module's docstring). Without the checkpoint's
  tensor names (config.json alone), as transformers 4 read config.json: tied where scaled."""
  scaled = _scales_output(c)
  if c.tensor_names is None:
    return scaled
  return scaled or HEAD not in c.tensor_names


def model_fields(c: HfConfig) -> dict:
  c.require('is_decoder', False, (False,), 'builds the encoder and the decoder of T5')
  mlp = c.require('feed_forward_proj', 'relu', tuple(MLP_KERNELS),
                  'builds the MLPs of T5 1.0 and T5 1.1 only')
  return dict(FIXED, width=c.get('d_model', 512), head_width=c.get('d_kv', 64),
              d_ff=c.get('d_ff', 2048), num_layers=c.get('num_layers', 6),
              num_decoder_layers=c.get('num_decoder_layers', c.get('num_layers', 6)),
              num_heads=c.get('num_heads', 8), vocab_size=c.get('vocab_size', 32128),
              max_len=c.get('n_positions', 512),
              relative_buckets=c.get('relative_attention_num_buckets', 32),
              relative_max_distance=c.get('relative_attention_max_distance', 128),
              norm_eps=float(c.get('layer_norm_epsilon', 1e-6)), mlp=mlp,
              tie_embeddings=_tied(c), scale_tied_head=_scales_output(c),
              dropout_rate=float(c.get('dropout_rate', 0.1)))


def hf_config(cfg) -> dict:
  if cfg.mlp not in MLP_KERNELS:
    raise CheckpointError(f'{NAME} has no {cfg.mlp!r} MLP: model.mlp must be one of '
                          f'{list(MLP_KERNELS)}.')
  return dict(d_model=cfg.width, d_kv=cfg.head_dim, d_ff=cfg.hidden_dim,
              num_layers=cfg.num_layers, num_decoder_layers=cfg.decoder_layers,
              num_heads=cfg.num_heads, vocab_size=cfg.vocab_size, n_positions=cfg.max_len,
              relative_attention_num_buckets=cfg.relative_buckets,
              relative_attention_max_distance=cfg.relative_max_distance,
              layer_norm_epsilon=cfg.norm_eps, feed_forward_proj=cfg.mlp,
              dropout_rate=cfg.dropout_rate,
              # Read as the output scaling by transformers 4 and 5 alike (see the docstring).
              tie_word_embeddings=cfg.scale_tied_head, scale_decoder_outputs=cfg.scale_tied_head,
              is_encoder_decoder=True, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)


def _attention(hf: str, ours: str) -> list[Tensor]:
  specs = []
  for name, path in (('q', 'query'), ('k', 'key'), ('v', 'value')):
    specs += linear(f'{hf}.{name}', f'{ours}/{path}', bias=False)
  return specs + linear(f'{hf}.o', f'{ours}/out', bias=False, num_in=2)


def _block(cfg, stack: str, i: int) -> list[Tensor]:
  """Block i of `stack` ('encoder' or 'decoder'): HF's layers are self-attention, then in the
  decoder cross-attention, then the MLP, each with its norm."""
  hf, ours = f'{stack}.block.{i}.layer', f'{stack}/block_{i}'
  sublayers = [('SelfAttention', 'attn')] + ([('EncDecAttention', 'cross_attn')]
                                             if stack == 'decoder' else [])
  specs = []
  for j, (name, path) in enumerate(sublayers):
    specs += [*norm(f'{hf}.{j}.layer_norm', f'{ours}/{path}_norm', bias=False),
              *_attention(f'{hf}.{j}.{name}', f'{ours}/{path}')]
  mlp = len(sublayers)
  specs += norm(f'{hf}.{mlp}.layer_norm', f'{ours}/mlp_norm', bias=False)
  for name, path in MLP_KERNELS[cfg.mlp]:
    specs += linear(f'{hf}.{mlp}.DenseReluDense.{name}', f'{ours}/mlp/{path}', bias=False)
  return specs


def tensors(cfg) -> list[Tensor]:
  specs = [Tensor(EMBEDDING, ('embed/tokens',))]
  for stack, layers in (('encoder', cfg.num_layers), ('decoder', cfg.decoder_layers)):
    specs.append(Tensor(f'{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight',
                        (f'{stack}_position_bias/relative_attention_bias',)))
    for i in range(layers):
      specs += _block(cfg, stack, i)
    specs += norm(f'{stack}.final_layer_norm', f'{stack}_norm', bias=False)
  return specs + ([] if cfg.tie_embeddings else linear('lm_head', 'head/unembed', bias=False))


def tied(cfg) -> dict[str, str]:
  """The copies of the shared embedding that older checkpoints hold (and the tied head)."""
  copies = {f'{stack}.embed_tokens.weight': EMBEDDING for stack in ('encoder', 'decoder')}
  return copies | ({HEAD: EMBEDDING} if cfg.tie_embeddings else {})


T5 = Architecture(
    NAME, 't5', 'encoder_decoder', 'transformer', model_fields, hf_config, tensors, tied,
    # A cross-attention table that checkpoints of transformers 3 hold and no attention uses.
    ignored=(r'decoder\.block\.0\.layer\.1\.EncDecAttention\.relative_attention_bias\.weight',))
