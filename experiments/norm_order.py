"""Block orders: pre-LN against post-LN, at 6 and 24 blocks, with and without warmup.

In post-LN (the order of Vaswani et al. 2017) every LayerNorm sits on the main path, the
gradients near the output are large at initialization, and training needs a learning-rate warmup
(Xiong et al. 2020); pre-LN keeps an identity path from input to output. The model is the GPT-2
style of configs/gpt_shakespeare.py (LayerNorm, GELU MLP, learned positions, biases, tied
embedding, AdamW b2=0.99, gradient clipping at 1, cosine decay to 10%), narrowed to width 64
(4 heads) and contexts of 64 characters so that 24 blocks fit a CPU budget, without dropout (the
runs are short). Every run: the same seed and steps; only the block order, the depth, the warmup
and the peak learning rate (an axis of LEARNING_RATES) differ.

  python experiments/norm_order.py --quick
  nice -n 19 python experiments/norm_order.py \\
      --manual_dir DIR --tfds_data_dir TFDS_DIR

Writes experiments/results/norm_order/: results.json, README.md (final losses) and
norm_order.png (training loss and gradient norm against the step).
"""
import pathlib

from matplotlib.figure import Figure

from transformer_jax import sweep

NAME = 'norm_order'
TITLE = 'Pre-LN against post-LN, with and without warmup'
CONFIG = pathlib.Path(__file__).resolve().parent.parent / 'configs' / 'gpt_shakespeare.py'
STEPS = 300
LEARNING_RATES = (1e-3,)
WARMUP = 60
DEPTHS = (6, 24)
FULL = {'model.width': 64, 'model.num_heads': 4, 'model.max_len': 64, 'model.dropout_rate': 0.0,
        'model.scan_layers': True, 'data.seq_len': 64, 'data.batch_size': 32,
        'training.steps': STEPS,
        'training.log_every': 10, 'training.eval_every': STEPS,
        'training.checkpoint_every': STEPS}
QUICK = {'data.name': 'synthetic', 'data.seq_len': 16, 'data.batch_size': 16,
         'data.eval_batch_size': 16, 'data.eval_steps': 2, 'model.width': 32, 'model.max_len': 16,
         'model.scan_layers': False, 'training.steps': 6, 'training.log_every': 2,
         'training.eval_every': 6, 'training.checkpoint_every': 6}
QUICK_DEPTHS = (1,)


def sweep_runs(quick: bool, warmup: int = WARMUP) -> list[sweep.SweepRun]:
  return sweep.product(
      sweep.values('model.num_layers', QUICK_DEPTHS if quick else DEPTHS, 'blocks'),
      sweep.values('model.norm_position', ('pre', 'post'), 'norm'),
      sweep.values('optimizer.warmup_steps', (0, 2 if quick else warmup), 'warmup'),
      sweep.values('optimizer.learning_rate', LEARNING_RATES, 'lr'))


def run(quick: bool = False, workdir: str = f'/tmp/transformer_jax_experiments/{NAME}',
        results_dir: str | None = None, data: dict | None = None,
        command: str = 'norm_order.run()', vmap: bool = False) -> dict:
  """Trains (or reads back) every run, writes the results folder, returns table and figures."""
  base = [FULL, QUICK if quick else {}, data or {}]
  results = sweep.run_all(sweep_runs(quick), lambda r: sweep.config_for(r, CONFIG, *base), workdir,
                          vmap=vmap)
  return sweep.finish(TITLE, command, results, lambda: report(results, command), figures,
                      results_dir or f'{workdir}/results', quick)


def setting(result: dict, key: str):
  return result['overrides'][key]


def report(results: list[dict], command: str) -> str:
  lines = [f'# {TITLE}', '',
           'GPT-2 style blocks (configs/gpt_shakespeare.py) at width 64, 4 heads, contexts of 64 '
           f'characters, batch 32, no dropout; {STEPS} steps at a peak learning rate of '
           f'{" or ".join(f"{lr:g}" for lr in LEARNING_RATES)} with cosine decay to 10%, '
           'gradients clipped at norm 1. "Warmup": '
           f'linear from 0 over the first {WARMUP} steps. Held-out TinyShakespeare loss (nats per '
           'character) after the last step; "loss at step 50" is the training loss of steps '
           '41-50.', '',
           f'Command: `{command}`', '',
           f'Machine time: {sweep.machine_seconds(results) / 60:.1f} min over {len(results)} runs.',
           '', '| blocks | peak lr | order | warmup | held-out loss | loss at step 50 | largest '
           'gradient norm (first 50 steps) | status |', '|---|---|---|---|---|---|---|---|']
  for r in results:
    early = [row for row in r['train_curve'] if row['step'] <= 50]
    loss_50 = f'{early[-1]["loss"]:.3f}' if early else '-'
    grad = f'{max(row["grad_norm"] for row in early):.2f}' if early else '-'
    held_out = f'{r["eval_loss"]:.3f}' if r['eval_loss'] is not None else '-'
    lines.append(f'| {setting(r, "model.num_layers")} | '
                 f'{setting(r, "optimizer.learning_rate"):g} | '
                 f'{setting(r, "model.norm_position")}-LN | '
                 f'{setting(r, "optimizer.warmup_steps")} steps | {held_out} | {loss_50} | '
                 f'{grad} | {r["status"]} |')
  lines += ['', sweep.figure_markdown(NAME, 'Training loss (top) and gradient norm before '
                                      'clipping (bottom) against the step, one column per depth '
                                      'and peak learning rate; dashed: no warmup.')]
  return '\n'.join(lines) + '\n'


def curves(results: list[dict]) -> Figure:
  """Training loss (top) and gradient norm (bottom) against the step, one column per depth
  and peak learning rate."""
  columns = sorted({(setting(r, 'model.num_layers'), setting(r, 'optimizer.learning_rate'))
                    for r in results})
  figure = Figure(figsize=(4.5 * len(columns), 6.4))
  axes = figure.subplots(2, len(columns), squeeze=False, sharex='col', sharey='row')
  colours = {'pre': '#2563eb', 'post': '#dc2626'}
  for column, (depth, lr) in enumerate(columns):
    loss_ax, grad_ax = axes[0, column], axes[1, column]
    for r in (r for r in results if (setting(r, 'model.num_layers'),
                                     setting(r, 'optimizer.learning_rate')) == (depth, lr)):
      order, warmup = setting(r, 'model.norm_position'), setting(r, 'optimizer.warmup_steps')
      style = dict(color=colours[order], ls='-' if warmup else '--',
                   label=f'{order}-LN, {"warmup " + str(warmup) if warmup else "no warmup"}')
      loss_ax.plot(*sweep.series(r['train_curve'], 'loss'), **style)
      grad_ax.plot(*sweep.series(r['train_curve'], 'grad_norm'), **style)
    loss_ax.set_title(f'{depth} blocks, peak lr {lr:g}')
    loss_ax.set_ylabel('training loss (nats per character)')
    grad_ax.set_ylabel('gradient norm (before clipping)')
    grad_ax.set_yscale('log')
    grad_ax.set_xlabel('step')
    loss_ax.legend(fontsize=8, frameon=False)
  figure.suptitle('Pre-LN and post-LN, with and without learning-rate warmup')
  return figure


def figures(payload: dict) -> dict[str, Figure]:
  """From results.json's content: the curves of every run."""
  return {NAME: curves(payload['runs'])}


def main(argv=None):
  sweep.main(NAME, run, argv, figures)


if __name__ == '__main__':
  main()
