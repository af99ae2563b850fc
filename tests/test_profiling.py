"""transformer_jax.train.profiling: a trace's op times matched to the optimized HLO, summed by
kind of work and model part."""
import time

import jax
import jax.numpy as jnp
import pytest

from transformer_jax.train import profiling


@pytest.mark.parametrize('op_name, part', [
    ('jit(step)/jvp(Whisper)/Whisper.encode/encoder/block_1/block_1._sublayer/attn/'
     'dot_general', 'forward encoder/block/attn'),
    ('jit(step)/transpose(jvp(Clip))/Clip.encode_text/text/encoder/block_11/'
     'block_11._sublayer/mlp/up/dot_general', 'backward text/encoder/block/mlp'),
    ('jit(step)/transpose(jvp(T5))/decoder/block_0/attn/bkqd,bksd->bkqs/dot_general',
     'backward decoder/block/attn'),
    ('jit(step)/jvp(Whisper)/Whisper.decode/head/cond/branch_0_fun/dot_general',
     'forward head'),
    ('jit(step)/jvp(DiT)/mul', 'forward (model)'),
    ('jit(step)/mul', 'update'),
    ('', 'unattributed'),
])
def test_model_part_names_the_pass_and_the_module_path_without_layer_numbers(op_name, part):
  assert profiling.model_part(op_name) == part


def _matmul_then_tanh(a, b):
  return jnp.tanh(a @ b).sum(axis=0)


def test_the_optimized_hlos_ops_are_classed_by_the_work_their_fusions_do():
  a = jnp.ones((256, 256))
  text = jax.jit(_matmul_then_tanh).lower(a, a).compile().as_text()
  ops = profiling.hlo_ops(text)
  kinds = {op.kind for op in ops.values()}
  assert profiling.MATMUL in kinds
  assert not kinds & {'control'}
  # The ops a fusion holds are not ops of their own: every op is in the entry computation.
  entry = text[text.index('ENTRY'):]
  assert all(f'%{name} = ' in entry or f' {name} = ' in entry for name in ops)


def test_a_traced_step_is_mostly_its_matmul_and_takes_no_more_than_its_wall_time(tmp_path):
  a = jnp.asarray(jax.random.normal(jax.random.key(0), (768, 768)))
  compiled = jax.jit(_matmul_then_tanh).lower(a, a).compile()
  compiled(a, a).block_until_ready()
  with jax.profiler.trace(str(tmp_path)):
    start = time.perf_counter()
    for _ in range(3):
      compiled(a, a).block_until_ready()
    wall = (time.perf_counter() - start) / 3
  summary = profiling.summarize(str(tmp_path), compiled.as_text(), steps=3)
  # 2 x 768^3 FLOPs against a tanh and a sum of 768^2 elements.
  assert summary.by_kind[profiling.MATMUL] > 0.5 * summary.total
  # The shares add up to the time some op ran; their own durations to no less.
  assert 0 < summary.total <= wall
  assert summary.total <= summary.summed + 1e-9
  assert sum(summary.by_part.values()) == pytest.approx(summary.total)
  assert summary.lines()[0].startswith('ops ran')


def test_ops_running_side_by_side_share_the_wall_time_they_overlap():
  a, b, c = (profiling.Op(name, profiling.MATMUL, 'update') for name in 'abc')
  shares = profiling.wall_shares([(0.0, 10.0, a), (5.0, 15.0, b), (20.0, 20.0, c),
                                  (30.0, 31.0, a)])
  assert shares[a] == pytest.approx(1e-6 * (5 + 2.5 + 1))
  assert shares[b] == pytest.approx(1e-6 * (2.5 + 5))
  assert c not in shares  # an op of no duration takes no time


def test_a_folder_without_a_trace_says_how_to_make_one(tmp_path):
  with pytest.raises(FileNotFoundError, match=r'jax\.profiler\.trace'):
    profiling.summarize(str(tmp_path), '', steps=1)
