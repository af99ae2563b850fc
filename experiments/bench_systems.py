"""The systems' training steps against their PyTorch originals, and their input pipelines' rates
beside the steps': T5, CLIP, SigLIP, Whisper and DiT, each at two shapes (system_peers.py).

  python experiments/bench_systems.py --quick      # every row at the tiny shapes, a minute
  python experiments/bench_systems.py              # the full table (see its README for the time)
  python experiments/bench_systems.py --systems t5,dit --shapes small --parts train

--parts train: our jitted train step (step_timing, the run's own step and optimizer) against
the same model, loss and optimizer in the peer library (transformers' T5ForConditionalGeneration,
CLIPModel, SiglipModel, WhisperForConditionalGeneration; diffusers' DiTTransformer2DModel), both
in float32 on the CPU, torch on --torch_threads threads (XLA:CPU on the machine's cores, as the
other benchmarks run it), the same weights (the peer's random ones, imported by
transformer_jax.convert) and the same batches. Step 0 of each side is on the same batch (and
for DiT the same timesteps, noise and dropped labels): their losses must agree to
--loss_rtol, or the row fails, before anything is timed. Then --warmup steps each, then
--repeats interleaved measurements of --steps steps each (or as many as take --seconds: ours,
then the peer's), each reported
as its median step with the 1-minute load average, MFU beside it: the accounting's model FLOPs
of a step (3 x the family's forward_flops per example) over this machine's float32 matmul peak
(train.metrics.measured_matmul_flops, measured in the same sitting).
--parts input: each system's input pipeline (grain's threads, as training reads it) at the
'small' shape, in examples per second beside our step's rate measured in the same sitting:
image-text pairs (375x500 JPEG files decoded, CLIP's random-resized crop or SigLIP's resize to
224, captions tokenized by a BPE), T5's span corruption with packing of documents (--text's
paragraphs; generated ones without it) tokenized by a BPE of T5's 32,128 ids, whisper-tiny's
audio (16 kHz FLAC files of 5 to 30 s, read and padded to 30 s windows; the log-Mel features
made in the pipeline, 'host', or in the step, 'device'), DiT-S/2's images (CIFAR-10 from
--tfds_data_dir as configs/dit_reference.py reads it, else generated images). The files are
written to a temporary folder first; setting up (tokenizing, training the BPEs) is not timed.

--profile_dir: after each training row's timing, a jax.profiler trace of our steps and where
their time goes (transformer_jax.train.profiling: by kind of work, model part and op); XLA:CPU's
flags are read from XLA_FLAGS as ever, and printed, so that flag sets can be compared run
against run (the peer's time in each run a yardstick).

A benchmark, not a test: the figures drift with the machine's load, printed beside each. With
--json_out the rows are also written as JSON. Without torch, transformers and diffusers (the
`bench` extra), the peers' columns are skipped with a line saying so. Measured figures:
experiments/results/bench_systems/README.md.
"""
import csv
import importlib.util
import json
import os
import pathlib
import statistics
import tempfile
import time

from absl import app, flags
import jax
import numpy as np
import soundfile

import image_datasets
import step_timing
from transformer_jax import accounting, config_lib
from transformer_jax.train import cpu_runtime, metrics, setup

ROOT = pathlib.Path(__file__).resolve().parent.parent
SYSTEMS = ('t5', 'clip', 'siglip', 'whisper', 'dit')
SHAPES = ('tiny', 'small')
PARTS = ('train', 'input')

_SYSTEMS = flags.DEFINE_list('systems', list(SYSTEMS), f'Of {SYSTEMS}.')
_SHAPES = flags.DEFINE_list('shapes', ['tiny', 'small'], "'tiny' (seconds) and 'small' (near "
                            'the smallest published size; system_peers.py).')
_PARTS = flags.DEFINE_list('parts', list(PARTS), f'Of {PARTS}.')
_STEPS = flags.DEFINE_integer('steps', 3, 'Timed steps per measurement, at least: more while '
                              'they take under --seconds.')
_SECONDS = flags.DEFINE_float('seconds', 10.0, 'A measurement runs steps until it has taken this '
                              'long (and --steps of them, at most 100).')
_WARMUP = flags.DEFINE_integer('warmup', 2, 'Untimed steps per side first (step 0 among them).')
_REPEATS = flags.DEFINE_integer('repeats', 2, 'Interleaved measurements per side.')
_TORCH_THREADS = flags.DEFINE_integer('torch_threads', 2, 'torch.set_num_threads.')
_TORCH_ADAMW = flags.DEFINE_enum('torch_adamw', 'fused', ['default', 'foreach', 'fused'],
                                 "torch.optim.AdamW's implementation (fused: its fastest on "
                                 'the CPU).')
_LOSS_RTOL = flags.DEFINE_float('loss_rtol', 1e-4, 'Step 0 losses must agree to this.')
_BATCHES = flags.DEFINE_integer('batches', 20, 'Timed batches per input pipeline.')
_TEXT = flags.DEFINE_string('text', None, "A text file whose paragraphs (blank-line separated) "
                            "are T5's documents to corrupt; generated documents without it.")
_TFDS_DATA_DIR = flags.DEFINE_string('tfds_data_dir', None, 'TFDS data dir holding CIFAR-10 '
                                     "(prepared), for DiT's pipeline; generated images without.")
_PROFILE_DIR = flags.DEFINE_string(
    'profile_dir', None, 'Also trace --profile_steps of our steps per row after its timing, in '
    'DIR/<system>_<shape> (jax.profiler), and print where their time goes by kind of work, '
    'model part and op (transformer_jax.train.profiling).')
_PROFILE_STEPS = flags.DEFINE_integer('profile_steps', 3, 'Steps per --profile_dir trace.')
_KEEP_FREED_MEMORY = flags.DEFINE_bool(
    'keep_freed_memory', False, "cpu_runtime's malloc settings, as launch.py sets them; off by "
    'default here, where the peers allocate on the same heap.')
_JSON_OUT = flags.DEFINE_string('json_out', None, 'Also write the rows here as JSON.')
_QUICK = flags.DEFINE_bool('quick', False, 'Every row at the tiny shapes, 2 timed steps, one '
                           'measurement each: a check that it runs and that both sides agree.')


def load_average() -> str:
  return f'load {os.getloadavg()[0]:.2f}'


def missing_peers(name: str) -> list[str]:
  """The peer libraries system `name`'s PyTorch side needs that are not installed."""
  needed = ('torch', 'diffusers') if name == 'dit' else ('torch', 'transformers')
  return [module for module in needed if importlib.util.find_spec(module) is None]


def step_flops(run, batch: dict) -> float:
  """Model FLOPs of one train step of `batch`, as the training loop counts them (3 x the
  family's forward FLOPs of an example, times the batch)."""
  size = len(next(iter(batch.values())))
  forward = accounting.forward_flops(run.model_config, *run.family.lengths(batch))['total']
  return 3 * forward * size


def report(side: str, seconds: float, flops: float, peak: float, examples: int) -> dict:
  row = {'side': side, 'step_ms': 1e3 * seconds, 'examples_per_s': examples / seconds,
         'mfu': flops / seconds / peak, 'load': os.getloadavg()[0]}
  print(f'    {side:<10} {row["step_ms"]:9.1f} ms  {row["examples_per_s"]:8.1f} examples/s  '
        f'MFU {row["mfu"]:6.1%}  ({load_average()})', flush=True)
  return row


def timed(step, first: int, steps: int, seconds: float) -> list[float]:
  """Seconds of steps first, first + 1, ...: at least `steps` of them, more until they add up to
  `seconds` (at most 100)."""
  times = []
  while len(times) < steps or (sum(times) < seconds and len(times) < 100):
    times.append(step(first + len(times)))
  return times


def train_row(peers, name: str, shape: str, peak: float, steps: int, budget: float,
              warmup: int, repeats: int) -> dict:
  """One system at one shape: the step-0 check, then interleaved measurements."""
  peer = peers.PEERS[name](shape)
  with tempfile.TemporaryDirectory() as directory:
    model = peer.build(directory)
    config = peer.config(directory)
    batches = [peer.batch(i) for i in range(step_timing.READY_BATCHES)]
    ours = step_timing.timed_step(config, batches=batches, params=peer.params(model, config))
  run = ours.run
  theirs = peers.TorchStep(peer, model, batches, run.settings.optimizer,
                           peer.first_draws(run, batches[0]))
  flops = step_flops(run, batches[0])
  params = accounting.count_params(run.abstract_params)['total']
  peer_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
  print(f'{name} ({shape}): {params:,} parameters trained ({peer_params:,} by the peer), batch '
        f'{peer.batch_size}, {flops / 1e9:.3g} GFLOP per step (accounting)', flush=True)
  ours(0)
  theirs(0)
  loss, peer_loss = float(ours.metrics['loss'] / ours.metrics['weight']), theirs.loss
  difference = abs(loss / peer_loss - 1)
  print(f'  step 0 on the same batch: loss {loss:.6f} (ours), {peer_loss:.6f} (peer), '
        f'relative difference {difference:.1e}', flush=True)
  if not difference <= _LOSS_RTOL.value:
    raise RuntimeError(f'{name} ({shape}): the step 0 losses differ by {difference:.1e}, more '
                       f'than {_LOSS_RTOL.value:g}: the two sides do not compute the same thing.')
  for i in range(1, warmup):
    ours(i)
    theirs(i)
  row = dict(system=name, shape=shape, params=params, peer_params=peer_params,
             batch_size=peer.batch_size,
             gflop_per_step=flops / 1e9, loss_ours=loss, loss_peer=peer_loss,
             loss_rel_difference=difference, ours=[], peer=[])
  for _ in range(repeats):
    for side, step in (('ours', ours), ('peer', theirs)):
      seconds = statistics.median(timed(step, warmup, steps, budget))
      row[side].append(report(side, seconds, flops, peak, peer.batch_size))
  median = lambda side: statistics.median(r['step_ms'] for r in row[side])
  row['speedup'] = median('peer') / median('ours')
  print(f'  ours {row["speedup"]:.2f}x the peer\'s speed (medians of the measurements)',
        flush=True)
  if _PROFILE_DIR.value:
    row['profile'] = profile_row(ours, f'{_PROFILE_DIR.value}/{name}_{shape}', warmup)
  return row


def profile_row(ours, directory: str, first: int) -> dict:
  """Traces our steps into `directory`, prints where their time goes, returns it (ms a step
  by kind of work and by model part)."""
  summary = ours.profile(directory, first, _PROFILE_STEPS.value)
  print('\n'.join(f'  {line}' for line in summary.lines()), flush=True)
  milliseconds = lambda table: {key: 1e3 * s for key, s in sorted(table.items(),
                                                                   key=lambda item: -item[1])}
  return {'directory': directory, 'op_ms': 1e3 * summary.total,
          'summed_op_ms': 1e3 * summary.summed,
          'by_kind_ms': milliseconds(summary.by_kind), 'by_part_ms': milliseconds(summary.by_part)}


# The input pipelines (--parts input): the project's configs at the 'small' shapes' batches,
# reading files written here (or --text, --tfds_data_dir).

WORDS = ('the of and to in is was for on that with as by at from his her this which be or an '
         'are were had not but have they one all their been has more there when who will would '
         'time year said city river music team film game water light world house school night '
         'first other new two three four five six seven eight nine zero').split()


def sentences(rng: np.random.Generator, count: int, low: int, high: int) -> list[str]:
  """`count` texts of low to high words, the words Zipf-distributed over WORDS."""
  weights = 1.0 / np.arange(1, len(WORDS) + 1)
  weights /= weights.sum()
  return [' '.join(rng.choice(WORDS, rng.integers(low, high + 1), p=weights))
          for _ in range(count)]


def text_documents(directory: str, quick: bool) -> str:
  """A JSONL of documents: --text's paragraphs (blank-line separated), else generated ones of
  50 to 1,000 words."""
  if _TEXT.value:
    paragraphs = pathlib.Path(_TEXT.value).read_text().split('\n\n')
    documents = [p.strip() for p in paragraphs if p.strip()]
  else:
    documents = sentences(np.random.default_rng(0), 200 if quick else 4000, 50, 1000)
  path = f'{directory}/documents.jsonl'
  pathlib.Path(path).write_text(''.join(json.dumps({'text': d}) + '\n' for d in documents))
  return path


def t5_input(directory: str, quick: bool):
  """T5 1.1 small, span corruption of the documents with packing (512 inputs, 114 targets),
  a byte-level BPE of T5's 32,128 ids trained on them."""
  config = config_lib.from_file(ROOT / 'configs' / 't5_small.py', 'v1_1')
  config.model.dtype = 'float32'
  config.data.update(task='span_corruption', name='jsonl', path=text_documents(directory, quick),
                     tokenizer='bpe', vocab_size=32128, packing=True, batch_size=8,
                     token_dir=f'{directory}/tokens')
  return config


def image_text_files(directory: str, quick: bool) -> str:
  """A JSONL of {"image", "text"}: JPEG photos' stand-ins of 375x500 (image_datasets) with
  captions of 5 to 20 words."""
  path = pathlib.Path(directory, 'pairs.jsonl')
  if path.exists():
    return str(path)
  rng = np.random.default_rng(0)
  count = 80 if quick else 400  # every tenth held out: one eval batch of 8 at least
  colours = rng.integers(32, 224, size=(count, 3))
  lines = []
  for i, caption in enumerate(sentences(rng, count, 5, 20)):
    image_datasets.stand_in(colours[i], rng).save(f'{directory}/{i}.jpg', quality=90)
    lines.append(json.dumps({'image': f'{i}.jpg', 'text': caption}) + '\n')
  path.write_text(''.join(lines))
  return str(path)


def image_text_input(name: str, directory: str, quick: bool):
  """CLIP ViT-B/32 at batch 64 (its training crop: random-resized 90-100%, bicubic) or SigLIP
  B/16 at batch 16 (resized to 224), on the JPEG pairs, captions by a BPE trained on them."""
  file, batch = {'clip': ('clip_b32.py', 64), 'siglip': ('siglip_b16.py', 16)}[name]
  config = config_lib.from_file(ROOT / 'configs' / file)
  # The BPE's own EOS, vocabulary and held-out split (every tenth record).
  config.model.update(dtype='float32', eos_id=None, vocab_size=0)
  config.data.update(name='jsonl', path=image_text_files(directory, quick), tokenizer='bpe',
                     vocab_size=4096, batch_size=batch, eval_batch_size=4, eval_steps=1,
                     token_dir=f'{directory}/tokens')
  return config


def audio_files(directory: str, quick: bool) -> str:
  """An audiofolder of 80 16 kHz FLAC files (LibriSpeech's format) of 5 to 30 s (--quick: 1 to
  3 s): tones in noise, transcribed by words."""
  folder = pathlib.Path(directory, 'audio')
  if folder.exists():
    return str(folder)
  folder.mkdir()
  rng = np.random.default_rng(0)
  with open(folder / 'metadata.csv', 'w', newline='') as f:
    writer = csv.writer(f)
    writer.writerow(['file_name', 'transcription'])
    for i, text in enumerate(sentences(rng, 80, 10, 60)):  # the last tenth held out: 8
      seconds = rng.uniform(1, 3) if quick else rng.uniform(5, 30)
      t = np.arange(int(seconds * 16000)) / 16000
      wave = 0.3 * np.sin(2 * np.pi * rng.uniform(100, 1000) * t) + rng.normal(0, 0.05, t.size)
      soundfile.write(folder / f'{i}.flac', wave.astype(np.float32), 16000)
      writer.writerow([f'{i}.flac', text])
  return str(folder)


def whisper_input(directory: str, quick: bool, log_mel_on: str):
  """whisper-tiny at batch 8 on the audiofolder, the characters' vocabulary (its transcripts
  are under 448 tokens), the log-Mel features made in the pipeline ('host') or in the step."""
  config = config_lib.from_file(ROOT / 'configs' / 'whisper_tiny.py')
  config.model.update(dtype='float32', vocab_size=0)
  config.data.update(name='audiofolder', audio_dir=audio_files(directory, quick),
                     tokenizer='chars', batch_size=8, eval_batch_size=8, eval_examples=8,
                     log_mel_on=log_mel_on)
  return config


def dit_input(directory: str, quick: bool):
  """DiT-S/2 at batch 32 on 32x32 images read as configs/dit_reference.py reads them (decode,
  flip, to [-1, 1]): CIFAR-10 from --tfds_data_dir, else generated images."""
  del directory, quick
  config = config_lib.from_file(ROOT / 'configs' / 'dit_reference.py')
  config.model.update(width=384, num_layers=12, num_heads=6, patch_size=2, dtype='float32')
  config.data.update(batch_size=32, eval_batch_size=32)
  if _TFDS_DATA_DIR.value:
    config.data.update(tfds_data_dir=_TFDS_DATA_DIR.value, download=False)
  else:
    config.data.update(name='synthetic', eval_examples=64)
  return config


def input_configs(name: str, directory: str, quick: bool) -> dict:
  """{label: config} of the system's pipelines."""
  if name == 't5':
    configs = {'span corruption, packed': t5_input(directory, quick)}
  elif name in ('clip', 'siglip'):
    configs = {'JPEG pairs, BPE captions': image_text_input(name, directory, quick)}
  elif name == 'whisper':
    configs = {f'FLAC, log-Mel on the {where}': whisper_input(directory, quick, where)
               for where in ('host', 'device')}
  else:
    configs = {'CIFAR-10' if _TFDS_DATA_DIR.value else 'generated images':
               dit_input(directory, quick)}
  return {label: shrunk(config) if quick else config for label, config in configs.items()}


def shrunk(config):
  """--quick: the run smoked (2 blocks per stack, batch 8), narrowed to width 64, T5's inputs
  cut to 128 tokens and Whisper's windows to 3 s, so that its step compiles and runs in
  seconds; the data as it was."""
  config = config_lib.smoke(config)
  narrow = dict(width=64, num_heads=2, head_width=None, d_ff=None)
  family = config.model.family
  if family == 'clip':
    narrow.update(text_width=64, text_heads=2, text_d_ff=None, embed_dim=32)
  elif family == 'whisper':
    narrow.update(num_frames=300)  # 3 s windows
  elif family == 'encoder_decoder':
    config.data.seq_len = 128
  config.model.update(narrow)
  return config


def pipeline_rate(run, batches: int) -> float:
  """Examples per second of the run's training batches (grain's threads, as training reads
  them), after two warm-up batches."""
  iterator = run.data.train_iterator(0)
  for _ in range(2):
    next(iterator)
  start = time.perf_counter()
  for _ in range(batches):
    next(iterator)
  return batches * run.data.batch_size / (time.perf_counter() - start)


def input_rows(name: str, directory: str, quick: bool, batches: int, steps: int,
               budget: float) -> list[dict]:
  rows = []
  for label, config in input_configs(name, directory, quick).items():
    run = setup.build_run(config)
    feeds = pipeline_rate(run, batches)
    step = step_timing.timed_step(config)
    step(0)
    step(1)
    seconds = statistics.median(timed(step, 2, steps, budget))
    takes = run.data.batch_size / seconds
    rows.append(dict(system=name, pipeline=label, batch_size=run.data.batch_size,
                     pipeline_examples_per_s=feeds, step_examples_per_s=takes,
                     pipeline_over_step=feeds / takes, load=os.getloadavg()[0]))
    print(f'{name}, {label}: the pipeline {feeds:8.1f} examples/s, our step {takes:8.1f} '
          f'examples/s ({seconds * 1e3:.0f} ms): {feeds / takes:5.1f}x what the step takes  '
          f'({load_average()})', flush=True)
  return rows


def main(argv):
  del argv
  jax.config.update('jax_platforms', 'cpu')  # both sides on the CPU, whatever else is here
  # As launch.py runs a step, but for its malloc settings, which slow our large steps by up to
  # 2x once torch's allocations share the heap (cpu_runtime.configure).
  cpu_runtime.configure(keep_freed_memory=_KEEP_FREED_MEMORY.value)
  quick = _QUICK.value
  shapes = ['tiny'] if quick else _SHAPES.value
  steps, budget, warmup, repeats = ((2, 0.0, 2, 1) if quick else
                                    (_STEPS.value, _SECONDS.value, _WARMUP.value, _REPEATS.value))
  if not missing_peers('t5') or not missing_peers('dit'):
    import system_peers as peers
    import torch
    torch.set_num_threads(_TORCH_THREADS.value)
    peers.Peer.adamw = _TORCH_ADAMW.value
    if not missing_peers('t5'):
      import transformers
      transformers.logging.set_verbosity_error()
  for flag, values, known in ((_SYSTEMS, _SYSTEMS.value, SYSTEMS), (_SHAPES, shapes, SHAPES),
                              (_PARTS, _PARTS.value, PARTS)):
    if set(values) - set(known):
      raise app.UsageError(f'--{flag.name}: {sorted(set(values) - set(known))} unknown; of '
                           f'{known}.')
  print(f'jax {jax.__version__}, {metrics.cpu_model()}, {os.cpu_count()} CPUs, '
        f'XLA_FLAGS={os.environ.get("XLA_FLAGS", "")!r}, {load_average()}')
  peak = metrics.measured_matmul_flops()
  print(f'float32 matmul peak (best jitted square matmul): {peak / 1e9:.1f} GFLOP/s')
  rows = []
  for name in _SYSTEMS.value if 'train' in _PARTS.value else ():
    if missing_peers(name):
      print(f'{name}: no training rows: {", ".join(missing_peers(name))} not installed (pip '
            'install -e \'.[bench]\').')
      continue
    for shape in shapes:
      rows.append(train_row(peers, name, shape, peak, steps, budget, warmup, repeats))
  inputs = []
  if 'input' in _PARTS.value:
    batches = 2 if quick else _BATCHES.value
    with tempfile.TemporaryDirectory() as directory:
      for name in _SYSTEMS.value:
        inputs += input_rows(name, directory, quick, batches, steps, budget)
  print(f'{load_average()} at the end')
  if _JSON_OUT.value:
    pathlib.Path(_JSON_OUT.value).write_text(json.dumps(
        {'cpu': metrics.cpu_model(), 'cpus': os.cpu_count(), 'peak_flops': peak,
         'xla_flags': os.environ.get('XLA_FLAGS', ''),
         'train': rows, 'input': inputs}, indent=2))


if __name__ == '__main__':
  app.run(main)
