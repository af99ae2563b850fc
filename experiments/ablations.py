"""Ablations: remove one block at a time from a 6-block version of the reference character LM.

The model and training of configs/llama_shakespeare.py (width 128, 4 heads, RMSNorm, SwiGLU,
RoPE, AdamW at a constant 3e-3, batch 32 of 64 characters) with 6 blocks and 400 steps, the same
budget and seed for every variant; each variant trained at seed = 0, 1 and 2 (config.seed: the
initialization, the batches and the dropout streams). The loss is the mean over every full batch
of the held-out 10% of TinyShakespeare (1,728 windows of 64 characters).

  python experiments/ablations.py --quick      # seconds: synthetic text, tiny model
  nice -n 19 python experiments/ablations.py \\
      --manual_dir DIR --tfds_data_dir TFDS_DIR

Writes experiments/results/ablations/: results.json, README.md (the table against a published
PyTorch run of the same ablation at three seed values, with the ranking check) and
ablations.png (mean and standard deviation per variant).
"""
import math
import pathlib
import statistics

from matplotlib.figure import Figure

from transformer_jax import sweep

NAME = 'ablations'
TITLE = 'Ablations: remove one block at a time'
CONFIG = pathlib.Path(__file__).resolve().parent.parent / 'configs' / 'llama_shakespeare.py'
VARIANTS = {
    'full model': {},
    'no position': {'model.positions': 'none'},
    'no attention': {'model.use_attention': False},
    'no feed-forward': {'model.use_mlp': False},
    'no normalization': {'model.use_norm': False},
    'no residual': {'model.use_residual': False},
}
SEED_VALUES = (0, 1, 2)
# A published PyTorch run of the same ablation (the same model with 6 blocks, 400 steps), at
# seed = 0 / 1 / 2: its validation loss, from a sample of held-out windows.
PUBLISHED_RUN = {
    'full model': (1.743, 1.808, 1.759),
    'no position': (2.099, 2.082, 2.076),
    'no attention': (2.492, 2.494, 2.489),
    'no feed-forward': (1.873, 1.888, 1.839),
    'no normalization': (1.717, 1.759, 1.726),
    'no residual': (3.355, 3.358, 3.364),
}
# The published run's ranking, most harmful removal first; normalization should not hurt.
EXPECTED_ORDER = ('no residual', 'no attention', 'no position', 'no feed-forward')
FULL = {'model.num_layers': 6, 'training.steps': 400, 'training.eval_every': 200,
        'training.checkpoint_every': 200, 'training.log_every': 50}
QUICK = {'data.name': 'synthetic', 'data.seq_len': 16, 'data.batch_size': 16,
         'data.eval_batch_size': 16, 'data.eval_steps': 2, 'model.width': 32,
         'model.num_layers': 1, 'training.steps': 6, 'training.eval_every': 6,
         'training.checkpoint_every': 6, 'training.log_every': 3}
QUICK_SEED_VALUES = (0,)


def sweep_runs(quick: bool) -> list[sweep.SweepRun]:
  return sweep.product(sweep.named(VARIANTS),
                       sweep.values('seed', QUICK_SEED_VALUES if quick else SEED_VALUES))


def run_config(spec: sweep.SweepRun, quick: bool = False, data: dict | None = None):
  """The config of one run of the sweep; `data`: where the dataset comes from."""
  return sweep.config_for(spec, CONFIG, FULL, QUICK if quick else {}, data or {})


def run(quick: bool = False, workdir: str = f'/tmp/transformer_jax_experiments/{NAME}',
        results_dir: str | None = None, data: dict | None = None,
        command: str = 'ablations.run()', vmap: bool = False) -> dict:
  """Trains (or reads back) every run, writes the results folder, returns table and figures."""
  results = sweep.run_all(sweep_runs(quick), lambda r: run_config(r, quick, data), workdir,
                          vmap=vmap)
  table = variant_table(results)
  return sweep.finish(TITLE, command, results, lambda: report(table, results, command), figures,
                      results_dir or f'{workdir}/results', quick, table=table)


def variant_table(results: list[dict]) -> dict[str, dict]:
  """Per variant: the loss of each seed, their mean and sample standard deviation."""
  table = {}
  for variant in VARIANTS:
    losses = [r['eval_loss'] for r in results if r['name'].rpartition(',')[0] == variant]
    table[variant] = {'losses': losses, 'mean': statistics.mean(losses),
                      'sd': statistics.stdev(losses) if len(losses) > 1 else 0.0}
  return table


def ranking_checks(table: dict) -> dict[str, str]:
  """The published run's claims, checked on the means and at every seed."""
  def holds(losses):
    ordered = all(losses[a] > losses[b] for a, b in zip(EXPECTED_ORDER, EXPECTED_ORDER[1:]))
    return ordered and losses[EXPECTED_ORDER[-1]] > losses['full model']

  runs = len(table['full model']['losses'])
  per_seed = sum(holds({v: row['losses'][i] for v, row in table.items()}) for i in range(runs))
  means = {v: row['mean'] for v, row in table.items()}
  norm_gap = [n - f for n, f in zip(table['no normalization']['losses'],
                                    table['full model']['losses'])]
  return {
      'order by mean loss (worst first)': ', '.join(sorted(means, key=means.get, reverse=True)),
      'residual > attention > position > feed-forward > full, on the means':
          'holds' if holds(means) else 'does not hold',
      'the same, seed by seed': f'holds at {per_seed} of {runs} seed values',
      'no normalization minus full model, per seed': ' / '.join(f'{g:+.3f}' for g in norm_gap),
  }


def report(table: dict, results: list[dict], command: str) -> str:
  lines = [f'# {TITLE}', '',
           'The reference character LM with 6 blocks, width 128 (configs/llama_shakespeare.py '
           'with model.num_layers=6), 400 steps of batch 32 x 64 characters at a constant '
           'learning rate of 3e-3, for each variant and seed. Loss: held-out TinyShakespeare '
           '(last 10%, 1,728 windows of 64), nats per character. The published run (a PyTorch '
           'run of the same ablation at seed = 0, 1 and 2) evaluates a sample of held-out '
           'windows; here every full batch of the held-out split.', '',
           f'Command: `{command}`', '',
           f'Machine time: {sweep.machine_seconds(results) / 60:.1f} min of training and '
           f'evaluation over {len(results)} runs.', '',
           '| variant | seed = 0 / 1 / 2 | mean ± sd | published run: mean ± sd '
           '| published run: seed = 0 / 1 / 2 | mean − full (ours) | mean − full (published) |',
           '|---|---|---|---|---|---|---|']
  published_full = statistics.mean(PUBLISHED_RUN['full model'])
  for variant, row in table.items():
    theirs = PUBLISHED_RUN[variant]
    lines.append(
        f'| {variant} | {" / ".join(f"{x:.3f}" for x in row["losses"])} | '
        f'{row["mean"]:.3f} ± {row["sd"]:.3f} | '
        f'{statistics.mean(theirs):.3f} ± {statistics.stdev(theirs):.3f} | '
        f'{" / ".join(f"{x:.3f}" for x in theirs)} | '
        f'{row["mean"] - table["full model"]["mean"]:+.3f} | '
        f'{statistics.mean(theirs) - published_full:+.3f} |')
  lines += ['', sweep.figure_markdown(NAME, 'Held-out loss of each variant: mean ± sd over the '
                                      'seed values (bars), the published run\'s mean ± sd '
                                      '(black), the full model\'s mean (dashed).')]
  lines += ['', '## The published run\'s ranking', '']
  lines += [f'- {claim}: {verdict}' for claim, verdict in ranking_checks(table).items()]
  return '\n'.join(lines) + '\n'


def bar_chart(table: dict) -> Figure:
  figure = Figure(figsize=(7.5, 3.6))
  ax = figure.subplots()
  names = list(table)[::-1]
  ax.barh(names, [table[n]['mean'] for n in names], xerr=[table[n]['sd'] for n in names],
          color=['#2563eb' if n == 'full model' else '#9ca3af' for n in names], capsize=3,
          label='this project: mean ± sd, one run per seed')
  theirs = [PUBLISHED_RUN[n] for n in names]
  ax.errorbar([statistics.mean(t) for t in theirs], names,
              xerr=[statistics.stdev(t) for t in theirs], fmt='D', color='black', ms=4,
              capsize=3, label='published PyTorch run: mean ± sd')
  ax.axvline(table['full model']['mean'], color='#2563eb', lw=1, ls='--')
  # Bars start near the best loss, so that the small differences stay visible.
  lowest = min(min(row['mean'] for row in table.values()), *map(min, theirs))
  ax.set_xlim(left=math.floor(10 * lowest) / 10 - 0.1)
  ax.set_xlabel('held-out loss after the same budget (nats per character, lower is better)')
  ax.set_title('Removing one block at a time (6 blocks, width 128)')
  ax.legend(loc='upper center', bbox_to_anchor=(0.5, -0.18), ncols=2, fontsize=8, frameon=False)
  return figure


def figures(payload: dict) -> dict[str, Figure]:
  """From results.json's content: the bar chart of the variants."""
  return {NAME: bar_chart(payload['table'])}


def main(argv=None):
  sweep.main(NAME, run, argv, figures)


if __name__ == '__main__':
  main()
