"""AdamW against Muon on the reference character LM, each at the best of three learning rates.

The model and training of configs/llama_shakespeare.py (4 blocks, width 128, 4 heads, RMSNorm,
SwiGLU, RoPE, batch 32 of 64 characters, 600 steps, a constant learning rate, no clipping).
AdamW runs train every parameter with AdamW (0.9, 0.95, weight decay 0.1) at three peak rates;
Muon runs (optimizer.name='muon') train the blocks' projection kernels with Muon (momentum 0.95,
Nesterov, 5 Newton-Schulz steps, no weight decay) at three Muon rates, and the embedding, the
norms and the head with the reference's AdamW at its 3e-3. Every run: the same seed, batches and
steps. The loss is the mean over every full batch of the held-out 10% of TinyShakespeare.

  python experiments/optimizer_compare.py --quick
  nice -n 19 python experiments/optimizer_compare.py \\
      --manual_dir DIR --tfds_data_dir TFDS_DIR

Writes experiments/results/optimizer_compare/: results.json, README.md (held-out loss and step
time per run, the best of each optimizer) and optimizer_compare.png (training loss curves).
"""
import pathlib

from matplotlib.figure import Figure

from transformer_jax import sweep

NAME = 'optimizer_compare'
TITLE = 'AdamW against Muon on the reference character LM'
CONFIG = pathlib.Path(__file__).resolve().parent.parent / 'configs' / 'llama_shakespeare.py'
STEPS = 600
ADAMW_RATES = (1e-3, 3e-3, 1e-2)  # optimizer.learning_rate; 3e-3 is the reference's
MUON_RATES = (0.01, 0.02, 0.05)  # optimizer.muon_learning_rate; 0.02 is Keller Jordan's
FULL = {'training.steps': STEPS, 'training.eval_every': STEPS,
        'training.checkpoint_every': STEPS, 'training.log_every': 50}
QUICK = {'data.name': 'synthetic', 'data.seq_len': 16, 'data.batch_size': 16,
         'data.eval_batch_size': 16, 'data.eval_steps': 2, 'model.width': 32,
         'model.num_layers': 1, 'training.steps': 6, 'training.eval_every': 6,
         'training.checkpoint_every': 6, 'training.log_every': 3}


def sweep_runs() -> list[sweep.SweepRun]:
  adamw = sweep.values('optimizer.learning_rate', ADAMW_RATES, 'adamw lr')
  muon = sweep.product(sweep.named({'muon': {'optimizer.name': 'muon'}}),
                       sweep.values('optimizer.muon_learning_rate', MUON_RATES, 'lr'))
  return adamw + muon


def run(quick: bool = False, workdir: str = f'/tmp/transformer_jax_experiments/{NAME}',
        results_dir: str | None = None, data: dict | None = None,
        command: str = 'optimizer_compare.run()', vmap: bool = False) -> dict:
  """Trains (or reads back) every run, writes the results folder, returns table and figures."""
  base = [FULL, QUICK if quick else {}, data or {}]
  results = sweep.run_all(sweep_runs(), lambda r: sweep.config_for(r, CONFIG, *base), workdir,
                          vmap=vmap)
  return sweep.finish(TITLE, command, results, lambda: report(results, command), figures,
                      results_dir or f'{workdir}/results', quick, best=best_runs(results))


def optimizer(result: dict) -> str:
  return dict(result['overrides']).get('optimizer.name', 'adamw')


def rate(result: dict) -> float:
  """The rate the run varies: AdamW's, or Muon's for a Muon run."""
  overrides = dict(result['overrides'])
  return overrides.get('optimizer.muon_learning_rate', overrides.get('optimizer.learning_rate'))


def step_ms(result: dict, batch_size: int = 32) -> float | None:
  rate_ = result['examples_per_sec']
  return 1000 * batch_size / rate_ if rate_ else None


def best_runs(results: list[dict]) -> dict:
  """{optimizer: the name of its run with the lowest held-out loss}."""
  finished = [r for r in results if r['eval_loss'] is not None]
  return {name: min((r for r in finished if optimizer(r) == name),
                    key=lambda r: r['eval_loss'])['name']
          for name in sorted({optimizer(r) for r in finished})}


def report(results: list[dict], command: str) -> str:
  best = best_runs(results)
  lines = [f'# {TITLE}', '',
           'The reference LM (configs/llama_shakespeare.py: 4 blocks, width 128, 4 heads, SwiGLU, '
           f'RoPE; batch 32 of 64 characters), {STEPS} steps at a constant learning rate, no '
           'clipping, the same seed for every run. AdamW: every parameter, (0.9, 0.95), weight '
           'decay 0.1. Muon: the blocks\' projection kernels (attention q/k/v/out with the heads '
           'folded into the matrix, the MLP), momentum 0.95, Nesterov, 5 Newton-Schulz steps, '
           'no weight decay; the embedding, norms and head with the AdamW above at 3e-3. '
           'Held-out loss: nats per character over every full batch of the held-out 10% of '
           'TinyShakespeare. Step time: the median over the logged windows after the first '
           '(on this shared CPU, so differences under about 10% are noise).', '',
           f'Command: `{command}`', '',
           f'Machine time: {sweep.machine_seconds(results) / 60:.1f} min over {len(results)} runs.',
           '', '| optimizer | learning rate | held-out loss | final training loss | step time '
           '(ms) | status |', '|---|---|---|---|---|---|']
  for r in results:
    mark = ' (best)' if best.get(optimizer(r)) == r['name'] else ''
    held_out = f'{r["eval_loss"]:.3f}' if r['eval_loss'] is not None else '-'
    final = f'{r["final_loss"]:.3f}' if r['final_loss'] is not None else '-'
    ms = step_ms(r)
    lines.append(f'| {optimizer(r)}{mark} | {rate(r):g} | {held_out} | {final} | '
                 f'{"-" if ms is None else f"{ms:.0f}"} | {r["status"]} |')
  lines += ['', sweep.figure_markdown(NAME, 'Training loss against the step, one panel per '
                                      'optimizer, one line per learning rate.')]
  return '\n'.join(lines) + '\n'


def curves(results: list[dict]) -> Figure:
  """Training loss against the step, one panel per optimizer, one line per learning rate."""
  figure = Figure(figsize=(10, 4))
  axes = figure.subplots(1, 2, sharey=True)
  for ax, name in zip(axes, ('adamw', 'muon')):
    for r in (r for r in results if optimizer(r) == name):
      ax.plot(*sweep.series(r['train_curve'], 'loss'), label=f'lr {rate(r):g}')
    ax.set_title(name)
    ax.set_xlabel('step')
    ax.legend(fontsize=8, frameon=False)
  axes[0].set_ylabel('training loss (nats per character)')
  figure.suptitle('AdamW and Muon on the reference character LM')
  return figure


def figures(payload: dict) -> dict[str, Figure]:
  """From results.json's content: the curves of every run."""
  return {NAME: curves(payload['runs'])}


def main(argv=None):
  sweep.main(NAME, run, argv, figures)


if __name__ == '__main__':
  main()
