"""Memory of a run on a JSONL corpus of documents, for corpora of several sizes, and the rate of
tokenization.

  python experiments/text_memory.py --text FILE --workdir DIR

Cuts the text file into documents at blank lines (paragraphs) and writes them as JSONL corpora
of --copies times the text (copy k > 0 appends ' (k)' to each document, so that no two copies
tokenize alike), then trains the reference LM (configs/llama_shakespeare.py, batch 32 of 64
tokens) on each through launch.py in a fresh process: a byte-level BPE of --vocab_size ids
trained on the training documents, packed rows (data.packing), every tenth document held out,
--steps steps and one evaluation of --eval_steps batches. Reports that process's peak resident
memory (ru_maxrss, which counts the pages of the memory-mapped token files it touched) and its
peak anonymous memory (heap, sampled from /proc) beside the corpus's size and its token files'
size on disk, and the rate at which the training documents were tokenized (from the token
folder's info.json). A benchmark,
not a test: it prints figures and writes experiments/results/text_memory/ (results.json,
README.md's tables, keeping its reading, and text_memory.png: memory and tokenization rate
against the corpus's size); `--plot_only` draws the figure again from results.json.
"""
import json
import pathlib
import re
import sys
import time

from absl import app, flags
from matplotlib.figure import Figure

from peak_memory import peak_memory_mib
from transformer_jax import sweep

NAME = 'text_memory'
ROOT = pathlib.Path(__file__).resolve().parent.parent
# --workdir (where the corpora and the runs go) and --results are sweep's flags.
_TEXT = flags.DEFINE_string('text', None, 'The UTF-8 text file to cut into documents.')
_COPIES = flags.DEFINE_list('copies', ['1', '10', '100'], 'Copies of the text in each corpus.')
_STEPS = flags.DEFINE_integer('steps', 200, 'Training steps of each run.')
_EVAL_STEPS = flags.DEFINE_integer('eval_steps', 20, 'Held-out batches of the evaluation (the '
                                   'same for every corpus).')
_VOCAB_SIZE = flags.DEFINE_integer('vocab_size', 512, 'Ids of the trained BPE.')


def documents(text: str) -> list[str]:
  """The paragraphs of `text`: the pieces between blank lines, stripped, none empty."""
  return [piece.strip() for piece in re.split(r'\n\s*\n', text) if piece.strip()]


def write_corpus(paragraphs: list[str], copies: int, path: pathlib.Path) -> int:
  """`copies` copies of the paragraphs as JSONL records {'text': ...}; returns the file's bytes."""
  with open(path, 'w', encoding='utf-8') as out:
    for copy in range(copies):
      suffix = f' ({copy})' if copy else ''
      for paragraph in paragraphs:
        out.write(json.dumps({'text': paragraph + suffix}) + '\n')
  return path.stat().st_size


def launch_command(corpus: pathlib.Path, workdir: pathlib.Path, steps: int, eval_steps: int,
                   vocab_size: int) -> list[str]:
  return [sys.executable, str(ROOT / 'launch.py'), f'--config={ROOT}/configs/llama_shakespeare.py',
          f'--workdir={workdir / "run"}', '--config.data.name=jsonl',
          f'--config.data.path={corpus}', '--config.data.tokenizer=bpe',
          f'--config.data.vocab_size={vocab_size}', '--config.data.packing=True',
          f'--config.data.token_dir={workdir / "tokens"}', f'--config.data.eval_steps={eval_steps}',
          f'--config.training.steps={steps}', f'--config.training.eval_every={steps}',
          f'--config.training.checkpoint_every={steps}']


def token_files(token_dir: pathlib.Path) -> dict:
  """The size on disk of the token folders, and the training split's tokenization rate."""
  disk = sum(f.stat().st_size for f in token_dir.glob('jsonl-*/*') if f.name != 'info.json')
  (info_file,) = token_dir.glob('jsonl-train-*/info.json')
  info = json.loads(info_file.read_text())
  seconds = max(info['seconds'], 1e-9)
  return {'token_files_mib': disk / 2**20, 'train_tokens': info['num_tokens'],
          'train_documents': info['num_documents'], 'train_mb': info['num_bytes'] / 1e6,
          'tokenize_seconds': info['seconds'], 'mb_per_second': info['num_bytes'] / 1e6 / seconds,
          'tokens_per_second': info['num_tokens'] / seconds}


def measure(paragraphs: list[str], copies: int, workdir: pathlib.Path) -> dict:
  """Writes the corpus of `copies` copies, trains on it in a fresh process, measures both."""
  if workdir.exists():  # cached tokens or a resumed run would measure nothing
    raise app.UsageError(f'{workdir} exists: give a new --workdir.')
  workdir.mkdir(parents=True)
  corpus = workdir / 'corpus.jsonl'
  corpus_bytes = write_corpus(paragraphs, copies, corpus)
  began = time.monotonic()
  memory = peak_memory_mib(launch_command(corpus, workdir, _STEPS.value, _EVAL_STEPS.value,
                                          _VOCAB_SIZE.value))
  return {'copies': copies, 'documents': copies * len(paragraphs),
          'corpus_mib': corpus_bytes / 2**20, **memory,
          'process_seconds': time.monotonic() - began, **token_files(workdir / 'tokens')}


def table(rows: list[dict]) -> str:
  lines = ['| copies | documents | corpus (JSONL) | token files | peak resident memory | peak '
           'anonymous memory | training split tokenized | rate |',
           '|---:|---:|---:|---:|---:|---:|---:|---:|']
  for r in rows:
    lines.append(f'| {r["copies"]} | {r["documents"]:,} | {r["corpus_mib"]:,.1f} MiB | '
                 f'{r["token_files_mib"]:,.1f} MiB | {r["peak_rss_mib"]:,.0f} MiB | '
                 f'{r["peak_anon_mib"]:,.0f} MiB | '
                 f'{r["train_tokens"]:,} tokens in {r["tokenize_seconds"]:.1f} s | '
                 f'{r["mb_per_second"]:.2f} MB/s, {r["tokens_per_second"]:,.0f} tokens/s |')
  return '\n'.join(lines)


def report(rows: list[dict], command: str) -> str:
  first, last = rows[0], rows[-1]
  growth = last['peak_rss_mib'] - first['peak_rss_mib']
  anon = last['peak_anon_mib'] - first['peak_anon_mib']
  return '\n'.join([
      '# Memory and tokenization rate of a run on a corpus of documents', '',
      __doc__.split('\n\n', 2)[2].rsplit(' A benchmark', 1)[0].replace('\n', ' '), '',
      f'Command: `{command}`', '',
      'Measured on a 2-core x86_64 machine, no accelerator.', '',
      table(rows), '',
      f'{last["copies"] / first["copies"]:g} times the corpus ({last["corpus_mib"]:,.1f} against '
      f'{first["corpus_mib"]:,.1f} MiB of JSONL): {growth:+,.0f} MiB of peak resident memory '
      f'({growth / first["peak_rss_mib"]:+.1%}), {anon:+,.0f} MiB of peak anonymous memory '
      f'({anon / first["peak_anon_mib"]:+.1%}).', '',
      sweep.figure_markdown(NAME, 'Left: the run\'s peak resident and anonymous memory, and its '
                            'token files\' size, against the corpus\'s size; right: the rate '
                            'at which the training split was tokenized.'), ''])


def figures(payload: dict) -> dict[str, Figure]:
  """From results.json's content: the peak memories and the token files' size (left) and the
  tokenization rate (right) against the corpus's size."""
  rows = payload['rows']
  corpus = [r['corpus_mib'] for r in rows]
  figure = Figure(figsize=(10, 4))
  memory_ax, rate_ax = figure.subplots(1, 2)
  for key, label, style in (('peak_rss_mib', 'peak resident memory', 'o-'),
                            ('peak_anon_mib', 'peak anonymous memory (heap)', 's-'),
                            ('token_files_mib', 'token files on disk', 'x--')):
    memory_ax.plot(corpus, [r[key] for r in rows], style, label=label)
  memory_ax.set(xscale='log', xlabel='corpus (JSONL, MiB)', ylabel='MiB', ylim=(0, None),
                title='Memory of the run against the corpus')
  memory_ax.legend(fontsize=8, frameon=False)
  rate_ax.plot(corpus, [r['mb_per_second'] for r in rows], 'o-', color='#2563eb')
  rate_ax.set(xscale='log', xlabel='corpus (JSONL, MiB)', ylim=(0, None),
              ylabel='training split tokenized (MB of text per second)', title='Tokenization rate')
  return {NAME: figure}


def run(quick: bool, workdir: str, results_dir: str, data: dict, command: str,
        vmap: bool = False) -> None:
  """Measures a run on each corpus, prints each row and the table, writes the results folder."""
  del data, command, vmap  # the corpora are made here; the command is written with placeholders
  if quick:
    raise app.UsageError(f'{NAME} measures memory at full size: it has no --quick setting.')
  if not _TEXT.value:
    raise app.UsageError('--text=FILE: the UTF-8 text file to cut into documents.')
  paragraphs = documents(pathlib.Path(_TEXT.value).read_text('utf-8'))
  rows = []
  for copies in map(int, _COPIES.value):
    rows.append(measure(paragraphs, copies, pathlib.Path(workdir) / f'copies_{copies}'))
    print(json.dumps(rows[-1]), flush=True)
  command = (f'python experiments/text_memory.py --text TEXT_FILE --workdir DIR --copies '
             f'{",".join(_COPIES.value)} --steps {_STEPS.value} --eval_steps {_EVAL_STEPS.value} '
             f'--vocab_size {_VOCAB_SIZE.value}')
  payload = {'command': command, 'rows': rows}
  sweep.write_results(results_dir, payload, report(rows, command), figures(payload))
  print(table(rows))


def main(argv=None):
  sweep.main(NAME, run, argv, figures)


if __name__ == '__main__':
  main()
