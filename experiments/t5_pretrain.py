"""Does span-corruption pre-training help a small T5 on a text-to-text task? (Raffel et al. 2020,
section 3.1.5: the pre-trained baseline beats training from scratch on every task but
translation.)

A small T5 (configs/t5_small.py's T5 1.0 block: RMS norms, ReLU, relative position biases, no
biases; here 4 + 4 blocks of width 128, 4 heads, hidden 512, 1,969,152 parameters) with a
byte-level BPE of 1,024 ids (100 of them sentinels) trained on the first half of TinyShakespeare
pre-trains with span corruption (noise density 0.15, mean span 3, inputs of 64 tokens, batch 32)
on that half for 4,000 steps, once per seed (0, 1, 2). Each is then fine-tuned on a cloze task
made from the second half's lines, which pre-training never saw: 'fill the blank: ' + a line of
4 to 14 words with one of the training lines' 10 most frequent words blanked -> that word (the
last 10% of the half held out). The pairs are balanced over the words (100 training pairs of
each, the held-out pairs cut to the rarest word's count), so that always answering one word
matches a tenth of them and a higher match reads the line. Beside each, the same model
fine-tuned from scratch with the same tokenizer, steps, batches, dropout stream and seed.
Reported: held-out loss and greedy exact match every 100 of 600 fine-tuning steps, their means
and spreads over the seeds.

T5's recipe (configs/t5_small.py): Adafactor with T5X's settings, a z-loss of 1e-4, the summed
loss divided by batch size x target length; pre-training at T5's inverse square root
1/sqrt(max(step, k)), fine-tuning at T5's constant 1e-3 with dropout 0.1. Adapted to this
budget: k = 2,500 (T5: 10,000 of 524,288 steps), so the rate is 0.02 to step 2,500 and 0.0158 at
step 4,000; no dropout in pre-training (as T5 1.1). Found on the way (one seed): 800 steps of
pre-training (held-out span-corruption loss 3.63) left the cloze's exact match where scratch's
was (0.11-0.16 against 0.12-0.18 over 600 steps; the held-out loss 0.04-0.20 lower), hence
4,000; unbalanced pairs (2,000 drawn as they come) let both starts sit on the commonest word for
hundreds of steps.
  python experiments/t5_pretrain.py --quick
  python experiments/t5_pretrain.py --manual_dir DIR   # about 40 minutes on 2 cores

DIR holds TinyShakespeare's input.txt. Writes experiments/results/t5_pretrain/: results.json,
README.md (the tables) and t5_pretrain.png (the curves of both phases); `--plot_only` draws the
figure again from results.json.
"""
import collections
import os
import pathlib
import re
import statistics

import jax
from matplotlib.figure import Figure
import numpy as np

from transformer_jax import data, sweep
from transformer_jax.data import corpus, seq2seq, span_corruption, span_corruption_task
from transformer_jax.data import text_data, text_to_text
from transformer_jax.data import tokenizer as tokenizer_lib
from transformer_jax.errors import ConfigError
from transformer_jax.train import metrics

NAME = 't5_pretrain'
TITLE = 'Span-corruption pre-training of a small T5 against training from scratch'
CONFIG = pathlib.Path(__file__).resolve().parent.parent / 'configs' / 't5_small.py'
SEEDS = (0, 1, 2)
PRETRAIN_STEPS, FINETUNE_STEPS = 4000, 600
RSQRT_START = 2500  # T5's k of 1/sqrt(max(step, k)): 10,000 of 524,288 steps
PREFIX, BLANK = 'fill the blank: ', tokenizer_lib.sentinel(0)
MIN_WORDS, MAX_WORDS = 4, 14
TARGET_LEN = 8  # tokens of a blanked word and its EOS; longer words are left out
COMMON_WORDS = 10  # the words that may be blanked: the training lines' most frequent
CLOZE_SEED = 1606  # draws the blanked word of each line and the training pairs, for every seed
PER_WORD = 100  # training pairs of each common word
BATCH, SPAN_INPUTS = 32, 64
SPAN_TARGETS = span_corruption.raw_length(SPAN_INPUTS, noise_density=0.15,
                                          mean_noise_span_length=3.0)[1]  # 14
MODEL = {'model.width': 128, 'model.num_layers': 4, 'model.num_decoder_layers': 4,
         'model.num_heads': 4, 'model.d_ff': 512, 'model.vocab_size': 1024,
         'model.max_len': SPAN_INPUTS, 'data.name': 'text_file', 'data.batch_size': BATCH}
PRETRAIN = {'data.task': 'span_corruption', 'data.tokenizer': 'bpe', 'data.vocab_size': 1024,
            'data.seq_len': SPAN_INPUTS, 'data.eval_batch_size': 32, 'data.eval_steps': 8,
            'model.dropout_rate': 0.0, 'optimizer.schedule': 'rsqrt',
            'optimizer.learning_rate': 1.0, 'optimizer.warmup_steps': RSQRT_START,
            'training.loss_normalizing_factor': float(BATCH * SPAN_TARGETS),
            'training.steps': PRETRAIN_STEPS, 'training.eval_every': PRETRAIN_STEPS // 4,
            'training.checkpoint_every': PRETRAIN_STEPS // 4, 'training.log_every': 50}
FINETUNE = {'data.task': 'cloze', 'data.seq_len': 32, 'data.eval_batch_size': 64,
            'data.eval_steps': -1, 'data.exact_match_examples': 1024,
            'training.loss_normalizing_factor': float(BATCH * TARGET_LEN),
            'training.steps': FINETUNE_STEPS, 'training.eval_every': FINETUNE_STEPS // 6,
            'training.checkpoint_every': FINETUNE_STEPS, 'training.log_every': 25}
QUICK = {'model.width': 32, 'model.num_layers': 1, 'model.num_decoder_layers': 1,
         'model.num_heads': 2, 'model.d_ff': 64, 'model.vocab_size': 400, 'data.vocab_size': 400,
         'data.num_sentinels': 20, 'data.batch_size': 8, 'data.eval_batch_size': 8,
         'data.eval_steps': 1, 'data.exact_match_examples': 8, 'data.seq_len': 32}
QUICK_STEPS = {'training.steps': 3, 'training.eval_every': 3, 'training.checkpoint_every': 3,
               'optimizer.warmup_steps': 2,
               'training.log_every': 1}
QUICK_SEEDS = (0,)


class ClozeTask(text_to_text.TokenPairsTask):
  """Text-to-text pairs of a corpus's lines of MIN_WORDS to MAX_WORDS words: PREFIX + the line
  with one of its common words (`cloze_pairs`) replaced by BLANK -> that word, then EOS ('fill
  the blank: To be, or not ___ be: that is the question:' -> 'to'), both tokenized with the
  run's tokenizer; pairs whose input passes data.seq_len or whose target passes TARGET_LEN
  tokens are left out. The pairs are `balanced` over their words (at most `per_word` training
  pairs of each), the same for every run seed. text_to_text.TokenPairsTask's batches, and the
  exact match of the first data.exact_match_examples held-out pairs."""

  def __init__(self, train_lines, held_out_lines, tokenizer, *, seq_len: int, seed: int,
               exact_match_examples: int, per_word: int | None = None):
    common = common_words(train_lines)
    train, held_out = (balanced(*cloze_pairs(lines, common), per_word=count)
                       for lines, count in ((train_lines, per_word), (held_out_lines, None)))
    sides = []
    for sources, targets in (train, held_out):
      sources = tokenizer.encode_batch([PREFIX + source for source in sources])
      targets = [ids + [tokenizer.eos_id] for ids in tokenizer.encode_batch(targets)]
      kept = [i for i in range(len(sources))
              if len(sources[i]) <= seq_len and len(targets[i]) <= TARGET_LEN]
      if not kept:
        raise ConfigError(f'No line of {MIN_WORDS} to {MAX_WORDS} words fits data.seq_len='
                          f'{seq_len}: raise it.')
      sides.append(([sources[i] for i in kept], [targets[i] for i in kept]))
    super().__init__(tokenizer, *sides, seq_len=seq_len, seed=seed,
                     exact_match_examples=exact_match_examples, target_len=TARGET_LEN)
    self.info['common_words'] = len(common)


def balanced(sources: list[str], targets: list[str], per_word: int | None = None):
  """The pairs cut to the same number for every target word (the rarest word's count, at most
  `per_word`), drawn by a fixed shuffle: always answering one word then matches 1 /
  COMMON_WORDS of them, so a match above that reads the line."""
  order = np.random.default_rng(CLOZE_SEED).permutation(len(sources))
  by_word = collections.defaultdict(list)
  for i in order:
    by_word[targets[i].strip()].append(i)
  count = min(len(rows) for rows in by_word.values())
  count = count if per_word is None else min(count, per_word)
  kept = sorted(i for rows in by_word.values() for i in rows[:count])
  return [sources[i] for i in kept], [targets[i] for i in kept]


def _letters(word: str):
  """The match of a word's letters ('be,' -> 'be', "'tis" -> 'tis'), None if it has none."""
  return re.search(r"[A-Za-z](?:[A-Za-z'-]*[A-Za-z])?", word)


def _cloze_lines(lines: list[str]) -> list[list[str]]:
  return [line.split() for line in lines if MIN_WORDS <= len(line.split()) <= MAX_WORDS]


def common_words(lines: list[str]) -> set[str]:
  """The COMMON_WORDS most frequent words (their letters, case kept) of the lines of
  MIN_WORDS to MAX_WORDS words."""
  counts = collections.Counter(found.group() for words in _cloze_lines(lines) for word in words
                               if (found := _letters(word)))
  return {word for word, _ in counts.most_common(COMMON_WORDS)}


def cloze_pairs(lines: list[str], common: set[str]) -> tuple[list[str], list[str]]:
  """(each line of MIN_WORDS to MAX_WORDS words that holds a word of `common`, with one such
  word blanked; that word): the word drawn from the line's common words by (CLOZE_SEED, the
  pair's number). BLANK takes the place of the word's letters and of the space before them, and
  the target keeps that space, as the word's tokens are in running text ('not to be,' ->
  'not<extra_id_0> be,' and ' to'); the punctuation around the letters stays."""
  sources, targets = [], []
  for words in _cloze_lines(lines):
    letters = [_letters(word) for word in words]
    candidates = [i for i, found in enumerate(letters) if found and found.group() in common]
    if not candidates:
      continue
    chosen = candidates[np.random.default_rng((CLOZE_SEED, len(sources))).integers(
        len(candidates))]
    found, word = letters[chosen], words[chosen]
    before = ' '.join(words[:chosen]) + (' ' if chosen else '') + word[:found.start()]
    space = ' ' if before.endswith(' ') else ''
    after = ' '.join([word[found.end():]] + words[chosen + 1:])
    sources.append(before.removesuffix(' ') + BLANK + after)
    targets.append(space + found.group())
  return sources, targets


def cloze_task(settings, train, held_out, tokenizer, seed: int) -> ClozeTask:
  """ClozeTask of the lines of data.name's splits `train` and `held_out`, PER_WORD training
  pairs a word."""
  lines = lambda split: [line for document in split.documents() for line in document.split('\n')]
  return ClozeTask(
      lines(train), lines(held_out), tokenizer, seq_len=settings.seq_len, seed=seed,
      exact_match_examples=settings.part(seq2seq.Seq2SeqSettings).exact_match_examples,
      per_word=PER_WORD)


def make_cloze(settings, seed: int, tokenizer_dir, vocab_size=None, **unused):
  """The cloze task of data.name, tokenized by data.tokenizer (the registered task's maker)."""
  del unused
  train, held_out = corpus.open_corpus(settings, settings.name)
  tokenizer = text_data.resolve_tokenizer(settings, train, held_out, mask=False, separated=True,
                                          vocab_size=vocab_size, saved_dir=tokenizer_dir)
  return cloze_task(settings, train, held_out, tokenizer, seed)


data.register_task(data.Task('cloze', make_cloze, span_corruption_task.SOURCES,
                             layout='seq2seq'))


def smoke_text() -> str:
  """Lines of 2 to 8 random words of a small lexicon, a blank line after each, for --quick."""
  generator = np.random.default_rng(0)
  words = ['to', 'be', 'or', 'not', 'that', 'is', 'the', 'question', 'whether', 'tis', 'nobler']
  return '\n\n'.join(' '.join(generator.choice(words, generator.integers(2, 9)))
                     for _ in range(1500))


def pretrain_runs(texts: dict, seeds) -> list[sweep.SweepRun]:
  """Span-corruption pre-training of each seed on the first half."""
  return [sweep.SweepRun(f'pretrain,seed={seed}',
                         overrides=(('data.path', texts['pretrain']), ('seed', seed)))
          for seed in seeds]


def finetune_runs(texts: dict, pretrain_dirs: dict[int, str]) -> list[sweep.SweepRun]:
  """The fine-tuning runs of each seed (config argument 'finetune': configs/t5_small.py's
  fine-tuning) on the second half: from that seed's pre-trained checkpoint, and from scratch,
  both with its tokenizer."""
  runs = []
  for seed, directory in pretrain_dirs.items():
    common = (('data.path', texts['finetune']), ('seed', seed),
              ('data.tokenizer', f'{directory}/tokenizer/tokenizer.json'))
    runs += [sweep.SweepRun(f'pretrained,seed={seed}', 'finetune',
                            (*common, ('init_from_checkpoint', directory))),
             sweep.SweepRun(f'scratch,seed={seed}', 'finetune', common)]
  return runs


def exact_match(result: dict) -> float | None:
  last = result['eval_curve'][-1] if result['eval_curve'] else {}
  return last.get('eval_exact_match')


def majority_exact_match(tokenizer_path: str, config) -> dict:
  """The exact match of always answering the training pairs' most frequent word, on the
  held-out pairs the runs decode: the floor a model reaches without reading the line."""
  settings = data.DataSettings.of(config.data)
  task = cloze_task(settings, *corpus.open_corpus(settings, settings.name),
                    tokenizer_lib.HFTokenizer.from_file(tokenizer_path), seed=0)
  rows = collections.Counter(map(tuple, task.train['targets']))
  commonest = np.asarray(rows.most_common(1)[0][0])
  held_out_rows = task.held_out['targets'][:task.exact_match_examples]
  return {'word': task.vocab.decode(commonest),
          'exact_match': float(np.mean(np.all(held_out_rows == commonest, axis=1))),
          'train_pairs': int(len(task.train['targets'])),
          'held_out_pairs': int(task.num_eval_examples),
          'decoded_pairs': int(task.exact_match_examples)}


def run(quick: bool = False, workdir: str = f'/tmp/transformer_jax_experiments/{NAME}',
        results_dir: str | None = None, data_flags: dict | None = None,
        command: str = 't5_pretrain.run()', vmap: bool = False) -> dict:
  """Pre-trains each seed (or reads the runs back), fine-tunes each both ways, writes the
  results folder."""
  texts = sweep.text_halves(NAME, smoke_text() if quick else None, workdir, data_flags or {})
  # The quick settings last: they shrink both phases.
  shrunk = [QUICK, QUICK_STEPS] if quick else []
  tokens = {'data.token_dir': f'{workdir}/tokens'}
  seeds = QUICK_SEEDS if quick else SEEDS
  pretrain = pretrain_runs(texts, seeds)
  pretrained = sweep.run_all(
      pretrain, lambda r: sweep.config_for(r, CONFIG, MODEL, PRETRAIN, *shrunk, tokens), workdir)
  pretrain_dirs = {seed: f'{workdir}/{r.dirname}' for seed, r in zip(seeds, pretrain)}
  runs = finetune_runs(texts, pretrain_dirs)
  make_config = lambda r: sweep.config_for(r, CONFIG, MODEL, FINETUNE, *shrunk, tokens)
  results = sweep.run_all(runs, make_config, workdir, vmap=vmap)
  majority = majority_exact_match(
      f'{pretrain_dirs[seeds[0]]}/tokenizer/tokenizer.json', make_config(runs[0]))
  return sweep.finish(TITLE, command, results,
                      lambda: report(pretrained, results, majority, command), figures,
                      results_dir or f'{workdir}/results', quick, pretrain=pretrained,
                      majority=majority)


def by_start(results: list[dict]) -> dict[str, list[dict]]:
  """The runs grouped by where they started: the part of their name before the first ','."""
  groups = {}
  for result in results:
    groups.setdefault(result['name'].split(',')[0], []).append(result)
  return groups


def mean_curve(runs: list[dict]) -> dict[int, tuple[float, float]]:
  """{step: (held-out loss, exact match)} of each evaluation, the mean over the runs."""
  points = collections.defaultdict(list)
  for result in runs:
    for point in result['eval_curve']:
      points[point['step']].append((point['eval_loss'], point['eval_exact_match']))
  return {step: tuple(map(statistics.mean, zip(*values)))
          for step, values in sorted(points.items())}


def spread(values: list[float], digits: int) -> str:
  """'mean ± standard deviation (min to max)' of the seeds' values."""
  deviation = statistics.stdev(values) if len(values) > 1 else 0.0
  return (f'{statistics.mean(values):.{digits}f} ± {deviation:.{digits}f} '
          f'({min(values):.{digits}f} to {max(values):.{digits}f})')


def report(pretrained: list[dict], results: list[dict], majority: dict, command: str) -> str:
  doc = __doc__.split('\n\n')
  lines = [f'# {TITLE}', '', doc[0].replace('\n', ' '), '', doc[1].replace('\n', ' '), '',
           doc[2].split('\n  python')[0].replace('\n', ' '), '', f'Command: `{command}`', '',
           '| pre-training | steps | held-out span-corruption loss |', '|---|---|---|']
  lines += [f'| {r["name"]} | {r["steps"]} | {r["eval_loss"]:.4f} |' for r in pretrained]
  covered = (majority['held_out_pairs'] // FINETUNE['data.eval_batch_size']
             * FINETUNE['data.eval_batch_size'])
  lines += ['', f'Fine-tuning: {majority["train_pairs"]} training pairs, held-out loss over '
            f'the first {covered} of the {majority["held_out_pairs"]} held-out pairs (full '
            f'batches), exact match over the first {majority["decoded_pairs"]} (greedy). '
            f'Always answering the training pairs\' commonest word, {majority["word"]!r}, '
            f'matches {majority["exact_match"]:.3f} of them.', '',
            '| run | steps | held-out loss | exact match |', '|---|---|---|---|']
  lines += [f'| {r["name"]} | {r["steps"]} | {r["eval_loss"]:.4f} | {exact_match(r):.4f} |'
            for r in results]
  groups = by_start(results)
  lines += ['', f'Over the {len(groups["scratch"])} seeds, mean ± standard deviation (min to '
            'max):', '', '| fine-tuned from | held-out loss | exact match |', '|---|---|---|']
  for start, runs in groups.items():
    lines.append(f'| {start} | {spread([r["eval_loss"] for r in runs], 4)} | '
                 f'{spread([exact_match(r) for r in runs], 4)} |')
  lines += ['', 'At each evaluation, the mean over the seeds:', '',
            '| step | held-out loss, pre-trained | scratch | exact match, pre-trained | '
            'scratch |', '|---|---|---|---|---|']
  curves = {start: mean_curve(runs) for start, runs in groups.items()}
  for step, (loss, match) in curves['pretrained'].items():
    scratch_loss, scratch_match = curves['scratch'][step]
    lines.append(f'| {step} | {loss:.4f} | {scratch_loss:.4f} | {match:.4f} | '
                 f'{scratch_match:.4f} |')
  pairs = list(zip(groups['pretrained'], groups['scratch']))
  loss_gain = [s['eval_loss'] - p['eval_loss'] for p, s in pairs]
  match_gain = [exact_match(p) - exact_match(s) for p, s in pairs]
  lines += ['', f'Pre-trained minus scratch, seed by seed: held-out loss '
            f'{", ".join(f"{-g:+.4f}" for g in loss_gain)}; exact match '
            f'{", ".join(f"{g:+.4f}" for g in match_gain)}.', '',
            f'Machine: {metrics.cpu_model()}, {os.cpu_count()} CPU cores, jax {jax.__version__}. '
            f'Wall time: {sweep.machine_seconds(pretrained) / 60:.1f} min over the '
            f'{len(pretrained)} pre-trainings, {sweep.machine_seconds(results) / 60:.1f} min over '
            f'the {len(results)} fine-tunings.', '',
            sweep.figure_markdown(NAME, 'Left: span-corruption pre-training of each seed; '
                                  'middle: the fine-tuning loss, held-out (points) and training '
                                  '(faint), from the pre-trained checkpoints and from scratch; '
                                  'right: their held-out exact match. One line per seed.')]
  return '\n'.join(lines) + '\n'


def figures(payload: dict) -> dict[str, Figure]:
  """From results.json's content: the span-corruption pre-training (left); the
  fine-tuning runs' training and held-out loss (middle) and exact match (right), coloured by
  where they started (the part of a run's name before its first ',', so that seeds share a
  colour)."""
  figure = Figure(figsize=(14, 4))
  pretrain_ax, loss_ax, match_ax = figure.subplots(1, 3)
  for number, pretrained in enumerate(payload['pretrain']):
    first = number == 0
    pretrain_ax.plot(*sweep.series(pretrained['train_curve'], 'loss'), color='#9ca3af',
                     label='training (logged mean)' if first else None)
    pretrain_ax.plot(*sweep.series(pretrained['eval_curve'], 'eval_loss'), 'o', color='black',
                     ms=3, label='held-out' if first else None)
  pretrain_ax.set(xlabel='step', ylabel='span-corruption loss (nats per token)',
                  title=f'Pre-training ({len(payload["pretrain"])} seeds)')
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
  majority = payload.get('majority')
  if majority:
    match_ax.axhline(majority['exact_match'], color='#6b7280', ls='--', lw=1,
                     label=f'always {majority["word"]!r}')
  loss_ax.set(xlabel='fine-tuning step', ylabel='loss (nats per token)',
              title='Fine-tuning: held-out (points), training (faint)')
  match_ax.set(xlabel='fine-tuning step', ylabel='exact match (held-out, greedy)',
               ylim=(0, None), title='Fine-tuning: exact match')
  for ax in (loss_ax, match_ax):
    ax.legend(fontsize=8, frameon=False, title='fine-tuned from', title_fontsize=8)
  return {NAME: figure}


def main(argv=None):
  sweep.main(NAME, run, argv, figures)


if __name__ == '__main__':
  main()
