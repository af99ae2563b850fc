"""A sweep trained as one program (sweep.run_all(vmap=True)) against the same runs one after
another, and the memory of the ablation sweep's vmapped steps compiled for one TPU v5e chip.

Timing: the full model of the ablation sweep (experiments/ablations.py: the reference character
LM with 6 blocks, width 128, batch 32 of 64 characters) at three seed values, TIMED_STEPS steps
each, trained one after another and then as one vmapped program; each run's losses are compared
between the two. Memory: the ablation sweep's 18 runs (6 variants x 3 seed values) fall into 6
groups of 3 (a removed block changes the program, a seed does not); each group's stacked step
and one run's step alone are compiled for a TPU v5e chip (v5e:1x1, 16 GiB) without one, on
generated batches of the same shapes. The compile needs the optional packages of
pip install -e '.[compile]'; without them that part is skipped and the README says so.

  python experiments/vmapped_sweep.py --quick
  nice -n 19 python experiments/vmapped_sweep.py --manual_dir DIR --tfds_data_dir TFDS_DIR

Writes experiments/results/vmapped_sweep/: results.json, README.md and vmapped_sweep.png (each
run's training loss, alone and vmapped).
"""
import importlib.util
import pathlib
import statistics
import sys

from matplotlib.figure import Figure
import numpy as np

from transformer_jax import aot, sweep, targets
from transformer_jax.train import metrics, run_settings, setup, vmapped

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import ablations  # noqa: E402  (the sweep this measures)

NAME = 'vmapped_sweep'
TITLE = 'A sweep trained as one program'
TIMED_STEPS = 200
TARGET = 'v5e:1x1'
FULL = {'training.steps': TIMED_STEPS, 'training.eval_every': TIMED_STEPS,
        'training.checkpoint_every': TIMED_STEPS}
QUICK_SEED_VALUES = (0, 1)


def timed_runs(quick: bool) -> list[sweep.SweepRun]:
  return sweep.product(sweep.named({'full model': {}}),
                       sweep.values('seed', QUICK_SEED_VALUES if quick else ablations.SEED_VALUES))


def run(quick: bool = False, workdir: str = f'/tmp/transformer_jax_experiments/{NAME}',
        results_dir: str | None = None, data: dict | None = None,
        command: str = 'vmapped_sweep.run()', vmap: bool = False) -> dict:
  """Trains the timed runs both ways (or reads them back), compiles the ablation sweep's groups
  for the target where the compile extra is installed, writes the results folder. `vmap` is
  the experiment itself: the flag changes nothing."""
  del vmap
  make_config = lambda r: ablations.run_config(r, quick, {**(data or {}),
                                                          **({} if quick else FULL)})
  runs = timed_runs(quick)
  alone = sweep.run_all(runs, make_config, f'{workdir}/alone')
  together = sweep.run_all(runs, make_config, f'{workdir}/vmapped', vmap=True)
  for result, trained in [(r, 'alone') for r in alone] + [(r, 'vmapped') for r in together]:
    result['trained'] = trained
  timing = timing_table(alone, together)
  memory = compiled_memory(quick)
  return sweep.finish(TITLE, command, alone + together,
                      lambda: report(timing, memory, alone, command), figures,
                      results_dir or f'{workdir}/results', quick, timing=timing, memory=memory)


def timing_table(alone: list[dict], together: list[dict]) -> dict:
  """Wall seconds of the runs one after another and vmapped, and the largest difference of any
  run's logged training loss between the two."""
  differences = [max(abs(a['loss'] - b['loss']) for a, b in zip(x['train_curve'],
                                                                 y['train_curve']))
                 for x, y in zip(alone, together)]
  sequential, stacked = sweep.machine_seconds(alone), together[0]['group_seconds']
  return {'runs': len(alone), 'steps': alone[0]['steps'], 'sequential_seconds': sequential,
          'vmapped_seconds': stacked, 'speedup': sequential / stacked,
          # Training examples per second of every run together, compile and evaluation aside
          # (each run's median over its logged windows): one at a time, or all of them at once.
          'sequential_examples_per_sec': statistics.mean(r['examples_per_sec'] for r in alone),
          'vmapped_examples_per_sec': sum(r['examples_per_sec'] for r in together),
          'largest_loss_difference': max(differences)}


def compiled_memory(quick: bool) -> dict:
  """Per group of the ablation sweep: XLA's bytes per device of its stacked step and of one of
  its runs alone, compiled for TARGET; {'skipped': why} without the compile extra."""
  if importlib.util.find_spec('libtpu') is None:
    return {'skipped': "the compile extra is not installed (pip install -e '.[compile]')"}
  target = targets.target(TARGET)
  specs = ablations.sweep_runs(quick=False)
  configs = [ablations.run_config(spec, quick) for spec in specs]
  rows = []
  for group in vmapped.groups(configs):
    runs = [_built_on(configs[i], target) for i in group]
    stacked, seconds = aot.compiled_stacked_step(runs)
    alone, _ = aot.compiled_train_step(runs[0])
    rows.append({'variant': specs[group[0]].name.rpartition(',')[0], 'runs': len(group),
                 'vmapped': metrics.compiled_memory(stacked),
                 'alone': metrics.compiled_memory(alone), 'compile_seconds': seconds})
  first = [_built_on(configs[i], target) for i in vmapped.groups(configs)[0]]
  by_size = {len(first[:n]): metrics.compiled_memory(aot.compiled_stacked_step(first[:n])[0])
             for n in range(1, len(first))}
  return {'target': TARGET, 'memory_bytes': target.chip.memory_bytes, 'groups': rows,
          'first_group_by_size': {**by_size, len(first): rows[0]['vmapped']}}


def _built_on(config, target: targets.Target):
  """The run of `config` on the target's compile-only devices, its data generated."""
  stand_in = aot.stand_in(run_settings.resolve(config, target.platform))
  return setup.build_run(stand_in, devices=target.devices)


def report(timing: dict, memory: dict, alone: list[dict], command: str) -> str:
  mib = lambda b: f'{b / 2**20:.1f}'
  lines = [
      f'# {TITLE}', '',
      'The full model of the ablation sweep (the reference character LM with 6 blocks, width '
      f'128, batch 32 of 64 characters, held-out TinyShakespeare) at {timing["runs"]} seed '
      f'values, {timing["steps"]} steps each: trained one after another, then as one vmapped '
      'program (`sweep.run_all(..., vmap=True)`, `--vmap`).', '',
      f'Command: `{command}`', '',
      '| runs | steps each | wall time: one after another | vmapped | ratio | training '
      'examples/s of all runs: one after another | vmapped | ratio | largest difference of a '
      'logged training loss |', '|---|---|---|---|---|---|---|---|---|',
      f'| {timing["runs"]} | {timing["steps"]} | {timing["sequential_seconds"]:.0f} s | '
      f'{timing["vmapped_seconds"]:.0f} s | {timing["speedup"]:.2f}x | '
      f'{timing["sequential_examples_per_sec"]:.0f} | {timing["vmapped_examples_per_sec"]:.0f} | '
      f'{timing["vmapped_examples_per_sec"] / timing["sequential_examples_per_sec"]:.2f}x | '
      f'{timing["largest_loss_difference"]:.1e} |', '',
      'Wall time: the training calls, each run\'s compile and evaluations included (vmapped: one '
      'compile for the group). Examples per second: the training steps alone, each run\'s median '
      'over its logged windows (one after another: their mean; vmapped: their sum). Measured on a '
      '2-core CPU: read the ratios, not the seconds. Held-out loss per run: '
      + ', '.join(f'{r["name"]} {r["eval_loss"]:.4f}' for r in alone) + '.', '']
  lines += [f'## The ablation sweep compiled for {memory.get("target", TARGET)}', '']
  if 'skipped' in memory:
    return '\n'.join(lines + [f'Not measured: {memory["skipped"]}.']) + '\n'
  lines += [
      f'18 runs, {len(memory["groups"])} groups; XLA\'s memory analysis per device (arguments '
      '+ outputs - aliases + temporaries + code), MiB, of a chip with '
      f'{mib(memory["memory_bytes"])} MiB.', '',
      '| group | runs | vmapped step: total (arguments, temporaries) | one run alone: total '
      '(arguments, temporaries) | vmapped / alone, total | compile (vmapped) |',
      '|---|---|---|---|---|---|']
  shown = lambda m: f'{mib(m["total"])} ({mib(m["argument"])}, {mib(m["temporary"])})'
  for row in memory['groups']:
    lines.append(f'| {row["variant"]} | {row["runs"]} | {shown(row["vmapped"])} | '
                 f'{shown(row["alone"])} | {row["vmapped"]["total"] / row["alone"]["total"]:.2f} '
                 f'| {row["compile_seconds"]:.1f} s |')
  sizes = memory['first_group_by_size']
  lines += ['', f'The {memory["groups"][0]["variant"]}\'s step stacked over 1, 2, ... runs '
            '(MiB, total / temporaries): ' + ', '.join(
                f'{n} run{"s" * (int(n) > 1)} {mib(m["total"])} / {mib(m["temporary"])}'
                for n, m in sizes.items()) + '.']
  total = sum(row['vmapped']['total'] for row in memory['groups'])
  largest = max(row['vmapped']['total'] for row in memory['groups'])
  lines += ['', f'The largest group needs {mib(largest)} MiB of the chip\'s '
            f'{mib(memory["memory_bytes"])} MiB; the groups train one after another, so that '
            f'is the most the sweep holds at once (the {len(memory["groups"])} groups\' steps '
            f'together: {mib(total)} MiB).']
  lines += ['', sweep.figure_markdown(NAME, 'Training loss of each seed value trained alone '
                                      '(lines) and vmapped (crosses).')]
  return '\n'.join(lines) + '\n'


def curves(alone: list[dict], together: list[dict]) -> Figure:
  figure = Figure(figsize=(7, 4))
  ax = figure.subplots()
  for a, b, color in zip(alone, together, ('#2563eb', '#dc2626', '#16a34a')):
    ax.plot(*sweep.series(a['train_curve'], 'loss'), color=color, label=f'{a["name"]}')
    ax.plot(*sweep.series(b['train_curve'], 'loss'), color=color, ls='none', marker='x', ms=5)
  ax.set_xlabel('step')
  ax.set_ylabel('training loss (nats per character)')
  ax.set_title('Lines: each run alone; crosses: the same runs vmapped')
  ax.legend(fontsize=8, frameon=False)
  ax.set_ylim(top=np.percentile([r['loss'] for x in alone for r in x['train_curve']], 95))
  return figure


def figures(payload: dict) -> dict[str, Figure]:
  """From results.json's content: the curves of the runs trained alone and vmapped."""
  runs = payload['runs']
  return {NAME: curves([r for r in runs if r['trained'] == 'alone'],
                       [r for r in runs if r['trained'] == 'vmapped'])}


def main(argv=None):
  sweep.main(NAME, run, argv, figures)


if __name__ == '__main__':
  main()
