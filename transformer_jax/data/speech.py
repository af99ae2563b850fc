"""Speech to text for Whisper: utterances as log-Mel features and their transcripts as decoder
targets, from an `audiofolder`, a TFDS speech dataset, or generated.

  data.name='audiofolder', data.audio_dir=DIR: Hugging Face's audiofolder layout, a
    metadata.csv (or .jsonl) whose `file_name` and `transcription` columns name each audio file
    and give its text: DIR's own, its last tenth held out, or one in each split folder
    (DIR/train, DIR/test or DIR/validation). audiofolder.py reads it, checking every row and
    every file's header when it is opened; the task then checks that every transcript fits
    data.seq_len, naming the longest and the value that fits it.
  data.name=NAME of a TFDS dataset (librispeech, speech_commands, ...) prepared in
    data.tfds_data_dir: its Audio feature data.audio_key and its Text (or ClassLabel, whose
    names are the words) feature data.transcript_key, each unset for the dataset's only one;
    splits data.train_split and data.eval_split.
  data.name='synthetic': tones whose transcript is their digit (digit d: a sine of 300 + 100 d
    Hz, of random phase, length and start, plus noise), so that describe, compile and training
    run without files.

The encoder reads Whisper's log-Mel features (layers.log_mel), with SpecAugment (Park et al.
2019) on training examples where data.spec_augment. data.log_mel_on='device' (the default): the
pipeline ships each utterance's 16 kHz waveform padded or trimmed to the window (the features of
which equal those of the raw waveform, which Whisper pads or trims first) and its masks' bands,
drawn here, and the model makes the features inside the jitted step; 'host': the pipeline's
workers make the features, per example, and mask them. Either way the masks are a pure function
of (seed, step), and the same on both.
Transcripts are encoded by the text data's tokenizer (data.tokenizer): 'chars', a character
vocabulary with PAD, BOS and EOS (data.vocab.Vocab) of the digits for generated data and of the
transcripts' characters for a folder; or a tokenizer.json. One with Whisper's special tokens
(<|startoftranscript|>, the language's <|en|>, the task's <|transcribe|> or <|translate|>,
<|notimestamps|>, <|endoftext|>: a Whisper checkpoint directory's) makes Whisper's decoder
prompt, <|startoftranscript|> <|LANG|> <|TASK|> <|notimestamps|> (LANG: data.language, TASK:
data.whisper_task), before the text and its <|endoftext|>: the loss and the word error rate skip
the prompt, and decoding starts from it. Any other tokenizer (the characters, a tokenizer.json
without them) starts the decoder from its BOS (<|startoftranscript|> where it has no BOS).
`generation_metrics` gives eval_wer, the word error rate (jiwer) of the greedy (or beam)
transcripts of the first data.wer_examples held-out utterances, both sides lower-cased and
stripped of punctuation.
"""
import dataclasses
import re
import string

import jiwer
import numpy as np

from transformer_jax.data import audio, audiofolder, corpus, rng, seq2seq, sources, tokenizer
from transformer_jax.data.settings import DataPart, register_part
from transformer_jax.data.vocab import Vocab
from transformer_jax.errors import ConfigError, UserError
from transformer_jax.layers.log_mel import mask_bands
from transformer_jax.ranges import COUNT, Range

__all__ = ['AudioSettings', 'AudioTask', 'encoder_inputs', 'make_audio_task', 'normalized',
           'SOURCES', 'transcript_tokenizer', 'word_error_rate']

SOURCES = ('synthetic', 'audiofolder')
DIGITS = '0123456789'
# The characters a TFDS dataset's Text transcripts may hold with data.tokenizer='chars' (they are
# not read ahead to find theirs): LibriSpeech's are upper-case letters, the apostrophe and space.
TEXT_ALPHABET = string.ascii_letters + string.digits + " '.,;:!?-"
START_OF_TRANSCRIPT = '<|startoftranscript|>'  # Whisper's decoder start
NO_TIMESTAMPS = '<|notimestamps|>'
WHISPER_TASKS = ('transcribe', 'translate')
LOG_MEL_ON = ('device', 'host')


@register_part
@dataclasses.dataclass(frozen=True)
class AudioSettings(DataPart):
  """The keys of config.data that speech data reads."""
  PART = 'audio'
  audio_dir: str | None = None  # an audiofolder (data.name='audiofolder')
  sample_rate: int = audio.SAMPLE_RATE  # Hz the audio is resampled to
  window_seconds: float | None = None  # audio per utterance, padded or trimmed; None: the model's
  n_mels: int | None = None  # Mel bins; None: the model's num_mels
  spec_augment: bool = False  # SpecAugment's masks on training features
  num_time_masks: int = 2
  max_time_width: int = 100  # frames
  num_freq_masks: int = 2
  max_freq_width: int = 27  # Mel bins
  tone_noise: float = 0.05  # the noise of generated tones (standard deviation)
  wer_examples: int = 0  # held-out utterances transcribed for eval_wer; 0: none
  audio_key: str | None = None  # a TFDS dataset's Audio feature; None: its only one
  # Its Text or ClassLabel feature, None: its only one; an audiofolder's metadata column, None:
  # 'transcription'.
  transcript_key: str | None = None
  source_sample_rate: int | None = None  # a TFDS dataset's audio rate where it states none
  language: str = 'en'  # Whisper's language token <|en|>, where the tokenizer has Whisper's
  whisper_task: str = 'transcribe'  # Whisper's task token, where the tokenizer has Whisper's
  # Where the log-Mel features (and SpecAugment's masking) are computed: 'device', inside the
  # jitted step, the pipeline shipping padded waveforms; or 'host', in the pipeline's workers.
  # 'device' by default: on the 2-core CPU machine of experiments/speech_digits the NumPy front
  # end was most of the pipeline's cost and made it the slower side (46 to 51 utterances/s
  # against the step's 65 to 96), where shipping waveforms it made 269 to 612 and the front end
  # added 10% to the step. 'host' for a host with cores to spare beside a slow accelerator, or to
  # ship fewer bytes (features are num_mels / 160 of the waveform's).
  log_mel_on: str = 'device'

  RANGES = {'sample_rate': COUNT, 'window_seconds': Range(0, open_low=True, optional=True),
            'n_mels': Range(1, integer=True, optional=True),
            'num_time_masks': Range(0, integer=True), 'max_time_width': Range(0, integer=True),
            'num_freq_masks': Range(0, integer=True), 'max_freq_width': Range(0, integer=True),
            'tone_noise': Range(0), 'wer_examples': Range(0, integer=True),
            'source_sample_rate': Range(1, integer=True, optional=True)}
  CHOICES = {'whisper_task': WHISPER_TASKS, 'log_mel_on': LOG_MEL_ON}


def normalized(text: str) -> str:
  """Lower case, punctuation removed, whitespace collapsed: what the word error rate compares."""
  return ' '.join(re.sub(r'[^\w\s]', ' ', text.lower()).split())


def word_error_rate(hypotheses: list[str], references: list[str]) -> float:
  """The corpus's word edits over its reference words (jiwer's WER), after `normalized`; the
  words of a hypothesis whose reference has none count as insertions."""
  hypotheses = [normalized(text) for text in hypotheses]
  references = [normalized(text) for text in references]
  spoken = [(h, r) for h, r in zip(hypotheses, references) if r]
  edits = sum(len(h.split()) for h, r in zip(hypotheses, references) if not r)
  if spoken:
    output = jiwer.process_words([r for _, r in spoken], [h for h, _ in spoken])
    edits += output.substitutions + output.deletions + output.insertions
  return edits / max(1, sum(len(r.split()) for r in references))


def transcript_tokenizer(name: str, alphabet: str):
  """data.tokenizer's tokenizer of transcripts: 'chars' (of `alphabet`), or a tokenizer.json
  with an EOS, its BOS being Whisper's <|startoftranscript|> where it has none."""
  if name == 'chars':
    return Vocab.seq2seq(alphabet)
  if name == 'bpe':
    raise ConfigError("data.tokenizer='bpe' trains on text corpora, not transcripts: use 'chars' "
                      'or the path of a tokenizer.json (a Whisper checkpoint directory).')
  found = tokenizer.HFTokenizer.from_file(name)
  if found.bos_id is None:
    found.bos_id = found.id_of(START_OF_TRANSCRIPT)
  if found.bos_id is None or found.eos_id is None:
    raise ConfigError(f'data.tokenizer={name} has no BOS (or {START_OF_TRANSCRIPT}) or no EOS, '
                      'which the decoder starts from and ends with: give a tokenizer.json that '
                      'has them.')
  return found


def decoder_prompt(vocab, language: str, task: str) -> list[int]:
  """The ids the decoder starts from: Whisper's <|startoftranscript|> <|language|> <|task|>
  <|notimestamps|> where `vocab` has Whisper's special tokens (their first and last decide), else
  its BOS alone."""
  id_of = getattr(vocab, 'id_of', lambda token: None)
  if id_of(START_OF_TRANSCRIPT) is None or id_of(NO_TIMESTAMPS) is None:
    return [vocab.bos_id]
  tokens = [START_OF_TRANSCRIPT, f'<|{language}|>', f'<|{task}|>', NO_TIMESTAMPS]
  missing = [token for token in tokens if id_of(token) is None]
  if missing:
    raise ConfigError(f'The tokenizer has Whisper\'s special tokens but not {", ".join(missing)}: '
                      'set data.language (a code it has, such as en) and data.whisper_task '
                      f'({" or ".join(WHISPER_TASKS)}).')
  return [id_of(token) for token in tokens]


class FolderSplit:
  """An audiofolder's rows: [i] -> (waveform at sample_rate, transcript) of row i."""

  def __init__(self, rows: list[audiofolder.Row], sample_rate: int):
    self.rows, self.sample_rate = rows, sample_rate

  def __len__(self) -> int:
    return len(self.rows)

  def __getitem__(self, index) -> tuple[np.ndarray, str]:
    row = self.rows[int(index)]
    return audio.load_audio(row.path, self.sample_rate, origin=row.origin), row.text


class TFDSSplit:
  """A TFDS split's records: [i] -> (waveform at data.sample_rate, transcript) of record i, its
  audio as audio.waveform_of makes it from the dataset's integer samples and rate; a ClassLabel's
  name as words ('_silence_' -> 'silence'), a Text as it is."""

  def __init__(self, source, dataset: 'sources.AudioDataset', part: AudioSettings):
    self.source, self.dataset, self.sample_rate = source, dataset, part.sample_rate
    self.source_rate = dataset.sample_rate or part.source_sample_rate
    if self.source_rate is None:
      raise ConfigError(f'{dataset.name}\'s {dataset.audio_key} feature states no sample rate: '
                        'set data.source_sample_rate to the rate of its audio (Hz).')
    self.label_words = tuple(' '.join(name.replace('_', ' ').split())
                             for name in dataset.label_names or ())

  def __len__(self) -> int:
    return len(self.source)

  def __getitem__(self, index) -> tuple[np.ndarray, str]:
    record = self.source[int(index)]
    name = f'{self.dataset.name} record {int(index)}'
    waveform = audio.waveform_of(record[self.dataset.audio_key], self.source_rate,
                                 self.sample_rate, source=name)
    transcript = record[self.dataset.transcript_key]
    if self.label_words:
      return waveform, self.label_words[int(transcript)]
    return waveform, transcript.decode() if isinstance(transcript, bytes) else str(transcript)


class AudioTask:
  """{'waveforms': float32 (b, frames * 160) (data.log_mel_on='device', with 'time_masks' and
  'freq_masks' int32 (b, count, 2) on training batches where data.spec_augment) or 'features':
  float32 (b, frames, mels) ('host'); 'decoder_inputs': (b, T), 'targets': (b, T), 'weights':
  float32 (b, T)} (`encoder_inputs`), T = data.seq_len: of the sequence prompt + transcript + [EOS],
  padded to T + 1 (the prompt: `decoder_prompt`, [BOS] for a tokenizer without Whisper's
  tokens), the decoder inputs are all but its last token and the targets all but its first;
  the weights are 1.0 on the targets of the transcript and its EOS, 0.0 on the prompt's and the
  padding. A batch is a pure function of (seed, step).

  The transcript is encoded alone (the tokenizer.json's post-processor adds Whisper's prompt and
  <|endoftext|> again; `tokenizer.HFTokenizer.encode` leaves them out). With Whisper's tokenizer
  the sequence is transformers' WhisperTokenizer's `tokenizer(text).input_ids` of its language
  and task (WhisperProcessor's labels), and the batch its fine-tuning recipe's: the targets are
  the labels less the <|startoftranscript|> its data collator drops, the decoder inputs those
  labels shifted right by decoder_start_token_id. By design the weights differ: that recipe
  scores the prompt's <|LANG|> <|TASK|> <|notimestamps|> too, which decoding is given, never
  asked to write."""

  def __init__(self, settings, seed: int, *, num_mels: int, num_frames: int, max_len: int):
    part = settings.part(AudioSettings)
    self.part, self.seed, self.seq_len, self.max_len = part, seed, settings.seq_len, max_len
    self.num_mels = part.n_mels or num_mels
    frames = (round(part.window_seconds * audio.SAMPLE_RATE / audio.HOP_LENGTH)
              if part.window_seconds else num_frames)
    self.num_samples = frames * audio.HOP_LENGTH
    if self.seq_len > max_len:
      raise ConfigError(f'data.seq_len={self.seq_len} transcript tokens exceed the decoder\'s '
                        f'model.max_len={max_len} positions: lower data.seq_len or raise '
                        'model.max_len.')
    if settings.name == 'audiofolder':
      self.train, self.held_out, alphabet = self._folder(settings, part)
      self.num_eval_examples = len(self.held_out)
    elif settings.name == 'synthetic':
      self.train = self.held_out = None
      alphabet = DIGITS
      self.num_eval_examples = settings.eval_examples
    else:
      dataset = sources.open_audio_dataset(
          settings.name, data_dir=settings.tfds_data_dir, train_split=settings.train_split,
          eval_split=settings.eval_split, audio_key=part.audio_key,
          transcript_key=part.transcript_key)
      self.train, self.held_out = (TFDSSplit(split, dataset, part)
                                   for split in (dataset.train, dataset.held_out))
      alphabet = (''.join(sorted({c for n in self.train.label_words for c in n}))
                  if dataset.label_names else TEXT_ALPHABET)
      self.num_eval_examples = len(self.held_out)
    self.vocab = transcript_tokenizer(settings.part(corpus.TextSettings).tokenizer, alphabet)
    self.prompt = decoder_prompt(self.vocab, part.language, part.whisper_task)
    if settings.name == 'audiofolder':
      self._check_transcripts()
    self.pad_id = self.vocab.eos_id if self.vocab.pad_id is None else self.vocab.pad_id
    self.token_bytes = self.vocab.token_bytes
    self.info = {'vocab_size': self.vocab.size, 'num_mels': self.num_mels,
                 'num_frames': frames, 'seq_len': self.seq_len}

  def train_batch(self, step: int, batch_size: int, rows: slice) -> dict:
    generator = rng.generator(rng.GENERATE, self.seed, step)
    if self.train is None:
      utterances = [self._tone(generator) for _ in range(batch_size)][rows]
    else:
      chosen = generator.integers(0, len(self.train), size=batch_size)[rows]
      utterances = [self.train[i] for i in chosen]
    augment = rng.generator(rng.AUGMENT, self.seed, step) if self.part.spec_augment else None
    return self._batch(utterances, augment)

  def eval_examples(self, indices: np.ndarray) -> dict:
    if self.held_out is None:
      utterances = [self._tone(rng.generator(rng.HELD_OUT, int(i))) for i in indices]
    else:
      utterances = [self.held_out[int(i)] for i in indices]
    return self._batch(utterances, None)

  def generation_metrics(self, generate, batch_size: int) -> dict:
    """{'eval_wer'} of the transcripts of the first data.wer_examples held-out utterances ({}
    for none); generate as seq2seq.decode_held_out's."""
    count = min(self.part.wer_examples, self.num_eval_examples)
    if not count:
      return {}
    utterances = lambda rows: {'inputs': self._audio(self.eval_examples(np.asarray(rows))),
                               'input_valid': None}
    outputs = seq2seq.decode_held_out(generate, utterances, count, batch_size, self.vocab,
                                      self.seq_len + 1 - len(self.prompt), prompt=self.prompt)
    held_out = self.eval_examples(np.arange(count))
    references = [self.vocab.decode(row[weights > 0])
                  for row, weights in zip(held_out['targets'], held_out['weights'])]
    return {'eval_wer': word_error_rate([self.vocab.decode(o) for o in outputs], references)}

  def _audio(self, batch: dict) -> np.ndarray:
    """The encoder's inputs of a batch: its waveforms, or its features (data.log_mel_on)."""
    return batch['waveforms' if self.part.log_mel_on == 'device' else 'features']

  def _tone(self, generator: np.random.Generator) -> tuple[np.ndarray, str]:
    """A tone of digit d at 300 + 100 d Hz, 40 to 100% of the window long, and its transcript."""
    digit = int(generator.integers(0, 10))
    length = int(self.num_samples * generator.uniform(0.4, 1.0))
    start = int(generator.integers(0, self.num_samples - length + 1))
    t = np.arange(length) / audio.SAMPLE_RATE
    waveform = np.zeros(self.num_samples)
    waveform[start:start + length] = 0.5 * np.sin(2 * np.pi * (300 + 100 * digit) * t
                                                  + generator.uniform(0, 2 * np.pi))
    waveform += self.part.tone_noise * generator.standard_normal(self.num_samples)
    return waveform.astype(np.float32), DIGITS[digit]

  @staticmethod
  def _folder(settings, part: AudioSettings) -> tuple['FolderSplit', 'FolderSplit', str]:
    """The training and held-out rows of data.audio_dir (audiofolder.open_folder), and the
    characters of their transcripts."""
    if not part.audio_dir:
      raise ConfigError("data.name='audiofolder' reads data.audio_dir: set it to the folder "
                        f'holding {audiofolder.METADATA} (or the split folders holding theirs).')
    train, held_out = audiofolder.open_folder(
        part.audio_dir, train_split=settings.train_split, eval_split=settings.eval_split,
        transcript_key=part.transcript_key)
    alphabet = ''.join(sorted({c for row in train + held_out for c in row.text}))
    return (FolderSplit(train, part.sample_rate), FolderSplit(held_out, part.sample_rate),
            alphabet)

  def _check_transcripts(self) -> None:
    """Every transcript of the folder, as `_sequence` makes it, fits data.seq_len; else a
    UserError naming the longest (its file, metadata line and tokens) and the seq_len it needs."""
    rows = self.train.rows + self.held_out.rows
    lengths = [len(self._sequence(row.text)) - 1 for row in rows]  # the decoder's inputs
    over = sum(length > self.seq_len for length in lengths)
    if not over:
      return
    needed = max(lengths)
    row = rows[lengths.index(needed)]
    prompt = f' after a prompt of {len(self.prompt)}' if len(self.prompt) > 1 else ''
    fix = (f'set data.seq_len={needed}' if needed <= self.max_len else
           f'set data.seq_len={needed} and model.max_len={needed} (the decoder\'s positions, '
           f'{self.max_len} now), or shorten that transcript')
    raise UserError(f'{over} of {len(rows)} transcripts are over data.seq_len={self.seq_len} '
                    f'tokens; the longest, of {row.path} ({row.origin}), is '
                    f'{needed + 1 - len(self.prompt)} tokens with its EOS{prompt}: {fix}.')

  def _batch(self, utterances, augment: np.random.Generator | None) -> dict:
    waveforms = [audio.pad_or_trim(waveform, self.num_samples) for waveform, _ in utterances]
    masks = None if augment is None else [self._masks(augment) for _ in utterances]
    ids = [self._fitted(text) for _, text in utterances]
    sequences = np.array([row + [self.pad_id] * (self.seq_len + 1 - len(row)) for row in ids],
                         np.int32)
    positions = np.arange(self.seq_len)
    lengths = np.array([len(row) for row in ids])
    scored = (positions >= len(self.prompt) - 1) & (positions < lengths[:, None] - 1)
    return {**encoder_inputs(waveforms, masks, self.part.log_mel_on, self.num_mels),
            'decoder_inputs': sequences[:, :-1], 'targets': sequences[:, 1:],
            'weights': scored.astype(np.float32)}

  def _masks(self, generator: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """One utterance's SpecAugment bands: (time masks, frequency masks), each (count, 2)."""
    masks = audio.spec_augment_masks(
        self.num_samples // audio.HOP_LENGTH, self.num_mels, generator,
        num_time_masks=self.part.num_time_masks, max_time_width=self.part.max_time_width,
        num_freq_masks=self.part.num_freq_masks, max_freq_width=self.part.max_freq_width)
    return tuple(audio.as_bands(bands) for bands in masks)

  def _sequence(self, text: str) -> list[int]:
    """The prompt, the transcript's ids and EOS."""
    return self.prompt + self.vocab.encode(text) + [self.vocab.eos_id]

  def _fitted(self, text: str) -> list[int]:
    """`_sequence`, or a UserError if over data.seq_len + 1 (a TFDS dataset's transcripts are
    not read ahead; a folder's were all checked when it was opened)."""
    ids = self._sequence(text)
    if len(ids) - 1 > self.seq_len:
      prompt = f' after a prompt of {len(self.prompt)}' if len(self.prompt) > 1 else ''
      raise UserError(f'The transcript {text[:40]!r} is {len(ids) - len(self.prompt)} tokens with '
                      f'its EOS{prompt}, over data.seq_len={self.seq_len}: raise data.seq_len '
                      '(up to model.max_len).')
    return ids


def encoder_inputs(waveforms: list[np.ndarray], masks: list | None, log_mel_on: str,
                   num_mels: int) -> dict:
  """What the encoder reads of waveforms already of the window's length: {'waveforms': float32
  (b, samples)} with log_mel_on='device', whose features the model computes, with SpecAugment's
  bands (`masks`: (time, frequency) masks of each utterance, or None) as 'time_masks' and
  'freq_masks' int32 (b, count, 2) for the model to apply; or, with 'host', their features
  {'features': float32 (b, frames, num_mels)}, masked here."""
  bands = {} if masks is None else {
      'time_masks': np.stack([time for time, _ in masks]),
      'freq_masks': np.stack([freq for _, freq in masks])}
  if log_mel_on == 'device':
    return {'waveforms': np.stack(waveforms).astype(np.float32), **bands}
  features = np.stack([audio.log_mel_spectrogram(waveform, num_mels=num_mels,
                                                 num_samples=len(waveform))
                       for waveform in waveforms])
  if bands:
    features = mask_bands(features, bands['time_masks'], bands['freq_masks'])
  return {'features': features}


def make_audio_task(settings, seed, tokenizer_dir=None, *, num_mels, num_frames, max_len,
                    **unused):
  del tokenizer_dir, unused
  return AudioTask(settings, seed, num_mels=num_mels, num_frames=num_frames, max_len=max_len)
