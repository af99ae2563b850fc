"""The sweep machinery, the scaling-law fit, and every experiment script and the notebook end to
end in their quick settings (synthetic data, tiny models)."""
import json
import math

import nbclient
import nbformat
import numpy as np
import pytest
import scipy.optimize

from helpers import load_experiment, ROOT
from train_helpers import small_config
from transformer_jax import sweep, train
from transformer_jax.data import tokenizer as tokenizer_lib

# Each experiment's plots, by file name.
FIGURES = {'ablations': ['ablations'], 'beam_search': [], 'clip_zero_shot': ['clip_zero_shot'],
           'dit_cifar': ['grid_guidance_1', 'grid_guidance_2', 'grid_guidance_4'],
           'long_context': ['loss_vs_position'],
           'lora_finetune': ['lora_finetune'], 'norm_order': ['norm_order'],
           'optimizer_compare': ['optimizer_compare'],
           'patch_sweep': ['accuracy_vs_flops', 'accuracy_vs_patch', 'flops_vs_tokens', 'resize'],
           'scaling': ['isoflop', 'loss_vs_params', 'loss_vs_tokens', 'surface'],
           't5_pretrain': [],
           'vmapped_sweep': ['vmapped_sweep']}


def test_product_crosses_named_runs_values_and_argument_strings():
  runs = sweep.product(sweep.named({'no mlp': {'model.use_mlp': False}, 'full': {}}),
                       sweep.values('seed', (0, 1)), sweep.args(['variant=S/4']))
  assert [r.name for r in runs] == ['no mlp,seed=0,variant=S/4', 'no mlp,seed=1,variant=S/4',
                                    'full,seed=0,variant=S/4', 'full,seed=1,variant=S/4']
  assert runs[1].overrides == (('model.use_mlp', False), ('seed', 1))
  assert runs[1].arg == 'variant=S/4'
  assert runs[1].dirname == 'no_mlp,seed=1,variant=S_4'


def test_product_refuses_runs_that_would_share_a_workdir():
  with pytest.raises(ValueError, match='share the workdirs'):
    sweep.product(sweep.named({'a/b': {}, 'a b': {}}))


def test_config_for_applies_the_argument_base_and_run_in_order():
  run = sweep.product(sweep.args(['variant=S/16']), sweep.values('model.num_layers', (3,)))[0]
  config = sweep.config_for(run, ROOT / 'configs' / 'vit_cifar.py',
                            {'model.num_layers': 1, 'model.width': 96})
  assert (config.model.patch_size, config.model.width, config.model.num_layers) == (16, 96, 3)
  with pytest.raises(KeyError, match='model.widht'):
    sweep.override(config, {'model.widht': 8})


def test_finished_runs_are_read_back_not_repeated(tmp_path, monkeypatch):
  runs = sweep.values('seed', (0, 1))
  make_config = lambda r: sweep.override(small_config(steps=2), dict(r.overrides))
  first = sweep.run_all(runs, make_config, str(tmp_path))
  assert [r['status'] for r in first] == ['finished', 'finished']
  assert all(r['steps'] == 2 and math.isfinite(r['eval_loss']) for r in first)

  def fail(*args):
    raise AssertionError('a finished run was trained again')
  monkeypatch.setattr(train, 'train', fail)
  again = sweep.run_all(runs, make_config, str(tmp_path))
  assert [r['eval_loss'] for r in again] == [r['eval_loss'] for r in first]
  with pytest.raises(ValueError, match=r"another config \(differing keys: \['training.steps'\]"):
    sweep.run_all(runs, lambda r: sweep.override(make_config(r), {'training.steps': 3}),
                  str(tmp_path))
  # A key added to the project since the runs were saved is theirs at its default value alone.
  for run in runs:
    path = tmp_path / run.dirname / 'config.json'
    saved = json.loads(path.read_text())
    del saved['optimizer']['muon_momentum']
    path.write_text(json.dumps(saved))
  sweep.run_all(runs, make_config, str(tmp_path))
  with pytest.raises(ValueError, match=r"differing keys: \['optimizer.muon_momentum'\]"):
    sweep.run_all(runs, lambda r: sweep.override(make_config(r), {'optimizer.muon_momentum': 0.9}),
                  str(tmp_path))


def test_a_run_whose_loss_turns_non_finite_is_recorded_as_diverged(tmp_path):
  config = small_config(steps=3, **{'optimizer.learning_rate': 1e30,
                                    'optimizer.grad_clip_norm': 0.0, 'optimizer.warmup_steps': 0})
  (result,) = sweep.run_all([sweep.SweepRun('huge lr')], lambda r: config, str(tmp_path))
  assert result['status'] == 'diverged'
  assert 'Non-finite' in result['error']
  assert result['eval_loss'] is None


def test_a_rerun_rewrites_the_report_and_keeps_the_hand_written_reading(tmp_path):
  sweep.write_results(tmp_path, {}, '# Old\n\n| a | 1 |\n', {})
  assert (tmp_path / 'README.md').read_text() == '# Old\n\n| a | 1 |\n'
  reading = f'\n{sweep.READING}\n\nA is small.\n\n## Samples, by hand\n\nb\n'
  (tmp_path / 'README.md').write_text('# Old\n\n| a | 1 |\n' + reading)
  sweep.write_results(tmp_path, {}, '# New\n\n| a | 2 |\n', {})
  assert (tmp_path / 'README.md').read_text() == '# New\n\n| a | 2 |\n' + reading
  sweep.write_results(tmp_path, {}, '# Smoke\n', {}, smoke=True)
  assert (tmp_path / 'README.md').read_text() == '# Smoke\n'


def test_scaling_fit_recovers_a_known_law_within_its_intervals():
  scaling = load_experiment('scaling')
  truth = {'E': 1.3, 'A': 30.0, 'alpha': 0.35, 'B': 400.0, 'beta': 0.4}
  n = np.repeat(np.geomspace(1.2e4, 1e6, 5), 4)
  d = np.tile(np.geomspace(2e5, 1.6e6, 4), 5)
  noise = np.exp(np.random.default_rng(0).normal(0, 0.003, n.size))
  loss = scaling.predict(truth, n, d) * noise
  fitted = scaling.fit_with_intervals(np.log([n, d]), np.log(loss), bootstrap=50)
  value = scaling.named_parameters(fitted['theta'])
  low, high = (scaling.named_parameters(fitted[k]) for k in ('low', 'high'))
  for key in ('E', 'alpha', 'beta'):
    assert low[key] <= truth[key] <= high[key], key
    assert value[key] == pytest.approx(truth[key], rel=0.15), key


def test_compute_optimal_allocation_minimizes_the_loss_at_fixed_compute():
  scaling = load_experiment('scaling')
  law = {'E': 1.3, 'A': 30.0, 'alpha': 0.35, 'B': 400.0, 'beta': 0.4}
  compute = 1e13
  best = scipy.optimize.minimize_scalar(
      lambda log_n: scaling.predict(law, math.exp(log_n), compute / (6 * math.exp(log_n))),
      bounds=(0, 30), method='bounded', options={'xatol': 1e-9})
  optimal = scaling.compute_optimal(law, compute)
  assert optimal['N'] == pytest.approx(math.exp(best.x), rel=1e-4)
  assert 6 * optimal['N'] * optimal['D'] == pytest.approx(compute)


def test_a_degenerate_refit_gives_unbounded_coefficients_and_no_optimum():
  """A bootstrap refit of a few runs can reach log B = 1e3: B is inf, and its compute-optimal
  allocation is NaN (left out of the percentiles) rather than an OverflowError."""
  scaling = load_experiment('scaling')
  p = scaling.named_parameters([0.2, 3.0, 0.3, 1e3, 0.5])
  assert p['B'] == math.inf and p['A'] == pytest.approx(math.exp(3.0))
  assert all(math.isnan(v) for v in scaling.compute_optimal(p, 1e13).values())


def test_tokenizer_runs_take_the_steps_of_the_character_runs_training_flops():
  """The reference LM (4 blocks, width 128, SwiGLU of 341, batch 32 of 64 tokens) costs
  3 (2 (L (4d^2 + 3dh) + dV) + 4LTd) FLOPs per token in training: 600 character steps (V = 65)
  buy 562.6 steps of BPE 512 and 463.2 of BPE 2048."""
  compare = load_experiment('tokenizer_compare')
  runs = compare.tokenizer_runs(65, [512, 2048])
  configs = [sweep.config_for(r, compare.CONFIG) for r in runs]
  per_token = lambda v: 3 * (2 * (4 * (4 * 128**2 + 3 * 128 * 341) + 128 * v) + 4 * 4 * 64 * 128)
  assert [compare.train_flops_per_step(c) for c in configs] == [
      32 * 64 * per_token(v) for v in (65, 512, 2048)]
  budget = 600 * compare.train_flops_per_step(configs[0])
  assert [compare.matched_steps(c, budget) for c in configs] == [600, 563, 463]

@pytest.mark.slow
@pytest.mark.parametrize('name', sorted(FIGURES))
def test_quick_mode_writes_the_results_folder(tmp_path, name):
  experiment = load_experiment(name)
  experiment.main(['--quick', '--workdir', str(tmp_path)])
  results = tmp_path / 'results'
  payload = json.loads((results / 'results.json').read_text())
  assert payload['command'] == f'python experiments/{name}.py --quick --workdir {tmp_path}'
  assert all(r['status'] == 'finished' for r in payload['runs'])
  assert payload['command'] in (results / 'README.md').read_text()
  assert sorted(p.stem for p in results.glob('*.png')) == FIGURES[name]


@pytest.mark.slow
def test_notebook_runs_end_to_end_in_its_quick_setting(tmp_path, monkeypatch):
  monkeypatch.setenv('TRANSFORMER_JAX_NOTEBOOK_QUICK', '1')
  monkeypatch.setenv('TRANSFORMER_JAX_NOTEBOOK_WORKDIR', str(tmp_path))
  notebook = nbformat.read(ROOT / 'experiments' / 'colab.ipynb', as_version=4)
  nbclient.NotebookClient(notebook, timeout=600, kernel_name='python3', resources={
      'metadata': {'path': str(ROOT / 'experiments')}}).execute()
  images = [output for cell in notebook.cells if cell.cell_type == 'code'
            for output in cell.get('outputs', []) if 'image/png' in output.get('data', {})]
  assert len(images) == 5  # four patch-sweep plots and the ablation chart
  assert (tmp_path / 'ablations' / 'results' / 'README.md').exists()


def test_t5_pretrain_pairs_reverse_the_words_of_each_short_line():
  t5_pretrain = load_experiment('t5_pretrain')
  bpe = tokenizer_lib.train_bpe(['to be or not to be that is the question'] * 5, 300)
  lines = ['to be or not', 'one', 'that is the question to be or not to be', 'be that']
  task = t5_pretrain.ReverseWordsTask(lines, lines, bpe, seq_len=32, seed=0,
                                      exact_match_examples=2)
  pairs = task.eval_examples([0, 1])  # the one-word and the nine-word lines are left out
  assert task.num_eval_examples == 2
  assert [bpe.decode(row) for row in pairs['inputs']] == [
      'reverse words: to be or not', 'reverse words: be that']
  assert [bpe.decode(row) for row in pairs['targets']] == ['not or be to', 'that be']
  np.testing.assert_array_equal(pairs['decoder_inputs'][:, 1:], pairs['targets'][:, :-1])
  assert pairs['weights'].sum(axis=1).tolist() == [len(bpe.encode('not or be to')) + 1,
                                                   len(bpe.encode('that be')) + 1]
