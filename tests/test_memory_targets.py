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

# Sizes none of the grid's models has.
HELD_OUT = {
    'decoder': fit_memory.Model('decoder', 192, 3, 6, 256, vocab=300, dtype='bfloat16'),
    'vit': fit_memory.Model('vit', 160, 3, 4, 96, patch=4),
    'encoder_decoder': fit_memory.Model('encoder_decoder', 128, 3, 4, 512, vocab=200,
                                        dtype='bfloat16'),
}


CASES = [(target, family) for target in ('v5e:2x2', 'v4-8', 'h100x4') for family in HELD_OUT]
# Measured misses (plan / XLA), each a strict xfail, so that a plan that comes within 15% of one
# fails here until it is struck off: on XLA:TPU the plan's terms do not capture what the
# compiler keeps (all but the decoder under TP; experiments/results/compile_targets), on XLA:GPU
# one case is just over.
_MISSES = {
    ('v5e:2x2', 'decoder', 'dp'): 0.77, ('v5e:2x2', 'decoder', 'fsdp'): 0.58,
    ('v5e:2x2', 'vit', 'dp'): 0.29, ('v5e:2x2', 'vit', 'fsdp'): 0.22,
    ('v5e:2x2', 'vit', 'tp'): 0.41, ('v5e:2x2', 'encoder_decoder', 'dp'): 0.32,
    ('v5e:2x2', 'encoder_decoder', 'fsdp'): 0.19, ('v5e:2x2', 'encoder_decoder', 'tp'): 0.37,
    ('v4-8', 'decoder', 'dp'): 0.75, ('v4-8', 'decoder', 'fsdp'): 0.67,
    ('v4-8', 'vit', 'dp'): 0.28, ('v4-8', 'vit', 'fsdp'): 0.23, ('v4-8', 'vit', 'tp'): 0.32,
    ('v4-8', 'encoder_decoder', 'dp'): 0.35, ('v4-8', 'encoder_decoder', 'fsdp'): 0.29,
    ('v4-8', 'encoder_decoder', 'tp'): 0.41, ('h100x4', 'encoder_decoder', 'fsdp'): 1.16}


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
