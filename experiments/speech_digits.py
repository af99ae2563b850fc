"""Speech recognition of spoken digit strings: the reference Whisper on a set espeak-ng speaks.

The set: 4,000 strings of 3 to 6 digits written as words ('four one nine'), each spoken by
espeak-ng (the formant synthesizer of the system's packages: `apt-get install espeak-ng`) with
a voice drawn from 6 English accents (en-us, en-gb, en-gb-scotland, en-gb-x-rp, en-029,
en-us-nyc) x 6 variants (m1, m3, m7, f2, f4, klatt: male, female and other timbres), a speed of
130 to 200 words per minute and a pitch of 20 to 80 (of espeak-ng's 0-99), written at its
22,050 Hz as WAV files beside a metadata.csv (the audiofolder layout; the last tenth, 400, held
out, as data.name='audiofolder' does). The model: configs/whisper_reference.py (2 + 2 blocks of
width 64, 40 Mel bins) with a 4 s window (400 frames) and a decoder of 40 positions over the
transcripts' characters, trained for 800 steps of 32 utterances (resampled to 16 kHz in grain's
threads, log-Mel features where data.log_mel_on says). Reported: held-out loss and greedy word
error rate against steps, greedy and beam-4 WER at the end, and the training step's rate in
seconds of audio per second.

  python experiments/speech_digits.py --quick
  nice -n 5 python experiments/speech_digits.py
  python experiments/speech_digits.py --throughput   # the input pipeline's and the step's speed

--throughput prints, on the set this script made (made first if missing): the input pipeline
alone (reading, resampling, SpecAugment off) in utterances and seconds of audio per second, on
one thread and through grain's threads as training reads it, shipping the padded waveforms only
(data.log_mel_on='device', the default) or making the log-Mel features ('host'); the log-Mel
features of a batch made clip by clip in NumPy (the pipeline's way) and by one jitted program on
the device (layers.log_mel, float32: the step's way); and the train step fed from batches made
ahead, of waveforms whose features the step makes and of features, the two steps timed in turn.

The results folder holds results.json, README.md and speech_digits.png (the losses and the word
error rate against the step); `--plot_only` draws the figure again from results.json.
"""
import functools
import os
import pathlib
import shutil
import statistics
import subprocess
import time

from absl import flags
import jax
from matplotlib.figure import Figure
import numpy as np
import soundfile

import step_timing
from transformer_jax import data, run as run_lib, sweep
from transformer_jax.data import audio, audiofolder, speech
from transformer_jax.errors import UserError
from transformer_jax.layers import log_mel

NAME = 'speech_digits'
TITLE = 'Spoken digit strings: the reference Whisper on speech espeak-ng synthesizes'
CONFIG = pathlib.Path(__file__).resolve().parent.parent / 'configs' / 'whisper_reference.py'
DIGIT_WORDS = ('zero', 'one', 'two', 'three', 'four', 'five', 'six', 'seven', 'eight', 'nine')
ACCENTS = ('en-us', 'en-gb', 'en-gb-scotland', 'en-gb-x-rp', 'en-029', 'en-us-nyc')
VARIANTS = ('m1', 'm3', 'm7', 'f2', 'f4', 'klatt')
SPEEDS, PITCHES = (130, 200), (20, 80)  # inclusive ranges
MIN_DIGITS, MAX_DIGITS = 3, 6
NUM_UTTERANCES, QUICK_UTTERANCES = 4000, 80  # the last tenth held out
STEPS, EVALS = 800, 4
WINDOW_SECONDS, SEQ_LEN = 4.0, 40
ALPHABET = ''.join(sorted(set(' '.join(DIGIT_WORDS))))
MODEL = {'data.name': 'audiofolder', 'data.window_seconds': WINDOW_SECONDS,
         'data.seq_len': SEQ_LEN, 'model.max_len': SEQ_LEN, 'model.num_frames': 400,
         'model.vocab_size': 3 + len(ALPHABET),  # PAD, BOS, EOS and the characters
         'data.batch_size': 32, 'data.eval_batch_size': 100, 'data.wer_examples': 400,
         'data.num_threads': 2, 'training.steps': STEPS,
         'training.eval_every': STEPS // EVALS, 'training.checkpoint_every': STEPS // EVALS,
         'training.log_every': 50}
QUICK = {'data.batch_size': 8, 'data.eval_batch_size': 8, 'data.wer_examples': 8,
         'training.steps': 2, 'training.eval_every': 2, 'training.checkpoint_every': 2,
         'training.log_every': 1, 'optimizer.warmup_steps': 1}
BEAM_SIZE = 4
# What the pipeline makes and what the step reads, by data.log_mel_on.
SHIPS = {'host': 'log-Mel features made in it', 'device': 'waveforms only'}
STEP_READS = {'host': 'features made ahead', 'device': 'waveforms made ahead, log-Mel in the step'}

_THROUGHPUT = flags.DEFINE_bool('throughput', False, 'Measure the input pipeline and the train '
                                'step on the set (no training).')
_BATCHES = flags.DEFINE_integer('batches', 20, 'Timed batches per throughput measurement.')


def espeak() -> str:
  """The espeak-ng program's path; a UserError saying how to install it where it is absent."""
  found = shutil.which('espeak-ng')
  if found is None:
    raise UserError(f'{NAME} synthesizes its speech with espeak-ng, which is not installed: '
                    '`apt-get install espeak-ng` (Debian/Ubuntu) or `brew install espeak-ng`.')
  return found


def utterances(count: int, seed: int = 0) -> list[dict]:
  """count draws of {'text', 'voice', 'speed', 'pitch'}: 3 to 6 digit words, a voice of
  ACCENTS x VARIANTS, a speed in words per minute and a pitch, uniform in their ranges."""
  generator = np.random.default_rng(seed)
  drawn = []
  for _ in range(count):
    digits = generator.integers(0, 10, size=generator.integers(MIN_DIGITS, MAX_DIGITS + 1))
    drawn.append({'text': ' '.join(DIGIT_WORDS[d] for d in digits),
                  'voice': f'{generator.choice(ACCENTS)}+{generator.choice(VARIANTS)}',
                  'speed': int(generator.integers(SPEEDS[0], SPEEDS[1] + 1)),
                  'pitch': int(generator.integers(PITCHES[0], PITCHES[1] + 1))})
  return drawn


def synthesize(directory: str, count: int) -> dict:
  """The audiofolder of `count` utterances in `directory` (kept where its metadata.csv already
  lists them); returns {'utterances', 'hours', 'longest_seconds'} of its clips."""
  directory = pathlib.Path(directory)
  metadata = directory / audiofolder.METADATA
  rows = utterances(count)
  if not (metadata.exists() and len(metadata.read_text().splitlines()) == count + 1):
    program = espeak()
    directory.mkdir(parents=True, exist_ok=True)
    for number, row in enumerate(rows):
      subprocess.run([program, '-v', row['voice'], '-s', str(row['speed']), '-p',
                      str(row['pitch']), '-w', str(directory / f'{number:05d}.wav'),
                      row['text']], check=True, capture_output=True)
    lines = ['file_name,transcription'] + [f'{n:05d}.wav,{r["text"]}' for n, r in enumerate(rows)]
    metadata.write_text('\n'.join(lines) + '\n')
  seconds = [soundfile.info(directory / f'{n:05d}.wav').duration for n in range(count)]
  return {'utterances': count, 'hours': sum(seconds) / 3600, 'longest_seconds': max(seconds),
          'mean_seconds': float(np.mean(seconds))}


def config_for(audio_dir: str, quick: bool, *extra: dict):
  shrunk = [QUICK] if quick else []
  return sweep.config_for(sweep.SweepRun('reference'), CONFIG, MODEL,
                          {'data.audio_dir': audio_dir}, *shrunk, *extra)


def run(quick: bool = False, workdir: str = f'/tmp/transformer_jax_experiments/{NAME}',
        results_dir: str | None = None, data_flags: dict | None = None,
        command: str = 'speech_digits.run()', vmap: bool = False) -> dict:
  """Synthesizes the set (or reads it back), trains the reference model, decodes the held-out
  set with beam search, writes the results folder."""
  del data_flags, vmap  # the set is made here; one run
  audio_dir = f'{workdir}/audio'
  made = synthesize(audio_dir, QUICK_UTTERANCES if quick else NUM_UTTERANCES)
  (result,) = sweep.run_all([sweep.SweepRun('reference')],
                            lambda r: config_for(audio_dir, quick), workdir)
  beam = run_lib.run(config_for(audio_dir, quick, {'eval.beam_size': BEAM_SIZE}),
                     f'{workdir}/reference', 'eval')
  return sweep.finish(TITLE, command, [result], lambda: report(made, result, beam, command),
                      figures, results_dir or f'{workdir}/results', quick, data=made,
                      beam={'beam_size': BEAM_SIZE, **beam})


def report(made: dict, result: dict, beam: dict, command: str) -> str:
  curve = [row for row in result['eval_curve'] if 'eval_wer' in row]
  audio_rate = result['examples_per_sec'] * made['mean_seconds']
  lines = [f'# {TITLE}', '', __doc__.split('\n\n')[1].replace('\n', ' '), '',
           f'Command: `{command}`', '',
           f'Machine: {os.cpu_count()} CPU cores, no accelerator, jax {jax.__version__}, shared '
           'with other jobs (the load averages below): the rates are what the run got, not '
           'what the machine does alone (`--throughput` measures them on their own).', '',
           f'The set: {made["utterances"]} utterances, {made["hours"]:.2f} hours, mean '
           f'{made["mean_seconds"]:.2f} s, longest {made["longest_seconds"]:.2f} s. Training: '
           f'{result["steps"]} steps in {result["train_seconds"] / 60:.1f} min of wall time '
           f'(load average {result["load_average_start"]:.1f} at the start, '
           f'{result["load_average_end"]:.1f} at the end), the step at '
           f'{result["examples_per_sec"]:.1f} utterances/s = {audio_rate:.1f} s of audio per '
           'second (median over the logged windows).', '',
           '| step | held-out loss | greedy WER |', '|---|---|---|']
  lines += [f'| {row["step"]} | {row["eval_loss"]:.4f} | {row["eval_wer"]:.4f} |' for row in curve]
  lines += ['', f'At step {beam["step"]}: greedy WER {curve[-1]["eval_wer"]:.4f}, beam '
            f'{BEAM_SIZE} WER {beam["eval_wer"]:.4f} (the held-out {MODEL["data.wer_examples"]} '
            'utterances).', '',
            sweep.figure_markdown(NAME, 'Left: the training and held-out loss; right: the '
                                  'held-out word error rate, greedy at each evaluation and with '
                                  f'beam {BEAM_SIZE} at the end.')]
  return '\n'.join(lines) + '\n'


def figures(payload: dict) -> dict[str, Figure]:
  """From results.json's content: the training and held-out loss (left) and the held-out word
  error rate, greedy at each evaluation and with beam search at the end (right), by step."""
  (result,) = payload['runs']
  beam = payload['beam']
  figure = Figure(figsize=(10, 4))
  loss_ax, wer_ax = figure.subplots(1, 2)
  loss_ax.plot(*sweep.series(result['train_curve'], 'loss'), color='#9ca3af',
               label='training (logged mean)')
  loss_ax.plot(*sweep.series(result['eval_curve'], 'eval_loss'), 'o-', color='black',
               label='held-out')
  loss_ax.set(xlabel='step', ylabel='loss (nats per character)', yscale='log',
              title='The reference Whisper on spoken digits')
  loss_ax.legend(fontsize=8, frameon=False)
  wer_ax.plot(*sweep.series(result['eval_curve'], 'eval_wer'), 'o-', color='#2563eb',
              label='greedy')
  wer_ax.plot([beam['step']], [beam['eval_wer']], 'D', color='#dc2626', mfc='none', ms=8,
              label=f'beam {beam["beam_size"]}')
  wer_ax.set(xlabel='step', ylabel='word error rate (held-out)', ylim=(0, None),
             title='Word error rate')
  wer_ax.legend(fontsize=8, frameon=False)
  return {NAME: figure}


def throughput(quick: bool, workdir: str, *unused, **unused_keywords) -> None:
  """--throughput: prints the input pipeline's and the train step's rates on the set, with the
  log-Mel features made on the host (in the pipeline) and on the device (in the step)."""
  del unused, unused_keywords
  audio_dir = f'{workdir}/audio'
  made = synthesize(audio_dir, QUICK_UTTERANCES if quick else NUM_UTTERANCES)
  config = config_for(audio_dir, quick)
  batches = 2 if quick else _BATCHES.value
  batch_size = config.data.batch_size
  print(f'jax {jax.__version__}, {os.cpu_count()} CPUs; {made["utterances"]} utterances of '
        f'mean {made["mean_seconds"]:.2f} s; batches of {batch_size}')
  show = lambda name, per_second, extra='': print(
      f'  {name:<56} {per_second:7.1f} utterances/s = {per_second * made["mean_seconds"]:7.1f} '
      f's of audio/s{extra}  (load average {os.getloadavg()[0]:.2f})', flush=True)
  for where in speech.LOG_MEL_ON:
    config.data.log_mel_on = where
    for threads in (1, config.data.num_threads):
      config.data.num_threads = threads
      made_data = data.make_data(config.data, 'audio', seed=0, num_mels=config.model.num_mels,
                                 num_frames=config.model.num_frames, max_len=config.model.max_len)
      show(f'input pipeline, {SHIPS[where]}, {threads} thread(s)',
           pipeline_rate(made_data, batches))
  front_end(audio_dir, batch_size, config.model.num_mels)
  configs = [config_for(audio_dir, quick, {'data.log_mel_on': where})
             for where in speech.LOG_MEL_ON]
  for where, seconds in zip(speech.LOG_MEL_ON, step_seconds(configs, batches)):
    show(f'train step, {STEP_READS[where]}', batch_size / seconds,
         f' ({seconds * 1e3:.1f} ms a step)')


def front_end(audio_dir: str, batch_size: int, num_mels: int) -> None:
  """Prints the log-Mel features of a batch of the set's clips made two ways: data.audio's front
  end clip by clip in NumPy (as the pipeline's threads make them), and layers.log_mel as one
  jitted program on the JAX device (as the step makes them); their largest difference first."""
  samples = int(WINDOW_SECONDS * audio.SAMPLE_RATE)
  waveforms = np.stack([audio.pad_or_trim(audio.load_audio(f'{audio_dir}/{n:05d}.wav'), samples)
                        for n in range(batch_size)])
  on_device = jax.jit(functools.partial(log_mel.log_mel, num_mels=num_mels))
  made = lambda: [audio.log_mel_spectrogram(w, num_mels=num_mels, num_samples=samples)
                  for w in waveforms]
  difference = np.abs(np.stack(made()) - np.asarray(on_device(waveforms))).max()
  print(f'  log-Mel features of {batch_size} clips, the two ways differing by {difference:.1e}:')
  for _ in range(3):
    start = time.perf_counter()
    made()
    numpy_seconds = time.perf_counter() - start
    start = time.perf_counter()
    jax.block_until_ready(on_device(waveforms))
    device_seconds = time.perf_counter() - start
    print(f'    NumPy, clip by clip {numpy_seconds * 1e3:6.1f} ms; jitted on the device '
          f'{device_seconds * 1e3:6.1f} ms  (load average {os.getloadavg()[0]:.2f})', flush=True)


def pipeline_rate(made_data, batches: int) -> float:
  """Utterances per second of training batches from grain's iterator, after two warm-up ones."""
  iterator = made_data.train_iterator(0)
  for _ in range(2):
    next(iterator)
  start = time.perf_counter()
  for _ in range(batches):
    next(iterator)
  return batches * made_data.batch_size / (time.perf_counter() - start)


def step_seconds(configs: list, batches: int) -> list[float]:
  """The train step's median seconds of each config, on batches made ahead (step_timing); the
  configs' steps are timed in turn, so that a shared machine's changing load falls on each."""
  steps = [step_timing.timed_step(config) for config in configs]
  times = [[step(i) for step in steps] for i in range(batches + 2)]
  return [statistics.median(row[n] for row in times[2:]) for n in range(len(steps))]


def main(argv=None):
  sweep.main(NAME, lambda *args, **keywords: (throughput if _THROUGHPUT.value else run)(
      *args, **keywords), argv, figures)


if __name__ == '__main__':
  main()
