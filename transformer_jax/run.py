"""What launch.py calls: the config a command means, one entry point per mode, and the errors a
user can fix printed as their message alone."""
import contextlib
import dataclasses
import logging
import os
import shutil
import sys
from typing import Any, Mapping

from absl import logging as absl_logging
import jax
import ml_collections

from transformer_jax import (aot, config_lib, convert, data, decode, describe, errors, models,
                             quantization, targets, train)
from transformer_jax.train import checkpoint, setup

__all__ = [
    'configure_logging', 'errors_as_messages', 'exit_with', 'export', 'flag_error_message',
    'resolve_config', 'run', 'sample']

log = logging.getLogger(__name__)


def configure_logging(verbose_libraries: bool = False):
  """Our progress at INFO; JAX's and Orbax's INFO chatter only when asked for."""
  if not verbose_libraries:
    absl_logging.set_verbosity(absl_logging.WARNING)
  logging.getLogger('transformer_jax').setLevel(logging.INFO)


@contextlib.contextmanager
def errors_as_messages(show_traceback: bool = False):
  """A mistake in what the user asked for (a config value, missing data, a checkpoint that does
  not fit, a run that diverged) ends the command with its message as the last line printed and
  exit status 1; the traceback only with `show_traceback`."""
  try:
    yield
  except (errors.UserError, FloatingPointError) as error:
    if show_traceback:
      raise
    exit_with(str(error))


def exit_with(message: str):
  print(message, file=sys.stderr, flush=True)
  sys.exit(1)


def flag_error_message(error: Exception) -> str:
  """What to print for a command line that fails to parse: an error in a config file with the
  first and last lines of that file's traceback, a mistake in the --config.KEY flags with a line
  for each (absl recasts config_lib.CheckedConfigFile's error, keeping it as the context)."""
  text = str(error) or type(error).__name__
  if 'Traceback (most recent call last)' in text:
    lines = [line for line in text.splitlines() if line.strip()]
    return f'{lines[0]} {lines[-1]}'
  if isinstance(error.__context__, errors.UserError):
    return str(error.__context__)
  return text


def resolve_config(config: ml_collections.ConfigDict, overrides: Mapping[str, Any],
                   workdir: str | None) -> ml_collections.ConfigDict:
  """The config a command on `workdir` means: the config the workdir's run saved (its data
  location included), with the --config.KEY=VALUE flags of the command line (`overrides`) on
  top. A workdir without a saved config takes `config` (the --config file and its flags)."""
  saved = config_lib.saved_config(workdir)
  if saved is None:
    return config
  from_file = config.copy_and_resolve_references()
  unknown = config_lib.assign(config, saved)
  config_lib.assign(config, dict(overrides))
  replaced = [k for k in config_lib.differing_keys(saved, from_file) if k not in overrides]
  log.info('Using the config saved in %s/config.json%s; --config.KEY=VALUE flags override it.',
           workdir, f' (the --config file differs in {", ".join(replaced)})' if replaced else '')
  if unknown:
    log.warning('Keys of the saved config that this version does not know were left out: %s.',
                ', '.join(unknown))
  return config


def run(config, workdir: str | None, mode: str):
  """Resolves the config once, for the platform the mode compiles for (a compile target's, else
  this machine's), and runs the mode on those settings."""
  target = config.compile.target
  if mode == 'compile' and not target:
    raise errors.ConfigError('--mode=compile needs --config.compile.target: a TPU topology '
                             "('v5e:2x2'), a Cloud TPU type ('v4-8') or GPUs ('h100x8').")
  on_target = target and mode in ('describe', 'compile')
  settings = train.resolve(config, targets.target(target).platform if on_target else None,
                           deterministic=mode in ('eval', 'sample'))
  if mode == 'describe':
    print(describe.describe(settings))
    return None
  if mode == 'compile':
    return compile_for_target(settings)
  starts_elsewhere = settings.init_from_hf or settings.init_from_checkpoint
  if not workdir and not (starts_elsewhere and mode in ('eval', 'sample')):
    raise errors.ConfigError(f'--mode={mode} needs --workdir (checkpoints, metrics and the config '
                             'go there).')
  if mode == 'train':
    return train.train(settings, workdir)
  if mode == 'eval':
    return train.evaluate(settings, workdir)
  if mode == 'sample':
    return sample(settings, workdir)
  if mode == 'export':
    return export(settings, workdir)
  raise errors.ConfigError(f'Unknown --mode={mode}: use train, eval, sample, export, describe or '
                           'compile.')


def export(settings: train.RunSettings, workdir: str) -> str:
  """--mode=export: the parameters of the workdir's latest checkpoint (with LoRA, the base with
  the adapters merged in) as a Hugging Face checkpoint in WORKDIR/hf (convert.save), for a model
  that a Hugging Face class expresses, with the run's tokenizer.json where it trained with one
  (a BPE's, or one it was given), and for CLIP and SigLIP the preprocessor_config.json of the
  run's held-out image preprocessing; returns its path."""
  settings = train.resolve(settings)
  run_, params, step = train.restore_trained(settings, workdir)
  path = os.path.join(workdir, 'hf')
  if jax.process_index() == 0:
    pp_eval = getattr(run_.data.task, 'pp_eval', None)  # an image task's
    convert.save(path, run_.model_config, jax.device_get(params),
                 image_preprocessing=None if pp_eval is None else pp_eval.spec)
    tokenizer = os.path.join(setup.tokenizer_dir(workdir), 'tokenizer.json')
    if os.path.isfile(tokenizer):
      shutil.copy(tokenizer, path)
  log.info('Wrote the parameters of step %d as a Hugging Face checkpoint in %s.', step, path)
  return path


def compile_for_target(settings: train.RunSettings) -> aot.CompileReport:
  """--mode=compile: the report of aot.compile_for; a step that does not fit the target ends
  the command with status 1 after the report."""
  report = aot.compile_for(settings)
  print('\n'.join(aot.report_lines(report)), flush=True)
  if not report.fits:
    sys.exit(1)
  return report


def sample(settings: train.RunSettings, workdir: str | None) -> list[str]:
  """--mode=sample: text from the parameters of the workdir's latest checkpoint, or from the
  Hugging Face weights of config.init_from_hf (with their tokenizer), with the settings of
  config.sample (its window unset: the context the run trained on, data.seq_len). Writes
  nothing. `settings`: the run's RunSettings, or a config resolved here."""
  settings = train.resolve(settings)
  if settings.family.sample:  # a family that does not decode text samples itself
    settings.sample.check_for(settings.model)  # before anything is read
    run_, params, step = train.restore_trained(settings, workdir)
    return settings.family.sample(run_.model, params, step, settings.sample, workdir)
  audio = audio_inputs(settings)  # before anything is restored: a bad file fails first
  trained = workdir and checkpoint.latest_step(workdir) is not None
  hf = settings.init_from_hf
  if trained or not hf:
    run_, params, step = train.restore_trained(settings, workdir)
    model, vocab = run_.model, run_.data.vocab
    origin = f'step {step}' if trained else settings.init_from_checkpoint
  else:
    model = models.build(settings.model)
    params = convert.load_params(hf, settings.model)
    vocab, origin = None, hf
  params = sampled_params(settings, params)
  if hf:  # the checkpoint's tokenizer.json, stopping where its config says
    vocab = data.tokenizer.HFTokenizer.from_file(hf, key='init_from_hf',
                                                 eos_id=convert.eos_token_id(hf))
  wanted = settings.sample
  if audio is not None:
    return transcribe(model, params, vocab, settings, audio, origin)
  try:
    vocab.encode(wanted.prompt)
  except ValueError as error:
    raise errors.ConfigError(f'sample.prompt={wanted.prompt!r}: {error} Write the prompt with the '
                             'tokens the model was trained on.') from None
  continues = decode.decoding_of(model) == 'decoder'  # an encoder-decoder maps input to output
  texts = decode.sample_text(model, params, vocab, wanted, seq_len=settings.data.seq_len,
                             start_ids=None if continues else [decoder_start(vocab, hf)])
  for number, text in enumerate(texts):
    print(f'--- sample {number} ({origin}) ---\n'
          f'{wanted.prompt}{"" if continues else " -> "}{text}')
  return texts


def decoder_start(vocab, hf: str) -> int:
  """The token an encoder-decoder writes from: config.json's decoder_start_token_id for a
  Hugging Face checkpoint that names one (T5's pad id 0), else the one its training data shifted
  the targets by (BOS, else PAD)."""
  start = convert.decoder_start_token_id(hf) if hf else None
  return data.vocab.decoder_start_id(vocab) if start is None else start


def audio_inputs(settings: train.RunSettings):
  """What a speech model's encoder reads of sample.audio (the model's window and Mel bins, the
  data's sample rate): its waveform (1, samples) or, with data.log_mel_on='host', its log-Mel
  features (1, frames, mels); None for a model that reads no audio."""
  path = settings.sample.audio
  if settings.family.task != 'audio':
    if path is not None:
      raise errors.ConfigError(f'sample.audio={path}: this model reads no audio; unset it.')
    return None
  if path is None:
    raise errors.ConfigError('--mode=sample of a speech model transcribes an audio file: set '
                             '--config.sample.audio=FILE.')
  cfg, part = settings.model, settings.data.part(data.speech.AudioSettings)
  waveform = data.audio.pad_or_trim(data.audio.load_audio(path, part.sample_rate),
                                    cfg.num_frames * data.audio.HOP_LENGTH)
  (inputs,) = data.speech.encoder_inputs([waveform], None, part.log_mel_on,
                                         cfg.num_mels).values()
  return inputs


def sampled_params(settings: train.RunSettings, params):
  """The parameters --mode=sample decodes text with: int8 where config.sample.int8 asks."""
  return quantization.int8_params(settings.model, params) if settings.sample.int8 else params


def transcribe(model, params, vocab, settings: train.RunSettings, audio, origin) -> list[str]:
  """--mode=sample of a speech model: sample.num_samples transcripts of sample.audio (greedy
  with sample.temperature=0, beams with sample.beam_size), from Whisper's decoder prompt where
  the tokenizer has its tokens (data.language, data.whisper_task), printed; writes nothing."""
  part = settings.data.part(data.speech.AudioSettings)
  prompt = data.speech.decoder_prompt(vocab, part.language, part.whisper_task)
  fits = settings.model.max_len + 1 - len(prompt)  # the decoder's positions after the prompt
  wanted = dataclasses.replace(settings.sample, window=0,
                               max_new_tokens=min(settings.sample.max_new_tokens, fits))
  texts = decode.sample_text(model, params, vocab, wanted, inputs=audio, start_ids=prompt)
  for number, text in enumerate(texts):
    print(f'--- transcript {number} of {wanted.audio} ({origin}) ---\n{text}')
  return texts
