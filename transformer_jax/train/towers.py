"""Parts of a model's parameters started from another model (LiT, Zhai et al. 2022: a dual
encoder's image tower from a supervised ViT, its text tower from a text encoder): a family's
`starts` names each part's source, a run's workdir (WORKDIR or WORKDIR:STEP) or a Hugging Face
directory. The source must compute what the part computes: the same parameters by name and
shape (its classifier or MLM head left out; a text position table longer than the part's cut
to its rows, as the source itself runs on shorter inputs) and the same block options.
"""
import os

import numpy as np
from flax import traverse_util

from transformer_jax import config_lib, convert, models
from transformer_jax.errors import ConfigError
from transformer_jax.model_config import ModelConfig
from transformer_jax.train import checkpoint

__all__ = ['started', 'source_params']

# The settings a source must share with the part it fills: its sizes (d_ff as it takes effect;
# not max_len, as a longer position table is cut) and what changes what the blocks compute.
_SIZES = {'width': 'width', 'num_layers': 'num_layers', 'num_heads': 'num_heads',
          'num_kv_heads': 'kv_heads', 'd_ff': 'hidden_dim', 'vocab_size': 'vocab_size',
          'type_vocab_size': 'type_vocab_size', 'embed_norm': 'embed_norm'}
_COMPUTES = ('norm', 'norm_eps', 'norm_position', 'mlp', 'positions', 'scale_attention',
             'scale_embeddings', 'use_attention', 'use_mlp', 'use_norm', 'use_residual')
_HEAD = 'head'  # a classifier's or an MLM head, which a tower does not have
_POSITIONS = ('embed', 'positions')


def source_params(source: str, key: str) -> tuple[dict, ModelConfig]:
  """(parameters, model config) of `source`: a Hugging Face directory (config.json) or a run's
  workdir, WORKDIR or WORKDIR:STEP (its latest readable checkpoint, or that step's)."""
  workdir, _, step = source.rpartition(':')
  if not workdir or not step.isdigit():
    workdir, step = source, ''
  if not os.path.isdir(os.path.join(workdir, 'checkpoints')):
    if os.path.isfile(os.path.join(source, 'config.json')):
      return (convert.load_params(source, head=False),
              models.model_config(convert.load_model_config(source)))
    raise ConfigError(f'{key}={source}: neither a run\'s workdir (checkpoints/) nor a Hugging '
                      'Face directory (config.json): give one (a workdir optionally with :STEP).')
  saved = config_lib.saved_config(workdir)
  if saved is None:
    raise ConfigError(f'{key}={source}: {workdir} holds no config.json to read its model from: '
                      'give the workdir of a run of this version.')
  reader = checkpoint.Checkpoints(os.path.join(workdir, 'checkpoints'), read_only=True)
  try:
    params, _ = reader.restore_saved_params(int(step) if step else None)
  finally:
    reader.close()
  if params is None:
    raise ConfigError(f'{key}={source}: no readable checkpoint in {workdir}.')
  return models.unstack_layers(params), models.model_config(saved['model'])


def started(params: dict, parts: dict[str, str], cfg: ModelConfig) -> dict:
  """`params` (of a model of `cfg`) with each part of `parts` ({name: source}) taken from its
  source, whose sizes and block options must be the part's (its family's `tower`)."""
  params = dict(params)
  tower = models.family_of(cfg).tower
  for part, source in parts.items():
    key = f'model.{part}_init'
    theirs, their_cfg = source_params(source, key)
    if their_cfg.family == cfg.family:  # the same part of a model like this one
      theirs, their_cfg = theirs.get(part, {}), tower(their_cfg, part)[0]
    else:
      theirs = {name: tree for name, tree in theirs.items() if name != _HEAD}
    _check_settings(key, source, their_cfg, *tower(cfg, part))
    ours = models.unstack_layers(params[part])
    fitted = _fitted(key, source, traverse_util.flatten_dict(theirs),
                     traverse_util.flatten_dict(ours))
    tree = traverse_util.unflatten_dict(fitted)
    params[part] = models.stack_layers(tree) if cfg.scan_layers else tree
  return params


def _check_settings(key: str, source: str, theirs: ModelConfig, ours: ModelConfig,
                    keys: dict[str, str]) -> None:
  """A ConfigError naming the first setting (_SIZES, _COMPUTES) of the part, `ours`, that its
  source, `theirs`, has otherwise, and the model.* key (`keys`, else its own name) to set."""
  for name, attribute in {**_SIZES, **{name: name for name in _COMPUTES}}.items():
    if hasattr(theirs, attribute) and hasattr(ours, attribute) and (
        getattr(theirs, attribute) != getattr(ours, attribute)):
      value, setting = getattr(theirs, attribute), keys.get(name, name)
      # Its token ids are those of its own tokenizer, which the captions must be read with.
      tokenizer = os.path.join(source, 'tokenizer.json')
      also = (f' with data.tokenizer={source}, its tokenizer'
              if name == 'vocab_size' and os.path.isfile(tokenizer) else '')
      raise ConfigError(f'{key}={source} has {name}={value!r} where the tower has '
                        f'{getattr(ours, attribute)!r}: set model.{setting}={value!r}{also}.')


def _fitted(key: str, source: str, theirs: dict, ours: dict) -> dict:
  """Our flat part with every array from `theirs`, each of the dtype ours has."""
  missing, extra = sorted(ours.keys() - theirs.keys()), sorted(theirs.keys() - ours.keys())
  if missing or extra:
    where, paths = ('lacks', missing) if missing else ('has, the tower does not,', extra)
    raise ConfigError(f'{key}={source} {where} {"/".join(paths[0])} ({len(paths)} parameters '
                      'in all): start the tower from a model of its architecture.')
  fitted = {}
  for path, mine in ours.items():
    array = np.asarray(theirs[path])
    if path[-2:] == _POSITIONS and array.shape[0] > mine.shape[0]:
      array = array[:mine.shape[0]]
    if array.shape != mine.shape:
      raise ConfigError(f'{key}={source} has {"/".join(path)} of shape {array.shape} where the '
                        f'tower has {tuple(mine.shape)}: set the tower\'s sizes to the source\'s.')
    fitted[path] = array.astype(mine.dtype)
  return fitted
