"""Helpers for the config files under configs/: the base config and argument strings."""
import dataclasses
import difflib
import importlib.util
import json
import os
import pathlib
import re
import sys
import types
import typing

from absl import flags
import ml_collections
from ml_collections import config_dict

from transformer_jax.errors import ConfigError
from transformer_jax import decode, lora, models
from transformer_jax.data.settings import DataSettings
from transformer_jax.model_config import ModelConfig, names
from transformer_jax.ranges import COUNT, FRACTION, Range
from transformer_jax.settings import MeshSettings, Settings, TrainingSettings

__all__ = [
    'assign', 'base_config', 'CheckedConfigFile', 'CHOICES', 'differences',
    'differing_keys', 'flatten', 'from_file', 'LOCATION_KEYS', 'model_defaults', 'parse_arg',
    'RANGES', 'SAVED_CONFIG', 'saved_config', 'section_of', 'smoke', 'unknown_keys', 'validate']


def model_defaults(family: str = 'decoder') -> ml_collections.ConfigDict:
  """Every setting of `family`'s config with its default, so a typo in --config.model.x (or a
  setting of another family) fails."""
  config_class = models.registry.get(family).config
  hints = typing.get_type_hints(config_class)
  model = ml_collections.ConfigDict()
  for field in dataclasses.fields(config_class):
    if field.default is None:  # an `X | None` field: a typed placeholder that flags can set
      (kind,) = [t for t in typing.get_args(hints[field.name]) if t is not types.NoneType]
      model[field.name] = config_dict.placeholder(kind)
    else:
      model[field.name] = field.default
  return model


def parse_arg(arg: str | None, **defaults) -> ml_collections.ConfigDict:
  """'variant=S/4,smoke' -> {'variant': 'S/4', 'smoke': True}, typed like `defaults`.

  Unknown names fail, naming the known ones.
  """
  values = ml_collections.ConfigDict(defaults)
  for item in filter(None, (arg or '').split(',')):
    key, _, value = item.partition('=')
    if key not in defaults:
      raise ConfigError(f'Unknown config argument {key!r}; known: {sorted(defaults)}.')
    default = defaults[key]
    if isinstance(default, bool):
      values[key] = value.lower() in ('', '1', 'true', 'yes')
    else:
      values[key] = type(default)(value) if default is not None else value
  return values


def base_config(family: str = 'decoder') -> ml_collections.ConfigDict:
  """Every section and key a run of a `family` model reads, with defaults; each config file
  overrides what it needs.

  With `lock_config`, `--config.x.y=...` can only set keys that exist here, so a typo fails.
  """
  config = ml_collections.ConfigDict()
  config.seed = 0
  config.model = model_defaults(family)
  config.data = section_of(DataSettings)
  config.optimizer = ml_collections.ConfigDict(dict(
      # 'adamw'; 'muon': Muon on the blocks' projection matrices (train.optim
      # .muon_dimension_numbers), this AdamW on the embeddings, norms, biases and heads.
      name='adamw',
      learning_rate=1e-3,
      warmup_steps=0,
      schedule='cosine',  # 'cosine' decays to min_lr_ratio * learning_rate; 'constant'
      min_lr_ratio=0.0,
      b1=0.9, b2=0.95, eps=1e-8,
      weight_decay=0.1,
      # Decay only the matmul kernels by default: norms, biases and embeddings are not decayed.
      decay_norms_and_biases=False,
      decay_embeddings=False,
      grad_clip_norm=1.0,  # 0: no clipping (of all the gradients, Muon's too)
      # Muon's settings: its peak learning rate (larger than AdamW's; the warmup and schedule
      # above apply to it too), momentum (beta) and whether it is Nesterov's, the Newton-Schulz
      # iterations that orthogonalize the momentum, and decoupled weight decay (times its rate).
      muon_learning_rate=0.02,
      muon_momentum=0.95,
      muon_nesterov=True,
      muon_ns_steps=5,
      muon_weight_decay=0.0,
  ))
  config.training = section_of(TrainingSettings)
  # Low-rank adaptation (Hu et al. 2021; transformer_jax.lora): with rank > 0 the model's
  # parameters are frozen (no gradient, no optimizer state) and only adapters train beside the
  # kernels whose '/'-joined paths the regular expression `targets` matches (re.search; default:
  # every attention's query and value kernels), the update of a kernel W being
  # (alpha / rank) * A @ B with B = 0 at the start. The base comes from init_from_hf,
  # init_from_checkpoint (a run without adapters) or a random init; checkpoints hold the base once
  # and the adapters; eval and sample run the merged model.
  config.lora = section_of(lora.LoraSettings)
  # 'jit': GSPMD shards from in/out shardings; 'shard_map': the same step per device with an
  # explicit pmean of the gradients over the data axis.
  config.parallelism = 'jit'
  config.mesh = section_of(MeshSettings)
  # How parameters and activations are laid out on the mesh: a named set of rules
  # (train.sharding.RULE_SETS: 'dp', 'fsdp', 'tp', 'fsdp_tp'), after any explicit (logical axis,
  # mesh axis) rules of sharding_rules, which win: (('embed', 'data'),) alone makes 'dp' into FSDP.
  config.rule_set = 'dp'
  config.sharding_rules = ()
  # --mode=compile: the accelerator to compile the run's steps for, without it (transformer_jax
  # .targets): a TPU topology 'v5e:2x2', a Cloud TPU type 'v4-8', or GPUs 'h100x8'.
  config.compile = ml_collections.ConfigDict(dict(target=''))
  # A Hugging Face checkpoint directory to start from instead of a random init (see
  # transformer_jax.convert); a checkpoint of the run's own, once there is one, wins.
  config.init_from_hf = ''
  # Another run's parameters to start from, with a fresh optimizer and step 0 (fine-tuning, a
  # changed schedule): WORKDIR or WORKDIR:STEP (default: its latest checkpoint). A checkpoint of
  # the run's own, once there is one, wins.
  config.init_from_checkpoint = ''
  # --mode=sample: the keyword arguments of decode.sample_text. window: each new token attends
  # to its last `window` tokens; unset: data.seq_len, the context the run trained on; 0: all.
  # beam_size > 0: the num_samples best outputs of a beam search (decode.beam_search) ranked by
  # log-probability over Wu et al. (2016)'s length penalty ((5 + length) / 6) ** length_penalty,
  # instead of samples (temperature, top_k and top_p then unused).
  # An encoder-decoder's held-out outputs, decoded at each evaluation for eval_exact_match (and
  # a translation's eval_bleu): greedily, or with beam_size > 0 the best beam of decode
  # .beam_search under its length penalty.
  config.eval = ml_collections.ConfigDict(dict(beam_size=0, length_penalty=0.6))
  config.sample = ml_collections.ConfigDict(dict(
      prompt='ROMEO:', max_new_tokens=256, temperature=0.8, top_k=0, top_p=1.0, seed=0,
      num_samples=1, window=config_dict.placeholder(int), beam_size=0, length_penalty=0.6))
  return config


def section_of(settings: type[Settings]) -> ml_collections.ConfigDict:
  """The config section of a Settings class, its defaults; keys whose default is None become
  placeholders of their type."""
  section, types = ml_collections.ConfigDict(), settings.placeholder_types()
  for key, default in settings.defaults().items():
    section[key] = config_dict.placeholder(types[key]) if default is None else default
  return section


def smoke(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Shrinks a run to seconds: 2 blocks, 3 steps of batch 8, one eval batch (of which an
  encoder-decoder decodes 8 pairs at most)."""
  config.model.num_layers = min(config.model.num_layers, 2)
  if config.model.get('num_decoder_layers'):
    config.model.num_decoder_layers = min(config.model.num_decoder_layers, 2)
  config.data.update(batch_size=8, eval_batch_size=8, eval_steps=1,
                     bleu_examples=min(config.data.bleu_examples, 8),
                     exact_match_examples=min(config.data.exact_match_examples, 8))
  config.training.update(steps=3, log_every=1, eval_every=3, checkpoint_every=3)
  return config


def from_file(path, arg: str | None = None) -> ml_collections.ConfigDict:
  """get_config(arg) of a config file, loaded as config_flags loads it (by path, so that a
  config can derive from a sibling: from_file(pathlib.Path(__file__).with_name('x.py')))."""
  path = pathlib.Path(path)
  spec = importlib.util.spec_from_file_location(f'config_{path.stem}', path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg)


class CheckedConfigFile(flags.ArgumentParser):
  """The parser of a config_flags config file flag, wrapped: loads the file as config_flags does,
  then checks each --config.KEY flag of the command line against it, where ml_collections'
  own error names only the key's last part (which data.name and a mistyped training.name share)."""

  def __init__(self, flag: flags.Flag):
    self.name, self._load = flag.name, flag.parser

  def parse(self, path):
    if not os.path.isfile(path.partition(':')[0]):
      raise ConfigError(f'--{self.name}={path}: there is no such file.')
    config = self._load.parse(path)
    problems = unknown_keys(config, flags.FLAGS.read_flags_from_files(sys.argv, force_gnu=False),
                            self.name)
    if problems:
      raise ConfigError('\n'.join(problems))
    return config

  def flag_type(self):
    return self._load.flag_type()


def unknown_keys(config: ml_collections.ConfigDict, argv: list[str],
                 flag: str = 'config') -> list[str]:
  """One line for each --config.KEY flag of `argv` whose KEY `config` lacks, naming the flag as
  typed and the nearest keys there are; an unknown section, the sections there are."""
  lines = []
  for arg in argv:
    typed = arg.partition('=')[0]
    match = re.fullmatch(rf'--?(?:no)?{flag}\.(.+)', typed)
    problem = match and _unknown_part(config, typed, match[1].split('.'))
    if problem:
      lines.append(problem)
  return lines


def _unknown_part(config: ml_collections.ConfigDict, flag: str, parts: list[str]) -> str | None:
  """What `flag`, which sets the key `parts`, names that `config` does not hold; None: nothing."""
  section = config
  for depth, part in enumerate(parts):
    name = part.partition('[')[0]  # mesh.shape[0]: an item of the value, for config_flags
    where = '.'.join(parts[:depth])
    if not isinstance(section, ml_collections.ConfigDict):
      return f'Unknown config key {parts[-1]!r} in {flag}: {where} is a value, not a section.'
    if name not in section:
      return _unknown_message(section, flag, where, name, is_section=depth < len(parts) - 1)
    if name != part:
      return None
    section = section[name]
  return None


def _unknown_message(section: ml_collections.ConfigDict, flag: str, where: str, name: str,
                     is_section: bool) -> str:
  """The line for a key or section `name` that `section` (the config's `where`) lacks."""
  keys = sorted(section.keys())
  sections = [k for k in keys if isinstance(section[k], ml_collections.ConfigDict)]
  near = difflib.get_close_matches(name, sections if is_section else keys)
  suggestion = f' Did you mean {_either(near)}?' if near else ''
  of = f' of {where}' if where else ''
  if not is_section:
    listed = '' if near else f' The keys{of} are {", ".join(keys)}.'
    return f'Unknown config key {name!r} in {flag}.{suggestion}{listed}'
  listed = (f'The sections{of} are {", ".join(sections)}.' if sections else
            f'{where} has no sections.')
  return f'Unknown config section {name!r} in {flag}.{suggestion} {listed}'


def _either(names: list[str]) -> str:
  """['a', 'b', 'c'] -> '"a", "b" or "c"'."""
  quoted = [f'"{name}"' for name in names]
  return ' or '.join(filter(None, (', '.join(quoted[:-1]), quoted[-1])))


# Every numeric key outside config.model (ModelConfig checks its own), with its valid range.
RANGES = {
    'seed': Range(0, integer=True),
    'data.seq_len': COUNT,
    'data.batch_size': COUNT,
    'data.eval_batch_size': Range(1, integer=True, optional=True),
    'data.eval_steps': Range(1, integer=True, special=(-1,), optional=True),
    'data.eval_examples': COUNT,
    'data.mlm_probability': Range(0, 1, open_low=True),
    'data.seq2seq_min_len': COUNT,
    'data.seq2seq_max_len': Range(1, integer=True, optional=True),
    'data.vocab_size': Range(1, integer=True, optional=True),
    'data.bleu_examples': Range(0, integer=True),  # 0: no BLEU
    'data.exact_match_examples': Range(0, integer=True),  # 0: none
    'data.image_size': COUNT,
    'data.num_classes': Range(2, integer=True),
    'data.num_threads': Range(0, integer=True),
    'data.prefetch_buffer_size': Range(0, integer=True),
    'data.mixup_alpha': Range(0),
    'data.cutmix_alpha': Range(0),
    'data.cutmix_prob': Range(0, 1),
    'optimizer.learning_rate': Range(0, open_low=True),
    'optimizer.warmup_steps': Range(0, integer=True),
    'optimizer.min_lr_ratio': Range(0, 1),
    'optimizer.b1': FRACTION,
    'optimizer.b2': FRACTION,
    'optimizer.eps': Range(0, open_low=True),  # 0 divides 0 by 0 for a never-used embedding row
    'optimizer.weight_decay': Range(0),
    'optimizer.grad_clip_norm': Range(0),  # 0: no clipping
    'optimizer.muon_learning_rate': Range(0, open_low=True),
    'optimizer.muon_momentum': FRACTION,
    'optimizer.muon_ns_steps': COUNT,
    'optimizer.muon_weight_decay': Range(0),
    'training.steps': COUNT,
    'training.grad_accum_steps': COUNT,
    'training.label_smoothing': FRACTION,
    'training.log_every': COUNT,
    'training.eval_every': COUNT,
    'training.checkpoint_every': COUNT,
    'training.keep_checkpoints': COUNT,
    'training.peak_flops_per_device': Range(0, open_low=True, optional=True, example=1e12),
    'training.device_memory_gb': Range(0, open_low=True, optional=True, example=16),
    'training.profile_start': Range(1, integer=True, optional=True, example=10),
    'training.profile_steps': COUNT,
    'lora.rank': Range(0, integer=True),  # 0: no adapters
    'lora.alpha': Range(0, open_low=True, example=8),
    'sample.max_new_tokens': COUNT,
    **{f'sample.{name}': valid for name, (valid, _) in decode.SAMPLER_RANGES.items()},
    'sample.seed': Range(0, integer=True),
    'sample.num_samples': COUNT,
    'sample.window': Range(0, integer=True, optional=True),  # 0: the whole context
    'sample.beam_size': Range(0, integer=True),  # 0: sample
    'sample.length_penalty': Range(0),
    'eval.beam_size': Range(0, integer=True),  # 0: greedy
    'eval.length_penalty': Range(0),
}
CHOICES = {'parallelism': ('jit', 'shard_map'), 'optimizer.name': ('adamw', 'muon'),
           'optimizer.schedule': ('cosine', 'constant')}

def _get(config, key: str):
  section, _, name = key.rpartition('.')
  return (config[section] if section else config).get(name)


def validate(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Checks every key of a run's config before anything is read or compiled: each value in its
  range, the model's options (ModelConfig), and the keys that constrain each other. Fails with
  a ConfigError naming the key and a value that works."""
  defaults = base_config()
  for key, valid in RANGES.items():
    value = _get(config, key)
    valid.check(key, value, _get(defaults, key))
  for key, allowed in CHOICES.items():
    if _get(config, key) not in allowed:
      raise ConfigError(f'{key}={_get(config, key)!r} must be one of {list(allowed)}.')
  cfg = models.model_config(config.model)
  _validate_mesh(config)
  _validate_profile(TrainingSettings.of(config.training))
  _validate_lengths(config, cfg)
  lora.check_targets(lora.LoraSettings.of(config.lora))
  if config.init_from_hf and config.init_from_checkpoint:
    raise ConfigError('Set one of init_from_hf and init_from_checkpoint, not both: a run starts '
                      'from one set of parameters.')
  return config


def _validate_mesh(config) -> None:
  axes, shape = tuple(config.mesh.axes), tuple(config.mesh.shape)
  if len(axes) != len(shape) or len(set(axes)) != len(axes):
    raise ConfigError(f'mesh.axes={axes} and mesh.shape={shape} must name distinct axes, one size '
                      "each: for example --config.mesh.axes=\"('data',)\" "
                      '--config.mesh.shape="(-1,)".')
  if any(not isinstance(s, int) or (s < 1 and s != -1) for s in shape) or shape.count(-1) > 1:
    raise ConfigError(f'mesh.shape={shape} must hold positive sizes and at most one -1 (all the '
                      'remaining devices).')
  for rule in config.sharding_rules:
    if len(rule) != 2 or not isinstance(rule[0], str) or rule[1] not in (*axes, None):
      raise ConfigError(f'sharding_rules entry {tuple(rule)} must be a pair (logical axis, mesh '
                        f'axis) with the mesh axis one of {list(axes)} or None: for example '
                        f'--config.sharding_rules="((\'embed\', \'{axes[0]}\'),)".')


def _validate_profile(training: TrainingSettings) -> None:
  if training.profile_start is not None and training.profile_start > training.steps:
    raise ConfigError(f'training.profile_start={training.profile_start} is past the last step '
                      f'(training.steps={training.steps}): for example '
                      f'--config.training.profile_start={min(10, training.steps)}.')


def _validate_lengths(config, cfg: ModelConfig) -> None:
  """Sequences that the model's position table must cover."""
  if models.registry.get(cfg.family).unit != 'token' or cfg.positions != 'learned':
    return
  if config.data.seq_len > cfg.max_len:
    raise ConfigError(f'data.seq_len={config.data.seq_len} is longer than the learned position '
                      f'table (model.max_len={cfg.max_len}): set --config.model.max_len='
                      f'{config.data.seq_len} or --config.data.seq_len={cfg.max_len}.')


# Keys that say where the data lies or how fast it is read, not what a run computes.
LOCATION_KEYS = ('data.manual_dir', 'data.tfds_data_dir', 'data.download', 'data.num_threads',
                 'data.prefetch_buffer_size')
SAVED_CONFIG = 'config.json'


def saved_config(workdir: str | None) -> dict | None:
  """The resolved config a run saved in its workdir (as JSON), or None. Its model section holds
  its family's settings only (a run of an earlier version saved every family's)."""
  path = os.path.join(workdir, SAVED_CONFIG) if workdir else None
  if not path or not os.path.exists(path):
    return None
  with open(path) as f:
    saved = json.load(f)
  if 'model' in saved:
    cfg = models.model_config(saved['model'])
    saved['model'] = {key: saved['model'][key] for key in names(type(cfg))
                      if key in saved['model']}
  return saved


def flatten(tree: dict, prefix: str = '') -> dict:
  """{'model': {'width': 128}} -> {'model.width': 128}."""
  flat = {}
  for key, value in tree.items():
    if isinstance(value, dict):
      flat.update(flatten(value, f'{prefix}{key}.'))
    else:
      flat[f'{prefix}{key}'] = value
  return flat


def differing_keys(saved: dict, config: ml_collections.ConfigDict) -> list[str]:
  """The keys whose values differ between a saved config (as JSON) and `config`, model keys
  first; the keys that say where the data lies are left out. A key the saved config lacks (one
  added to the project after it was saved) differs only where `config` moves it off its default:
  the saved run ran as that default does."""
  old, new = flatten(saved), flatten(json.loads(config.to_json_best_effort()))
  defaults = flatten(json.loads(base_config(config.model.family).to_json_best_effort()))
  old.update({k: defaults[k] for k in new.keys() - old.keys() if k in defaults})
  return sorted((k for k in old.keys() | new.keys()
                 if k not in LOCATION_KEYS and old.get(k) != new.get(k)),
                key=lambda k: (not k.startswith('model.'), k))


def differences(saved: dict, config: ml_collections.ConfigDict) -> list[str]:
  """'model.num_layers 4 -> 3' for each of the differing_keys."""
  old, new = flatten(saved), flatten(json.loads(config.to_json_best_effort()))
  return [f'{k} {_shown(old, k)} -> {_shown(new, k)}' for k in differing_keys(saved, config)]


def _shown(flat: dict, key: str) -> str:
  return json.dumps(flat[key]) if key in flat else '(absent)'


def assign(config: ml_collections.ConfigDict, values: dict) -> list[str]:
  """Sets each key of `values` (nested, as a saved config.json, or flat with dotted keys, as
  --config flags) in `config`, lists as the tuples the config holds; returns the keys `config`
  does not have, which are left out. A model section of another family replaces the model
  section with that family's defaults first."""
  family = values.get('model', {}).get('family', config.model.family)
  if family != config.model.family:
    config.model = model_defaults(family)
    if config.is_locked:
      config.model.lock()
  unknown = []
  for key, value in flatten(values).items():
    *sections, name = key.split('.')
    section = config
    for part in sections:
      section = section.get(part) if isinstance(section, ml_collections.ConfigDict) else None
    if not isinstance(section, ml_collections.ConfigDict) or name not in section:
      unknown.append(key)
      continue
    section[name] = _as_tuples(value) if isinstance(section[name], tuple) else value
  return unknown


def _as_tuples(value):
  return tuple(map(_as_tuples, value)) if isinstance(value, list) else value
