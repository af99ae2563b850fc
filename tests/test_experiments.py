"""The sweep machinery, the scaling-law fit, and every experiment script and the notebook end to
end in their quick settings (synthetic data, tiny models)."""
import json
import math
import os
import subprocess
import sys

from absl import app
import nbclient
import nbformat
import numpy as np
from PIL import Image
import pytest
import scipy.optimize

from helpers import load_experiment, ROOT
from train_helpers import small_config
from transformer_jax import errors, sweep, train
from transformer_jax.data import tokenizer as tokenizer_lib

# Each experiment's plots, by file name.
FIGURES = {'ablations': ['ablations'], 'beam_search': ['beam_search'],
           'clip_zero_shot': ['clip_zero_shot', 'clip_zero_shot_curves'],
           'dit_cifar': ['dit_cifar', 'grid_guidance_1', 'grid_guidance_2', 'grid_guidance_4'],
           'dit_digits': ['dit_digits', 'samples'],
           'long_context': ['loss_vs_position'],
           'lora_finetune': ['lora_finetune'], 'nanogpt_speedrun': ['nanogpt_speedrun'],
           'norm_order': ['norm_order'],
           'optimizer_compare': ['optimizer_compare'],
           'patch_sweep': ['accuracy_vs_flops', 'accuracy_vs_patch', 'flops_vs_tokens', 'resize'],
           'scaling': ['isoflop', 'loss_vs_params', 'loss_vs_tokens', 'surface'],
           't5_pretrain': ['t5_pretrain'],
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
@pytest.mark.parametrize('name', sorted(FIGURES.keys() - {'patch_sweep'}))  # the notebook runs it
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
  # The patch sweep's quick setting, as `patch_sweep.py --quick` runs it.
  results = tmp_path / 'patch_sweep' / 'results'
  payload = json.loads((results / 'results.json').read_text())
  assert len(payload['runs']) > 1 and all(r['status'] == 'finished' for r in payload['runs'])
  assert sorted(p.stem for p in results.glob('*.png')) == FIGURES['patch_sweep']


def test_t5_pretrain_blanks_one_common_word_of_each_line_the_same_for_every_seed():
  t5_pretrain = load_experiment('t5_pretrain')
  blank = tokenizer_lib.sentinel(0)
  lines = ['To be, or not to be: that is the question:', 'one two',
           "'Tis nobler in the mind to suffer", 'Whether tis nobler in the mind']
  common = t5_pretrain.common_words(lines)
  assert {'to', 'the', 'be', 'in', 'mind'} < common and 'one' not in common
  sources, targets = t5_pretrain.cloze_pairs(lines, common)
  assert len(sources) == 3  # the two-word line is left out
  for line, source, target in zip([lines[0], *lines[2:]], sources, targets):
    assert target.strip() in common
    # The blank takes the word's letters and the space before them, the target keeps the space.
    assert source.replace(blank, target, 1) == line
  bpe = tokenizer_lib.train_bpe(lines * 5, 300, sentinels=4)
  make = lambda seed, per_word=None: t5_pretrain.ClozeTask(
      lines, lines, bpe, seq_len=48, seed=seed, exact_match_examples=3, per_word=per_word)
  task, other_seed = make(0), make(1)
  sources, targets = t5_pretrain.balanced(sources, targets)
  pairs = task.eval_examples(list(range(len(sources))))
  assert pairs['targets'].shape == (len(sources), t5_pretrain.TARGET_LEN)
  for row, (source, target) in enumerate(zip(sources, targets)):
    length = len(bpe.encode(t5_pretrain.PREFIX + source))
    assert pairs['inputs'][row, :length].tolist() == bpe.encode(t5_pretrain.PREFIX + source)
    assert blank in bpe._tokenizer.decode(pairs['inputs'][row, :length].tolist(),
                                          skip_special_tokens=False)
    assert pairs['targets'][row][pairs['weights'][row] > 0].tolist() == (
        bpe.encode(target) + [bpe.eos_id])
  np.testing.assert_array_equal(pairs['decoder_inputs'][:, 1:], pairs['targets'][:, :-1])
  for key, value in task.held_out.items():
    np.testing.assert_array_equal(value, other_seed.held_out[key])


def test_t5_pretrain_balances_the_pairs_over_their_words_in_their_order():
  t5_pretrain = load_experiment('t5_pretrain')
  sources = [f'line {i}' for i in range(7)]
  targets = [' the', ' to', ' the', ' I', ' to', ' the', ' I']
  kept_sources, kept_targets = t5_pretrain.balanced(sources, targets)
  assert sorted(kept_targets) == [' I', ' I', ' the', ' the', ' to', ' to']
  assert kept_sources == sorted(kept_sources)  # the pairs' order kept
  assert [sources.index(s) for s in kept_sources if targets[sources.index(s)] == ' to'] == [1, 4]
  assert sorted(t5_pretrain.balanced(sources, targets, per_word=1)[1]) == [' I', ' the', ' to']


# The plots of the experiments, drawn from small results.json payloads without training.

def curve(key: str, points: dict) -> list[dict]:
  """Curve rows {step, key} of {step: value}."""
  return [{'step': step, key: value} for step, value in points.items()]


def plotted(ax) -> dict[str, tuple[list, list]]:
  """{label: (x, y)} of an axis's labelled lines."""
  return {line.get_label(): (list(line.get_xdata()), list(line.get_ydata()))
          for line in ax.get_lines() if not line.get_label().startswith('_')}


def redrawn(experiment, payload: dict, results) -> list:
  """--plot_only on results/results.json holding `payload`: the PNGs it wrote (each checked to
  be one), the folder otherwise left as it was."""
  results.mkdir(exist_ok=True)
  (results / 'results.json').write_text(json.dumps(payload))
  experiment.main(['--plot_only', '--results', str(results)])
  assert sorted(p.name for p in results.iterdir() if p.suffix != '.png') == ['results.json']
  pngs = sorted(results.glob('*.png'))
  for png in pngs:
    assert png.read_bytes().startswith(b'\x89PNG\r\n\x1a\n')
    with Image.open(png) as image:
      assert min(image.size) > 100
  return [png.stem for png in pngs]


def test_finish_draws_the_figures_from_the_payload_as_stored_in_json(tmp_path):
  seen = []
  def figures(payload):
    seen.append(payload)
    return {}
  sweep.finish('T', 'cmd', [{'name': 'a'}], lambda: '# T\n', figures, str(tmp_path), False,
               per_class={0: 0.5}, scales=(1.0, 2.0))
  assert seen == [json.loads((tmp_path / 'results.json').read_text())]
  assert seen[0]['per_class'] == {'0': 0.5} and seen[0]['scales'] == [1.0, 2.0]


def test_plot_only_without_results_or_figures_says_what_to_do(tmp_path):
  with pytest.raises(errors.UserError, match='run the experiment first'):
    sweep.redraw(tmp_path, lambda payload: {})
  with pytest.raises(app.UsageError, match='ablations draws no figures'):
    sweep.main('ablations', None, ['--plot_only', '--results', str(tmp_path)])


def test_beam_search_plots_its_curve_and_each_decodings_exact_match(tmp_path):
  beam_search = load_experiment('beam_search')
  decodings = [{'step': step, 'beam_size': beams, 'length_penalty': alpha, 'eval_loss': loss,
                'eval_exact_match': match}
               for step, loss, matches in ((2, 1.5, (0.1, 0.2, 0.3)), (4, 0.5, (0.7, 0.8, 0.9)))
               for (beams, alpha), match in zip(beam_search.DECODINGS, matches)]
  payload = {'command': 'c', 'decoding': decodings, 'runs': [
      {'name': 'reverse', 'train_curve': curve('loss', {1: 3.0, 2: 2.0, 3: 1.0})}]}
  loss_ax, match_ax = beam_search.figures(payload)['beam_search'].axes
  assert plotted(loss_ax) == {'training (logged mean)': ([1, 2, 3], [3.0, 2.0, 1.0]),
                              'held-out, at each checkpoint': ([2, 4], [1.5, 0.5])}
  assert plotted(match_ax) == {'greedy': ([2, 4], [0.1, 0.7]),
                               'beam 4, alpha 0.6': ([2, 4], [0.2, 0.8]),
                               'beam 4, alpha 0': ([2, 4], [0.3, 0.9])}
  assert redrawn(beam_search, payload, tmp_path) == ['beam_search']


def test_speech_digits_plots_its_losses_and_word_error_rate(tmp_path):
  speech_digits = load_experiment('speech_digits')
  evals = [{'step': 2, 'eval_loss': 0.9, 'eval_wer': 0.5}, {'step': 4, 'eval_loss': 0.4,
                                                              'eval_wer': 0.25}]
  payload = {'command': 'c', 'beam': {'beam_size': 4, 'step': 4, 'eval_wer': 0.2}, 'runs': [
      {'name': 'reference', 'train_curve': curve('loss', {1: 2.0, 3: 1.0}),
       'eval_curve': evals}]}
  loss_ax, wer_ax = speech_digits.figures(payload)['speech_digits'].axes
  assert plotted(loss_ax) == {'training (logged mean)': ([1, 3], [2.0, 1.0]),
                              'held-out': ([2, 4], [0.9, 0.4])}
  assert plotted(wer_ax) == {'greedy': ([2, 4], [0.5, 0.25]), 'beam 4': ([4], [0.2])}
  assert redrawn(speech_digits, payload, tmp_path) == ['speech_digits']


def test_t5_pretrain_plots_both_phases_with_seeds_sharing_a_colour(tmp_path):
  t5_pretrain = load_experiment('t5_pretrain')
  def finetuned(name, losses, matches):
    return {'name': name, 'train_curve': curve('loss', {1: 9.0, 2: 8.0}), 'eval_curve': [
        {'step': step, 'eval_loss': loss, 'eval_exact_match': match}
        for step, loss, match in zip((2, 4), losses, matches)]}
  pretrain = lambda held_out: {'train_curve': curve('loss', {5: 6.0, 10: 5.0}),
                               'eval_curve': curve('eval_loss', {10: held_out})}
  payload = {'command': 'c', 'pretrain': [pretrain(5.5), pretrain(5.25)],
      'runs': [finetuned('pretrained,seed=0', (4.0, 3.0), (0.0, 0.5)),
               finetuned('pretrained,seed=1', (4.5, 3.5), (0.0, 0.25)),
               finetuned('scratch,seed=0', (5.0, 4.0), (0.0, 0.0))]}
  pretrain_ax, loss_ax, match_ax = t5_pretrain.figures(payload)['t5_pretrain'].axes
  assert plotted(pretrain_ax) == {'training (logged mean)': ([5, 10], [6.0, 5.0]),
                                  'held-out': ([10], [5.5])}
  assert [list(line.get_ydata()) for line in pretrain_ax.get_lines()][2:] == [[6.0, 5.0], [5.25]]
  held_out = [line for line in loss_ax.get_lines() if line.get_marker() == 'o']
  assert [list(line.get_ydata()) for line in held_out] == [[4.0, 3.0], [4.5, 3.5], [5.0, 4.0]]
  assert [line.get_color() for line in held_out] == ['#2563eb', '#2563eb', '#dc2626']
  assert [list(line.get_ydata()) for line in match_ax.get_lines()] == [[0.0, 0.5], [0.0, 0.25],
                                                                        [0.0, 0.0]]
  assert [t.get_text() for t in match_ax.get_legend().get_texts()] == ['pretrained', 'scratch']
  assert redrawn(t5_pretrain, payload, tmp_path) == ['t5_pretrain']


def test_t5_pretrain_reports_each_evaluation_as_the_mean_over_seeds():
  t5_pretrain = load_experiment('t5_pretrain')
  def finetuned(name, losses, matches):
    curve = [{'step': step, 'eval_loss': loss, 'eval_exact_match': match}
             for step, loss, match in zip((100, 200), losses, matches)]
    return {'name': name, 'steps': 200, 'eval_loss': losses[-1], 'eval_curve': curve,
            'train_seconds': 60.0}
  results = [finetuned('pretrained,seed=0', (1.0, 0.8), (0.25, 0.375)),
             finetuned('scratch,seed=0', (1.5, 1.25), (0.125, 0.125)),
             finetuned('pretrained,seed=1', (1.25, 0.9), (0.25, 0.25)),
             finetuned('scratch,seed=1', (1.75, 1.5), (0.0, 0.25))]
  pretrained = [{'name': f'pretrain,seed={seed}', 'steps': 10, 'eval_loss': 3.0,
                 'train_seconds': 120.0} for seed in (0, 1)]
  majority = {'word': ' the', 'exact_match': 0.1, 'train_pairs': 1000, 'held_out_pairs': 130,
              'decoded_pairs': 130}
  report = t5_pretrain.report(pretrained, results, majority, 'c')
  assert '| 100 | 1.1250 | 1.6250 | 0.2500 | 0.0625 |' in report
  assert '| 200 | 0.8500 | 1.3750 | 0.3125 | 0.1875 |' in report
  assert 'held-out loss over the first 128 of the 130 held-out pairs' in report
  assert 'exact match +0.2500, +0.0000' in report
  assert '4.0 min over the 2 pre-trainings' in report


def test_tokenizer_compare_plots_bits_per_byte_against_training_flops(tmp_path):
  compare = load_experiment('tokenizer_compare')
  def run(name, vocab, bytes_per_token, bits):
    return {'name': name, 'vocab_size': vocab, 'steps': 4, 'train_flops': 400.0,
            'bytes_per_token': bytes_per_token, 'eval_bits_per_byte': bits,
            'train_curve': curve('loss', {2: math.log(2) * 3, 4: math.log(2) * 2})}
  payload = {'command': 'c', 'budget_flops': 400.0,
             'runs': [run('chars', 65, 1.0, 2.5), run('bpe512', 512, 2.0, None)]}
  (ax,) = compare.figures(payload)['tokenizer_compare'].axes
  lines = plotted(ax)
  np.testing.assert_allclose(lines['chars (65 ids): training'], [[200, 400], [3.0, 2.0]])
  np.testing.assert_allclose(lines['bpe512 (512 ids): training'], [[200, 400], [1.5, 1.0]])
  assert lines['chars: held-out, 2.500'] == ([400.0], [2.5])
  assert len(lines) == 3  # no held-out point where a run has none
  assert redrawn(compare, payload, tmp_path) == ['tokenizer_compare']


def test_clip_zero_shot_evaluates_every_batch_size_at_the_same_images_seen():
  clip = load_experiment('clip_zero_shot')
  full = {b: clip.schedule(b, quick=False) for b in (32, 128, 512)}
  assert [s['training.steps'] for s in full.values()] == [6144, 1536, 384]
  assert {b * s['training.eval_every'] for b, s in full.items()} == {12288}
  assert all(s['training.steps'] == 16 * s['training.eval_every'] for s in full.values())
  quick = clip.schedule(8, quick=True)
  assert (quick['training.steps'], quick['training.eval_every']) == (4, 2)
  with pytest.raises(ValueError, match='Batch 100 does not divide the 12288 images'):
    clip.schedule(100, quick=False)


def test_clip_zero_shot_plots_and_reports_accuracy_against_images_seen(tmp_path):
  clip = load_experiment('clip_zero_shot')
  def run(name, overrides, every, key, accuracies, **last):
    evaluations = [{'step': every * k, 'eval_loss': 1.0, key: accuracy}
                   for k, accuracy in enumerate(accuracies, 1)]
    evaluations[-1].update(last)
    return {'name': name, 'overrides': overrides, 'status': 'finished', 'steps': 8 * every,
            'eval_loss': 1.0, 'eval_curve': evaluations, 'train_seconds': 60.0,
            'load_average_start': 1.0, 'load_average_end': 2.0}
  zero_shot = 'eval_zero_shot_accuracy'
  runs = [run('loss=softmax,batch=4', {'model.loss': 'softmax', 'data.batch_size': 4}, 2,
              zero_shot, (0.1, 0.2, 0.3, 0.4, 0.6, 0.45, 0.5, 0.55), eval_zero_shot_top5=0.9,
              eval_temperature=12.25),
          run('loss=sigmoid,batch=8', {'model.loss': 'sigmoid', 'data.batch_size': 8}, 1,
              zero_shot, (0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.38), eval_zero_shot_top5=0.8,
              eval_temperature=9.5, eval_bias=-9.75),
          run('vit,batch=8', {'data.batch_size': 8}, 1, 'eval_accuracy',
              (0.2, 0.3, 0.4, 0.5, 0.6, 0.66, 0.7, 0.74), eval_top5_accuracy=0.95)]
  payload = {'command': 'c', 'runs': runs,
             'machine': {'cpu': 'CPU', 'cores': 2, 'jax': '0'}}
  drawn = clip.figures(payload)
  softmax_ax, sigmoid_ax = drawn['clip_zero_shot_curves'].axes
  epochs = lambda images_per_eval: pytest.approx([images_per_eval * k / 50_000
                                                  for k in range(1, 9)])
  softmax, sigmoid = plotted(softmax_ax), plotted(sigmoid_ax)
  assert list(softmax) == ['batch 4', 'supervised ViT, batch 8', 'chance (10%)']
  assert softmax['batch 4'] == (epochs(8), [0.1, 0.2, 0.3, 0.4, 0.6, 0.45, 0.5, 0.55])
  assert sigmoid['batch 8'][0] == epochs(8)
  assert sigmoid['supervised ViT, batch 8'][1] == [0.2, 0.3, 0.4, 0.5, 0.6, 0.66, 0.7, 0.74]
  assert sigmoid['chance (10%)'][1] == [0.1, 0.1]
  final = plotted(drawn['clip_zero_shot'].axes[0])
  assert final['softmax (CLIP)'] == ([4], [0.55]) and final['sigmoid (SigLIP)'] == ([8], [0.38])
  assert final['supervised ViT'] == ([8], [0.74])
  text = clip.report(runs, 'c', payload['machine'])
  assert '64 images (0.00 epochs); 8 evaluations a run' in text
  # Best: the highest evaluation and the images seen then (its step times the batch).
  for row in ('| loss=softmax,batch=4 | 4 | 16 | 55.0% | 90.0% | 60.0% (40) | 1.000 | 12.2 | - |',
              '| loss=sigmoid,batch=8 | 8 | 8 | 38.0% | 80.0% | 40.0% (56) | 1.000 | 9.5 | -9.75 |',
              '| vit,batch=8 | 8 | 8 | 74.0% | 95.0% | 74.0% (64) | 1.000 | - | - | finished |'):
    assert row in text
  # The last quarter: the mean of the last 2 of 8 evaluations, and the last less the one 2 before.
  assert '| loss=softmax,batch=4 | 52.5% | +10.0 points |' in text
  assert '| loss=sigmoid,batch=8 | 39.0% | +3.0 points |' in text
  assert '| vit,batch=8 | 72.0% | +8.0 points |' in text
  assert ('the best dual encoder, loss=softmax,batch=4, reaches 52.5% zero-shot top-1 (the dual '
          'encoders: 39.0% to 52.5%); the supervised vit,batch=8 72.0%; chance 10%. Over that '
          'quarter the dual encoders\' top-1 moved by +3.0 points to +10.0 points') in text
  assert 'Machine: CPU, 2 cores (load average 1.0 to 2.0' in text
  assert redrawn(clip, payload, tmp_path) == ['clip_zero_shot', 'clip_zero_shot_curves']


def test_dit_cifar_plots_its_curve_held_out_quarters_and_sample_scores(tmp_path):
  dit_cifar = load_experiment('dit_cifar')
  quarters = {'eval_loss': 0.1, 'eval_loss_t0': 0.3, 'eval_loss_t1': 0.05, 'eval_loss_t2': 0.03,
              'eval_loss_t3': 0.02}
  payload = {'command': 'c', 'step': 6, 'held_out': quarters, 'vit_test_accuracy': 0.5,
             'runs': [{'name': 'vit'},
                      {'name': 'dit', 'train_curve': curve('loss', {2: 1.0, 4: 0.2})}],
             'samples': [{'guidance_scale': scale, 'sample_accuracy': accuracy, 'sample_fd': fd,
                          'per_class': {str(c): accuracy for c in range(10)}}
                         for scale, accuracy, fd in ((1.0, 0.2, 30.0), (4.0, 0.6, 20.0))]}
  curve_ax, quarter_ax, accuracy_ax, distance_ax = dit_cifar.figures(payload)['dit_cifar'].axes
  assert plotted(curve_ax) == {'training (logged mean)': ([2, 4], [1.0, 0.2]),
                               'held-out': ([6], [0.1])}
  assert [bar.get_height() for bar in quarter_ax.patches] == [0.3, 0.05, 0.03, 0.02]
  lines = plotted(accuracy_ax)
  assert lines['samples'] == ([1.0, 4.0], [0.2, 0.6])
  assert lines['chance'][1] == [0.1, 0.1] and lines['real test images'][1] == [0.5, 0.5]
  assert [list(line.get_ydata()) for line in distance_ax.get_lines()] == [[30.0, 20.0]]
  # A run scored from --dit_workdir kept no curve before: the figure leaves that panel out.
  del payload['runs'][1]['train_curve']
  assert len(dit_cifar.figures(payload)['dit_cifar'].axes) == 3
  assert redrawn(dit_cifar, payload, tmp_path) == ['dit_cifar']
  # Scored checkpoints: their distance and accuracy against the step (accuracy on a twin axis).
  payload['checkpoints'] = [{'step': step, 'eval_loss': 0.1, 'sample_accuracy': accuracy,
                             'sample_fd': fd} for step, accuracy, fd in ((150, 0.1, 90.0),
                                                                         (300, 0.3, 60.0))]
  *_, trend_ax, trend_accuracy_ax = dit_cifar.figures(payload)['dit_cifar'].axes
  assert plotted(trend_ax) == {'Fréchet distance': ([150, 300], [90.0, 60.0])}
  assert plotted(trend_accuracy_ax)['ViT accuracy'] == ([150, 300], [0.1, 0.3])


def test_dit_cifar_scores_evenly_spaced_checkpoints_first_and_last_among_them():
  evenly_spaced = load_experiment('dit_cifar').evenly_spaced
  steps = list(range(150, 1651, 150))  # 11 checkpoints
  assert evenly_spaced(steps, 8) == [150, 300, 600, 750, 1050, 1200, 1500, 1650]
  assert evenly_spaced(steps[:3], 8) == [150, 300, 450]
  assert evenly_spaced(steps, 2) == [150, 1650]


def test_dit_digits_writes_scikit_learns_digits_as_an_image_folder(tmp_path):
  from sklearn.datasets import load_digits  # pylint: disable=import-outside-toplevel
  dit_digits = load_experiment('dit_digits')
  folder = dit_digits.write_digits(str(tmp_path / 'digits'))
  digits = load_digits()
  counts = {split: sum(1 for _ in (tmp_path / 'digits' / split).rglob('*.png'))
            for split in ('train', 'test')}
  assert counts == {'train': 1437, 'test': 360} and not list(tmp_path.glob('*.partial'))
  with Image.open(tmp_path / 'digits' / 'test' / str(digits.target[5]) / '0005.png') as image:
    assert image.mode == 'L'
    np.testing.assert_array_equal(np.asarray(image), np.rint(digits.images[5] * 255 / 16))
  assert (tmp_path / 'digits' / 'train' / str(digits.target[6]) / '0006.png').exists()
  (tmp_path / 'digits' / 'kept').mkdir()  # a folder already there is read, not written again
  assert dit_digits.write_digits(folder) == folder and (tmp_path / 'digits' / 'kept').exists()


def test_dit_digits_grids_have_a_row_per_class_and_survive_results_json():
  dit_digits = load_experiment('dit_digits')
  images = np.arange(12 * 2 * 3 * 3, dtype=np.uint8).reshape(12, 2, 3, 3)
  labels = np.array([2, 0, 2, 0, 2, 0, 2, 0, 2, 0, 2, 2])
  grid = json.loads(json.dumps(dit_digits.class_rows(images, labels)))
  assert grid['grid_classes'] == [0, 2]
  columns = min(dit_digits.GRID_COLUMNS, 5)  # class 0 has 5 samples
  expected = np.concatenate([np.concatenate(list(images[labels == c][:columns]), axis=1)
                             for c in (0, 2)])
  np.testing.assert_array_equal(dit_digits.decoded(grid['grid_png']), expected)


def test_dit_digits_plots_and_reports_its_curves_scores_and_grids(tmp_path):
  dit_digits = load_experiment('dit_digits')
  grid = lambda value: dit_digits.class_rows(np.full((10, 4, 4, 3), value, np.uint8),
                                             np.arange(10))
  evaluation = lambda step, loss, accuracy, fd: {
      'step': step, 'eval_loss': loss, **{f'eval_loss_t{i}': loss * (4 - i) for i in range(4)},
      'eval_sample_accuracy': accuracy, 'eval_sample_fd': fd}
  runs = [{'name': 'vit', 'steps': 10, 'train_seconds': 60.0},
          {'name': 'dit', 'steps': 8, 'train_seconds': 600.0, 'examples_per_sec': 100.0,
           'load_average_start': 3.0, 'load_average_end': 4.0,
           'train_curve': curve('loss', {2: 1.0, 8: 0.1}),
           'eval_curve': [evaluation(4, 0.2, 0.3, 40.0), evaluation(8, 0.1, 0.9, 4.0)]}]
  samples = [{'sampler': sampler, 'steps': steps, 'guidance_scale': scale,
              'sample_accuracy': accuracy, 'sample_fd': fd, 'sample_seconds': 12.0,
              'per_class': {c: accuracy for c in range(10)}, **grid(value)}  # as scored
             for sampler, steps, scale, accuracy, fd, value in (
                 ('ddim', 50, 1.0, 0.5, 9.0, 10), ('ddim', 50, 4.0, 0.92, 5.0, 20),
                 ('ddpm', 250, 1.0, 0.6, 8.0, 30), ('ddpm', 250, 4.0, 0.95, 3.25, 40))]
  payload = {'command': 'c', 'runs': runs, 'step': 8, 'held_out': runs[1]['eval_curve'][-1],
             'reference': {'real_fd': 1.5, 'held_out_accuracy': 0.97, 'held_out_images': 360,
                           'train_images': 200, **grid(0)},
             'samples': samples, 'budget': {'samples': 200, 'steps': {'ddim': 50, 'ddpm': 250}},
             'during': {'samples': 100, 'sampler': 'ddim', 'steps': 50, 'guidance_scale': 4.0},
             'machine': {'cpu': 'CPU', 'cores': 2, 'jax': '0', 'load_average_end': 5.0}}
  drawn = dit_digits.figures(payload)
  curve_ax, quarter_ax, during_ax, fd_during_ax, accuracy_ax, distance_ax = drawn[
      'dit_digits'].axes
  lines = plotted(curve_ax)
  assert lines['training (logged mean)'] == ([2, 8], [1.0, 0.1])
  assert lines['held-out, t in [0, 250)'] == ([4, 8], [0.8, 0.4])
  assert [bar.get_height() for bar in quarter_ax.patches] == [0.4, 0.30000000000000004, 0.2, 0.1]
  assert plotted(during_ax)['DDIM-50, guidance 4'] == ([4, 8], [0.3, 0.9])
  assert plotted(fd_during_ax)['DDIM-50, guidance 4'] == ([4, 8], [40.0, 4.0])
  lines = plotted(accuracy_ax)
  assert lines['DDIM-50'] == ([1.0, 4.0], [0.5, 0.92])
  assert lines['DDPM-250'] == ([1.0, 4.0], [0.6, 0.95])
  assert lines['chance'][1] == [0.1, 0.1] and lines['held-out images'][1] == [0.97, 0.97]
  assert plotted(distance_ax)['real training images'][1] == [1.5, 1.5]
  grid_axes = drawn['samples'].axes
  assert len(grid_axes) == 5
  assert [t.get_text() for t in grid_axes[4].get_yticklabels()] == [str(c) for c in range(10)]
  assert grid_axes[4].get_images()[0].get_array().max() == 40
  text = dit_digits.report('c', payload)
  assert '| DDPM-250 | 4 | 95.0% | 3.25 | 12 |' in text
  assert '| real training images | - | - | 1.50 | - |' in text
  assert '| 8 | 0.1000 | 90.0% | 4.00 |' in text
  assert '| DDIM-50 | 1 | ' + ' | '.join(['50%'] * 10) + ' |' in text
  assert redrawn(dit_digits, payload, tmp_path) == ['dit_digits', 'samples']


def test_text_memory_plots_memory_and_rate_against_the_corpus(tmp_path):
  # In a process of its own: text_memory's --text flag is also tokenizer_compare's.
  rows = [{'corpus_mib': mib, 'peak_rss_mib': rss, 'peak_anon_mib': anon, 'token_files_mib': mib,
           'mb_per_second': rate}
          for mib, rss, anon, rate in ((1.0, 900.0, 600.0, 2.0), (100.0, 1000.0, 610.0, 3.0))]
  (tmp_path / 'results.json').write_text(json.dumps({'command': 'c', 'rows': rows}))
  script = ('import json, sys; sys.path.insert(0, "tests"); from helpers import load_experiment; '
            'm = load_experiment("text_memory"); '
            'figure = m.figures(json.load(open(sys.argv[1] + "/results.json")))["text_memory"]; '
            'print(json.dumps([[[list(map(float, l.get_xdata())), list(map(float, l.get_ydata()))]'
            ' for l in ax.get_lines()] for ax in figure.axes])); '
            'm.main(["--plot_only", "--results", sys.argv[1]])')
  done = subprocess.run([sys.executable, '-c', script, str(tmp_path)], cwd=ROOT, check=True,
                        capture_output=True, text=True,
                        env={**os.environ, 'PYTHONPATH': str(ROOT)})
  memory, rate = json.loads(done.stdout.splitlines()[-1])
  assert memory == [[[1.0, 100.0], [r[key] for r in rows]]
                    for key in ('peak_rss_mib', 'peak_anon_mib', 'token_files_mib')]
  assert rate == [[[1.0, 100.0], [2.0, 3.0]]]
  assert (tmp_path / 'text_memory.png').read_bytes().startswith(b'\x89PNG\r\n\x1a\n')


@pytest.mark.parametrize('name', sorted({*FIGURES, 'speech_digits', 'tokenizer_compare'}))
def test_plot_only_redraws_the_committed_results_into_the_committed_figures(tmp_path, name):
  """Each results folder holds every figure its script draws from its results.json, and
  --plot_only draws them again from that file alone."""
  experiment = load_experiment(name)
  committed = ROOT / 'experiments' / 'results' / name
  payload = json.loads((committed / 'results.json').read_text())
  drawn = sorted(experiment.figures(payload))
  assert drawn and all((committed / f'{figure}.png').exists() for figure in drawn)
  assert redrawn(experiment, payload, tmp_path) == drawn


@pytest.mark.slow
def test_tokenizer_compare_quick_mode_trains_each_tokenizer_on_a_text_of_its_own(tmp_path):
  generator = np.random.default_rng(0)
  words = ['to', 'be', 'or', 'not', 'that', 'is', 'the', 'question']
  text = '\n\n'.join(' '.join(generator.choice(words, 30)) for _ in range(3000))
  (tmp_path / 'text.txt').write_text(text)
  load_experiment('tokenizer_compare').main(['--quick', '--text', str(tmp_path / 'text.txt'),
                                             '--workdir', str(tmp_path), '--vocab_sizes', '300'])
  payload = json.loads((tmp_path / 'results' / 'results.json').read_text())
  assert [(r['name'], r['status'], r['vocab_size']) for r in payload['runs']] == [
      ('chars', 'finished', len(set(text))), ('bpe300', 'finished', 300)]
  assert (tmp_path / 'results' / 'tokenizer_compare.png').stat().st_size > 0


def test_nanogpt_speedrun_reads_nanogpts_log():
  """Its per-iteration times of the 2,000 updates, an iteration that evaluated counted at the
  median of the others (the 2,001st left out), and its evaluations at the seconds before them."""
  lines = []
  for i in range(2001):
    if i % 250 == 0:
      lines.append(f'step {i}: train loss {4 - i / 1000:.4f}, val loss {4.1 - i / 1000:.4f}')
    ms = 500.0 if i % 250 == 0 else (20.0 if i < 1000 else 30.0)
    lines.append(f'iter {i}: loss {3 - i / 1000:.4f}, time {ms:.2f}ms, mfu -100.00%')
  parsed = load_experiment('nanogpt_speedrun').parse_nanogpt_log('\n'.join(lines))
  # 996 iterations of 20 ms, 996 of 30 (median 25) and 8 that evaluated (0, 250, ..., 1750).
  assert parsed['step_ms'] == pytest.approx(25.0)
  assert parsed['step_seconds'] == pytest.approx(996 * 0.020 + 996 * 0.030 + 8 * 0.025)
  assert parsed['estimate'] == pytest.approx(2.1)
  assert parsed['final_loss'] == pytest.approx(3 - 1999 / 1000)
  assert [row['step'] for row in parsed['eval_curve']] == list(range(0, 2001, 250))
  assert parsed['eval_curve'][1]['seconds'] == pytest.approx(0.025 + 249 * 0.020)
