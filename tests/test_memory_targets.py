"""The memory plan of a TPU or GPU target against XLA:TPU's and XLA:GPU's memory analysis of the
real train step compiled for compile-only devices, for the decoder, the ViT and the
encoder-decoder under data, fully-sharded and tensor parallelism, on two TPU topologies (v5e
chips, and v4's megacore) and four H100s, for models memory.ACTIVATION_COPIES was not fitted to
(experiments/fit_memory.py's GRID): within 15%, or a strict xfail at its measured ratio."""
import dataclasses

import pytest

from helpers import load_experiment
from transformer_jax import memory

pytest.importorskip('libtpu', reason="compile-only TPU devices need pip install -e '.[compile]'")
pytest.importorskip('jax_plugins.xla_cuda12',
                    reason="compile-only GPU devices need pip install -e '.[compile]'")

from transformer_jax import targets  # noqa: E402

fit_memory = load_experiment('fit_memory')

# Sizes, vocabularies, head counts and sequences none of the grid's models has, of 1 to 5 GiB per
# device: a GQA decoder of LLaMA's blocks, a ViT of 257 tokens, an encoder-decoder of Vaswani
# et al.'s blocks.
HELD_OUT = {
    'decoder': fit_memory.Model('decoder', 1152, 3, 12, 1536, vocab=20000, dtype='bfloat16',
                                kv_heads=4),
    'vit': fit_memory.Model('vit', 896, 3, 14, 256, patch=16, dtype='bfloat16', batch=128),
    'encoder_decoder': fit_memory.Model('encoder_decoder', 768, 3, 12, 768, vocab=12000,
                                        dtype='bfloat16'),
}


CASES = [(target, family) for target in ('v5e:2x2', 'v4-8', 'h100x4') for family in HELD_OUT]
# Measured misses (plan / XLA), each a strict xfail, so that a plan that comes within 15% of one
# fails here until it is struck off. Under FSDP XLA:TPU's v5e schedule keeps 0.7 GiB more of
# this encoder-decoder's temporaries than under DP (live buffers at its peak: 1.4 GiB either
# way), which no term of the plan follows; on XLA:GPU the plan's counts, fitted to blocks whose
# width, heads and MLP all scale together, overstate what this post-LN ReLU encoder-decoder's
# blocks keep under FSDP.
_MISSES = {('v5e:2x2', 'encoder_decoder', 'fsdp'): 0.79,
           ('h100x4', 'encoder_decoder', 'fsdp'): 1.18}


@pytest.mark.slow
@pytest.mark.parametrize('rule_set', ['dp', 'fsdp', 'tp'])
@pytest.mark.parametrize('target_name,family', CASES)
def test_the_plan_is_within_15_percent_of_the_targets_compiler(request, target_name, family,
                                                               rule_set):
  if (target_name, family, rule_set) in _MISSES:
    request.applymarker(pytest.mark.xfail(
        strict=True, reason=f'measured {_MISSES[target_name, family, rule_set]}x XLA'))
  target = targets.target(target_name)
  config = dataclasses.replace(HELD_OUT[family], rule_set=rule_set).config()
  measured, _ = fit_memory.compile_train_step(config, target.devices)
  planned = memory.plan(config, fit_memory.mesh_of(config, target.devices),
                        platform=target.platform).train_total
  assert abs(planned / measured - 1) <= 0.15, (planned, measured)
