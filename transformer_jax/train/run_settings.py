"""A run's config resolved once, at the top: every section typed and checked, the platform its
steps are compiled for, and the model's compute dtype and attention kernel decided for it.

launch.py's walk resolves the config once (`resolve`) and passes the RunSettings down; code below
it reads these, never the ConfigDict, which they keep only to save it (config.json) and compare
it with a saved one. Library entry points (train.build_run, memory.plan, describe...) also take
a ConfigDict, which they resolve themselves.
"""
import dataclasses
from typing import Any

import jax
import ml_collections

from transformer_jax import config_lib, decode, kernels, lora, models
from transformer_jax.data import DataSettings
from transformer_jax.errors import ConfigError
from transformer_jax.model_config import ModelConfig
from transformer_jax.models.registry import Family
from transformer_jax.settings import (CompileSettings, MeshSettings, OptimizerSettings,
                                     TrainingSettings)
from transformer_jax.train import sharding

__all__ = ['resolve', 'RunSettings']


@dataclasses.dataclass(frozen=True)
class RunSettings:
  """What a run's config means on `platform`."""
  config: ml_collections.ConfigDict  # saved and compared, never read below the top
  platform: str  # of the devices the steps are compiled for: 'cpu', 'gpu', 'tpu'
  model: ModelConfig  # its dtype and attention kernel decided for the platform
  kernel: kernels.Choice
  dtype_reason: str
  data: DataSettings
  training: TrainingSettings
  optimizer: OptimizerSettings
  mesh: MeshSettings
  lora: lora.LoraSettings
  eval: Any  # decode's settings of the held-out decoding (beam_size...), or the family's own
  sample: Any  # --mode=sample's settings: decode's, or the family's own (sample_settings)
  seed: int
  rule_set: str
  sharding_rules: tuple
  rules: tuple  # the sharding rules in force: sharding_rules, then the rule set's
  parallelism: str
  init_from_hf: str
  init_from_checkpoint: str
  compile: CompileSettings  # the target describe and --mode=compile compile for

  @property
  def family(self) -> Family:
    return models.registry.get(self.model.family)

  def with_model(self, cfg: ModelConfig) -> 'RunSettings':
    """These settings with the model's sizes the data filled in (build_run)."""
    return dataclasses.replace(self, model=cfg)


def resolve(config: 'ml_collections.ConfigDict | RunSettings',
            platform: str | None = None, deterministic: bool = False) -> RunSettings:
  """The settings of `config` on `platform` ('cpu', 'gpu', 'tpu'; default: this machine's
  devices'), every key checked before anything is read or compiled: a ConfigError names the
  key and a value that works. RunSettings are returned as they are.

  `deterministic`: for a mode that never trains (eval, sample), the model's dropout rates are
  set to 0, so that none of them makes 'auto' pick the reference attention kernel (an imported
  GPT-2's attention dropout would otherwise sample on the reference kernel of a GPU)."""
  if isinstance(config, RunSettings):
    if platform and platform != config.platform:
      raise ValueError(f'The settings were resolved for {config.platform}, not {platform}: '
                       'resolve the config for the platform it runs on.')
    return config
  platform = platform or jax.devices()[0].platform
  config_lib.check_values(config)
  data = DataSettings.of(config.data)
  cfg = models.model_config(config.model)
  family = models.registry.get(cfg.family)
  cfg = family.follow_data(cfg, data.stated_sizes(), 'The data settings')
  if deterministic:
    cfg = dataclasses.replace(cfg, **dict.fromkeys(cfg.dropout_rates, 0.0))
  cfg, kernel, dtype_reason = models.resolved(cfg, platform)
  mesh = MeshSettings.of(config.mesh)
  _check_rules(config, mesh)
  sharding.check_rule_set(config.rule_set, mesh.axes)
  _check_lengths(family, cfg, data)
  training = TrainingSettings.of(config.training)
  _check_whole_batch(family, config.parallelism, training)
  if training.z_loss and family.loss is not None:
    raise ConfigError(f'training.z_loss={training.z_loss} penalises the log-normalizer of a '
                      f"cross-entropy over logits, and a {family.name!r} model's loss is its "
                      'own: set --config.training.z_loss=0.')
  if training.logits_chunk and not family.chunked_logits:
    raise ConfigError(f'training.logits_chunk={training.logits_chunk} computes the logits of a '
                      f"language-model head in chunks, and a {family.name!r} model has none: set "
                      '--config.training.logits_chunk=0.')
  optimizer = OptimizerSettings.of(config.optimizer)
  optimizer.check_steps(training.steps)
  if config.init_from_hf and config.init_from_checkpoint:
    raise ConfigError('Set one of init_from_hf and init_from_checkpoint, not both: a run starts '
                      'from one set of parameters.')
  sample = (family.sample_settings or decode.SampleSettings).of(config.sample)
  return RunSettings(
      config=config, platform=platform, model=cfg, kernel=kernel, dtype_reason=dtype_reason,
      data=data, training=training,
      optimizer=optimizer, mesh=mesh,
      lora=lora.LoraSettings.of(config.lora), eval=_eval_settings(family, cfg, config.eval, sample),
      sample=sample,
      seed=config.seed,
      rule_set=config.rule_set, sharding_rules=tuple(map(tuple, config.sharding_rules)),
      rules=sharding.rules_of(config.rule_set, config.sharding_rules),
      parallelism=config.parallelism,
      init_from_hf=config.init_from_hf, init_from_checkpoint=config.init_from_checkpoint,
      compile=CompileSettings.of(config.compile))


def _eval_settings(family: Family, cfg: ModelConfig, section, sample):
  """config.eval: decode's settings, or the family's own checked against the model and the
  sample settings (before anything is compiled)."""
  if family.eval_settings is None:
    return decode.EvalSettings.of(section)
  settings = family.eval_settings.of(section)
  settings.check_for(cfg, sample)
  return settings


def _check_rules(config, mesh: MeshSettings) -> None:
  for rule in config.sharding_rules:
    if len(rule) != 2 or not isinstance(rule[0], str) or rule[1] not in (*mesh.axes, None):
      raise ConfigError(f'sharding_rules entry {tuple(rule)} must be a pair (logical axis, mesh '
                        f'axis) with the mesh axis one of {list(mesh.axes)} or None: for example '
                        f'--config.sharding_rules="((\'embed\', \'{mesh.axes[0]}\'),)".')


def _check_whole_batch(family: Family, parallelism: str, training: TrainingSettings) -> None:
  """A loss over the whole global batch (Family.loss_over_batch) needs the whole batch at once."""
  if not family.loss_over_batch:
    return
  if parallelism != 'jit':
    raise ConfigError(f"A {family.name!r} model's loss is over the whole global batch: set "
                      "--config.parallelism=jit (a shard_map step would score each device's "
                      'share alone).')
  if training.grad_accum_steps != 1:
    raise ConfigError(f"A {family.name!r} model's loss is over the whole global batch: set "
                      '--config.training.grad_accum_steps=1 (each microbatch would be scored '
                      'alone), or a smaller data.batch_size.')


def _check_lengths(family: Family, cfg: ModelConfig, data: DataSettings) -> None:
  """Sequences that the model's position table must cover."""
  if not family.per_token or cfg.positions != 'learned':
    return
  if data.seq_len > cfg.max_len:
    raise ConfigError(f'data.seq_len={data.seq_len} is longer than the learned position '
                      f'table (model.max_len={cfg.max_len}): set --config.model.max_len='
                      f'{data.seq_len} or --config.data.seq_len={cfg.max_len}.')
