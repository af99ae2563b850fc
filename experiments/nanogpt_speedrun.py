"""nanoGPT's CPU recipe beside nanoGPT itself, and a speedrun past it, on TinyShakespeare's
characters.

In each of --sittings sittings, one after another and in turn: nanoGPT's own train.py with the
flags of its README's CPU run (where --nanogpt_dir names a checkout of karpathy/nanoGPT),
configs/gpt_shakespeare.py:recipe=nanogpt (the same recipe here) and :recipe=speedrun (the
record: the least wall time to a held-out 1.88), ours at seed 0 in the first sitting, 1 in the
second and so on (nanoGPT's seed is its code's 1337). Every held-out loss is the mean over the 1,742
windows of 64 characters that tile the last 10% of TinyShakespeare; nanoGPT's trained model (its
checkpoint after the 2,000 updates) is scored on the same windows, beside its own estimate (20
batches of 12 random windows). The seconds are those of the training steps: ours the step times
of the logged windows (no compilation, no evaluation), nanoGPT's the times it prints for each of
its 2,000 updates, an iteration that also evaluated counted at the median of the others. Each
sitting runs the three in turn, so that a shared machine's changing load falls on each; the
ratio of a run's seconds to nanoGPT's of the same sitting is the figure to read.

  python experiments/nanogpt_speedrun.py --quick
  python experiments/nanogpt_speedrun.py --manual_dir DIR --tfds_data_dir TFDS_DIR \\
      --nanogpt_dir NANOGPT

DIR holds TinyShakespeare's input.txt; NANOGPT a checkout of karpathy/nanoGPT, whose
data/shakespeare_char is prepared from DIR's input.txt where it is not yet (its prepare.py,
which downloads nothing once input.txt is there). Writes experiments/results/nanogpt_speedrun/:
results.json, README.md and nanogpt_speedrun.png (held-out loss against seconds and steps);
--plot_only draws the figure again from results.json.
"""
import importlib.util
import json
import os
import pathlib
import re
import shutil
import statistics
import subprocess
import sys
import time

from absl import flags
from matplotlib.figure import Figure
import numpy as np

from transformer_jax import config_lib, sweep
from transformer_jax.data import builders
from transformer_jax.errors import ConfigError

NAME = 'nanogpt_speedrun'
TITLE = "nanoGPT's CPU recipe, and a speedrun past it"
ROOT = pathlib.Path(__file__).resolve().parent.parent
CONFIG = ROOT / 'configs' / 'gpt_shakespeare.py'
TARGET = 1.88  # the held-out loss nanoGPT's README reports for this run
RECIPES = ('nanogpt', 'speedrun')
# nanoGPT's README: "python train.py config/train_shakespeare_char.py --device=cpu
# --compile=False --eval_iters=20 --log_interval=1 --block_size=64 --batch_size=12 --n_layer=4
# --n_head=4 --n_embd=128 --max_iters=2000 --lr_decay_iters=2000 --dropout=0.0".
NANOGPT_FLAGS = ('config/train_shakespeare_char.py', '--device=cpu', '--compile=False',
                 '--eval_iters=20', '--log_interval=1', '--block_size=64', '--batch_size=12',
                 '--n_layer=4', '--n_head=4', '--n_embd=128', '--max_iters=2000',
                 '--lr_decay_iters=2000', '--dropout=0.0')
# nanogpt() adds, changing nothing it computes: where it writes, and a checkpoint at every
# evaluation (its default keeps the best one only), so that the model scored is that after its
# 2,000th update (the evaluation at iteration 2,000 comes before the 2,001st update its loop
# takes).
NANOGPT_UPDATES = 2000
QUICK = {'data.name': 'synthetic', 'data.seq_len': 16, 'data.batch_size': 8,
         'data.eval_batch_size': 8, 'data.eval_steps': 2, 'model.width': 32,
         'model.num_heads': 2, 'model.num_layers': 1, 'model.max_len': 16,
         'training.steps': 6, 'training.eval_every': 3, 'training.checkpoint_every': 6,
         'training.log_every': 3, 'optimizer.warmup_steps': 1}

_NANOGPT_DIR = flags.DEFINE_string('nanogpt_dir', None, "A checkout of karpathy/nanoGPT: its "
                                   "train.py runs in each sitting beside ours (none: ours only).")
_SITTINGS = flags.DEFINE_integer('sittings', 2, 'Sittings, each running every run once in turn.')
_BURSTS = flags.DEFINE_integer('bursts', 0, 'Then time the steps alone in this many interleaved '
                               'bursts of --burst_steps steps of each run (for a loaded machine, '
                               'where whole runs time the load).')
_BURST_STEPS = flags.DEFINE_integer('burst_steps', 50, 'Steps in each burst.')
_TIME_WORKER = flags.DEFINE_string('time_worker', None, "Internal: serve --bursts as the timing "
                                   "worker of a run ('nanoGPT', 'nanogpt', 'speedrun').")


# Ours.

def ours(recipe: str, sitting: int, workdir: str, base: list[dict]) -> dict:
  """Trains (or reads back) configs/gpt_shakespeare.py:recipe=`recipe` at seed sitting - 1 in
  workdir and returns its summary with the seconds of its steps."""
  run = sweep.SweepRun(f'{recipe} #{sitting}', arg=f'recipe={recipe}',
                       overrides=(('seed', sitting - 1),))
  run_dir = os.path.join(workdir, run.dirname)
  config = sweep.config_for(run, CONFIG, *base)
  sweep.train_once(config, run_dir)
  result = {'name': run.name, 'side': 'ours', 'recipe': recipe, 'sitting': sitting,
            'seed': config.seed, 'arg': run.arg, **sweep.summary(run_dir)}
  train_rows, _ = sweep.curves(run_dir)
  elapsed, previous, at_step = 0.0, 0, {0: 0.0}
  for row in train_rows:
    elapsed += row['step_time'] * (row['step'] - previous)
    previous, at_step[row['step']] = row['step'], elapsed
  for row in result['eval_curve']:
    row['seconds'] = at_step.get(row['step'])
  step_times = [row['step_time'] for row in train_rows]
  result.update(step_seconds=elapsed, step_ms=1000 * statistics.median(step_times[1:] or
                                                                         step_times))
  return result


# nanoGPT's own code.

def prepare_nanogpt(nanogpt_dir: pathlib.Path, manual_dir: str | None) -> pathlib.Path:
  """nanoGPT's data/shakespeare_char, prepared by its prepare.py from DIR's input.txt."""
  data_dir = nanogpt_dir / 'data' / 'shakespeare_char'
  if not (data_dir / 'val.bin').exists():
    source = builders.find_shakespeare(manual_dir)
    if source is None:
      raise ConfigError(f"{NAME} prepares nanoGPT's data from --manual_dir DIR, a folder "
                        f'holding {builders.SHAKESPEARE_FILE}.')
    if not (data_dir / 'input.txt').exists():
      shutil.copyfile(source, data_dir / 'input.txt')
    subprocess.run([sys.executable, 'prepare.py'], cwd=data_dir, check=True)
  return data_dir


def nanogpt(nanogpt_dir: pathlib.Path, data_dir: pathlib.Path, sitting: int,
            workdir: str) -> dict:
  """Runs (or reads back) nanoGPT's train.py with its README's CPU flags; its log parsed, its
  trained model scored on our held-out windows."""
  name = f'nanoGPT #{sitting}'
  run_dir = pathlib.Path(workdir, re.sub(r'[^A-Za-z0-9_.,=+-]', '_', name))
  log_path = run_dir / 'train.log'
  status_path = run_dir / sweep.STATUS_FILE
  if not status_path.exists():
    run_dir.mkdir(parents=True, exist_ok=True)
    start, load = time.time(), os.getloadavg()
    with open(log_path, 'w') as log:
      subprocess.run([sys.executable, 'train.py', *NANOGPT_FLAGS, f'--out_dir={run_dir}',
                      '--always_save_checkpoint=True'], cwd=nanogpt_dir, check=True,
                     stdout=log, stderr=subprocess.STDOUT)
    status_path.write_text(json.dumps({'status': 'finished', 'error': None,
                                       'train_seconds': time.time() - start,
                                       'load_average_start': load[0],
                                       'load_average_end': os.getloadavg()[0]}))
  result = {'name': name, 'side': 'nanoGPT', 'recipe': 'nanogpt', 'sitting': sitting,
            'seed': 1337, **json.loads(status_path.read_text()),
            **parse_nanogpt_log(log_path.read_text())}
  result['eval_loss'] = held_out_loss(nanogpt_dir, run_dir / 'ckpt.pt', data_dir)
  return result


def parse_nanogpt_log(text: str) -> dict:
  """Its per-iteration times and losses and its evaluations: the seconds of its first
  NANOGPT_UPDATES updates (an iteration that evaluated first counted at the median of the
  others), each evaluation at the seconds of the updates before it."""
  iterations = {int(i): (float(loss), float(ms) / 1000) for i, loss, ms in re.findall(
      r'^iter (\d+): loss ([\d.]+), time ([\d.]+)ms', text, re.M)}
  evaluations = [(int(i), float(train), float(val)) for i, train, val in re.findall(
      r'^step (\d+): train loss ([\d.]+), val loss ([\d.]+)', text, re.M)]
  updates = range(NANOGPT_UPDATES)
  evaluated = {i for i, _, _ in evaluations}
  median = statistics.median(iterations[i][1] for i in updates if i not in evaluated)
  seconds = np.cumsum([0.0] + [median if i in evaluated else iterations[i][1] for i in updates])
  return {
      'steps': NANOGPT_UPDATES, 'step_seconds': float(seconds[-1]), 'step_ms': 1000 * median,
      'final_loss': iterations[NANOGPT_UPDATES - 1][0],
      'estimate': next(val for i, _, val in evaluations if i == NANOGPT_UPDATES),
      'train_curve': [{'step': i + 1, 'loss': iterations[i][0]} for i in updates],
      'eval_curve': [{'step': i, 'estimate': val, 'seconds': float(seconds[i])}
                     for i, _, val in evaluations if i <= NANOGPT_UPDATES]}


def nanogpt_module(nanogpt_dir: pathlib.Path):
  """nanoGPT's model.py (GPT, GPTConfig), imported from the checkout."""
  spec = importlib.util.spec_from_file_location('nanogpt_model', nanogpt_dir / 'model.py')
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def held_out_loss(nanogpt_dir: pathlib.Path, checkpoint: pathlib.Path,
                  data_dir: pathlib.Path) -> float:
  """nanoGPT's model of `checkpoint` on our held-out windows: the 1,742 windows of 64
  characters that tile its val.bin (the last 10%), in the batches our evaluation takes."""
  import torch  # pylint: disable=g-import-not-at-top
  module = nanogpt_module(nanogpt_dir)
  saved = torch.load(checkpoint, map_location='cpu')
  model = module.GPT(module.GPTConfig(**saved['model_args']))
  model.load_state_dict(saved['model'])
  model.eval()
  config = config_lib.from_file(CONFIG, 'recipe=nanogpt')
  length, batch = config.data.seq_len, config.data.eval_batch_size
  ids = np.fromfile(data_dir / 'val.bin', dtype=np.uint16).astype(np.int64)
  windows = (len(ids) - 1) // length
  losses = []
  with torch.no_grad():
    for first in range(0, windows // batch * batch, batch):
      starts = (first + np.arange(batch))[:, None] * length + np.arange(length + 1)
      rows = torch.from_numpy(ids[starts])
      # Contiguous: its loss views the targets flat.
      losses.append(float(model(rows[:, :-1].contiguous(), rows[:, 1:].contiguous())[1]))
  return float(np.mean(losses))


# The steps alone, timed in interleaved bursts.

WARMUP_STEPS = 10


def nanogpt_step(nanogpt_dir: pathlib.Path, data_dir: pathlib.Path):
  """step() -> seconds of one iteration of nanoGPT's train.py in its README's CPU run (its
  model.py and configure_optimizers; its loop's forward, next batch, backward, clipping, update
  and loss.item() of log_interval=1), from its initialization."""
  import torch  # pylint: disable=g-import-not-at-top
  module = nanogpt_module(nanogpt_dir)
  torch.manual_seed(1337)
  model = module.GPT(module.GPTConfig(n_layer=4, n_head=4, n_embd=128, block_size=64,
                                      bias=False, vocab_size=65, dropout=0.0))
  optimizer = model.configure_optimizers(0.1, 1e-3, (0.9, 0.99), 'cpu')
  train = np.memmap(data_dir / 'train.bin', dtype=np.uint16, mode='r')

  def batch():  # train.py's get_batch('train')
    starts = torch.randint(len(train) - 64, (12,))
    return (torch.stack([torch.from_numpy(train[i:i + 64].astype(np.int64)) for i in starts]),
            torch.stack([torch.from_numpy(train[i + 1:i + 65].astype(np.int64))
                         for i in starts]))
  current = [batch()]

  def step() -> float:
    start = time.perf_counter()
    _, loss = model(*current[0])
    current[0] = batch()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    loss.item()
    return time.perf_counter() - start
  return step


def our_step(recipe: str, base: list[dict]):
  """step() -> seconds of one train step of recipe=`recipe`, its batch from its input pipeline
  (step_timing.timed_step)."""
  import step_timing  # pylint: disable=g-import-not-at-top
  config = sweep.config_for(sweep.SweepRun(recipe, arg=f'recipe={recipe}'), CONFIG, *base)
  timed, count = step_timing.timed_step(config, from_pipeline=True), iter(range(10 ** 9))
  return lambda: timed(next(count))


def serve_bursts(step) -> None:
  """The timing worker: WARMUP_STEPS steps, 'ready', then for each line N on stdin the
  seconds of N steps as a JSON list."""
  for _ in range(WARMUP_STEPS):
    step()
  print('ready', flush=True)
  for line in sys.stdin:
    print(json.dumps([step() for _ in range(int(line))]), flush=True)


def bursts(kinds: list[str], count: int, steps: int, worker_flags: list[str]) -> dict:
  """{'ms': {kind: the median milliseconds a step of each burst}, 'loads': the load average
  after each round}: a worker process per kind (this script with --time_worker), each idle while
  another runs its burst, the order reversed every other round."""
  workers = {kind: subprocess.Popen(
      [sys.executable, __file__, f'--time_worker={kind}', *worker_flags], stdin=subprocess.PIPE,
      stdout=subprocess.PIPE, text=True) for kind in kinds}
  try:
    for kind, worker in workers.items():  # nanoGPT's code prints its sizes before 'ready'
      if not any(line.strip() == 'ready' for line in iter(worker.stdout.readline, '')):
        raise RuntimeError(f'The timing worker of {kind} failed to start (its log above).')
    ms, loads = {kind: [] for kind in kinds}, []
    for round_ in range(count):
      for kind in kinds if round_ % 2 == 0 else kinds[::-1]:
        workers[kind].stdin.write(f'{steps}\n')
        workers[kind].stdin.flush()
        ms[kind].append(1000 * statistics.median(json.loads(workers[kind].stdout.readline())))
      loads.append(os.getloadavg()[0])
  finally:
    for worker in workers.values():
      worker.stdin.close()
      worker.wait()
  return {'ms': ms, 'loads': loads, 'steps': steps}


# The experiment.

def run(quick: bool = False, workdir: str = f'/tmp/transformer_jax_experiments/{NAME}',
        results_dir: str | None = None, data: dict | None = None,
        command: str = f'{NAME}.run()', vmap: bool = False, nanogpt_dir: str | None = None,
        sittings: int = 2, burst_count: int = 0, burst_steps: int = 50) -> dict:
  """Every sitting's runs in turn (nanoGPT's first in odd sittings, last in even ones), then the
  bursts (a --quick run: one of 2 steps); writes the results folder."""
  del vmap  # one run at a time: the runs are timed
  data = data or {}
  base = [QUICK if quick else {}, data]
  theirs = pathlib.Path(nanogpt_dir) if nanogpt_dir and not quick else None
  data_dir = theirs and prepare_nanogpt(theirs, data.get('data.manual_dir'))
  results = []
  for sitting in range(1, (1 if quick else sittings) + 1):
    order = ['theirs', *RECIPES] if sitting % 2 else [*RECIPES, 'theirs']
    for kind in order:
      if kind == 'theirs':
        if theirs:
          results.append(nanogpt(theirs, data_dir, sitting, workdir))
      else:
        results.append(ours(kind, sitting, workdir, base))
  for result in results:
    same = [r for r in results if r['side'] == 'nanoGPT' and r['sitting'] == result['sitting']]
    result['ratio'] = result['step_seconds'] / same[0]['step_seconds'] if same else None
  record = config_lib.differences(
      json.loads(config_lib.from_file(CONFIG, 'recipe=nanogpt').to_json_best_effort()),
      config_lib.from_file(CONFIG, 'recipe=speedrun'))
  extra = {'cpu': sweep.machine()['cpu'], 'target': TARGET, 'record_config': record}
  if quick or burst_count:
    worker_flags = [f'--{key.partition(".")[2]}={value}' for key, value in data.items()]
    worker_flags += [f'--nanogpt_dir={theirs}'] * bool(theirs) + ['--quick'] * quick
    timed = bursts(['nanoGPT'] * bool(theirs) + list(RECIPES), 1 if quick else burst_count,
                   2 if quick else burst_steps, worker_flags)
    extra['bursts'] = {**timed, **burst_summary(timed['ms'], base)}
  return sweep.finish(TITLE, command, results, lambda: report(results, command, extra), figures,
                      results_dir or f'{workdir}/results', quick, **extra)


def burst_summary(ms: dict[str, list[float]], base: list[dict]) -> dict:
  """Each run's milliseconds a step (the median of its bursts' medians), its steps, and the
  ratios of its steps' time (steps x ms a step) to nanoGPT's and to recipe=nanogpt's here."""
  rows = {}
  for kind, times in ms.items():
    steps = NANOGPT_UPDATES if kind == 'nanoGPT' else sweep.config_for(
        sweep.SweepRun(kind, arg=f'recipe={kind}'), CONFIG, *base).training.steps
    median = statistics.median(times)
    rows[kind] = {'ms': median, 'steps': steps, 'seconds': steps * median / 1000}
  for row in rows.values():
    for reference in ('nanoGPT', 'nanogpt'):
      if reference in rows:
        row[f'ratio_to_{reference}'] = row['seconds'] / rows[reference]['seconds']
  return {'summary': rows}


def report(results: list[dict], command: str, extra: dict) -> str:
  lines = [f'# {TITLE}', '',
           "nanoGPT's README trains a character GPT on a CPU in 2,000 steps (4 blocks, width 128, "
           '4 heads, context 64, batch 12) and reports a validation loss of 1.88. Here: its own '
           'code, the same recipe in this codebase (`configs/gpt_shakespeare.py:recipe=nanogpt`, '
           'its docstring lists each setting beside nanoGPT\'s) and the speedrun '
           '(`recipe=speedrun`), in sittings that run the three in turn. Held-out loss: nats per '
           'character over the 1,742 windows of 64 that tile the last 10% of TinyShakespeare '
           "(nanoGPT's trained model scored on the same windows; its own estimate from 20 "
           'random batches of 12 beside it). Seconds: the training steps only (no compilation, '
           'no evaluation); the ratio is to nanoGPT\'s seconds in the same sitting.', '',
           f'Command: `{command}`', '',
           f'Machine: {extra["cpu"]}, {os.cpu_count()} cores (the load column: the 1-minute '
           'load average when each run started and ended).', '',
           '| sitting | run | seed | steps | held-out loss | nanoGPT\'s estimate | '
           'seconds of steps | ms a step | ratio to nanoGPT | load |',
           '|---|---|---|---|---|---|---|---|---|---|']
  for r in results:
    estimate = f'{r["estimate"]:.4f}' if r.get('estimate') is not None else '-'
    ratio = f'{r["ratio"]:.2f}' if r.get('ratio') is not None else '-'
    held_out = f'{r["eval_loss"]:.4f}' if r['eval_loss'] is not None else '-'
    lines.append(f'| {r["sitting"]} | {r["name"]} | {r["seed"]} | {r["steps"]} | {held_out} | '
                 f'{estimate} | '
                 f'{r["step_seconds"]:.1f} | {r["step_ms"]:.1f} | {ratio} | '
                 f'{r["load_average_start"]:.1f} -> {r["load_average_end"]:.1f} |')
  if 'bursts' in extra:
    timed = extra['bursts']
    lines += ['', f'The steps alone, in {len(timed["loads"])} interleaved bursts of '
              f'{timed["steps"]} steps of each run (each in a process of its own, idle while the '
              'others run; nanoGPT\'s iteration as its train.py takes it, ours with the batch '
              'from the input pipeline; load average '
              f'{min(timed["loads"]):.1f} to {max(timed["loads"]):.1f}). A run\'s time: its steps '
              'times the median of its bursts\' median milliseconds a step.', '',
              '| run | ms a step | steps | seconds of steps | ratio to nanoGPT | '
              'ratio to recipe=nanogpt here |', '|---|---|---|---|---|---|']
    for kind, row in timed['summary'].items():
      ratios = [f'{row[key]:.2f}' if key in row else '-'
                for key in ('ratio_to_nanoGPT', 'ratio_to_nanogpt')]
      lines.append(f'| {kind} | {row["ms"]:.1f} | {row["steps"]} | {row["seconds"]:.1f} | '
                   f'{" | ".join(ratios)} |')
  lines += ['', 'The record\'s settings, against `recipe=nanogpt`:', '']
  lines += [f'- `{line}`' for line in extra['record_config']]
  lines += ['', sweep.figure_markdown(NAME, f'Held-out loss against the seconds of training '
                                      f'steps (left) and against the step (right); the dotted '
                                      f'line is {TARGET}. nanoGPT\'s points are its own '
                                      '20-batch estimates, its star its trained model on our '
                                      'held-out windows; dashed lines: the second sitting.')]
  return '\n'.join(lines) + '\n'


COLOURS = {'nanoGPT': '#6b7280', 'nanogpt': '#2563eb', 'speedrun': '#dc2626'}


def figures(payload: dict) -> dict[str, Figure]:
  """From results.json's content: held-out loss against seconds and against steps, every run."""
  figure = Figure(figsize=(11, 4.2))
  by_seconds, by_step = figure.subplots(1, 2, sharey=True)
  for r in payload['runs']:
    kind = 'nanoGPT' if r['side'] == 'nanoGPT' else r['recipe']
    key = 'estimate' if r['side'] == 'nanoGPT' else 'eval_loss'
    label = ("nanoGPT's code (its estimate)" if kind == 'nanoGPT' else
             f'ours, recipe={kind}') if r['sitting'] == 1 else None
    style = dict(color=COLOURS[kind], marker='o', ms=3, lw=1.2, label=label,
                 ls='-' if r['sitting'] % 2 else '--')
    by_seconds.plot(*sweep.series(r['eval_curve'], key, x='seconds'), **style)
    by_step.plot(*sweep.series(r['eval_curve'], key), **style)
    if r['side'] == 'nanoGPT' and r['eval_loss'] is not None:  # its model on our windows
      marker = dict(color=COLOURS[kind], marker='*', ms=9, ls='none',
                    label='nanoGPT\'s model on our held-out windows' if r['sitting'] == 1 else None)
      by_seconds.plot([r['step_seconds']], [r['eval_loss']], **marker)
      by_step.plot([r['steps']], [r['eval_loss']], **marker)
  for ax, xlabel in ((by_seconds, 'seconds of training steps'), (by_step, 'step')):
    ax.axhline(payload['target'], color='black', ls=':', lw=1)
    ax.set_xlabel(xlabel)
  by_seconds.set_ylabel('held-out loss (nats per character)')
  by_seconds.set_ylim(top=2.6)
  by_seconds.legend(fontsize=8, frameon=False)
  figure.suptitle(f"Reaching a held-out {payload['target']} on TinyShakespeare's characters "
                  f"({payload['cpu']})", fontsize=10)
  return {NAME: figure}


def main(argv=None):
  def run_with_flags(quick, workdir, results, data, command, vmap):
    if _TIME_WORKER.value:  # a process of bursts(): serves its steps on stdin and stdout
      kind, base = _TIME_WORKER.value, [QUICK if quick else {}, data]
      if kind == 'nanoGPT':
        nanogpt_dir = pathlib.Path(_NANOGPT_DIR.value)
        step = nanogpt_step(nanogpt_dir, prepare_nanogpt(nanogpt_dir, data.get('data.manual_dir')))
      else:
        step = our_step(kind, base)
      return serve_bursts(step)
    words = ['--nanogpt_dir NANOGPT'] * bool(_NANOGPT_DIR.value)
    words += [f'--{flag.name} {flag.value}' for flag in (_SITTINGS, _BURSTS, _BURST_STEPS)
              if flag.present]
    return run(quick, workdir, results, data, ' '.join([command, *words]), vmap,
               nanogpt_dir=_NANOGPT_DIR.value, sittings=_SITTINGS.value,
               burst_count=_BURSTS.value, burst_steps=_BURST_STEPS.value)
  sweep.main(NAME, run_with_flags, argv, figures)


if __name__ == '__main__':
  main()
