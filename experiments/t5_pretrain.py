"""Does span-corruption pre-training help a small T5 on a text-to-text task?

A small T5 (configs/t5_small.py's T5 1.0 block: RMS norms, ReLU, relative position biases, no
biases; here 4 + 4 blocks of width 128, 4 heads, hidden 512) with a byte-level BPE of 1,024 ids
(100 of them sentinels) trained on the first half of TinyShakespeare pre-trains with span
corruption (Raffel et al. 2020: noise density 0.15, mean span 3, inputs of 64 tokens) on that
half for PRETRAIN_STEPS. It is then fine-tuned on a text-to-text task made from the second half's
lines, 'reverse words: w1 w2 ... wn' -> 'wn ... w1' (lines of 2 to 8 words; the last 10% of the
text held out), against the same model fine-tuned from scratch (the same tokenizer, steps,
batches and seed). Reported: held-out loss and greedy exact match of each after FINETUNE_STEPS.

  python experiments/t5_pretrain.py --quick
  nice -n 5 python experiments/t5_pretrain.py --manual_dir DIR

DIR holds TinyShakespeare's input.txt. Writes experiments/results/t5_pretrain/: results.json,
README.md (the table) and t5_pretrain.png (the curves of both phases); `--plot_only` draws the
figure again from results.json.
"""
import os
import pathlib

import jax
from matplotlib.figure import Figure
import numpy as np

from transformer_jax import data, sweep
from transformer_jax.data import corpus, seq2seq, span_corruption_task, text_data, text_to_text
from transformer_jax.errors import ConfigError

NAME = 't5_pretrain'
TITLE = 'Span-corruption pre-training of a small T5 against training from scratch'
CONFIG = pathlib.Path(__file__).resolve().parent.parent / 'configs' / 't5_small.py'
PRETRAIN_STEPS, FINETUNE_STEPS = 600, 300
PREFIX = 'reverse words: '
MAX_WORDS = 8
# The optimizer its results were measured with, AdamW at 1e-3 with cosine decay, rather than
# configs/t5_small.py's T5 recipe (Adafactor, the inverse square root over 10^4 steps).
ADAMW = {'optimizer.name': 'adamw', 'optimizer.schedule': 'cosine', 'optimizer.learning_rate': 1e-3,
         'optimizer.warmup_steps': 0, 'optimizer.weight_decay': 0.1,
         'optimizer.grad_clip_norm': 1.0, 'training.z_loss': 0.0,
         'training.loss_normalizing_factor': None}
MODEL = {**ADAMW, 'model.width': 128, 'model.num_layers': 4, 'model.num_decoder_layers': 4,
         'model.num_heads': 4, 'model.d_ff': 512, 'model.vocab_size': 1024,
         'model.dropout_rate': 0.0, 'model.max_len': 64, 'data.name': 'text_file',
         'data.batch_size': 32, 'data.eval_batch_size': 32}
PRETRAIN = {'data.task': 'span_corruption', 'data.tokenizer': 'bpe', 'data.vocab_size': 1024,
            'data.seq_len': 64, 'data.eval_steps': 8, 'training.steps': PRETRAIN_STEPS,
            'training.eval_every': PRETRAIN_STEPS, 'training.checkpoint_every': PRETRAIN_STEPS,
            'training.log_every': 50}
FINETUNE = {'data.task': 'reverse_words', 'data.seq_len': 32, 'data.exact_match_examples': 256,
            'data.eval_steps': 8, 'optimizer.warmup_steps': 30,
            'training.steps': FINETUNE_STEPS, 'training.eval_every': 100,
            'training.checkpoint_every': FINETUNE_STEPS, 'training.log_every': 25}
QUICK = {'model.width': 32, 'model.num_layers': 1, 'model.num_decoder_layers': 1,
         'model.num_heads': 2, 'model.d_ff': 64, 'model.vocab_size': 400, 'data.vocab_size': 400,
         'data.num_sentinels': 20, 'data.batch_size': 8, 'data.eval_batch_size': 8,
         'data.eval_steps': 1, 'data.exact_match_examples': 8, 'data.seq_len': 32}
QUICK_STEPS = {'training.steps': 3, 'training.eval_every': 3, 'training.checkpoint_every': 3,
               'training.log_every': 1, 'optimizer.warmup_steps': 1}


class ReverseWordsTask(text_to_text.TokenPairsTask):
  """The text-to-text pairs of a corpus's lines of 2 to MAX_WORDS words: PREFIX + the line ->
  its words in reverse order, then EOS, both tokenized with the run's tokenizer; lines whose
  pair does not fit data.seq_len are left out. text_to_text.TokenPairsTask's batches and exact
  match of the first data.exact_match_examples held-out pairs."""

  def __init__(self, train_lines, held_out_lines, tokenizer, *, seq_len: int, seed: int,
               exact_match_examples: int):
    def pairs(lines: list[str]) -> tuple[list, list]:
      lines = [line.split() for line in lines if 2 <= len(line.split()) <= MAX_WORDS]
      sources = tokenizer.encode_batch([PREFIX + ' '.join(words) for words in lines])
      targets = [ids + [tokenizer.eos_id] for ids in
                 tokenizer.encode_batch([' '.join(reversed(words)) for words in lines])]
      kept = [i for i in range(len(lines))
              if len(sources[i]) <= seq_len and len(targets[i]) <= seq_len]
      if not kept:
        raise ConfigError(f'No line of 2 to {MAX_WORDS} words fits data.seq_len={seq_len}: '
                          'raise it.')
      return [sources[i] for i in kept], [targets[i] for i in kept]

    super().__init__(tokenizer, pairs(train_lines), pairs(held_out_lines), seq_len=seq_len,
                     seed=seed, exact_match_examples=exact_match_examples)


def make_reverse_words(settings, seed: int, tokenizer_dir, vocab_size=None, **unused):
  """ReverseWordsTask of the text source data.name, tokenized by data.tokenizer."""
  del unused
  train, held_out = corpus.open_corpus(settings, settings.name)
  tokenizer = text_data.resolve_tokenizer(settings, train, held_out, mask=False, separated=True,
                                          vocab_size=vocab_size, saved_dir=tokenizer_dir)
  lines = lambda split: [line for document in split.documents() for line in document.split('\n')]
  return ReverseWordsTask(
      lines(train), lines(held_out), tokenizer, seq_len=settings.seq_len, seed=seed,
      exact_match_examples=settings.part(seq2seq.Seq2SeqSettings).exact_match_examples)


data.register_task(data.Task('reverse_words', make_reverse_words, span_corruption_task.SOURCES,
                             layout='seq2seq'))


def smoke_text() -> str:
  """Lines of 2 to 8 random words of a small lexicon, a blank line after each, for --quick."""
  generator = np.random.default_rng(0)
  words = ['to', 'be', 'or', 'not', 'that', 'is', 'the', 'question', 'whether', 'tis', 'nobler']
  return '\n\n'.join(' '.join(generator.choice(words, generator.integers(2, 9)))
                     for _ in range(1500))


def finetune_runs(pretrain_dir: str) -> list[sweep.SweepRun]:
  """The fine-tuning runs: from the pre-trained checkpoint, and from scratch."""
  return [sweep.SweepRun('pretrained', overrides=(('init_from_checkpoint', pretrain_dir),)),
          sweep.SweepRun('scratch')]


def exact_match(result: dict) -> float | None:
  last = result['eval_curve'][-1] if result['eval_curve'] else {}
  return last.get('eval_exact_match')


def run(quick: bool = False, workdir: str = f'/tmp/transformer_jax_experiments/{NAME}',
        results_dir: str | None = None, data_flags: dict | None = None,
        command: str = 't5_pretrain.run()', vmap: bool = False) -> dict:
  """Pre-trains (or reads the run back), fine-tunes both ways, writes the results folder."""
  del vmap  # two runs of different initializations: nothing to group
  texts = sweep.text_halves(NAME, smoke_text() if quick else None, workdir, data_flags or {})
  # The quick settings last: they shrink both phases.
  shrunk = [QUICK, QUICK_STEPS] if quick else []
  tokens = {'data.token_dir': f'{workdir}/tokens'}
  pretrain_run = sweep.SweepRun('pretrain', overrides=(('data.path', texts['pretrain']),))
  (pretrained,) = sweep.run_all(
      [pretrain_run], lambda r: sweep.config_for(r, CONFIG, MODEL, PRETRAIN, *shrunk, tokens),
      workdir)
  pretrain_dir = f'{workdir}/{pretrain_run.dirname}'
  start = {'data.path': texts['finetune'],
           'data.tokenizer': f'{pretrain_dir}/tokenizer/tokenizer.json'}
  results = sweep.run_all(
      finetune_runs(pretrain_dir),
      lambda r: sweep.config_for(r, CONFIG, MODEL, FINETUNE, *shrunk, tokens, start), workdir)
  return sweep.finish(TITLE, command, results, lambda: report(pretrained, results, command),
                      figures, results_dir or f'{workdir}/results', quick, pretrain=pretrained)


def report(pretrained: dict, results: list[dict], command: str) -> str:
  lines = [f'# {TITLE}', '', __doc__.split('\n\n')[1].replace('\n', ' '), '',
           f'Command: `{command}`', '',
           f'Pre-training: {pretrained["steps"]} steps, held-out span-corruption loss '
           f'{pretrained["eval_loss"]:.4f}.', '',
           '| fine-tuned from | steps | held-out loss | exact match |', '|---|---|---|---|']
  for result in results:
    lines.append(f'| {result["name"]} | {result["steps"]} | {result["eval_loss"]:.4f} | '
                 f'{exact_match(result):.3f} |')
  by_name = {result['name']: result for result in results}
  change = by_name['pretrained']['eval_loss'] - by_name['scratch']['eval_loss']
  lines += ['', f'Pre-training {"lowers" if change < 0 else "raises"} the held-out fine-tuning '
            f'loss by {abs(change):.4f} nats per token.', '',
            f'Machine: {os.cpu_count()} CPU cores, jax {jax.__version__}, shared with other jobs. '
            f'Wall time: {pretrained["train_seconds"] / 60:.1f} min of pre-training, '
            f'{sweep.machine_seconds(results) / 60:.1f} min over the {len(results)} fine-tuning '
            'runs.', '',
            sweep.figure_markdown(NAME, 'Left: span-corruption pre-training; middle: the '
                                  'fine-tuning loss, held-out (points) and training (faint), from '
                                  'the pre-trained checkpoint and from scratch; right: their '
                                  'exact match.')]
  return '\n'.join(lines) + '\n'


def figures(payload: dict) -> dict[str, Figure]:
  """From results.json's content: the span-corruption pre-training (left); the fine-tuning
  runs' training and held-out loss (middle) and exact match (right), coloured by where they
  started (the part of a run's name before its first ',', so that seeds share a colour)."""
  figure = Figure(figsize=(14, 4))
  pretrain_ax, loss_ax, match_ax = figure.subplots(1, 3)
  pretrained = payload['pretrain']
  pretrain_ax.plot(*sweep.series(pretrained['train_curve'], 'loss'), color='#9ca3af',
                   label='training (logged mean)')
  pretrain_ax.plot(*sweep.series(pretrained['eval_curve'], 'eval_loss'), 'o', color='black',
                   label='held-out')
  pretrain_ax.set(xlabel='step', ylabel='span-corruption loss (nats per token)',
                  title='Pre-training')
  pretrain_ax.legend(fontsize=8, frameon=False)
  colours = {'pretrained': '#2563eb', 'scratch': '#dc2626'}
  labelled = set()
  for result in payload['runs']:
    start = result['name'].split(',')[0]
    colour = colours.setdefault(start, f'C{len(colours)}')
    label = None if start in labelled else start
    labelled.add(start)
    loss_ax.plot(*sweep.series(result['train_curve'], 'loss'), color=colour, alpha=0.35, lw=1)
    loss_ax.plot(*sweep.series(result['eval_curve'], 'eval_loss'), 'o-', color=colour,
                 label=label)
    match_ax.plot(*sweep.series(result['eval_curve'], 'eval_exact_match'), 'o-', color=colour,
                  label=label)
  loss_ax.set(xlabel='fine-tuning step', ylabel='loss (nats per token)',
              title='Fine-tuning: held-out (points), training (faint)')
  match_ax.set(xlabel='fine-tuning step', ylabel='exact match (held-out, greedy)',
               ylim=(-0.03, 1.03), title='Fine-tuning: exact match')
  for ax in (loss_ax, match_ax):
    ax.legend(fontsize=8, frameon=False, title='fine-tuned from', title_fontsize=8)
  return {NAME: figure}


def main(argv=None):
  sweep.main(NAME, run, argv, figures)


if __name__ == '__main__':
  main()
