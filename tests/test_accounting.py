"""Parameter, FLOP and KV-cache counts against independent ones: the initialized trees, the
matrix products of the traced forward and backward passes, XLA's cost analysis and published
sizes (GPT-2 small, ViT-B/16, LLaMA-2 70B's cache), and the reference models."""
import dataclasses
import importlib
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest
from jax.extend import core as jax_core

from helpers import CONFIG_FILES, ROOT, load_config, model_of
from transformer_jax import accounting, layers, models
from transformer_jax.models import common, styles

GPT2_SMALL = dict(family='decoder', vocab_size=50257, max_len=1024, width=768, num_layers=12,
                  num_heads=12, **styles.STYLES['gpt2'])
# Embedding 16,384,000, positions 524,288, 8 blocks of 12D^2 + 13D = 25,219,072, final
# LayerNorm 1,024; an untied head adds 16,384,000.
DECODER_8X512 = dict(family='decoder', vocab_size=32000, max_len=1024, width=512, num_layers=8,
                     num_heads=8, **styles.STYLES['gpt2'])
LLAMA2_70B = dict(family='decoder', vocab_size=32000, width=8192, num_layers=80, num_heads=64,
                  num_kv_heads=8, max_len=4096, **styles.STYLES['llama'])


def both_counts(model):
  analytic, counted = accounting.param_counts(model), accounting.counted_params(model)
  assert analytic == counted
  return analytic


def tree_size(tree) -> int:
  return sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(tree))


def _jaxprs_in(params):
  for value in params.values():
    for item in value if isinstance(value, (tuple, list)) else (value,):
      if isinstance(item, (jax_core.ClosedJaxpr, jax_core.Jaxpr)):
        yield getattr(item, 'jaxpr', item)


def matmul_flops(jaxpr) -> int:
  """2 FLOPs per multiply-add of every dot_general that `jaxpr` runs, in nested jaxprs too (a
  scan's body `length` times; of a cond's branches, such as lax.platform_dependent's forms of one
  product, the one that does the most)."""
  total = 0
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == 'cond':
      total += max(matmul_flops(branch.jaxpr) for branch in eqn.params['branches'])
      continue
    if eqn.primitive.name == 'dot_general':
      (_, rhs_contracted), (_, rhs_batch) = eqn.params['dimension_numbers']
      lhs, rhs = (var.aval.shape for var in eqn.invars)
      total += 2 * math.prod(lhs) * math.prod(
          size for i, size in enumerate(rhs) if i not in (*rhs_contracted, *rhs_batch))
    total += eqn.params.get('length', 1) * sum(map(matmul_flops, _jaxprs_in(eqn.params)))
  return total


def test_one_block_at_768_has_12d2_plus_13d(rng):
  # A decoder with no embedding, positions or head to speak of: count one block's parts.
  block = dict(family='decoder', vocab_size=1, max_len=1, width=768, num_layers=1, num_heads=12)
  counts = both_counts(block)
  blocks = counts['attention'] + counts['mlp'] + counts['norms'] - 2 * 768  # less the final norm
  assert blocks == 7_087_872
  # A Block initialized alone, and GPT-2's checkpoint, whose block holds ln_1, attn.c_attn
  # (768, 2304), attn.c_proj (768, 768), ln_2, mlp.c_fc (768, 3072) and mlp.c_proj (3072, 768).
  alone = jax.eval_shape(common.block(models.model_config(block).on('cpu'))().init, rng,
                         jnp.zeros((1, 1, 768)))
  assert tree_size(alone) == blocks
  gpt2_block = [(2, 768), (768, 2304), (2304,), (768, 768), (768,), (2, 768), (768, 3072),
                (3072,), (3072, 768), (768,)]
  assert sum(math.prod(shape) for shape in gpt2_block) == blocks


def test_gpt2_small():
  counts = both_counts(GPT2_SMALL)
  assert counts['total'] == 124_439_808
  assert counts['embedding'] == 38_597_376 + 786_432
  assert counts['attention'] + counts['mlp'] + counts['norms'] == 12 * 7_087_872 + 1_536


def test_vit_b16():
  counts = both_counts(load_config(CONFIG_FILES[0].parent / 'vit_b16.py').model)
  assert counts['total'] == 86_567_656
  assert counts['embedding'] == 590_592 + 768 + 151_296
  assert counts['head'] == 769_000


@pytest.mark.parametrize('tied,total', [(True, 42_128_384), (False, 58_512_384)])
def test_gpt_style_decoder_tied_and_untied(tied, total):
  assert both_counts(dict(DECODER_8X512, tie_embeddings=tied))['total'] == total


def test_reference_lm_and_vit():
  configs = CONFIG_FILES[0].parent
  assert both_counts(model_of(load_config(configs / 'llama_shakespeare.py')))['total'] == 803_712
  vit = both_counts(load_config(configs / 'vit_reference.py').model)
  assert vit['total'] == 802_826
  assert vit['mlp'] == 4 * 3 * 128 * 341


def test_cifar_vit_ti4_patch_and_position_embeddings():
  model = load_config(CONFIG_FILES[0].parent / 'vit_cifar.py', 'variant=Ti/4').model
  counts = both_counts(model)
  tree = models.abstract_variables(model)['params']
  # A (4, 4, 3, 192) patch kernel and its bias, 64 patches + [CLS] positions, the [CLS] token.
  sizes = {name: tree_size(tree[name]) for name in ('patch_embed', 'pos_embed', 'cls_token')}
  assert sizes == {'patch_embed': 9_408, 'pos_embed': 12_480, 'cls_token': 192}
  assert counts['embedding'] == sum(sizes.values())


@pytest.mark.parametrize('path', CONFIG_FILES, ids=lambda p: p.stem)
def test_every_config_counts_agree(path):
  both_counts(model_of(load_config(path)))


def test_kv_cache_bytes():
  assert accounting.kv_cache_bytes(GPT2_SMALL, 1024, dtype='float16') == 37_748_736
  assert accounting.kv_cache_bytes(LLAMA2_70B, 4096, dtype='float16') == 1_342_177_280
  mha = dict(LLAMA2_70B, num_kv_heads=64)
  assert accounting.kv_cache_bytes(mha, 4096, dtype='float16') == 8 * 1_342_177_280
  mqa = dict(LLAMA2_70B, num_kv_heads=1)
  assert accounting.kv_cache_bytes(mqa, 4096, batch=3, dtype='bfloat16') == 3 * 1_342_177_280 // 8


def test_a_sliding_window_caches_window_tokens_however_long_the_sequence():
  # A ring of 1,024 slots: a 4,096-token sequence caches what a 1,024-token one does.
  for seq_len in (1024, 4096, 100_000):
    assert accounting.kv_cache_bytes(GPT2_SMALL, seq_len, window=1024,
                                     dtype='float16') == 37_748_736
  assert accounting.kv_cache_bytes(GPT2_SMALL, 512, window=1024, dtype='float16') == 37_748_736 // 2


def test_no_kv_cache_without_causal_mask():
  with pytest.raises(ValueError, match='no causal mask'):
    accounting.kv_cache_bytes(dict(GPT2_SMALL, family='encoder'), 16)


def test_gpt2_small_flops_per_token():
  # GPT-2 small (Radford et al. 2019): N = 84,934,656 block weights + 38,597,376 unembedding
  # weights multiplied per token; forward 2N + 4LTD at T = 1024 (QK^T and AV over all T keys:
  # 37,748,736), training 3 times the forward (6N, Kaplan et al. 2020). Independently: the
  # matrix products the traced forward pass and its gradient run, per token of a 1024-token row,
  # with attention as written ('xla'): the CPU kernel's loop over long heads recomputes QK^T in
  # the backward pass, as flash attention does, which the 6N convention leaves out.
  flops = accounting.flops_per_token(GPT2_SMALL, 1024)
  model = models.build(dict(GPT2_SMALL, attention_kernel='xla'))
  params = nn.meta.unbox(models.abstract_variables(GPT2_SMALL)['params'])
  tokens = jax.ShapeDtypeStruct((1, 1024), jnp.int32)
  forward = lambda p, t: model.apply({'params': p}, t).sum()
  assert flops['forward'] == matmul_flops(jax.make_jaxpr(forward)(params, tokens).jaxpr) / 1024
  assert flops['forward'] == 2 * (84_934_656 + 38_597_376) + 37_748_736
  assert flops['train'] == matmul_flops(
      jax.make_jaxpr(jax.value_and_grad(forward))(params, tokens).jaxpr) / 1024
  assert flops['train'] == 3 * flops['forward']
  assert round(flops['forward'] / 1e6) == 285 and round(flops['train'] / 1e6) == 854
  assert f'{flops["train"] * 10e9:.1e}' == '8.5e+18'


def test_attention_equals_weights_at_t_equal_6d():
  model = dict(GPT2_SMALL, vocab_size=1)
  dense_vs_attention = accounting.forward_flops(model, 6 * 768)
  blocks = 2 * 6 * 768 * 12 * 12 * 768 ** 2
  assert (dense_vs_attention['attention'] == dense_vs_attention['dense'] - 2 * 6 * 768 * 768
          == blocks)


def test_vit_flops_grow_16x_in_attention_when_patch_halves():
  vit = load_config(CONFIG_FILES[0].parent / 'vit_b16.py').model
  p16 = accounting.forward_flops(vit)
  p8 = accounting.forward_flops(dict(vit.to_dict(), patch_size=8))
  assert p8['attention'] / p16['attention'] == pytest.approx(785 ** 2 / 197 ** 2)


@pytest.mark.parametrize('name', ['llama_shakespeare', 'gpt2_small', 'vit_cifar',
                                  'bert_shakespeare', 'seq2seq_transformer'])
def test_xla_counts_the_formulas_flops_plus_the_element_wise_work(name):
  """XLA's cost analysis of the jitted forward pass counts every matrix product the formulas
  count, and the softmax, norm and activation work they leave out: 0.6% to 9% more here. With
  attention as written ('xla'): XLA counts a loop's body once, and the CPU kernel loops over
  long heads (GPT-2's 1,024 tokens)."""
  config = load_config(ROOT / 'configs' / f'{name}.py')
  cfg = dataclasses.replace(model_of(config), attention_kernel='xla')
  family = models.registry.get(cfg.family)
  seq_len = config.data.seq_len if family.unit == 'token' else None
  inputs = models.example_inputs(cfg, 1, seq_len)
  counted = accounting.xla_flops(models.build(cfg), *inputs)
  analytic = accounting.forward_flops(cfg, seq_len)['total']
  assert 1.0 <= counted / analytic <= 1.1, counted / analytic


class Projection(nn.Module):
  """A module of one's own: x (B, 4) -> (B, 3), one weight matrix."""

  @nn.compact
  def __call__(self, x):
    return layers.Linear((3,), ('embed',), ('mlp',), use_bias=False, name='proj')(x)


def test_a_module_of_ones_own_is_sent_to_the_counts_that_take_any_model(rng):
  module, x = Projection(), jnp.ones((2, 4))
  for count in (accounting.param_counts, accounting.counted_params, accounting.forward_flops,
                accounting.flops_per_token, lambda model: accounting.kv_cache_bytes(model, 16)):
    with pytest.raises(TypeError, match=r'not Projection: .* accounting\.count_params\(params\) '
                                        r'.* accounting\.xla_flops\(module, \*inputs\)'):
      count(module)
  # What the message names counts it: 12 weights, 2 * 2 * 4 * 3 FLOPs.
  assert accounting.count_params(module.init(rng, x)['params'])['total'] == 12
  assert accounting.xla_flops(module, x) == 48


def test_no_kv_cache_formula_for_a_family_registered_without_formulas():
  importlib.import_module('conv_family')  # registers 'conv_lm', without formulas
  with pytest.raises(ValueError, match="family 'conv_lm' registers none: measure its cache"):
    accounting.kv_cache_bytes(dict(family='conv_lm', vocab_size=10, width=32, num_heads=4), 16)
