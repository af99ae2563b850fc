"""Greedy decoding against beam search on string reversal, through training.

The original transformer layout of configs/seq2seq_transformer.py (post-LN, ReLU, sinusoidal
positions, 3 + 3 blocks of width 128) learns to reverse strings of 1 to 31 letters. One run
keeps a checkpoint at each of CHECKPOINTS; each checkpoint's 1024 held-out pairs are then
decoded greedily and by beam search (DECODINGS: beams and length penalties), and scored by exact
match (the whole reversed string and its EOS) and held-out loss.

  python experiments/beam_search.py --quick
  nice -n 19 python experiments/beam_search.py

Writes experiments/results/beam_search/: results.json, README.md (the table) and beam_search.png
(the training curve; exact match per checkpoint and decoding). `--plot_only` draws the figure
again from results.json.
"""
import pathlib

from matplotlib.figure import Figure

from transformer_jax import sweep, train

NAME = 'beam_search'
TITLE = 'Greedy decoding against beam search on string reversal'
CONFIG = pathlib.Path(__file__).resolve().parent.parent / 'configs' / 'seq2seq_transformer.py'
CHECKPOINTS = (250, 500, 750, 1000)
# (beams, length penalty): 0 beams is greedy decoding.
DECODINGS = ((0, 0.0), (4, 0.6), (4, 0.0))
FULL = {'training.steps': CHECKPOINTS[-1], 'training.checkpoint_every': CHECKPOINTS[0],
        'training.keep_checkpoints': 12,  # more than the run writes: each one is decoded
        'training.eval_every': CHECKPOINTS[-1],
        'data.exact_match_examples': 1024, 'data.eval_batch_size': 256}
QUICK = {'model.width': 32, 'model.num_layers': 1, 'model.num_decoder_layers': 1,
         'data.seq_len': 8, 'data.batch_size': 16, 'data.eval_examples': 32,
         'data.exact_match_examples': 32, 'data.eval_batch_size': 16, 'training.steps': 4,
         'training.checkpoint_every': 2, 'training.eval_every': 4, 'training.log_every': 2,
         'optimizer.warmup_steps': 1}
QUICK_CHECKPOINTS = (2, 4)


def decoded(config, workdir: str, step: int, beam_size: int, length_penalty: float) -> dict:
  """Held-out loss and exact match of the run's checkpoint at `step`, decoded greedily (beam 0)
  or with `beam_size` beams under `length_penalty`."""
  config = config.copy_and_resolve_references()
  config.init_from_checkpoint = f'{workdir}:{step}'
  config.eval.update(beam_size=beam_size, length_penalty=length_penalty)
  results = train.evaluate(config, None)
  return {'step': step, 'beam_size': beam_size, 'length_penalty': length_penalty,
          'eval_loss': results['eval_loss'], 'eval_exact_match': results['eval_exact_match']}


def run(quick: bool = False, workdir: str = f'/tmp/transformer_jax_experiments/{NAME}',
        results_dir: str | None = None, data: dict | None = None,
        command: str = 'beam_search.run()', vmap: bool = False) -> dict:
  """Trains (or reads back) the run, decodes each checkpoint, writes the results folder."""
  runs = [sweep.SweepRun(name='reverse', arg='task=reverse')]
  make_config = lambda r: sweep.config_for(r, CONFIG, FULL, QUICK if quick else {}, data or {})
  results = sweep.run_all(runs, make_config, workdir, vmap=vmap)
  run_dir = f'{workdir}/{runs[0].dirname}'
  table = [decoded(make_config(runs[0]), run_dir, step, *decoding)
           for step in (QUICK_CHECKPOINTS if quick else CHECKPOINTS) for decoding in DECODINGS]
  return sweep.finish(TITLE, command, results, lambda: report(results, table, command), figures,
                      results_dir or f'{workdir}/results', quick, decoding=table)


def label(row: dict) -> str:
  """A decoding's name: 'greedy', or its beams and length penalty."""
  return (f'beam {row["beam_size"]}, alpha {row["length_penalty"]:g}' if row['beam_size']
          else 'greedy')


def report(results: list[dict], table: list[dict], command: str) -> str:
  lines = [f'# {TITLE}', '',
           'configs/seq2seq_transformer.py (the original transformer layout, post-LN, ReLU, '
           'sinusoidal positions, 3 + 3 blocks of width 128, 4 heads) reversing strings of 1 to '
           f'31 letters, {CHECKPOINTS[-1]} steps of batch 64. Each checkpoint decodes the 1024 '
           'held-out pairs greedily and by beam search (length penalty alpha: Wu et al. 2016\'s '
           '((5 + length) / 6) ** alpha); exact match: the whole reversed string and its EOS.',
           '', f'Command: `{command}`', '',
           f'Machine time of training: {sweep.machine_seconds(results) / 60:.1f} min.', '',
           '| step | decoding | exact match | held-out loss |', '|---|---|---|---|']
  for row in table:
    lines.append(f'| {row["step"]} | {label(row)} | {row["eval_exact_match"]:.4f} | '
                 f'{row["eval_loss"]:.4f} |')
  lines += ['', sweep.figure_markdown(NAME, 'Left: the training loss (logged means) and each '
                                      'checkpoint\'s held-out loss; right: each decoding\'s '
                                      'exact match at each checkpoint.')]
  return '\n'.join(lines) + '\n'


def figures(payload: dict) -> dict[str, Figure]:
  """From results.json's content: the run's training loss with the checkpoints' held-out loss
  (left), and each decoding's exact match at each checkpoint (right)."""
  figure = Figure(figsize=(10, 4))
  loss_ax, match_ax = figure.subplots(1, 2)
  (result,) = payload['runs']
  loss_ax.plot(*sweep.series(result['train_curve'], 'loss'), color='#9ca3af',
               label='training (logged mean)')
  checkpoints = {row['step']: row['eval_loss'] for row in payload['decoding']}
  loss_ax.plot(list(checkpoints), list(checkpoints.values()), 'o', color='black',
               label='held-out, at each checkpoint')
  loss_ax.set(xlabel='step', ylabel='loss (nats per token)', yscale='log',
              title='Training the reversal model')
  loss_ax.legend(fontsize=8, frameon=False, loc='lower left')
  # Decodings that score alike overlap: larger, hollow markers keep each one visible.
  styles = ({'marker': 'o', 'ms': 11, 'mfc': 'none'}, {'marker': 's', 'ms': 7, 'mfc': 'none'},
            {'marker': 'x', 'ms': 6})
  names = list(dict.fromkeys(label(row) for row in payload['decoding']))
  for number, name in enumerate(names):
    rows = [row for row in payload['decoding'] if label(row) == name]
    match_ax.plot([row['step'] for row in rows], [row['eval_exact_match'] for row in rows],
                  label=name, **styles[number % len(styles)])
  match_ax.set(xlabel='checkpoint (step)', ylabel='exact match (held-out pairs)',
               ylim=(-0.03, 1.03), title='Greedy decoding and beam search')
  match_ax.legend(fontsize=8, frameon=False)
  return {NAME: figure}


def main(argv=None):
  sweep.main(NAME, run, argv, figures)


if __name__ == '__main__':
  main()
