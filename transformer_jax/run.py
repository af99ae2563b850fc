"""What launch.py calls: one entry point per mode."""
import contextlib
import logging
import tempfile

from absl import logging as absl_logging

from transformer_jax import convert, decode, describe, models, train
from transformer_jax.train import checkpoint


def configure_logging(verbose_libraries: bool = False):
  """Our progress at INFO; JAX's and Orbax's INFO chatter only when asked for."""
  if not verbose_libraries:
    absl_logging.set_verbosity(absl_logging.WARNING)
  logging.getLogger('transformer_jax').setLevel(logging.INFO)


def run(config, workdir: str | None, mode: str):
  if mode == 'describe':
    print(describe.describe(config))
    return None
  if not workdir and not (config.init_from_hf and mode in ('eval', 'sample')):
    raise ValueError(f'--mode={mode} needs --workdir (checkpoints, metrics and the config go there).')
  if mode == 'train':
    return train.train(config, workdir)
  if mode == 'eval':
    with _or_temporary(workdir) as directory:
      return train.evaluate(config, directory)
  if mode == 'sample':
    return sample(config, workdir)
  raise ValueError(f'Unknown --mode={mode}: use train, eval, sample or describe.')


def _or_temporary(workdir):
  return contextlib.nullcontext(workdir) if workdir else tempfile.TemporaryDirectory()


def sample(config, workdir: str | None) -> list[str]:
  """--mode=sample: text from the workdir's latest checkpoint, or from the Hugging Face weights of
  config.init_from_hf (with their tokenizer), with the keys of config.sample."""
  if workdir and checkpoint.latest_step(workdir) is not None or not config.init_from_hf:
    run, state = train.restore_trained(config, workdir)
    run.checkpoints.close()
    model, params, vocab = run.model, state.params, run.data.vocab
    origin = f'step {int(state.step)}'
  else:
    model = models.build(config.model)
    params = convert.load_params(config.init_from_hf, config.model)
    vocab, origin = None, config.init_from_hf
  if config.init_from_hf:
    vocab = convert.Tokenizer(config.init_from_hf)
  texts = decode.sample_text(model, params, vocab, **decode.sample_settings(config))
  continues = model.cfg.family == 'decoder'  # an encoder-decoder maps input to output
  for number, text in enumerate(texts):
    print(f'--- sample {number} ({origin}) ---\n'
          f'{config.sample.prompt}{"" if continues else " -> "}{text}')
  return texts
