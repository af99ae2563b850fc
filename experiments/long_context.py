"""Loss far past the training context, with and without the sliding-window cache.

The reference character LM (configs/llama_shakespeare.py: 4 blocks, width 128, RoPE, trained on
64-character windows for 600 steps) reads the held-out text in pieces of 16 contexts (1,024
characters), teacher-forced, and its per-character loss is averaged by position band, three ways:
- whole context: each position attends to every earlier one (the uncached forward pass, which is
  what the whole-context cache computes);
- window: through `decode.forced_logits(..., window=64)`, the ring-buffer cache that
  `generate` decodes with, one token per step (checked against the forward pass under a banded
  causal mask: the largest logit difference is reported);
- crop (positions 8-16 contexts out only): each position recomputed from its last 64 characters
  alone, at positions 0..63, as nanoGPT's sampler does. With 4 layers this differs from the
  window, whose upper layers see keys computed from earlier windows.
The same model with sinusoidal positions and with none, trained alike, shows what a window does
for them. Each model also writes 600 characters after 'ROMEO:' with and without the window.

  python experiments/long_context.py --quick
  nice -n 19 python experiments/long_context.py --manual_dir DIR_WITH_input.txt \\
      --tfds_data_dir TFDS_DIR

Writes experiments/results/long_context/: results.json, README.md and loss_vs_position.png.
"""
import functools
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
from matplotlib.figure import Figure

from transformer_jax import decode, sweep, train

NAME = 'long_context'
TITLE = 'Loss far past the training context'
CONFIG = pathlib.Path(__file__).resolve().parent.parent / 'configs' / 'llama_shakespeare.py'
POSITIONS = ('rope', 'sinusoidal', 'none')
TITLES = {'rope': 'RoPE', 'sinusoidal': 'sinusoidal positions', 'none': 'no positions'}
CONTEXTS = 16  # each piece of held-out text is this many training contexts long
SAMPLE = dict(prompt='ROMEO:', max_new_tokens=600, temperature=0.8, seed=0)
QUICK = {'data.name': 'synthetic', 'data.seq_len': 16, 'data.batch_size': 16,
         'data.eval_batch_size': 16, 'data.eval_steps': 2, 'model.width': 32,
         'model.num_layers': 2, 'data.vocab_size': 26, 'training.steps': 6,
         'training.log_every': 2, 'training.eval_every': 6, 'training.checkpoint_every': 6}
QUICK_SAMPLE = dict(prompt='abc', max_new_tokens=40, temperature=0.8, seed=0)
QUICK_ROWS = 4
ROWS_PER_CALL = 4  # forward passes over whole pieces: (4, 1024) keeps the attention matrices small


def sweep_runs() -> list[sweep.SweepRun]:
  return sweep.values('model.positions', POSITIONS, 'positions')


def run(quick: bool = False, workdir: str = f'/tmp/transformer_jax_experiments/{NAME}',
        results_dir: str | None = None, data: dict | None = None,
        command: str = 'long_context.run()', vmap: bool = False) -> dict:
  """Trains (or reads back) each model, measures it, writes the results folder."""
  base = [QUICK if quick else {}, data or {}]
  make_config = lambda r: sweep.config_for(r, CONFIG, *base)
  results = sweep.run_all(sweep_runs(), make_config, workdir, vmap=vmap)
  for run_spec, result in zip(sweep_runs(), results):
    result.update(measure(make_config(run_spec), f'{workdir}/{run_spec.dirname}',
                          QUICK_ROWS if quick else None, QUICK_SAMPLE if quick else SAMPLE))
  return sweep.finish(TITLE, command, results, lambda: report(results, command), figures,
                      results_dir or f'{workdir}/results', quick)


def measure(config, run_dir: str, max_rows: int | None, sample: dict) -> dict:
  """Per-position losses of the run's final parameters on the held-out text, by band, and
  samples with and without the window."""
  trained, params, _ = train.restore_trained(config, run_dir)
  model, vocab = trained.model, trained.data.vocab
  window = config.data.seq_len
  pieces = held_out_pieces(trained.data.task.eval_ids, CONTEXTS * window, max_rows)
  inputs, targets = pieces[:, :-1], pieces[:, 1:]
  whole, banded = forward_logits(model, params, inputs, None), forward_logits(
      model, params, inputs, window)
  cached = decode.forced_logits(model, params, inputs, window=window)
  far = CONTEXTS // 2 * window
  losses = {'whole context': nll(whole, targets), 'window': nll(cached, targets),
            'crop': np.concatenate([np.full((len(inputs), far), np.nan),
                                    nll(crop_logits(model, params, inputs, window, far),
                                        targets[:, far:])], axis=1)}
  return {
      'window': window, 'pieces': len(pieces), 'piece_length': inputs.shape[1],
      'prompt': sample['prompt'],
      'bands': {method: band_means(loss, window) for method, loss in losses.items()},
      'curve': {method: binned(loss, window // 4) for method, loss in losses.items()},
      'cache_vs_banded_max_logit_difference': float(jnp.abs(cached - banded).max()),
      'samples': {label: decode.sample_text(model, params, vocab,
                                            decode.SampleSettings(window=w, **sample))[0]
                  for label, w in (('window', window), ('whole context', 0))},
  }


def held_out_pieces(ids: np.ndarray, length: int, max_rows: int | None) -> np.ndarray:
  """Consecutive pieces of length + 1 tokens (inputs and targets), a multiple of ROWS_PER_CALL."""
  rows = len(ids) // (length + 1) // ROWS_PER_CALL * ROWS_PER_CALL
  rows = rows if max_rows is None else min(rows, max_rows)
  if rows == 0:
    raise ValueError(f'The held-out text has {len(ids)} tokens, fewer than {ROWS_PER_CALL} '
                     f'pieces of {length + 1}.')
  return ids[:rows * (length + 1)].reshape(rows, length + 1)


@functools.partial(jax.jit, static_argnames=('model', 'window'))
def _forward(model, params, inputs, window):
  slots = np.arange(inputs.shape[1])
  band = None if window is None else (slots[None, :] > slots[:, None] - window)[None, None]
  return model.apply({'params': params}, inputs, attention_mask=band)


def forward_logits(model, params, inputs, window: int | None) -> jax.Array:
  """The uncached forward pass over whole pieces, ROWS_PER_CALL at a time; with `window`, under
  a banded causal mask (each position sees its last `window` tokens)."""
  return jnp.concatenate([_forward(model, params, inputs[i:i + ROWS_PER_CALL], window)
                          for i in range(0, len(inputs), ROWS_PER_CALL)])


@functools.partial(jax.jit, static_argnames='model')
def _last_logits(model, params, contexts):
  return model.apply({'params': params}, contexts)[:, -1]


def crop_logits(model, params, inputs, window: int, start: int) -> jax.Array:
  """(rows, T - start, V): the logits at each position from `start` on, each from a forward pass
  over its last `window` tokens alone, at positions 0..window - 1."""
  ends = np.arange(start, inputs.shape[1])
  contexts = ends[:, None] - window + 1 + np.arange(window)
  return jnp.stack([_last_logits(model, params, row[contexts]) for row in inputs])


def nll(logits, targets) -> np.ndarray:
  log_probs = jax.nn.log_softmax(logits.astype(jnp.float32))
  return np.asarray(-jnp.take_along_axis(log_probs, jnp.asarray(targets)[..., None], -1)[..., 0])


def band_means(loss: np.ndarray, window: int) -> dict[str, float]:
  """Mean loss over positions [0, W), [W, 2W), [2W, 4W), ... [CONTEXTS W / 2, CONTEXTS W),
  leaving out bands that were not measured (NaN)."""
  edges = [0] + [window * 2 ** k for k in range(CONTEXTS.bit_length())]
  return {f'{a}-{b - 1}': float(loss[:, a:b].mean()) for a, b in zip(edges, edges[1:])
          if not np.isnan(loss[:, a:b]).any()}


def binned(loss: np.ndarray, size: int) -> list[float | None]:
  means = loss.reshape(loss.shape[0], -1, size).mean(axis=(0, 2))
  return [None if np.isnan(m) else float(m) for m in means]


def report(results: list[dict], command: str) -> str:
  window, length = results[0]['window'], results[0]['piece_length']
  model = ('The reference character LM (configs/llama_shakespeare.py: 4 blocks, width 128, 600 '
           'steps of batch 32 on TinyShakespeare)')
  lines = [f'# {TITLE}', '',
           f'{model}, trained on {window}-character windows, with RoPE, sinusoidal or no '
           f'positions. Held-out text in {results[0]["pieces"]} consecutive pieces of '
           f'{length} characters, teacher-forced; mean loss (nats per character) by position. '
           f'"window": through the sliding-window cache of {window} slots, one token per step '
           f'(decode.forced_logits); "crop": each position recomputed from its last {window} '
           'characters alone (nanoGPT); "whole context": every earlier character.', '',
           f'Command: `{command}`', '',
           f'Machine time: {sweep.machine_seconds(results) / 60:.1f} min of training over '
           f'{len(results)} runs.', '']
  bands = list(results[0]['bands']['whole context'])
  lines += ['| positions | held-out loss (training) | method | ' + ' | '.join(bands) + ' |',
            '|---|---|---|' + '---|' * len(bands)]
  for r in results:
    for method, values in r['bands'].items():
      cells = ' | '.join('' if b not in values else f'{values[b]:.3f}' for b in bands)
      lines.append(f'| {r["overrides"]["model.positions"]} | {r["eval_loss"]:.3f} | {method} | '
                   f'{cells} |')
  differences = ', '.join(f'{r["overrides"]["model.positions"]} '
                          f'{r["cache_vs_banded_max_logit_difference"]:.1e}' for r in results)
  lines += ['', 'Largest logit difference between the window cache and the forward pass under '
            f'a banded causal mask: {differences}.', '',
            sweep.figure_markdown('loss_vs_position', 'Teacher-forced held-out loss by position '
                                  'in the piece for each positional encoding: the whole context, '
                                  'the window cache and cropping (grey: the training context).'),
            '']
  for r in results:
    for label, text in r['samples'].items():
      lines += [f'## Sample, {r["overrides"]["model.positions"]}, {label}', '', '```',
                r['prompt'] + text, '```', '']
  return '\n'.join(lines)


def curves(results: list[dict]) -> Figure:
  figure = Figure(figsize=(4.5 * len(results), 3.6))
  axes = figure.subplots(1, len(results), sharey=True, squeeze=False)[0]
  styles = {'whole context': dict(color='#dc2626'), 'window': dict(color='#2563eb'),
            'crop': dict(color='#16a34a', ls=':')}
  for ax, r in zip(axes, results):
    size = r['window'] // 4
    for method, values in r['curve'].items():
      centres = [size * (i + 0.5) for i, v in enumerate(values) if v is not None]
      ax.plot(centres, [v for v in values if v is not None], label=method, **styles[method])
    ax.axvline(r['window'], color='grey', lw=0.8)
    ax.set_xscale('log')
    ax.set_title(TITLES[r['overrides']['model.positions']])
    ax.set_xlabel('position in the piece')
  axes[0].set_ylabel('held-out loss (nats per character)')
  axes[0].legend(fontsize=8, frameon=False)
  figure.suptitle('Teacher-forced loss by position; grey: the training context', y=1.02)
  return figure


def figures(payload: dict) -> dict[str, Figure]:
  """From results.json's content: the loss by position of every run."""
  return {'loss_vs_position': curves(payload['runs'])}


def main(argv=None):
  sweep.main(NAME, run, argv, figures)


if __name__ == '__main__':
  main()
