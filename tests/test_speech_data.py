"""Speech data from TFDS by name (TFDS's mock records of the real builders' features: integer
audio of random lengths), integer waveforms' scale, and bad input reported as one line."""
import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
import soundfile
import tensorflow_datasets as tfds

from helpers import load_experiment, mock_tfds, ROOT
from transformer_jax import data
from transformer_jax.data import audio, sources, speech
from transformer_jax.errors import ConfigError, UserError

LIBRISPEECH = dict(name='librispeech', train_split='train_clean100', eval_split='dev_clean',
                   seq_len=24)
# speech_commands' 12 labels as words: 'down', ..., 'yes', 'silence', 'unknown'.
COMMAND_WORDS = ('down', 'go', 'left', 'no', 'off', 'on', 'right', 'stop', 'up', 'yes', 'silence',
                 'unknown')


def audio_task(**settings):
  settings = data.DataSettings.of({'seq_len': 8, 'log_mel_on': 'host', **settings})
  return speech.AudioTask(settings, seed=0, num_mels=8, num_frames=20, max_len=24)


def expected_features(samples, rate=16000):
  """The log-Mel features of integer samples by hand: int16 over 32,768, then the front end."""
  assert samples.dtype == np.int16
  waveform = samples.astype(np.float64) / 32768
  if rate != 16000:
    waveform = audio.waveform_of(waveform.astype(np.float32), rate)
  return audio.log_mel_spectrogram(waveform, num_mels=8, num_samples=20 * audio.HOP_LENGTH)


def test_speech_commands_by_name_reads_its_labels_as_words():
  with mock_tfds(12):
    task = audio_task(name='speech_commands')
    held_out = sources.open_audio_dataset('speech_commands', data_dir=None, train_split='train',
                                          eval_split=None, audio_key=None,
                                          transcript_key=None).held_out
    assert task.train.label_words == COMMAND_WORDS
    assert task.vocab.size == 3 + len(set(''.join(COMMAND_WORDS)))  # PAD, BOS, EOS, letters
    batch = task.eval_examples(np.arange(3))
    for row in range(3):
      record = held_out[row]
      assert task.vocab.decode(batch['targets'][row]) == COMMAND_WORDS[record['label']]
      np.testing.assert_allclose(batch['features'][row], expected_features(record['audio']),
                                 atol=1e-5)


def test_librispeech_by_name_reads_its_text_and_resumes_exactly():
  with mock_tfds(12):
    task = audio_task(**LIBRISPEECH)
    assert (task.train.dataset.audio_key, task.train.dataset.transcript_key) == ('speech', 'text')
    batch = task.train_batch(3, 4, slice(None))
    texts = [task.vocab.decode(row) for row in batch['targets']]
    assert all(texts) and all(set(text) <= set(speech.TEXT_ALPHABET) for text in texts)
    # A fresh task (a resumed run) makes step 3's batch again, and the pipeline from step 3 too.
    again = audio_task(**LIBRISPEECH)
    for key, value in again.train_batch(3, 4, slice(None)).items():
      np.testing.assert_array_equal(value, batch[key])
    made = data.make_data({**LIBRISPEECH, 'batch_size': 4, 'eval_batch_size': 4,
                           'log_mel_on': 'host'}, 'audio', seed=0, process_index=0,
                          process_count=1, num_mels=8, num_frames=20, max_len=24)
    resumed = next(made.train_iterator(3))
    np.testing.assert_array_equal(resumed['features'], batch['features'])


def test_tfds_keys_that_name_no_audio_or_transcript_fail_naming_the_features():
  with mock_tfds(4):
    with pytest.raises(ConfigError, match=r"data.audio_key='audio': librispeech has no Audio "
                       r"feature of that name; set data.audio_key to one of \['speech'\]"):
      audio_task(**LIBRISPEECH, audio_key='audio')
    with pytest.raises(ConfigError, match=r"data.transcript_key='id'.*one of \['text'\]"):
      audio_task(**LIBRISPEECH, transcript_key='id')


@pytest.mark.parametrize('dtype,scale', [(np.int16, 2**15), (np.int32, 2**31), (np.int64, 2**15),
                                         (np.float32, 1)])
def test_integer_samples_are_scaled_by_their_full_scale(dtype, scale):
  samples = (np.array([0.5, -0.25, 1 / 64]) * scale).astype(dtype)
  np.testing.assert_array_equal(audio.waveform_of(samples, 16000), [0.5, -0.25, 1 / 64])
  assert audio.waveform_of(np.array([128, 192, 0], np.uint8), 16000).tolist() == [0, 0.5, -1]
  stereo = np.array([[2**14, 0], [-2**14, -2**14]], np.int16)
  np.testing.assert_array_equal(audio.waveform_of(stereo, 16000), [0.25, -0.5])


def test_a_sample_rate_the_resampler_refuses_is_named_with_its_source():
  with pytest.raises(UserError, match='soxr cannot resample clip.wav from 0 Hz to 16000 Hz'):
    audio.waveform_of(np.zeros(100, np.float32), 0, source='clip.wav')


def write_folder(directory, count, corrupt=()):
  lines = ['file_name,transcription']
  for i in range(count):
    if i in corrupt:
      (directory / f'{i}.wav').write_bytes(b'RIFF....WAVEfmt broken')
    else:
      soundfile.write(directory / f'{i}.wav', 0.1 * np.ones(800, np.float32), 8000)
    lines.append(f'{i}.wav,ab')
  (directory / 'metadata.csv').write_text('\n'.join(lines) + '\n')


def launch(*flags, timeout=600):
  """tests/mock_launch.py with `flags`, this checkout's package imported (not an installed one)."""
  return subprocess.run([sys.executable, str(ROOT / 'tests' / 'mock_launch.py'), *flags],
                        capture_output=True, text=True, timeout=timeout,
                        env={'JAX_PLATFORMS': 'cpu', 'PATH': '', 'PYTHONPATH': str(ROOT)})


REFERENCE = [f'--config={ROOT / "configs" / "whisper_reference.py"}:steps=2',
             '--config.model.width=32', '--config.model.num_frames=40',
             '--config.model.num_mels=16', '--config.data.batch_size=8',
             '--config.data.eval_batch_size=8', '--config.training.log_every=1']


@pytest.mark.slow
def test_launch_trains_on_tfds_speech_commands_and_librispeech(tmp_path):
  commands = ['--config.data.name=speech_commands', '--config.data.wer_examples=8',
              f'--config.model.vocab_size={3 + len(set("".join(COMMAND_WORDS)))}']
  librispeech = ['--config.data.name=librispeech', '--config.data.train_split=train_clean100',
                 '--config.data.eval_split=dev_clean', '--config.data.seq_len=24',
                 '--config.model.max_len=24', '--config.data.wer_examples=0',
                 f'--config.model.vocab_size={3 + len(speech.TEXT_ALPHABET)}']
  for name, flags in (('commands', commands), ('librispeech', librispeech)):
    result = launch(*REFERENCE, f'--workdir={tmp_path / name}', *flags)
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = (tmp_path / name / 'metrics.jsonl').read_text()
    rows = [json.loads(line) for line in metrics.splitlines()]
    assert [row['step'] for row in rows if 'loss' in row] == [1, 2]
    assert [row['step'] for row in rows if 'eval_loss' in row] == [2]


@pytest.mark.slow
def test_a_corrupt_file_among_thousands_is_one_line_naming_it(tmp_path):
  """Launch on a folder of 2,000 files, one of the held-out ones (the last 200) corrupt: the
  evaluation, whose batches grain's threads read, ends the run with one line naming that file,
  not a traceback."""
  write_folder(tmp_path, 2000, corrupt={1900})
  result = launch(*REFERENCE, f'--workdir={tmp_path / "run"}', '--config.data.name=audiofolder',
                  f'--config.data.audio_dir={tmp_path}', '--config.model.vocab_size=5',
                  '--config.data.num_threads=2')
  assert result.returncode == 1
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith(f'cannot read the audio file {tmp_path / "1900.wav"}')
  assert 'Traceback' not in result.stderr


def test_a_tfds_audio_feature_without_a_sample_rate_needs_the_setting(monkeypatch):
  with mock_tfds(4):
    monkeypatch.setattr(tfds.features.Audio, 'sample_rate', property(lambda self: None))
    with pytest.raises(ConfigError, match='states no sample rate: set data.source_sample_rate'):
      audio_task(name='speech_commands')
    task = audio_task(name='speech_commands', source_sample_rate=8000)
    held_out = task.held_out.source[0]['audio']
    np.testing.assert_allclose(task.eval_examples(np.array([0]))['features'][0],
                               expected_features(held_out, rate=8000), atol=1e-5)


def test_a_corrupt_file_read_in_a_training_thread_raises_its_own_error(tmp_path):
  """grain's threads read the training batches: the UserError naming the file reaches the loop
  as it is (run.errors_as_messages prints it as one line)."""
  write_folder(tmp_path, 20, corrupt={3})
  made = data.make_data({'name': 'audiofolder', 'audio_dir': str(tmp_path), 'seq_len': 4,
                         'batch_size': 8, 'eval_batch_size': 2, 'num_threads': 2}, 'audio',
                        seed=0, process_index=0, process_count=1, num_mels=8, num_frames=20,
                        max_len=8)
  batches = made.train_iterator(0)
  with pytest.raises(UserError, match=f'cannot read the audio file {tmp_path / "3.wav"}'):
    for _ in range(20):  # 160 draws of 18 training files: 3.wav among them
      next(batches)


@pytest.fixture(scope='module')
def speech_digits():
  """experiments/speech_digits.py, loaded once (it defines absl flags)."""
  return load_experiment('speech_digits')


def test_speech_digits_draws_digit_strings_voices_speeds_and_pitches(speech_digits, monkeypatch):
  drawn = speech_digits.utterances(300)
  assert drawn == speech_digits.utterances(300)  # the set is a function of its seed
  lengths = {len(row['text'].split()) for row in drawn}
  assert lengths == {3, 4, 5, 6}
  assert {word for row in drawn for word in row['text'].split()} == set(speech_digits.DIGIT_WORDS)
  accents = {row['voice'].split('+')[0] for row in drawn}
  assert accents == set(speech_digits.ACCENTS)
  assert {row['voice'].split('+')[1] for row in drawn} == set(speech_digits.VARIANTS)
  assert min(r['speed'] for r in drawn) >= 130 and max(r['speed'] for r in drawn) <= 200
  assert min(r['pitch'] for r in drawn) >= 20 and max(r['pitch'] for r in drawn) <= 80
  monkeypatch.setattr(speech_digits.shutil, 'which', lambda name: None)
  with pytest.raises(UserError, match='not installed: `apt-get install espeak-ng`'):
    speech_digits.synthesize('/nonexistent/audio', 3)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which('espeak-ng') is None, reason='speech_digits speaks with espeak-ng')
def test_speech_digits_quick_mode_synthesizes_trains_and_writes_its_results(speech_digits,
                                                                           tmp_path):
  speech_digits.main(['--quick', '--workdir', str(tmp_path)])
  metadata = (tmp_path / 'audio' / 'metadata.csv').read_text().splitlines()
  assert len(metadata) == 1 + speech_digits.QUICK_UTTERANCES
  assert metadata[1] == f'00000.wav,{speech_digits.utterances(1)[0]["text"]}'
  payload = json.loads((tmp_path / 'results' / 'results.json').read_text())
  assert payload['command'] == f'python experiments/speech_digits.py --quick --workdir {tmp_path}'
  assert [run['status'] for run in payload['runs']] == ['finished']
  assert payload['beam']['beam_size'] == 4 and 0 <= payload['beam']['eval_wer']
  assert payload['data']['longest_seconds'] <= speech_digits.WINDOW_SECONDS

