"""LoRA rank 8 against full fine-tuning of an imported GPT-2 checkpoint.

No pretrained GPT-2 can be downloaded where this runs, so the script makes its own: a small
GPT-2 (configs/gpt_shakespeare.py's family: LayerNorm, GELU, learned positions, biases, tied
unembedding, dropout 0.2; here 4 blocks of width 128, 4 heads, a byte-level BPE of 512 ids
trained on its text, windows of 128 tokens) pretrains on the first half of TinyShakespeare, and
`--mode=export` writes it as a Hugging Face GPT2LMHeadModel checkpoint with the run's
tokenizer.json. Every fine-tuning run starts from that directory through
`init_from_hf` (its weights) and `data.tokenizer` (its tokenizer), on the second half of the
text (other plays; its last 10% held out): full fine-tuning (every parameter, AdamW) and LoRA
(lora.rank=8 on the attention's query and value kernels, lora.alpha at its default 8, so a
scale of 1) at three learning rates each, with the same steps, batches and seed. Reported per
run: trainable parameters, the median step time, the train step's memory (XLA's memory
analysis, the figure the train loop logs) and held-out loss; and the base's held-out loss on the
fine-tuning text before any step.

  python experiments/lora_finetune.py --quick
  nice -n 19 python experiments/lora_finetune.py --manual_dir DIR

DIR holds TinyShakespeare's input.txt. Writes experiments/results/lora_finetune/: results.json,
README.md (the table) and lora_finetune.png (held-out loss through fine-tuning).
"""
import os
import pathlib

import jax
from matplotlib.figure import Figure
import numpy as np

from transformer_jax import accounting, memory, run as run_lib, sweep, train
from transformer_jax.train import metrics, setup, sharding

NAME = 'lora_finetune'
TITLE = 'LoRA rank 8 against full fine-tuning of an imported GPT-2 checkpoint'
CONFIG = pathlib.Path(__file__).resolve().parent.parent / 'configs' / 'gpt_shakespeare.py'
PRETRAIN_STEPS, FINETUNE_STEPS = 1200, 300
FULL_RATES = (1e-4, 3e-4, 1e-3)  # optimizer.learning_rate of full fine-tuning
LORA_RATES = (1e-3, 3e-3, 1e-2)  # and of LoRA, which usually wants about 10x more
BATCH_SIZE = 32
MODEL = {'model.width': 128, 'model.num_layers': 4, 'model.num_heads': 4, 'model.max_len': 128,
         'model.vocab_size': 512, 'data.name': 'text_file', 'data.seq_len': 128,
         'data.batch_size': BATCH_SIZE}
PRETRAIN = {'data.tokenizer': 'bpe', 'training.steps': PRETRAIN_STEPS,
            'training.eval_every': PRETRAIN_STEPS, 'training.checkpoint_every': PRETRAIN_STEPS,
            'training.log_every': 100}
FINETUNE = {'optimizer.warmup_steps': 30, 'training.steps': FINETUNE_STEPS,
            'training.eval_every': 50, 'training.checkpoint_every': FINETUNE_STEPS,
            'training.log_every': 25}
QUICK = {'model.width': 32, 'model.num_layers': 1, 'model.num_heads': 2, 'model.max_len': 16,
         'model.vocab_size': 264, 'data.vocab_size': 264, 'data.seq_len': 16,
         'data.batch_size': 8, 'data.eval_steps': 2}
QUICK_PRETRAIN = {'training.steps': 4, 'training.eval_every': 4, 'training.checkpoint_every': 4,
                  'training.log_every': 2, 'optimizer.warmup_steps': 1}
QUICK_FINETUNE = {'training.steps': 4, 'training.eval_every': 2, 'training.checkpoint_every': 4,
                  'training.log_every': 2, 'optimizer.warmup_steps': 1}
DESCRIPTION = (
    'No pretrained GPT-2 can be downloaded where this ran, so the base is made here: a GPT-2 of '
    '4 blocks, width 128, 4 heads (configs/gpt_shakespeare.py\'s family: LayerNorm, GELU, '
    'learned positions, biases, tied unembedding, dropout 0.2), a byte-level BPE of 512 ids and '
    f'windows of 128 tokens, pretrained for {PRETRAIN_STEPS} steps of batch {BATCH_SIZE} on the '
    'first half of TinyShakespeare (cut at the first blank line after its middle; its last 10% '
    'held out), then written by `--mode=export` as a Hugging Face GPT2LMHeadModel checkpoint '
    '(config.json, model.safetensors), to which the pretraining run\'s tokenizer.json is added. '
    'Each fine-tuning run imports that directory (`init_from_hf` for the weights, '
    '`data.tokenizer` for the tokenizer) and trains on the second half of the text, other '
    'plays by their speakers (the first half: Coriolanus, Richard III, Richard II, most of '
    'Romeo and Juliet; the second: the end of Romeo and Juliet, then Measure for Measure, The '
    'Taming of the Shrew, The Winter\'s Tale, Henry VI and The Tempest among others; its '
    'held-out 10%: The Tempest and the end of The Shrew), '
    f'for {FINETUNE_STEPS} steps of batch {BATCH_SIZE} (warmup 30, cosine to a tenth), '
    'evaluated every 50 steps on its last 10%: full fine-tuning trains every parameter with '
    'AdamW (0.9, 0.99, weight decay 0.1); LoRA (`lora.rank=8`, `lora.alpha` at its default 8, '
    'so the update is scaled by 1) trains adapters on every attention\'s query and value '
    'kernels with the same AdamW, the base frozen. Every run: the same seed, batches and '
    'steps. Held-out loss: nats per BPE token over every full batch of the held-out part; bits '
    'per byte divide its sum in bits by the UTF-8 bytes scored. Step time: the median over the '
    'logged windows after the first, measured on a CPU of 2 cores shared with other work (read '
    'the ratios, not the milliseconds). Memory: XLA\'s memory analysis of the compiled train '
    'step on one device (the figure the train loop logs as "it needs X GiB per device"), and '
    'the optimizer state of the memory plan (transformer_jax.memory, exact for the state).')


def smoke_text() -> str:
  """Paragraphs of random words of a small lexicon, for --quick."""
  words = np.random.default_rng(0).choice(['to', 'be', 'or', 'not', 'that', 'is', 'the',
                                           'question', 'whether', 'tis', 'nobler'], 3000)
  return '\n\n'.join(' '.join(paragraph) for paragraph in words.reshape(-1, 30))


def exported(config, run_dir: str) -> str:
  """The pretraining run as a Hugging Face checkpoint (run_dir/hf, written once by
  --mode=export, with the run's tokenizer.json beside the weights)."""
  hf = os.path.join(run_dir, 'hf')
  if not os.path.exists(os.path.join(hf, 'config.json')):
    run_lib.run(config, run_dir, 'export')
  return hf


def finetune_runs(quick: bool = False) -> list[sweep.SweepRun]:
  """Full fine-tuning at FULL_RATES, then LoRA at LORA_RATES (the first rate of each with
  --quick)."""
  rates = lambda rates_: rates_[:1] if quick else rates_
  full = sweep.product(sweep.named({'full': {}}),
                       sweep.values('optimizer.learning_rate', rates(FULL_RATES), 'lr'))
  adapters = sweep.product(sweep.named({'lora r8': {'lora.rank': 8}}),
                           sweep.values('optimizer.learning_rate', rates(LORA_RATES), 'lr'))
  return full + adapters


def method(result: dict) -> str:
  return 'lora' if dict(result['overrides']).get('lora.rank') else 'full'


def step_cost(config) -> dict:
  """Trainable and total parameters, the compiled train step's memory by XLA's memory analysis
  (the train loop's 'it needs X GiB per device') and the memory plan's optimizer state, in
  bytes, of a run of `config` on one device."""
  run = setup.build_run(config, devices=jax.devices()[:1])
  spec = sharding.batch_sharding(run.mesh)
  batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=spec)
           for k, v in run.data.train_batch(0).items()}
  compiled = run.train_step.lower(run.abstract_state, batch).compile()
  plan = memory.plan(config, mesh={'data': 1})
  return {'trainable_params': accounting.count_params(run.abstract_state.params)['total'],
          'model_params': accounting.count_params(run.abstract_params)['total'],
          'xla_memory': metrics.compiled_memory(compiled),
          'plan_optimizer_bytes': plan.optimizer, 'plan_gradient_bytes': plan.gradients}


def run(quick: bool = False, workdir: str = f'/tmp/transformer_jax_experiments/{NAME}',
        results_dir: str | None = None, data: dict | None = None,
        command: str = 'lora_finetune.run()', vmap: bool = False) -> dict:
  """Pretrains and exports the base (or reads it back), fine-tunes it each way, measures,
  writes the results folder."""
  texts = sweep.text_halves(NAME, smoke_text() if quick else None, workdir, data or {})
  model = [MODEL, QUICK if quick else {}, {'data.token_dir': f'{workdir}/tokens'}]
  pretrain_run = sweep.SweepRun('pretrain', overrides=(('data.path', texts['pretrain']),))
  pretrain_config = sweep.config_for(pretrain_run, CONFIG, *model, PRETRAIN,
                                     QUICK_PRETRAIN if quick else {})
  (pretrained,) = sweep.run_all([pretrain_run], lambda r: pretrain_config, workdir)
  hf = exported(pretrain_config, f'{workdir}/{pretrain_run.dirname}')
  start = {'init_from_hf': hf, 'data.tokenizer': hf, 'data.path': texts['finetune']}
  make_config = lambda r: sweep.config_for(r, CONFIG, *model, FINETUNE,
                                           QUICK_FINETUNE if quick else {}, start)
  runs = finetune_runs(quick)
  base = train.evaluate(make_config(runs[0]), None)
  results = sweep.run_all(runs, make_config, workdir, vmap=vmap)
  costs = {}
  for run_, result in zip(runs, results):  # the learning rate changes no shape: one per method
    if method(result) not in costs:
      costs[method(result)] = step_cost(make_config(run_))
  best = best_runs(results)
  return sweep.finish(TITLE, command, results, lambda: report(pretrained, base, results, costs,
                                                              command),
                      figures, results_dir or f'{workdir}/results', quick, pretrain=pretrained,
                      base=base, costs=costs, best=best)


def best_runs(results: list[dict]) -> dict:
  """{method: the name of its run with the lowest held-out loss}."""
  finished = [r for r in results if r['eval_loss'] is not None]
  return {name: min((r for r in finished if method(r) == name),
                    key=lambda r: r['eval_loss'])['name']
          for name in sorted({method(r) for r in finished})}


def step_ms(result: dict) -> float | None:
  rate = result['examples_per_sec']
  return 1000 * BATCH_SIZE / rate if rate else None


def bits_per_byte(result: dict) -> float | None:
  finished = result['eval_loss'] is not None
  return result['eval_curve'][-1].get('eval_bits_per_byte') if finished else None


def mib(num_bytes: float) -> str:
  return f'{num_bytes / 2**20:.1f}'


def report(pretrained: dict, base: dict, results: list[dict], costs: dict, command: str) -> str:
  best = best_runs(results)
  lines = [f'# {TITLE}', '', DESCRIPTION, '', f'Command: `{command}`', '',
           f'Machine time: {pretrained["train_seconds"] / 60:.1f} min of pretraining, '
           f'{sweep.machine_seconds(results) / 60:.1f} min over {len(results)} fine-tuning runs.',
           '', f'The base: held-out loss {pretrained["eval_loss"]:.3f} nats per token on its own '
           f'text (the last 10% of the first half) after {pretrained["steps"]} steps; on the '
           f'fine-tuning text\'s held-out part before any fine-tuning (step 0) '
           f'{base["eval_loss"]:.3f} nats per token, {base["eval_bits_per_byte"]:.3f} bits per '
           'byte.', '',
           '| method | trainable parameters | of the model\'s | train step memory (MiB, XLA) '
           '| of it arguments / temporaries | optimizer state (MiB, plan) |',
           '|---|---|---|---|---|---|']
  for name, cost in costs.items():
    xla = cost['xla_memory']
    lines.append(f'| {name} | {cost["trainable_params"]:,} | {cost["model_params"]:,} | '
                 f'{mib(xla["total"])} | {mib(xla["argument"])} / {mib(xla["temporary"])} | '
                 f'{mib(cost["plan_optimizer_bytes"])} |')
  lines += ['', '| run | learning rate | held-out loss (nats/token) | bits per byte | final '
            'training loss | step time (ms) | status |', '|---|---|---|---|---|---|---|',
            f'| base (step 0) | - | {base["eval_loss"]:.3f} | {base["eval_bits_per_byte"]:.3f} | '
            '- | - | - |']
  for r in results:
    mark = ' (best)' if best.get(method(r)) == r['name'] else ''
    held_out = '-' if r['eval_loss'] is None else f'{r["eval_loss"]:.3f}'
    bpb = bits_per_byte(r)
    final = '-' if r['final_loss'] is None else f'{r["final_loss"]:.3f}'
    ms = step_ms(r)
    lines.append(f'| {r["name"].split(",")[0]}{mark} | '
                 f'{r["overrides"]["optimizer.learning_rate"]:g} | {held_out} | '
                 f'{"-" if bpb is None else f"{bpb:.3f}"} | {final} | '
                 f'{"-" if ms is None else f"{ms:.0f}"} | {r["status"]} |')
  lines += ['', sweep.figure_markdown(NAME, 'Held-out loss against the fine-tuning step from the '
                                      'base model\'s at step 0, one line per run (the best '
                                      'learning rate of each method solid).')]
  return '\n'.join(lines) + '\n'


def curves(results: list[dict], base: dict, best: dict) -> Figure:
  """Held-out loss against the fine-tuning step, from the base's at step 0, one line per run
  (the best of each method solid)."""
  figure = Figure(figsize=(7, 4.5))
  ax = figure.subplots()
  colors = {'full': '#1f77b4', 'lora': '#d62728'}
  for r in results:
    steps = [0] + [row['step'] for row in r['eval_curve']]
    losses = [base['eval_loss']] + [row['eval_loss'] for row in r['eval_curve']]
    solid = best.get(method(r)) == r['name']
    ax.plot(steps, losses, color=colors[method(r)], linestyle='-' if solid else ':',
            alpha=1 if solid else 0.6,
            label=f'{method(r)} lr {r["overrides"]["optimizer.learning_rate"]:g}')
  ax.set_xlabel('fine-tuning step')
  ax.set_ylabel('held-out loss (nats per token)')
  ax.legend(fontsize=8, frameon=False)
  ax.set_title('Full fine-tuning and LoRA rank 8 from the same imported GPT-2')
  return figure


def figures(payload: dict) -> dict[str, Figure]:
  """From results.json's content: the held-out curves of every run."""
  return {NAME: curves(payload['runs'], payload['base'], payload['best'])}


def main(argv=None):
  sweep.main(NAME, run, argv, figures)


if __name__ == '__main__':
  main()
