"""A mini scaling law from character-level decoders on TinyShakespeare.

The grid: five sizes of the reference character LM's block (configs/llama_shakespeare.py:
RMSNorm, SwiGLU, RoPE, no biases; heads of width 16, initialization scaled as PyTorch's default,
0.05 * sqrt(128 / width)), from about 12 thousand to about a million non-embedding parameters N
(1.9 decades), each trained for four token budgets D (100 to 800 steps of 32 x 64 characters:
0.2 to 1.6 million tokens). Each budget is its own run whose cosine schedule (20 warmup steps,
decay to 10% of 3e-3) ends at that budget, as Chinchilla (Hoffmann et al. 2022) trains, rather
than evaluations along one long run (Kaplan et al. 2020): those would cost the longest run alone
instead of 1.9 times it, but an intermediate point of a cosine run has not yet decayed its
learning rate, so its loss overstates what that budget can reach. The loss is the held-out
TinyShakespeare loss (nats per character) at the end of each run.

N counts the blocks and the final norm, not the embedding table nor the unembedding (Kaplan et
al.'s non-embedding parameters). Compute per run, from the accounting module: C = 6ND plus the
attention term 3 * 4LTd per token (T = 64); the head's 6dV per token is left out with the
embeddings.

Fits (Hoffmann et al., approach 3): L(N) = E + A / N^alpha on the longest run of each size, and
L(N, D) = E + A / N^alpha + B / D^beta on every run, by a Huber loss (delta 1e-3) on the
log-loss with L-BFGS started from a grid of initial values; 95% intervals from refitting runs
resampled with replacement (scipy.stats.bootstrap's percentile method). Compute-optimal N*(C) and
D*(C) follow from the joint fit with C = 6ND.

  python experiments/scaling.py --quick
  nice -n 19 python experiments/scaling.py \\
      --manual_dir DIR --tfds_data_dir TFDS_DIR
"""
import itertools
import math
import pathlib

import numpy as np
import scipy.optimize
import scipy.stats
from matplotlib.figure import Figure

from transformer_jax import accounting, sweep, train

NAME = 'scaling'
TITLE = 'A mini scaling law on TinyShakespeare characters'
CONFIG = pathlib.Path(__file__).resolve().parent.parent / 'configs' / 'llama_shakespeare.py'
HEAD_WIDTH = 16
SIZES = ((32, 1), (48, 2), (64, 3), (96, 4), (128, 5))  # (width, blocks)
BUDGETS = (100, 200, 400, 800)  # steps
FULL = {'optimizer.schedule': 'cosine', 'optimizer.warmup_steps': 20,
        'optimizer.min_lr_ratio': 0.1, 'training.log_every': 50}
QUICK = {'data.name': 'synthetic', 'data.seq_len': 16, 'data.batch_size': 16,
         'data.eval_batch_size': 16, 'data.eval_steps': 2, 'optimizer.warmup_steps': 1,
         'training.log_every': 2}
QUICK_SIZES = ((16, 1), (32, 1), (32, 2))
QUICK_BUDGETS = (3, 6)
HUBER_DELTA = 1e-3
# Hoffmann et al.'s grid of initial values: exponents, log E, and log A or log B.
EXPONENTS = (0.0, 0.5, 1.0, 1.5, 2.0)
LOG_E = (-1.0, -0.5, 0.0, 0.5, 1.0, 1.5)
LOG_COEFFICIENT = (0.0, 5.0, 10.0, 15.0, 20.0, 25.0)
# L-BFGS runs from the grid points of lowest objective (a run takes up to a second here: all
# 5,400 grid points would take an hour, and the best ones reach the same minimum); a bootstrap
# refit starts from the fit of all runs. The Huber loss of log-losses is about 1e-5, so scipy's
# default tolerances (absolute below 1) would stop at the start: tight ones.
FIT_STARTS = 16
QUICK_FIT_STARTS = 2
LBFGS_OPTIONS = {'ftol': 1e-15, 'gtol': 1e-12, 'maxiter': 5000}
TRAIN_CHARACTERS = 1_003_854  # TinyShakespeare's first 90%, the reference LM's training split
REFERENCE = {'Kaplan et al. 2020': {'alpha': 0.076},
             'Hoffmann et al. 2022 (Chinchilla)': {'alpha': 0.34, 'beta': 0.28}}


def size_runs(sizes) -> list[sweep.SweepRun]:
  return sweep.named({f'd{width}L{blocks}': {
      'model.width': width, 'model.num_layers': blocks, 'model.num_heads': width // HEAD_WIDTH,
      'model.init_std': 0.05 * math.sqrt(128 / width)} for width, blocks in sizes})


def budget_runs(budgets) -> list[sweep.SweepRun]:
  """One run per budget; evaluation and the last checkpoint at its end."""
  return sweep.named({f'steps={steps}': {
      'training.steps': steps, 'training.eval_every': steps, 'training.checkpoint_every': steps}
      for steps in budgets})


def sweep_runs(quick: bool) -> list[sweep.SweepRun]:
  return sweep.product(size_runs(QUICK_SIZES if quick else SIZES),
                       budget_runs(QUICK_BUDGETS if quick else BUDGETS))


def run(quick: bool = False, workdir: str = f'/tmp/transformer_jax_experiments/{NAME}',
        results_dir: str | None = None, data: dict | None = None,
        command: str = 'scaling.run()', vmap: bool = False, bootstrap: int = 200) -> dict:
  """Trains (or reads back) the grid, fits, writes the results folder."""
  base = [FULL, QUICK if quick else {}, data or {}]
  make_config = lambda r: sweep.config_for(r, CONFIG, *base)
  runs = sweep_runs(quick)
  results = sweep.run_all(runs, make_config, workdir, vmap=vmap)
  for r, spec in zip(results, runs):
    r.update(sizes(make_config(spec)))
  fits = (fit_all(results, bootstrap=10, num_starts=QUICK_FIT_STARTS) if quick
          else fit_all(results, bootstrap))
  return sweep.finish(TITLE, command, results, lambda: report(results, fits, command), figures,
                      results_dir or f'{workdir}/results', quick, fits=fits)


def sizes(config) -> dict:
  """N, D and C of a run, from the accounting module."""
  cfg = train.resolve(config).model  # its vocabulary as its data states it
  counts = accounting.param_counts(cfg)
  seq_len = config.data.seq_len
  flops = accounting.forward_flops(cfg, seq_len)
  n = counts['attention'] + counts['mlp'] + counts['norms']
  d = config.training.steps * config.data.batch_size * seq_len
  attention = 3 * flops['attention'] / flops['tokens'] * d
  return {'N': n, 'D': d, 'C': 6 * n * d + attention, 'C_attention': attention,
          'params_total': counts['total'], 'width': cfg.width, 'blocks': cfg.num_layers}


# The fits. theta = (log E, log A_1, alpha_1, log A_2, alpha_2, ...) for
# L = E + sum_i A_i / X_i^alpha_i, X_1 = N, X_2 = D; the Huber loss is on log L.

def log_prediction(theta, log_x):
  """log L and the softmax weights of its terms (for the gradient)."""
  theta = np.asarray(theta, float)
  terms = np.vstack([np.full(log_x.shape[1], theta[0]),
                     theta[1::2, None] - theta[2::2, None] * log_x])
  top = terms.max(axis=0)
  log_l = top + np.log(np.exp(terms - top).sum(axis=0))
  return log_l, np.exp(terms - log_l)


def huber_objective(theta, log_x, log_loss, delta=HUBER_DELTA):
  """Sum of Huber(log L(theta) - log L_observed) and its gradient."""
  log_l, weights = log_prediction(theta, log_x)
  residual = log_l - log_loss
  small = np.abs(residual) <= delta
  value = np.sum(np.where(small, 0.5 * residual ** 2, delta * (np.abs(residual) - 0.5 * delta)))
  slope = np.clip(residual, -delta, delta)
  grad = np.empty(len(theta))
  grad[0] = slope @ weights[0]
  grad[1::2] = weights[1:] @ slope
  grad[2::2] = -(weights[1:] * log_x) @ slope
  return value, grad


def initial_grid(num_terms: int) -> np.ndarray:
  axes = [LOG_E] + [LOG_COEFFICIENT, EXPONENTS] * num_terms
  return np.array(list(itertools.product(*axes)), float)


def best_starts(starts, log_x, log_loss, count: int) -> np.ndarray:
  """The `count` starting points of lowest objective."""
  initial = [huber_objective(start, log_x, log_loss)[0] for start in starts]
  return starts[np.argsort(initial)[:count]]


def fit(log_x, log_loss, starts) -> np.ndarray:
  """The best L-BFGS solution over the starting points."""
  best = None
  for start in starts:
    result = scipy.optimize.minimize(huber_objective, start, args=(log_x, log_loss), jac=True,
                                     method='L-BFGS-B', options=LBFGS_OPTIONS)
    if best is None or result.fun < best.fun:
      best = result
  return best.x


def fit_from_grid(log_x, log_loss, num_starts: int = FIT_STARTS) -> np.ndarray:
  return fit(log_x, log_loss, best_starts(initial_grid(len(log_x)), log_x, log_loss, num_starts))


def fit_with_intervals(log_x, log_loss, bootstrap: int, num_starts: int = FIT_STARTS,
                       seed: int = 0) -> dict:
  """The fit, and 95% percentile intervals of its parameters from refits of resampled runs."""
  theta = fit_from_grid(log_x, log_loss, num_starts)

  def refit(indices):
    indices = indices.astype(int)
    return fit(log_x[:, indices], log_loss[indices], [theta])

  samples = scipy.stats.bootstrap((np.arange(len(log_loss)),), refit, n_resamples=bootstrap,
                                  method='percentile', vectorized=False, random_state=seed)
  return {'theta': theta, 'low': samples.confidence_interval.low,
          'high': samples.confidence_interval.high, 'samples': samples.bootstrap_distribution.T}


def named_parameters(theta) -> dict:
  """E, A, alpha (and B, beta) from theta = (log E, log A, alpha, log B, beta). A bootstrap refit
  of a few runs can wander to a log coefficient past the float range: its coefficient is then
  inf (an unbounded interval), not an error."""
  with np.errstate(over='ignore'):
    coefficient = lambda log_value: float(np.exp(np.float64(log_value)))
    out = {'E': coefficient(theta[0]), 'A': coefficient(theta[1]), 'alpha': float(theta[2])}
    if len(theta) > 3:
      out.update(B=coefficient(theta[3]), beta=float(theta[4]))
  return out


def compute_optimal(p: dict, compute: float) -> dict:
  """N*(C), D*(C) minimizing E + A/N^alpha + B/D^beta subject to 6ND = C (Hoffmann et al.,
  appendix D.2): N* = G (C/6)^a, D* = (C/6)^b / G, a = beta/(alpha+beta), b = alpha/(alpha+beta),
  G = (alpha A / (beta B))^(1/(alpha+beta))."""
  degenerate = p['alpha'] <= 0 or p['beta'] <= 0 or not all(
      0 < p[k] < math.inf for k in ('A', 'B'))
  if degenerate:  # a degenerate bootstrap refit: no finite optimum
    return dict.fromkeys(('N', 'D', 'tokens_per_parameter'), math.nan)
  g = (p['alpha'] * p['A'] / (p['beta'] * p['B'])) ** (1 / (p['alpha'] + p['beta']))
  n = g * (compute / 6) ** (p['beta'] / (p['alpha'] + p['beta']))
  d = compute / 6 / n
  return {'N': n, 'D': d, 'tokens_per_parameter': d / n}


def fit_all(results: list[dict], bootstrap: int, num_starts: int = FIT_STARTS) -> dict:
  """Both fits with intervals, the compute-optimal allocation, and the predictive check."""
  n = np.array([r['N'] for r in results], float)
  d = np.array([r['D'] for r in results], float)
  loss = np.array([r['eval_loss'] for r in results], float)
  longest = d == d.max()
  largest = n == n.max()
  joint = fit_with_intervals(np.log([n, d]), np.log(loss), bootstrap, num_starts)
  by_size = fit_with_intervals(np.log([n[longest]]), np.log(loss[longest]), bootstrap, num_starts)
  fits = {'L(N,D)': _describe(joint), 'L(N)': _describe(by_size)}
  p = fits['L(N,D)']['value']
  optimal = {}
  for level in compute_levels([r['C'] for r in results]):
    samples = [compute_optimal(named_parameters(t), level) for t in joint['samples']]
    optimal[f'{level:.0e}'] = {
        **compute_optimal(p, level),
        **{f'{key}_interval': list(np.nanpercentile([s[key] for s in samples], [2.5, 97.5]))
           for key in ('N', 'D', 'tokens_per_parameter')}}
  fits['compute_optimal'] = {
      'a': p['beta'] / (p['alpha'] + p['beta']), 'b': p['alpha'] / (p['alpha'] + p['beta']),
      'levels': optimal}
  fits['predictive_check'] = predictive_check(n, d, loss, largest, longest, num_starts)
  return fits


def compute_levels(computes) -> np.ndarray:
  """Powers of ten from the smallest run's compute to one past the largest's."""
  return 10.0 ** np.arange(math.ceil(math.log10(min(computes))),
                           math.ceil(math.log10(max(computes))) + 1)


def _describe(fitted: dict) -> dict:
  value = named_parameters(fitted['theta'])
  low, high = named_parameters(fitted['low']), named_parameters(fitted['high'])
  return {'theta': list(fitted['theta']), 'value': value,
          'interval': {k: [low[k], high[k]] for k in value}}


def predictive_check(n, d, loss, largest, longest, num_starts: int) -> dict:
  """Both fits without the largest model, against its observed final losses."""
  joint = fit_from_grid(np.log([n[~largest], d[~largest]]), np.log(loss[~largest]), num_starts)
  predicted = np.exp(log_prediction(joint, np.log([n[largest], d[largest]]))[0])
  rows = [{'D': float(dd), 'observed': float(o), 'predicted': float(p),
           'error': float(p - o), 'relative_error': float((p - o) / o)}
          for dd, o, p in zip(d[largest], loss[largest], predicted)]
  small_longest = longest & ~largest
  by_size = fit_from_grid(np.log([n[small_longest]]), np.log(loss[small_longest]), num_starts)
  target = largest & longest
  by_size_prediction = float(np.exp(log_prediction(by_size, np.log([n[target]]))[0][0]))
  observed = float(loss[target][0])
  return {'N': float(n[largest][0]), 'L(N,D) fitted without it': named_parameters(joint),
          'L(N,D) predictions': rows,
          'L(N) prediction': {'observed': observed, 'predicted': by_size_prediction,
                              'error': by_size_prediction - observed,
                              'relative_error': (by_size_prediction - observed) / observed}}


def predict(p: dict, n, d=None):
  loss = p['E'] + p['A'] / np.asarray(n, float) ** p['alpha']
  return loss + p['B'] / np.asarray(d, float) ** p['beta'] if d is not None else loss


def report(results: list[dict], fits: dict, command: str) -> str:
  joint, by_size = fits['L(N,D)'], fits['L(N)']
  ns = sorted({r['N'] for r in results})
  ds = sorted({r['D'] for r in results})
  cell = {(r['N'], r['D']): r for r in results}

  def interval(f, key, digits=3):
    low, high = f['interval'][key]
    return f'{f["value"][key]:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]'

  lines = [f'# {TITLE}', '',
           f'{len(ns)} sizes x {len(ds)} token budgets = {len(results)} runs; each budget its own '
           'run with a cosine schedule ending at that budget. Loss: held-out TinyShakespeare, '
           'nats per character. N: non-embedding parameters; C = 6ND + attention (accounting '
           'module).', '', f'Command: `{command}`', '',
           f'Machine time: {sweep.machine_seconds(results) / 60:.1f} min over {len(results)} runs.',
           '', '## Held-out loss', '',
           '| width x blocks | N | ' + ' | '.join(f'D = {d / 1e6:.2f}M' for d in ds) + ' |',
           '|---|---|' + '---|' * len(ds)]
  for n in ns:
    first = cell[(n, ds[0])]
    lines.append(f'| {first["width"]} x {first["blocks"]} | {n:,} | ' + ' | '.join(
        f'{cell[(n, d)]["eval_loss"]:.3f} (C={cell[(n, d)]["C"]:.1e})' for d in ds) + ' |')
  lines += ['', '## Fits (95% bootstrap intervals)', '',
            f'- L(N, D) = E + A/N^alpha + B/D^beta, all runs: E = {interval(joint, "E")}, '
            f'alpha = {interval(joint, "alpha")}, beta = {interval(joint, "beta")}, '
            f'A = {joint["value"]["A"]:.3g}, B = {joint["value"]["B"]:.3g}',
            f'- L(N) = E + A/N^alpha, longest run of each size: E = {interval(by_size, "E")}, '
            f'alpha = {interval(by_size, "alpha")}, A = {by_size["value"]["A"]:.3g}',
            '- References: ' + '; '.join(
                f'{name}: ' + ', '.join(f'{k} = {v}' for k, v in ref.items())
                for name, ref in REFERENCE.items()), '',
            sweep.figure_markdown('loss_vs_tokens', 'Held-out loss of each run against its '
                                  'training tokens, one colour per model size, with the fitted '
                                  'L(N, D).'), '',
            sweep.figure_markdown('surface', 'The fitted loss surface over N and D, the runs '
                                  'coloured by their observed loss, and the compute-optimal N*, '
                                  'D* (dashed).'), '',
            '## Compute-optimal allocation (from L(N, D), C = 6ND)', '',
            f'N* ∝ C^{fits["compute_optimal"]["a"]:.2f}, D* ∝ C^{fits["compute_optimal"]["b"]:.2f}'
            ' (Chinchilla: about 0.5 and 0.5).', '',
            '| C (FLOPs) | N* | D* | D*/N* (tokens per parameter) |', '|---|---|---|---|']
  for level, row in fits['compute_optimal']['levels'].items():
    beyond = ' (beyond the grid)' if float(level) > max(r['C'] for r in results) else ''
    lines.append(
        f'| {level}{beyond} | '
        f'{row["N"]:.3g} [{row["N_interval"][0]:.2g}, {row["N_interval"][1]:.2g}] | '
        f'{row["D"]:.3g} [{row["D_interval"][0]:.2g}, {row["D_interval"][1]:.2g}] | '
        f'{row["tokens_per_parameter"]:.3g} [{row["tokens_per_parameter_interval"][0]:.2g}, '
        f'{row["tokens_per_parameter_interval"][1]:.2g}] |')
  check = fits['predictive_check']
  lines += ['', sweep.figure_markdown('isoflop', 'IsoFLOP curves of the fitted L(N, D = C/6N), '
                                      'each one\'s minimum marked, with the runs (shade: log10 '
                                      'C).')]
  lines += ['', f'## Predictive check: the largest model (N = {check["N"]:,.0f}) left out of '
            'the fits', '', '| D | observed | predicted by L(N, D) | error |', '|---|---|---|---|']
  lines += [f'| {row["D"]:,.0f} | {row["observed"]:.3f} | {row["predicted"]:.3f} | '
            f'{row["error"]:+.3f} ({row["relative_error"]:+.1%}) |'
            for row in check['L(N,D) predictions']]
  by_n = check['L(N) prediction']
  lines += ['', f'L(N) on the longest runs predicts {by_n["predicted"]:.3f} for the observed '
            f'{by_n["observed"]:.3f} ({by_n["error"]:+.3f}, {by_n["relative_error"]:+.1%}).',
            '', sweep.figure_markdown('loss_vs_params', 'Loss against model size: the longest '
                                      'runs with the L(N) fit, the joint fit\'s L(N, D→∞), and the '
                                      'largest model predicted without it (cross).')]
  lines += ['', '## Why these exponents are not Kaplan\'s or Chinchilla\'s', ''] + [
      f'- {reason}' for reason in differences(results)]
  return '\n'.join(lines) + '\n'


def differences(results: list[dict]) -> list[str]:
  """What separates this grid from the runs the published laws were fitted on."""
  n = [r['N'] for r in results]
  d_max = max(r['D'] for r in results)
  return [
      f'Scale: N spans {min(n):,} to {max(n):,} non-embedding parameters '
      f'({math.log10(max(n) / min(n)):.1f} decades) and C at most '
      f'{max(r["C"] for r in results):.1e} FLOPs; the published fits span about 7 decades of N '
      'and reach 1e23 FLOPs, where the power law is the only term left. Over so short a range '
      'the irreducible loss E and the exponents trade off against each other, which is why '
      'their intervals above are wide.',
      f'Data: {d_max:,} tokens at the longest budget against {TRAIN_CHARACTERS:,} training '
      f'characters, {d_max / TRAIN_CHARACTERS:.1f} epochs: repeated data, which both laws '
      'assume away (every token fresh).',
      'Tokens: 65 characters, not BPE tokens of about 4 characters each; a loss per character '
      'is about a quarter of a loss per token on the same text, and the models spend their '
      'capacity on spelling before anything a word-level model learns.',
      'Budgets: 100 to 800 steps are far from convergence, with one learning rate for every '
      'size; Kaplan et al. fit L(N) on converged models, Chinchilla tuned its schedules per '
      'budget.',
      'Context: 64 characters. Most of what larger models buy at long contexts is out of reach.',
  ]


def plots(results: list[dict], fits: dict) -> dict[str, Figure]:
  p = fits['L(N,D)']['value']
  n = np.array([r['N'] for r in results], float)
  d = np.array([r['D'] for r in results], float)
  c = np.array([r['C'] for r in results], float)
  loss = np.array([r['eval_loss'] for r in results], float)
  ns = np.unique(n)
  colours = [f'C{i}' for i in range(len(ns))]
  figures = {}

  figure = Figure(figsize=(6, 4.2))
  ax = figure.subplots()
  d_line = np.geomspace(d.min() / 1.5, d.max() * 1.5, 100)
  for size, colour in zip(ns, colours):
    ax.semilogx(d[n == size], loss[n == size], 'o', color=colour, label=f'N = {size:,.0f}')
    ax.semilogx(d_line, predict(p, size, d_line), '-', color=colour, lw=1)
  ax.set(xlabel='training tokens D', ylabel='held-out loss (nats per character)',
         title='Runs and the fitted L(N, D)')
  ax.legend(fontsize=8, frameon=False)
  figures['loss_vs_tokens'] = figure

  figure = Figure(figsize=(6, 4.6))
  ax = figure.subplots()
  compute = np.geomspace(c.min() / 3, c.max() * 3, 50)
  frontier = [compute_optimal(p, level) for level in compute]
  # Wide enough for the runs and the compute-optimal frontier through their compute range.
  frontier_n = [f['N'] for f in frontier if np.isfinite(f['N'])]
  frontier_d = [f['D'] for f in frontier if np.isfinite(f['D'])]
  grid_n, grid_d = np.meshgrid(np.geomspace(min([n.min() / 2, *frontier_n]), n.max() * 2, 120),
                               np.geomspace(d.min() / 2, max([d.max() * 2, *frontier_d]), 120))
  levels = np.linspace(loss.min() - 0.1, loss.max() + 0.3, 21)  # the runs' range, not the extremes
  contours = ax.contourf(grid_n, grid_d, predict(p, grid_n, grid_d), levels=levels,
                         cmap='viridis', extend='both')
  figure.colorbar(contours, ax=ax, label='fitted loss')
  ax.scatter(n, d, c=loss, cmap='viridis', vmin=contours.levels[0], vmax=contours.levels[-1],
             edgecolors='white', s=50, label='runs (colour: observed loss)')
  ax.plot([f['N'] for f in frontier], [f['D'] for f in frontier], 'w--',
          label='compute-optimal N*, D*')
  ax.set(xscale='log', yscale='log', xlabel='non-embedding parameters N', ylabel='tokens D',
         title='Fitted loss surface', xlim=(grid_n.min(), grid_n.max()),
         ylim=(grid_d.min(), grid_d.max()))
  ax.legend(fontsize=8, loc='upper right')
  figures['surface'] = figure

  figure = Figure(figsize=(6, 4.2))
  ax = figure.subplots()
  levels = np.geomspace(c.min(), c.max(), 5)
  n_line = np.geomspace(n.min() / 4, n.max() * 4, 200)
  for i, level in enumerate(levels):
    curve = predict(p, n_line, level / (6 * n_line))
    ax.semilogx(n_line, curve, color=f'C{i}', label=f'C = {level:.1e}')
    best = compute_optimal(p, level)
    ax.plot(best['N'], predict(p, best['N'], best['D']), 'o', color=f'C{i}')
  scatter = ax.scatter(n, loss, c=np.log10(c), cmap='Greys', edgecolors='black', s=25,
                       label='runs (shade: log10 C)')
  figure.colorbar(scatter, ax=ax, label='log10 C of the runs')
  ax.set(xlabel='non-embedding parameters N', ylabel='loss (nats per character)',
         title='IsoFLOP curves of the fitted L(N, D = C/6N)',
         ylim=(loss.min() - 0.1, loss.max() + 0.2))
  ax.legend(fontsize=7, frameon=False)
  figures['isoflop'] = figure

  figure = Figure(figsize=(6, 4.2))
  ax = figure.subplots()
  longest = d == d.max()
  by_size = fits['L(N)']['value']
  ax.loglog(n[longest], loss[longest], 'o', color='C0', label=f'longest runs (D = {d.max():,.0f})')
  ax.loglog(n_line, predict(by_size, n_line), '-', color='C0',
            label=f'L(N): alpha = {by_size["alpha"]:.3f}')
  ax.loglog(n_line, p['E'] + p['A'] / n_line ** p['alpha'], ':', color='C1',
            label=f'L(N, D→∞) of the joint fit: alpha = {p["alpha"]:.3f}')
  held_out = fits['predictive_check']['L(N) prediction']
  ax.plot(fits['predictive_check']['N'], held_out['predicted'], 'x', color='C3', ms=9,
          label='largest model, predicted without it')
  ax.set(xlabel='non-embedding parameters N', ylabel='loss (nats per character)',
         title='Loss against model size')
  ax.legend(fontsize=7, frameon=False)
  figures['loss_vs_params'] = figure
  return figures


def figures(payload: dict) -> dict[str, Figure]:
  """From results.json's content: `plots`."""
  return plots(payload['runs'], payload['fits'])


def main(argv=None):
  sweep.main(NAME, run, argv, figures)


if __name__ == '__main__':
  main()
