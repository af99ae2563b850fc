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
from transformer_jax import data, decode, lora, models
from transformer_jax.model_config import names
from transformer_jax.ranges import Range
from transformer_jax.settings import (CompileSettings, MeshSettings, OptimizerSettings, Settings,
                                     TrainingSettings)

__all__ = [
    'assign', 'base_config', 'check_values', 'CheckedConfigFile', 'CHOICES', 'differences',
    'differing_keys', 'flatten', 'from_file', 'LOCATION_KEYS', 'model_defaults', 'parse_arg',
    'RANGES', 'run_config', 'SAVED_CONFIG', 'saved_config', 'section_of', 'smoke', 'unknown_keys']


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
  config.data = _data_section()
  config.optimizer = section_of(OptimizerSettings)
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
  # The accelerator --mode=compile and --mode=describe compile for, and whether describe asks
  # XLA for the train step's memory (settings.CompileSettings).
  config.compile = section_of(CompileSettings)
  # A Hugging Face checkpoint directory to start from instead of a random init (see
  # transformer_jax.convert); a checkpoint of the run's own, once there is one, wins.
  config.init_from_hf = ''
  # Another run's parameters to start from, with a fresh optimizer and step 0 (fine-tuning, a
  # changed schedule): WORKDIR or WORKDIR:STEP (default: its latest checkpoint). A checkpoint of
  # the run's own, once there is one, wins.
  config.init_from_checkpoint = ''
  # --mode=sample's settings (decode.SampleSettings, or the family's own), and how an
  # encoder-decoder's held-out outputs are decoded at each evaluation (decode.EvalSettings).
  config.eval = section_of(models.registry.get(family).eval_settings or decode.EvalSettings)
  config.sample = section_of(models.registry.get(family).sample_settings
                              or decode.SampleSettings)
  return config


def section_of(settings: type[Settings]) -> ml_collections.ConfigDict:
  """The config section of a Settings class, its defaults; keys whose default is None become
  placeholders of their type."""
  return _section(settings.defaults(), settings.placeholder_types())


def _data_section() -> ml_collections.ConfigDict:
  """config.data: the shared keys and those of every registered source's part."""
  return _section(data.DataSettings.section_defaults(), data.DataSettings.section_types())


def _section(defaults: dict, types: dict) -> ml_collections.ConfigDict:
  section = ml_collections.ConfigDict()
  for key, default in defaults.items():
    section[key] = config_dict.placeholder(types[key]) if default is None else default
  return section


def smoke(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Shrinks a run to seconds: 2 blocks per stack, 3 steps of batch 8 (a warmup of 1 step at
  most), one eval batch (of which an encoder-decoder decodes 8 pairs at most)."""
  for key in models.registry.get(config.model.family).depth_keys:
    if config.model[key]:
      config.model[key] = min(config.model[key], 2)
  config.data.update(batch_size=8, eval_batch_size=8, eval_steps=1,
                     bleu_examples=min(config.data.bleu_examples, 8),
                     exact_match_examples=min(config.data.exact_match_examples, 8))
  config.training.update(steps=3, log_every=1, eval_every=3, checkpoint_every=3)
  config.optimizer.warmup_steps = min(config.optimizer.warmup_steps, 1)
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


# The keys outside the typed sections (which check their own), with their valid values.
RANGES = {'seed': Range(0, integer=True)}
CHOICES = {'parallelism': ('jit', 'shard_map')}


def check_values(config: ml_collections.ConfigDict) -> None:
  """Checks the top-level keys; each section's own settings check theirs when they are made."""
  for key, valid in RANGES.items():
    valid.check(key, config[key])
  for key, allowed in CHOICES.items():
    if config[key] not in allowed:
      raise ConfigError(f'{key}={config[key]!r} must be one of {list(allowed)}.')


# Keys that say where the data lies or how fast it is read, not what a run computes.
LOCATION_KEYS = ('data.manual_dir', 'data.tfds_data_dir', 'data.download', 'data.num_threads',
                 'data.prefetch_buffer_size')
SAVED_CONFIG = 'config.json'
# Keys earlier versions saved that now follow the model: generated images took data.image_size
# and data.num_classes, which were the model's in every run the project's configs made.
_RETIRED_KEYS = {'data': ('image_size', 'num_classes')}


def saved_config(workdir: str | None) -> dict | None:
  """The resolved config a run saved in its workdir (as JSON), or None. Its model section holds
  its family's settings only (a run of an earlier version saved every family's)."""
  path = os.path.join(workdir, SAVED_CONFIG) if workdir else None
  if not path or not os.path.exists(path):
    return None
  with open(path) as f:
    saved = json.load(f)
  for section, keys in _RETIRED_KEYS.items():
    for key in keys:
      saved.get(section, {}).pop(key, None)
  if 'model' in saved:
    cfg = models.model_config(saved['model'])
    saved['model'] = {key: saved['model'][key] for key in names(type(cfg))
                      if key in saved['model']}
  return saved


def run_config(workdir: str) -> ml_collections.ConfigDict | None:
  """The config of the run saved in `workdir` (its family's defaults with the saved values), to
  restore another run's model from its own settings; None where it saved none."""
  saved = saved_config(workdir)
  if saved is None:
    return None
  config = base_config(saved['model']['family'])
  assign(config, saved)
  return config


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
