"""Sweeps as data, run through the library: what the scripts under experiments/ share.

A sweep is a list of `SweepRun`s (each a name, the config file's argument string and overrides
of config keys; a train.Run is what one of them builds). `values` (one key over values), `args`
(config argument strings) and `named` (named sets of overrides) build axes; `product` crosses
them, as big_vision's sweeps do. `run_all` trains each run in its own workdir with
`run.run`: a finished run is read back instead of repeated, one that stopped midway resumes
from its latest checkpoint. `summary` reads a run's metrics.jsonl (`series` reads a curve of it
back for a plot), and `write_results` writes an experiment's results folder: results.json,
README.md and PNG plots. An experiment draws its plots from its results.json's content, so that
`--plot_only` draws them again from the stored file without training (`redraw`).
A results README is the generated report followed by its reading, written by hand under
`READING`: a rerun rewrites the report and keeps the reading, which the figures may then outdate.
"""
import dataclasses
import functools
import itertools
import json
import logging
import os
import pathlib
import re
import shlex
import statistics
import sys
import time
from typing import Any, Callable, Iterable, Mapping

from absl import app, flags
import jax
import ml_collections

from transformer_jax import config_lib, errors, run as run_lib
from transformer_jax.data import builders
from transformer_jax.train import checkpoint, cpu_runtime, metrics, vmapped

__all__ = [
    'args', 'config_for', 'CURVE_KEYS', 'curves', 'DATA_FLAGS', 'figure_markdown', 'finish',
    'machine', 'machine_seconds', 'main', 'named', 'override', 'parse_flags', 'product',
    'READING', 'redraw', 'RESULTS_FILE', 'run_all', 'series', 'SMOKE_NOTE', 'smoke_report',
    'STATUS_FILE', 'summary', 'SweepRun', 'text_halves', 'train_once', 'values', 'write_figures',
    'write_readme', 'write_results']

log = logging.getLogger(__name__)

STATUS_FILE = 'sweep.json'
RESULTS_FILE = 'results.json'
READING = '## What it shows'  # the heading of a results README's hand-written part
CURVE_KEYS = ('step', 'loss', 'accuracy', 'grad_norm', 'learning_rate')  # of each training row


@dataclasses.dataclass(frozen=True)
class SweepRun:
  """One point of a sweep: get_config(arg) of the experiment's config file, then overrides."""
  name: str
  arg: str = ''
  overrides: tuple[tuple[str, Any], ...] = ()

  @property
  def dirname(self) -> str:
    """The name with every character a path or a shell would trip on replaced by '_'."""
    return re.sub(r'[^A-Za-z0-9_.,=+-]', '_', self.name)


def values(key: str, options: Iterable, label: str | None = None) -> list[SweepRun]:
  """One config key over `options`: runs named 'label=value' (label: the key's last part)."""
  label = label or key.rpartition('.')[2]
  return [SweepRun(f'{label}={value}', overrides=((key, value),)) for value in options]


def args(strings: Iterable[str]) -> list[SweepRun]:
  """Config argument strings ('variant=S/4'), each a run named by its string."""
  return [SweepRun(string, arg=string) for string in strings]


def named(runs: Mapping[str, Mapping[str, Any]]) -> list[SweepRun]:
  """{name: {dotted key: value}} as runs."""
  return [SweepRun(name, overrides=tuple(overrides.items())) for name, overrides in runs.items()]


def product(*axes: list[SweepRun]) -> list[SweepRun]:
  """Every combination of one run per axis, the first axis varying slowest; names join with ','
  and so do argument strings (the syntax of config_lib.parse_arg)."""
  runs = []
  for combination in itertools.product(*axes):
    runs.append(SweepRun(','.join(r.name for r in combination if r.name),
                    ','.join(r.arg for r in combination if r.arg),
                    sum((r.overrides for r in combination), ())))
  dirnames = [r.dirname for r in runs]
  repeated = sorted({d for d in dirnames if dirnames.count(d) > 1})
  if repeated:
    raise ValueError(f'Runs would share the workdirs {repeated}: give the axes distinct names.')
  return runs


def override(config: ml_collections.ConfigDict, overrides: Mapping[str, Any]):
  """Sets dotted keys ('model.width') in place; a key the config lacks fails, as a flag would."""
  for key, value in overrides.items():
    *sections, name = key.split('.')
    section = functools.reduce(lambda c, s: c[s], sections, config)
    if name not in section:
      raise KeyError(f'Unknown config key {key!r}: it is not among {sorted(section.keys())}.')
    section[name] = value
  return config


def config_for(run: SweepRun, config_file, *base: Mapping[str, Any]) -> ml_collections.ConfigDict:
  """get_config(run.arg) of `config_file`, then each mapping of `base`, then the run's overrides."""
  config = config_lib.from_file(config_file, run.arg or None)
  for overrides in (*base, dict(run.overrides)):
    override(config, overrides)
  return config


def run_all(runs: list[SweepRun], make_config: Callable[[SweepRun], ml_collections.ConfigDict],
            workdir: str, vmap: bool = False) -> list[dict]:
  """Trains the runs, each in workdir/<run.dirname>, skipping finished ones; returns each run's
  name, argument, overrides and `summary`. One after another, or with `vmap` the runs that
  differ only in numbers the program does not depend on (train.vmapped.VMAPPED_KEYS: seeds,
  learning rates, ...) as one jitted program per such group."""
  configs = [make_config(run) for run in runs]
  run_dirs = [os.path.join(workdir, run.dirname) for run in runs]
  if vmap:
    _train_grouped(runs, configs, run_dirs)
  else:
    for number, (run, config, run_dir) in enumerate(zip(runs, configs, run_dirs), 1):
      log.info('Run %d of %d: %s', number, len(runs), run.name)
      train_once(config, run_dir)
  return [{'name': run.name, 'arg': run.arg, 'overrides': dict(run.overrides),
           **summary(run_dir)} for run, run_dir in zip(runs, run_dirs)]


def train_once(config: ml_collections.ConfigDict, run_dir: str) -> None:
  """Trains with run.run, unless run_dir already holds this config's finished (or diverged) run.

  A loss that turns NaN or Inf ends the run as 'diverged': an outcome to report, not an error.
  The status, the wall time of the call that finished it and the load average go to
  run_dir/sweep.json.
  """
  if _finished(config, run_dir):
    return
  start, load = time.time(), os.getloadavg()
  error = None
  try:
    run_lib.run(config, run_dir, 'train')
  except FloatingPointError as exception:
    error = str(exception)
    log.warning('%s diverged: %s', run_dir, error)
  _write_status(config, run_dir, error, time.time() - start, load)


def _train_grouped(runs: list[SweepRun], configs, run_dirs: list[str]) -> None:
  """The runs not yet finished, trained as vmapped.groups of them (a group of one alone)."""
  pending = [i for i, (c, d) in enumerate(zip(configs, run_dirs)) if not _finished(c, d)]
  for group in vmapped.groups([configs[i] for i in pending]):
    members = [pending[i] for i in group]
    if len(members) == 1:
      log.info('Training %s alone (no other run differs from it in vmapped numbers only).',
               runs[members[0]].name)
      train_once(configs[members[0]], run_dirs[members[0]])
      continue
    log.info('Training %d runs as one program: %s.', len(members),
             ', '.join(runs[i].name for i in members))
    start, load = time.time(), os.getloadavg()
    outcomes = vmapped.train_group([configs[i] for i in members],
                                   [run_dirs[i] for i in members])
    seconds = time.time() - start
    for i, error in zip(members, outcomes):
      _write_status(configs[i], run_dirs[i], error, seconds / len(members), load,
                    group_size=len(members), group_seconds=seconds)


def _finished(config, run_dir: str) -> bool:
  """Whether run_dir holds this config's finished (or diverged) run; a run of another config
  there is refused."""
  _check_same_config(config, run_dir)
  status_path = os.path.join(run_dir, STATUS_FILE)
  if os.path.exists(status_path):
    log.info('%s already %s; reading it back.', run_dir, _read_json(status_path)['status'])
    return True
  return False


def _write_status(config, run_dir: str, error: str | None, seconds: float, load, **extra):
  """run_dir/sweep.json of a run that ended: finished, or diverged with `error`. A run that a
  SIGTERM stopped before its last step has ended nothing: the sweep stops, to be rerun."""
  reached = checkpoint.latest_step(run_dir)
  if error is None and (reached or 0) < config.training.steps:
    raise errors.UserError(f'The sweep was stopped (SIGTERM) with {run_dir} at step {reached}: '
                           'run the same command again to resume it from its checkpoints.')
  with open(os.path.join(run_dir, STATUS_FILE), 'w') as f:
    json.dump({'status': 'diverged' if error else 'finished', 'error': error,
               'train_seconds': seconds, 'load_average_start': load[0],
               'load_average_end': os.getloadavg()[0], **extra}, f)


def _check_same_config(config, run_dir: str) -> None:
  saved = config_lib.saved_config(run_dir)
  differing = config_lib.differing_keys(saved, config) if saved else []
  if differing:
    raise ValueError(f'{run_dir} holds a run of another config (differing keys: {differing}): '
                     'delete that folder, or choose another --workdir.')


def _read_json(path: str):
  with open(path) as f:
    return json.load(f)


def curves(run_dir: str) -> tuple[list[dict], list[dict]]:
  """The training rows and the evaluation rows of a run's metrics.jsonl, each by step.

  metrics.jsonl is appended to, so a resumed run repeats the steps after its checkpoint: the
  later row of a step wins.
  """
  train_rows, eval_rows = {}, {}
  for row in metrics.read_metrics(run_dir):
    (eval_rows if 'eval_loss' in row else train_rows)[row['step']] = row
  return [train_rows[s] for s in sorted(train_rows)], [eval_rows[s] for s in sorted(eval_rows)]


def summary(run_dir: str) -> dict:
  """A run's status and final metrics, its training and eval curves (`curves`; the training
  rows' CURVE_KEYS) and its throughput. examples_per_sec is the median over the logged windows,
  leaving out the first (it pays for warm-up) where there are others.
  """
  train_curve, eval_curve = curves(run_dir)
  rates = [row['examples_per_sec'] for row in train_curve if 'examples_per_sec' in row]
  status = _read_json(os.path.join(run_dir, STATUS_FILE))
  last_eval = eval_curve[-1] if eval_curve and status['status'] == 'finished' else {}
  return {
      **status,
      'steps': train_curve[-1]['step'] if train_curve else 0,
      'final_loss': train_curve[-1]['loss'] if train_curve else None,
      'eval_loss': last_eval.get('eval_loss'),
      'eval_accuracy': last_eval.get('eval_accuracy'),
      'examples_per_sec': statistics.median(rates[1:] or rates) if rates else None,
      'train_curve': [{k: row[k] for k in CURVE_KEYS if k in row} for row in train_curve],
      'eval_curve': eval_curve,
  }


def series(rows: list[dict], key: str, x: str = 'step') -> tuple[list, list]:
  """(x values, `key` values) of the rows of a curve (a summary's train_curve or eval_curve)
  that hold `key`: the points of one line of a plot."""
  held = [row for row in rows if row.get(key) is not None]
  return [row[x] for row in held], [row[key] for row in held]


SMOKE_NOTE = ('A smoke run (--quick): a few steps of tiny models on synthetic data, which checks '
              'that training, evaluation, the report and the plots work end to end. Its numbers '
              'describe nothing, and no conclusion is drawn from them: run the script without '
              '--quick for the experiment.')


def smoke_report(title: str, results: list[dict], command: str) -> str:
  """The README of a --quick run: what it is, the command and each run's outcome, nothing else."""
  lines = [f'# {title}: smoke run', '', SMOKE_NOTE, '', f'Command: `{command}`', '',
           '| run | status | steps | final training loss | held-out loss |',
           '|---|---|---|---|---|']
  for r in results:
    held_out = '-' if r['eval_loss'] is None else f'{r["eval_loss"]:.3f}'
    final = '-' if r['final_loss'] is None else f'{r["final_loss"]:.3f}'
    lines.append(f'| {r["name"]} | {r["status"]} | {r["steps"]} | {final} | {held_out} |')
  return '\n'.join(lines) + '\n'


def figure_markdown(name: str, caption: str) -> str:
  """A results README's lines that show figure <name>.png and say in one line what it shows."""
  return f'![{name}]({name}.png)\n\n{caption}'


def finish(title: str, command: str, results: list[dict], report: Callable[[], str],
           figures: Callable[[dict], Mapping[str, Any]], results_dir: str, quick: bool,
           **extra) -> dict:
  """An experiment's last step: its README (`report()`, or the smoke report of a --quick run),
  results.json ({command, runs, **extra}) and figures written to `results_dir`; returns them.
  `figures`: the experiment's function from results.json's content to {name: matplotlib
  Figure}, given the payload as read back from JSON: the data --plot_only redraws."""
  markdown = smoke_report(title, results, command) if quick else report()
  payload = {'command': command, 'runs': results, **extra}
  drawn = figures(json.loads(json.dumps(payload)))
  write_results(results_dir, payload, markdown, drawn, smoke=quick)
  return {'runs': results, **extra, 'markdown': markdown, 'figures': drawn}


def write_results(results_dir, payload: dict, markdown: str, figures: Mapping[str, Any],
                  smoke: bool = False) -> None:
  """results.json (payload), README.md (markdown, followed by the reading of the README it
  replaces unless `smoke`) and the figures (write_figures)."""
  results_dir = pathlib.Path(results_dir)
  results_dir.mkdir(parents=True, exist_ok=True)
  (results_dir / RESULTS_FILE).write_text(json.dumps(payload, indent=1) + '\n')
  if smoke:
    (results_dir / 'README.md').write_text(markdown)
  else:
    write_readme(results_dir, markdown)
  write_figures(results_dir, figures, smoke)
  log.info('Results in %s', results_dir)


def write_figures(results_dir, figures: Mapping[str, Any], smoke: bool = False) -> list:
  """Each matplotlib Figure as results_dir/<name>.png (a smoke run's saying so across its top);
  returns the paths."""
  paths = []
  for name, figure in figures.items():
    if smoke:
      figure.suptitle('Smoke run (--quick): tiny models on synthetic data, no conclusions',
                      color='#b91c1c')
    paths.append(pathlib.Path(results_dir) / f'{name}.png')
    figure.savefig(paths[-1], dpi=120, bbox_inches='tight')
  return paths


def redraw(results_dir, figures: Callable[[dict], Mapping[str, Any]],
           smoke: bool = False) -> list:
  """--plot_only: the figures of results_dir/results.json drawn again by the experiment's
  `figures` function, without training; README.md and results.json stay as they are."""
  path = pathlib.Path(results_dir) / RESULTS_FILE
  if not path.exists():
    raise errors.UserError(f'--plot_only draws from {path}, which does not exist: run the '
                           'experiment first, or point --results at its results folder.')
  paths = write_figures(results_dir, figures(_read_json(path)), smoke)
  log.info('Figures drawn from %s: %s', path, ', '.join(p.name for p in paths))
  return paths


def write_readme(results_dir, report: str) -> None:
  """results_dir/README.md: `report` (which ends with a newline), then the hand-written reading
  (from `READING` to the end) of the README it replaces, if that had one."""
  path = pathlib.Path(results_dir) / 'README.md'
  previous = path.read_text() if path.exists() else ''
  start = previous.find(f'\n{READING}\n')
  path.write_text(report if start < 0 else f'{report}{previous[start:]}')


def text_halves(name: str, text: str | None, workdir: str, data_flags: dict) -> dict[str, str]:
  """{'pretrain': path, 'finetune': path}: `text` (None: TinyShakespeare's input.txt, from the
  folder data_flags['data.manual_dir']) cut at the first blank line after its middle, so that no
  speech is split, each half written into workdir/data (rewritten only where it changed).
  Raises ConfigError naming experiment `name`'s flag where the file is missing."""
  if text is None:
    source = builders.find_shakespeare(data_flags.get('data.manual_dir'))
    if source is None:
      raise errors.ConfigError(f'{name} reads TinyShakespeare from --manual_dir DIR, a folder '
                               f'holding {builders.SHAKESPEARE_FILE}.')
    text = source.read_text(encoding='utf-8')
  cut = text.index('\n\n', len(text) // 2) + 2
  paths = {}
  for part, part_text in (('pretrain', text[:cut]), ('finetune', text[cut:])):
    path = pathlib.Path(workdir, 'data', f'{part}.txt')
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text(encoding='utf-8') != part_text:
      path.write_text(part_text, encoding='utf-8')
    paths[part] = str(path)
  return paths


def machine() -> dict:
  """Where an experiment ran, for its report: {'cpu': the processor's model name, 'cores': the
  CPUs this process sees, 'jax': its version}."""
  return {'cpu': metrics.cpu_model(), 'cores': os.cpu_count(), 'jax': jax.__version__}


def machine_seconds(results: list[dict]) -> float:
  """Wall seconds the sweep's runs took to train (as recorded when each finished)."""
  return sum(r['train_seconds'] for r in results)


_QUICK = flags.DEFINE_bool('quick', False, 'The whole pipeline on tiny settings and synthetic '
                           'data, in seconds.')
_VMAP = flags.DEFINE_bool('vmap', False, 'Train the runs that differ only in numbers the '
                          'program does not depend on (seeds, learning rates, ...) as one '
                          'vmapped program per group (train.vmapped).')
_WORKDIR = flags.DEFINE_string('workdir', None, 'Where the runs (checkpoints, metrics) go. '
                               'Default: /tmp/transformer_jax_experiments/NAME[-quick].')
_RESULTS = flags.DEFINE_string('results', None, 'The results folder. Default: '
                               'experiments/results/NAME, or WORKDIR/results with --quick.')
_PLOT_ONLY = flags.DEFINE_bool('plot_only', False, 'Only draw the figures again, from the '
                                'results folder\'s results.json (nothing trains).')
_MANUAL_DIR = flags.DEFINE_string('manual_dir', None, 'config.data.manual_dir: local files to '
                                  'prepare the dataset from.')
_TFDS_DATA_DIR = flags.DEFINE_string('tfds_data_dir', None, 'config.data.tfds_data_dir (outside '
                                     'the repository).')
# Where the data lies on one machine means nothing on another: the command written into the
# results names these flags with a placeholder.
DATA_FLAGS = {'manual_dir': 'DIR', 'tfds_data_dir': 'TFDS_DIR'}


def parse_flags(name: str, argv=None) -> dict:
  """The flags every experiment script takes, from `argv` (default: the command line): quick,
  vmap, plot_only, workdir, results, data (the data-location overrides) and command (the command
  line as written into the results)."""
  argv = sys.argv[1:] if argv is None else list(argv)
  app.define_help_flags()
  flags.FLAGS.unparse_flags()  # a second parse in one process starts from the defaults
  app.parse_flags_with_usage([f'experiments/{name}.py', *argv])
  root = pathlib.Path(__file__).resolve().parent.parent
  workdir = (_WORKDIR.value
             or f'/tmp/transformer_jax_experiments/{name}' + '-quick' * _QUICK.value)
  results = _RESULTS.value or (os.path.join(workdir, 'results') if _QUICK.value
                               else str(root / 'experiments' / 'results' / name))
  words = ['--quick'] * _QUICK.value + ['--vmap'] * _VMAP.value
  for flag in (_WORKDIR, _RESULTS, _MANUAL_DIR, _TFDS_DATA_DIR):
    if flag.present:
      words += [f'--{flag.name}', DATA_FLAGS.get(flag.name, flag.value)]
  nice = 'nice -n 19 ' if os.nice(0) >= 19 else ''
  return {'quick': _QUICK.value, 'vmap': _VMAP.value, 'plot_only': _PLOT_ONLY.value,
          'workdir': workdir, 'results': results,
          'data': {f'data.{flag.name}': flag.value for flag in (_MANUAL_DIR, _TFDS_DATA_DIR)
                   if flag.value},
          'command': f'{nice}python experiments/{name}.py {shlex.join(words)}'.strip()}


def main(name: str, run: Callable, argv=None, figures: Callable | None = None) -> None:
  """An experiment script's entry point: its flags, logging, then run(quick, workdir, results,
  data, command, vmap=vmap); with --plot_only, redraw(results, figures) instead."""
  parsed = parse_flags(name, argv)
  run_lib.configure_logging()
  logging.basicConfig(level=logging.INFO, format='%(asctime)s %(message)s')
  if parsed['plot_only']:
    if figures is None:
      raise app.UsageError(f'{name} draws no figures: --plot_only has nothing to draw.')
    redraw(parsed['results'], figures, smoke=parsed['quick'])
    return
  # Steps run as launch.py runs them (inline dispatch, freed memory kept mapped), so that an
  # experiment's seconds are a user's.
  cpu_runtime.configure()
  run(parsed['quick'], parsed['workdir'], parsed['results'], parsed['data'], parsed['command'],
      vmap=parsed['vmap'])
