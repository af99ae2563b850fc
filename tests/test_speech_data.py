"""Speech data from TFDS by name (TFDS's mock records of the real builders' features: integer
audio of random lengths) and from folders of Hugging Face's audiofolder layouts, integer
waveforms' scale, and bad input reported as one line."""
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
  """Launch on a folder of 2,000 files, one of the held-out ones (the last 200, which only the
  evaluation reads) corrupt: opening the folder reads every header, so the run ends before it
  starts with one line naming that file and its metadata line, not a traceback, and writes
  nothing."""
  write_folder(tmp_path, 2000, corrupt={1900})
  result = launch(*REFERENCE, f'--workdir={tmp_path / "run"}', '--config.data.name=audiofolder',
                  f'--config.data.audio_dir={tmp_path}', '--config.model.vocab_size=5',
                  '--config.data.num_threads=2')
  assert result.returncode == 1
  assert result.stderr.strip().splitlines()[-1] == (
      f'cannot read the audio file {tmp_path / "1900.wav"} (named by '
      f'{tmp_path / "metadata.csv"}:1902): Error in WAV/W64/RF64 file. Malformed \'fmt \' chunk; '
      'convert it to WAV or FLAC, or remove that line')
  assert 'Traceback' not in result.stderr and not (tmp_path / 'run').exists()


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
  """grain's threads read the training batches: the UserError naming a file that broke after
  the folder was opened (its header checked) reaches the loop as it is (run.errors_as_messages
  prints it as one line)."""
  write_folder(tmp_path, 20)
  made = data.make_data({'name': 'audiofolder', 'audio_dir': str(tmp_path), 'seq_len': 4,
                         'batch_size': 8, 'eval_batch_size': 2, 'num_threads': 2}, 'audio',
                        seed=0, process_index=0, process_count=1, num_mels=8, num_frames=20,
                        max_len=8)
  (tmp_path / '3.wav').write_bytes(b'RIFF....WAVEfmt broken')
  batches = made.train_iterator(0)
  with pytest.raises(UserError, match=f'cannot read the audio file {tmp_path / "3.wav"}'):
    for _ in range(20):  # 160 draws of 18 training files: 3.wav among them
      next(batches)


def tone_file(path):
  """A 50 ms WAV file at 8 kHz, its folders made."""
  path.parent.mkdir(parents=True, exist_ok=True)
  soundfile.write(path, 0.1 * np.ones(400, np.float32), 8000)


def split(directory, texts, *, jsonl=False, under=''):
  """A folder of a WAV file per transcript (in its subfolder `under`) and the metadata.csv (or
  metadata.jsonl) naming them; returns the files' paths."""
  names = [f'{under}{i}.wav' for i in range(len(texts))]
  for name in names:
    tone_file(directory / name)
  if jsonl:
    lines = [json.dumps({'file_name': n, 'transcription': t}) for n, t in zip(names, texts)]
    (directory / 'metadata.jsonl').write_text('\n'.join(lines) + '\n')
  else:
    lines = ['file_name,transcription'] + [f'{n},{t}' for n, t in zip(names, texts)]
    (directory / 'metadata.csv').write_text('\n'.join(lines) + '\n')
  return [str(directory / name) for name in names]


def test_split_folders_are_the_splits_test_held_out_before_validation(tmp_path):
  """Hugging Face's audiofolder with split folders: train/ (here a metadata.jsonl naming files
  in a subfolder) trains; test/ is held out where there is one, validation/ where
  data.eval_split names it; a lone train/ holds out its last tenth, as a flat folder does."""
  train = split(tmp_path / 'train', ['ab', 'ba', 'a', 'b'], jsonl=True, under='clips/')
  test = split(tmp_path / 'test', ['aab', 'abb'])
  validation = split(tmp_path / 'validation', ['bba'])
  task = audio_task(name='audiofolder', audio_dir=str(tmp_path))
  assert [row.path for row in task.train.rows] == train
  assert task.train.rows[2].origin == f'{tmp_path / "train" / "metadata.jsonl"}:3'
  assert [row.path for row in task.held_out.rows] == test and task.num_eval_examples == 2
  held_out = task.eval_examples(np.arange(2))
  assert [task.vocab.decode(row) for row in held_out['targets']] == ['aab', 'abb']
  chosen = audio_task(name='audiofolder', audio_dir=str(tmp_path), eval_split='validation')
  assert [row.path for row in chosen.held_out.rows] == validation
  lone = split(tmp_path / 'lone' / 'train', ['a'] * 20)
  task = audio_task(name='audiofolder', audio_dir=str(tmp_path / 'lone'))
  assert [row.path for row in task.train.rows] == lone[:18]
  assert [row.path for row in task.held_out.rows] == lone[18:]


def test_the_transcript_column_is_data_transcript_key(tmp_path):
  """Common Voice's metadata names its transcripts `sentence`: data.transcript_key reads it."""
  split(tmp_path, ['ab', 'ba'])
  (tmp_path / 'metadata.csv').write_text('file_name,sentence\n0.wav,ab\n1.wav,"b, a"\n')
  with pytest.raises(UserError, match=r"has no column transcription \(it has \['file_name', "
                     r"'sentence'\]\).*or set data.transcript_key"):
    audio_task(name='audiofolder', audio_dir=str(tmp_path))
  task = audio_task(name='audiofolder', audio_dir=str(tmp_path), transcript_key='sentence')
  assert [row.text for row in task.train.rows + task.held_out.rows] == ['ab', 'b, a']


def _no_metadata(d):
  tone_file(d / '0.wav')
  return {}, (f'no metadata.csv (or metadata.jsonl) in data.audio_dir={d} nor in a split folder '
              'of it: an audiofolder is DIR/metadata.csv')


def _split_without_metadata(d):
  split(d / 'train', ['a', 'b'])
  tone_file(d / 'test' / '0.wav')
  return {}, (f'The split folder {d / "test"} has no metadata.csv (or metadata.jsonl) naming its '
              'audio files and their transcripts: write one (columns file_name, transcription).')


def _two_metadata_files(d):
  split(d, ['a', 'b'])
  split(d, ['a', 'b'], jsonl=True)
  return {}, f'{d} holds both metadata.csv and metadata.jsonl: keep the one that lists its files.'


def _parquet(d):
  (d / 'metadata.parquet').write_bytes(b'PAR1')
  return {}, (f'{d / "metadata.parquet"}: Parquet metadata is not read; write it as '
              'metadata.csv')


def _metadata_beside_split_folders(d):
  split(d, ['a', 'b'])
  split(d / 'train', ['a', 'b'])
  return {}, (f'{d} holds metadata.csv and split folders holding their own (train): keep one '
              'layout')


def _dev_beside_train(d):
  split(d / 'train', ['a', 'b'])
  split(d / 'dev', ['a'])
  return {}, (f'{d} has the split folder dev beside train, and no test or validation: set '
              'data.eval_split=dev to hold it out.')


def _eval_split_of_a_flat_folder(d):
  split(d, ['a', 'b'])
  return {'eval_split': 'validation'}, ("data.train_split='train' and "
                                        "data.eval_split='validation' name split folders, and "
                                        f'data.audio_dir={d} has one metadata.csv')


def _eval_split_of_no_folder(d):
  split(d / 'train', ['a', 'b'])
  split(d / 'test', ['a'])
  return {'eval_split': 'dev'}, (f"data.eval_split='dev': {d} has no split folder dev holding a "
                                 'metadata file; its split folders: test, train.')


def _fields_off_the_header(d):
  split(d, ['a', 'b', 'a'])
  (d / 'metadata.csv').write_text('file_name,transcription\n0.wav,a\n1.wav,a, b\n2.wav,a\n')
  return {}, (f'{d / "metadata.csv"}:3 has 3 fields where its header has 2: quote a field that '
              'holds a comma')


def _a_line_that_is_not_json(d):
  split(d, ['a', 'b', 'a'], jsonl=True)
  (d / 'metadata.jsonl').write_text('{"file_name": "0.wav", "transcription": "a"}\n'
                                    '{"file_name": "1.wav", "transcription": "b\n')
  return {}, f'{d / "metadata.jsonl"}:2 is not JSON (Unterminated string'


def _a_record_without_its_transcript(d):
  split(d, ['a', 'b'], jsonl=True)
  (d / 'metadata.jsonl').write_text('{"file_name": "0.wav", "transcription": "a"}\n\n'
                                    '{"file_name": "1.wav", "text": "b"}\n')
  return {}, (f"{d / 'metadata.jsonl'}:3 has no transcription (its keys: ['file_name', 'text']): "
              'give each line file_name and transcription, or set data.transcript_key')


def _no_file_name(d):
  split(d, ['a', 'b'])
  (d / 'metadata.csv').write_text('file_name,transcription\n0.wav,a\n,b\n')
  return {}, f"{d / 'metadata.csv'}:3 names no audio file under file_name ('')"


def _a_missing_file(d):
  split(d, ['a', 'b', 'a'])
  (d / '2.wav').unlink()
  return {}, (f'no audio file at {d / "2.wav"} (named by {d / "metadata.csv"}:4): check the path '
              '(or the metadata naming it)')


def _a_text_file_renamed_wav(d):
  split(d, ['a', 'b', 'a'])
  (d / '1.wav').write_text('file_name,transcription\n')
  return {}, (f'cannot read the audio file {d / "1.wav"} (named by {d / "metadata.csv"}:3): '
              'Format not recognised; convert it to WAV or FLAC, or remove that line')


def _a_file_without_samples(d):
  split(d, ['a', 'b'])
  soundfile.write(d / '0.wav', np.zeros(0, np.float32), 8000)
  return {}, (f'the audio file {d / "0.wav"} (named by {d / "metadata.csv"}:2) holds no '
              'samples: replace it, or remove that line')


@pytest.mark.parametrize('make', [
    _no_metadata, _split_without_metadata, _two_metadata_files, _parquet,
    _metadata_beside_split_folders, _dev_beside_train, _eval_split_of_a_flat_folder,
    _eval_split_of_no_folder, _fields_off_the_header, _a_line_that_is_not_json,
    _a_record_without_its_transcript, _no_file_name, _a_missing_file, _a_text_file_renamed_wav,
    _a_file_without_samples], ids=lambda make: make.__name__.strip('_'))
def test_a_folder_is_refused_at_opening_in_one_line_naming_the_file_and_fix(tmp_path, make):
  settings, expected = make(tmp_path)
  with pytest.raises(UserError) as raised:
    audio_task(name='audiofolder', audio_dir=str(tmp_path), **settings)
  message = str(raised.value)
  assert message.startswith(expected) and '\n' not in message


def test_every_transcript_is_checked_at_opening_naming_the_longest_and_the_seq_len_it_needs(
    tmp_path):
  """The longest transcript, 12 characters, is the held-out one (the last of four): [BOS] and
  its 12 characters are 13 decoder inputs, so it needs data.seq_len=13 (the decoder's
  model.max_len=24 has them); 30 characters need 31, over model.max_len too."""
  split(tmp_path, ['ab', 'abababab', 'ba', 'ab' * 6])
  with pytest.raises(UserError) as raised:
    audio_task(name='audiofolder', audio_dir=str(tmp_path), seq_len=8)
  assert str(raised.value) == (
      f'2 of 4 transcripts are over data.seq_len=8 tokens; the longest, of {tmp_path / "3.wav"} '
      f'({tmp_path / "metadata.csv"}:5), is 13 tokens with its EOS: set data.seq_len=13.')
  task = audio_task(name='audiofolder', audio_dir=str(tmp_path), seq_len=13)
  assert task.vocab.decode(task.eval_examples(np.arange(1))['targets'][0]) == 'ab' * 6
  split(tmp_path, ['ab', 'ab' * 15])
  with pytest.raises(UserError, match=r'is 31 tokens with its EOS: set data.seq_len=31 and '
                     r"model.max_len=31 \(the decoder's positions, 24 now\), or shorten that "
                     'transcript.$'):
    audio_task(name='audiofolder', audio_dir=str(tmp_path), seq_len=8)


@pytest.mark.slow
def test_a_users_folder_is_refused_one_fault_a_line_then_trains_in_the_same_workdir(tmp_path):
  """launch.py on a folder of split folders as a user's first tries go: each fault ends the
  command before it starts, with one line naming the folder, file and line, or the setting, and
  the fix, and nothing written in the workdir; corrected, the folder trains there, test/ held
  out."""
  folder, workdir = tmp_path / 'speech', tmp_path / 'run'
  split(folder / 'train', ['ab', 'ba', 'abba', 'b'] * 4)
  tone_file(folder / 'test' / '0.wav')
  command = [*REFERENCE, f'--workdir={workdir}', '--config.data.name=audiofolder',
             f'--config.data.audio_dir={folder}', '--config.model.vocab_size=5',
             '--config.model.max_len=8']

  def refused(expected):
    result = launch(*command, '--config.data.seq_len=3')
    assert result.returncode == 1 and 'Traceback' not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == expected
    assert not workdir.exists()

  train, test = folder / 'train', folder / 'test'
  refused(f'The split folder {test} has no metadata.csv (or metadata.jsonl) naming its audio '
          'files and their transcripts: write one (columns file_name, transcription).')
  split(test, ['ab', 'ba'] * 3 + ['b', 'ababab'])
  (train / '2.wav').write_text('file_name,transcription\n')
  refused(f'cannot read the audio file {train / "2.wav"} (named by {train / "metadata.csv"}:4): '
          'Format not recognised; convert it to WAV or FLAC, or remove that line')
  tone_file(train / '2.wav')
  (train / '5.wav').unlink()
  refused(f'no audio file at {train / "5.wav"} (named by {train / "metadata.csv"}:7): check the '
          'path (or the metadata naming it)')
  tone_file(train / '5.wav')
  refused(f'5 of 24 transcripts are over data.seq_len=3 tokens; the longest, of {test / "7.wav"} '
          f'({test / "metadata.csv"}:9), is 7 tokens with its EOS: set data.seq_len=7.')
  result = launch(*command, '--config.data.seq_len=7')
  assert result.returncode == 0, result.stderr[-3000:]
  assert 'train/ (16 files) trains, test/ (8) is held out' in result.stderr
  rows = [json.loads(line) for line in (workdir / 'metrics.jsonl').read_text().splitlines()]
  assert [row['step'] for row in rows if 'loss' in row] == [1, 2]
  assert [row['step'] for row in rows if 'eval_loss' in row] == [2]


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

