"""T5 as a style of the encoder-decoder (Raffel et al. 2020): its gated-GELU MLP, its relative
position bias computed once per stack, its parameter counts against transformers', and the
settings it refuses."""
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import ROOT, load_config, tiny
from transformer_jax import accounting, layers, models
from transformer_jax.errors import ConfigError
from transformer_jax.models import encoder_decoder, styles

T5_SMALL = dict(width=512, num_heads=8, d_ff=2048, num_layers=6, vocab_size=32128)
T5_V1_1_SMALL = dict(width=512, num_heads=6, head_width=64, d_ff=1024, num_layers=8,
                     vocab_size=32128)


def test_gated_gelu_is_tanh_gelu_of_the_gate_times_the_up_projection(rng):
  mlp = layers.MLP(hidden=6, activation='gated-gelu', use_bias=False)
  x = jax.random.normal(rng, (2, 3, 4))
  params = nn.meta.unbox(mlp.init(rng, x)['params'])
  gate, up = (np.asarray(x) @ np.asarray(params[name]['kernel']) for name in ('gate', 'up'))
  gelu = 0.5 * gate * (1 + np.tanh(math.sqrt(2 / math.pi) * (gate + 0.044715 * gate ** 3)))
  np.testing.assert_allclose(mlp.apply({'params': params}, x),
                             (gelu * up) @ np.asarray(params['down']['kernel']), atol=1e-5)


def test_each_stack_has_one_relative_bias_shared_by_its_layers_and_cross_attention_none():
  cfg = tiny('encoder_decoder', **styles.STYLES['t5'], num_decoder_layers=3, relative_buckets=6,
             relative_max_distance=9)
  params = nn.meta.unbox(models.abstract_variables(cfg)['params'])
  tables = {path for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]
            if 'relative_attention_bias' in jax.tree_util.keystr(path)}
  assert {jax.tree_util.keystr(path) for path in tables} == {
      "['encoder_position_bias']['relative_attention_bias']",
      "['decoder_position_bias']['relative_attention_bias']"}
  assert params['encoder_position_bias']['relative_attention_bias'].shape == (6, 4)
  assert accounting.param_counts(cfg) == accounting.counted_params(cfg)


def test_a_relative_bias_changes_the_logits_of_every_stack(rng):
  """Zeroing either stack's table changes the logits: both biases reach the attention."""
  cfg = tiny('encoder_decoder', **styles.STYLES['t5'], relative_buckets=8,
             relative_max_distance=12, dtype='float32')
  model = models.build(cfg)
  inputs = jax.random.randint(rng, (2, 7), 0, 40)
  params = nn.meta.unbox(model.init(rng, inputs, inputs)['params'])
  logits = model.apply({'params': params}, inputs, inputs)
  for stack in ('encoder_position_bias', 'decoder_position_bias'):
    table = params[stack]['relative_attention_bias']
    zeroed = {**params, stack: {'relative_attention_bias': jnp.zeros_like(table)}}
    assert not np.allclose(model.apply({'params': zeroed}, inputs, inputs), logits, atol=1e-4)


@pytest.mark.parametrize('style,sizes,expected', [('t5', T5_SMALL, 60_506_624),
                                                   ('t5_v1_1', T5_V1_1_SMALL, 76_961_152)])
def test_t5_small_counts_are_those_of_the_published_models(style, sizes, expected):
  """T5-small (tied) and T5 1.1 small (untied): the formulas, and the configs' describe."""
  cfg = models.model_config(dict(family='encoder_decoder', **styles.STYLES[style], **sizes))
  assert accounting.param_counts(cfg)['total'] == expected
  config = load_config(ROOT / 'configs' / 't5_small.py', None if style == 't5' else 'v1_1')
  assert accounting.param_counts(config.model)['total'] == expected


@pytest.mark.parametrize('style,sizes', [('t5', T5_SMALL), ('t5_v1_1', T5_V1_1_SMALL)])
def test_t5_small_counts_equal_transformers_t5(style, sizes):
  """transformers' T5ForConditionalGeneration of the same sizes (on the meta device: nothing
  allocated). transformers 5 ties T5's head to the embedding always (its T5Config forces
  tie_word_embeddings, keeping the flag only for the output scaling), so that an untied head,
  as T5 1.1's checkpoints hold it, adds vocab_size x width there."""
  torch = pytest.importorskip('torch')
  transformers = pytest.importorskip('transformers')
  hf = dict(d_model=sizes['width'], d_kv=64, d_ff=sizes['d_ff'], num_layers=sizes['num_layers'],
            num_heads=sizes['num_heads'], vocab_size=sizes['vocab_size'],
            feed_forward_proj='relu' if style == 't5' else 'gated-gelu',
            tie_word_embeddings=style == 't5')
  with torch.device('meta'):
    model = transformers.T5ForConditionalGeneration(transformers.T5Config(**hf))
  counted = sum(p.numel() for p in model.parameters())
  tied_there = model.lm_head.weight is model.shared.weight
  untied_head = sizes['vocab_size'] * sizes['width'] if style != 't5' and tied_there else 0
  cfg = models.model_config(dict(family='encoder_decoder', **styles.STYLES[style], **sizes))
  assert accounting.param_counts(cfg)['total'] == counted + untied_head


def test_flops_count_the_relative_bias_additions():
  cfg = models.model_config(dict(family='encoder_decoder', **styles.STYLES['t5'], **T5_SMALL))
  without = dict(cfg.__dict__, positions='none')
  del without['family']
  plain = encoder_decoder.EncoderDecoderConfig(**without)
  got = encoder_decoder.forward_flops(cfg, 512, 114)['attention']
  expected = encoder_decoder.forward_flops(plain, 512, 114)['attention']
  assert got - expected == 8 * (6 * 512 ** 2 + 6 * 114 ** 2)


@pytest.mark.parametrize('overrides,message', [
    (dict(family='decoder', positions='relative'),
     "model.positions='relative' .* encoder_decoder family only, not 'decoder'"),
    (dict(family='encoder', positions='relative'), 'encoder_decoder family only'),
    (dict(family='decoder', relative_buckets=8),
     "model.relative_buckets sets T5's relative position bias, which family 'decoder' does not"),
    (dict(positions='relative', relative_buckets=1),
     'model.relative_buckets=1 and model.relative_max_distance=128 leave no room'),
    (dict(positions='relative', relative_buckets=8, relative_max_distance=2), 'leave no room'),
    (dict(positions='learned', relative_buckets=16),
     "model.relative_buckets sets the relative position bias, which model.positions='learned'"),
    (dict(tie_embeddings=False, scale_tied_head=True), 'set model.tie_embeddings=True'),
])
def test_bad_t5_settings_fail_in_one_line_naming_the_fix(overrides, message):
  settings = dict(dict(family='encoder_decoder', width=32, num_heads=4, vocab_size=10),
                  **overrides)
  with pytest.raises(ConfigError, match=message) as error:
    models.model_config(settings)
  assert '\n' not in str(error.value)


def test_dropout_changes_training_logits_only(rng):
  """model.dropout_rate in the T5 style drops wherever T5's dropout_rate does in training (the
  embeddings, attention probabilities, feed-forward activations, sublayer outputs and final-norm
  outputs: each is tested in test_layers); evaluation computes the model without it."""
  t5 = dict(styles.STYLES['t5'], dtype='float32', attention_kernel='reference')
  cfg = tiny('encoder_decoder', **t5, dropout_rate=0.1)
  assert set(cfg.dropout_rates.values()) == {0.1}
  plain = models.build(tiny('encoder_decoder', **t5))
  model = models.build(cfg)
  inputs = jax.random.randint(rng, (2, 7), 0, 40)
  params = nn.meta.unbox(model.init(rng, inputs, inputs)['params'])
  apply = lambda key, **kw: model.apply({'params': params}, inputs, inputs,
                                        rngs={'dropout': jax.random.key(key)}, **kw)
  np.testing.assert_array_equal(apply(0), plain.apply({'params': params}, inputs, inputs))
  first, second = apply(0, deterministic=False), apply(1, deterministic=False)
  assert not np.allclose(first, apply(0)) and not np.allclose(first, second)
  np.testing.assert_array_equal(first, apply(0, deterministic=False))
