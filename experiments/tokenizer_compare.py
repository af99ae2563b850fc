"""Characters against byte-level BPEs at the same training FLOPs, in held-out bits per byte.

The reference character LM (configs/llama_shakespeare.py: 4 blocks, width 128, batch 32 of 64
tokens, constant learning rate 3e-3) trains on a UTF-8 text file (its first 90%; the rest is held
out) three ways: on characters for --steps steps, and on byte-level BPEs of --vocab_sizes ids
trained on the training text. A BPE's larger table costs more in the head (2 * width * vocab
FLOPs per token, from the accounting module), so each BPE run takes the number of steps whose
training FLOPs (3 x forward, steps x batch x seq_len tokens) match the character run's, rounded to
a whole step. The held-out loss is in nats per token of each run's own tokenizer;
eval_bits_per_byte (the summed loss in bits over the UTF-8 bytes of the scored targets) is what
compares them. A BPE token holds several bytes, so at equal FLOPs a BPE run sees more text.

  python experiments/tokenizer_compare.py --text FILE --workdir DIR

Writes experiments/results/tokenizer_compare/: results.json, README.md and tokenizer_compare.png
(bits per byte against training FLOPs); `--plot_only` draws the figure again from results.json.
"""
import json
import math
import pathlib

from absl import app, flags
from matplotlib.figure import Figure

from transformer_jax import accounting, models, sweep
from transformer_jax.data.vocab import Vocab

NAME = 'tokenizer_compare'
TITLE = 'Characters and byte-level BPEs at the same training FLOPs'
CONFIG = pathlib.Path(__file__).resolve().parent.parent / 'configs' / 'llama_shakespeare.py'
QUICK = {'data.eval_steps': 2, 'training.log_every': 2}
QUICK_STEPS = 6
_TEXT = flags.DEFINE_string('text', None, 'The UTF-8 text file: its first 90% trains, the rest '
                            'is held out.')
_STEPS = flags.DEFINE_integer('steps', 600, 'Training steps of the character run.')
_VOCAB_SIZES = flags.DEFINE_list('vocab_sizes', ['512', '2048'], 'Ids of each trained BPE.')


def train_flops_per_step(config) -> int:
  """3 x the forward FLOPs of a batch of data.seq_len-token examples."""
  forward = accounting.forward_flops(models.model_config(config.model), config.data.seq_len)
  return 3 * forward['total'] * config.data.batch_size


def matched_steps(config, budget: float) -> int:
  """The whole number of steps whose training FLOPs come nearest `budget`."""
  return max(1, round(budget / train_flops_per_step(config)))


def tokenizer_runs(chars: int, vocab_sizes) -> list[sweep.SweepRun]:
  """Characters (a table of `chars` rows, the text's own), then a BPE of each size. The data's
  size is set with the model's: the config's data.vocab_size (TinyShakespeare's 65 characters)
  would otherwise size the BPE, and refuse another text's characters."""
  sizes = {'chars': ('chars', chars), **{f'bpe{size}': ('bpe', size) for size in vocab_sizes}}
  return sweep.named({name: {'data.tokenizer': kind, 'data.vocab_size': size,
                             'model.vocab_size': size} for name, (kind, size) in sizes.items()})


def with_steps(config, steps: int):
  """One evaluation and one checkpoint, at the last step."""
  return sweep.override(config, {'training.steps': steps, 'training.eval_every': steps,
                                 'training.checkpoint_every': steps})


def token_info(token_dir: str) -> dict:
  """The training split's info.json (num_tokens, num_bytes, seconds) of a run's token folder."""
  (info,) = pathlib.Path(token_dir).glob('text_file-train-*/info.json')
  return json.loads(info.read_text())


def measured(result: dict, config) -> dict:
  """What a run saw and cost, beside its held-out loss and bits per byte."""
  info = token_info(config.data.token_dir)
  tokens = result['steps'] * config.data.batch_size * config.data.seq_len
  bytes_per_token = info['num_bytes'] / info['num_tokens']
  last_eval = result['eval_curve'][-1] if result['eval_curve'] else {}
  return {'vocab_size': config.model.vocab_size, 'tokens_seen': tokens,
          'bytes_per_token': bytes_per_token, 'bytes_seen': tokens * bytes_per_token,
          'train_flops': result['steps'] * train_flops_per_step(config),
          'eval_bits_per_byte': last_eval.get('eval_bits_per_byte')}


def run(quick: bool, workdir: str, results_dir: str, data: dict, command: str, *, text: str,
        steps: int, vocab_sizes, vmap: bool = False) -> dict:
  """Trains (or reads back) the character run and the FLOP-matched BPE runs, writes the results."""
  base = {**data, **(QUICK if quick else {}), 'data.name': 'text_file', 'data.path': text}
  runs = tokenizer_runs(Vocab.of_text(pathlib.Path(text).read_text('utf-8')).size, vocab_sizes)

  def config_of(spec: sweep.SweepRun):
    config = sweep.config_for(spec, CONFIG, base,
                              {'data.token_dir': f'{workdir}/tokens/{spec.dirname}'})
    return with_steps(config, matched_steps(config, budget))
  chars = with_steps(sweep.config_for(runs[0], CONFIG, base), QUICK_STEPS if quick else steps)
  budget = chars.training.steps * train_flops_per_step(chars)
  results = sweep.run_all(runs, config_of, workdir, vmap=vmap)
  for result, spec in zip(results, runs):
    result.update(measured(result, config_of(spec)))
  return sweep.finish(TITLE, command, results, lambda: report(results, command), figures,
                      results_dir, quick, budget_flops=budget)


def report(results: list[dict], command: str) -> str:
  lines = [f'# {TITLE}', '', __doc__.split('\n\n')[1].replace('\n', ' '), '',
           f'Command: `{command}`', '',
           'Measured on a 2-core x86_64 machine, no accelerator, with other work running beside '
           f'it: {sweep.machine_seconds(results) / 60:.1f} min over {len(results)} runs. '
           'Wall time includes compiling, training each BPE and tokenizing the text.', '',
           '| tokenizer | vocabulary | steps | tokens seen | bytes per token | bytes seen | '
           'training FLOPs | held-out loss (nats/token) | held-out bits per byte | wall time |',
           '|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|']
  for r in results:
    bpb = '-' if r['eval_bits_per_byte'] is None else f'{r["eval_bits_per_byte"]:.4f}'
    loss = '-' if r['eval_loss'] is None else f'{r["eval_loss"]:.4f}'
    lines.append(f'| {r["name"]} | {r["vocab_size"]:,} | {r["steps"]:,} | {r["tokens_seen"]:,} '
                 f'| {r["bytes_per_token"]:.3f} | {r["bytes_seen"]:,.0f} | '
                 f'{r["train_flops"]:.4g} | {loss} | {bpb} | {r["train_seconds"]:.0f} s |')
  lines += ['', sweep.figure_markdown(NAME, 'Each run\'s training loss in bits per byte (nats '
                                      'per token / ln 2 / the training split\'s bytes per token) '
                                      'against its training FLOPs, and its held-out bits per '
                                      'byte at the end (diamonds).')]
  return '\n'.join(lines) + '\n'


def figures(payload: dict) -> dict[str, Figure]:
  """From results.json's content: each run's training loss in bits per byte against its
  training FLOPs (nats per token / ln 2 / the training split's bytes per token: the batches'
  bytes taken at the split's mean), and its held-out bits per byte at the end."""
  figure = Figure(figsize=(6.5, 4.2))
  ax = figure.subplots()
  for number, r in enumerate(payload['runs']):
    steps, losses = sweep.series(r['train_curve'], 'loss')
    flops_per_step = r['train_flops'] / r['steps']
    ax.plot([step * flops_per_step for step in steps],
            [loss / math.log(2) / r['bytes_per_token'] for loss in losses], color=f'C{number}',
            label=f'{r["name"]} ({r["vocab_size"]:,} ids): training')
    if r['eval_bits_per_byte'] is not None:
      # Hollow markers of decreasing size: runs that end alike stay visible.
      ax.plot(r['train_flops'], r['eval_bits_per_byte'], 'D', color=f'C{number}', mfc='none',
              ms=11 - 3 * (number % 3),
              label=f'{r["name"]}: held-out, {r["eval_bits_per_byte"]:.3f}')
  ax.set(xlabel='training FLOPs',
         ylabel='bits per byte (lines: training batches; diamonds: held-out text)',
         title='Characters and byte-level BPEs at the same training FLOPs')
  ax.legend(fontsize=8, frameon=False)
  return {NAME: figure}


def main(argv=None):
  def run_flags(*args, **keywords):
    if not _TEXT.value:
      raise app.UsageError('--text=FILE: the UTF-8 text file to train and evaluate on.')
    words = f' --text TEXT_FILE --steps {_STEPS.value} --vocab_sizes {",".join(_VOCAB_SIZES.value)}'
    *rest, command = args
    return run(*rest, command + words, text=_TEXT.value, steps=_STEPS.value,
               vocab_sizes=[int(size) for size in _VOCAB_SIZES.value], **keywords)
  sweep.main(NAME, run_flags, argv, figures)


if __name__ == '__main__':
  main()
