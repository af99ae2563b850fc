"""The settings every family shares: its depth and the blocks it stacks, a frozen dataclass that
checks itself when it is made.

Each family extends `ModelConfig` with its own settings beside its module (models/decoder.py's
`DecoderConfig`, models/vit.py's `ViTConfig`, ...) and names that class on its registry entry;
`models.model_config` turns a config's model section into it once, at the top. Every rule is
checked once, in `check`, so a config that exists is one the layers accept: unknown keys, values
out of range and inconsistent sizes fail with a ConfigError that names the setting to change.
"""
import dataclasses
from typing import Any, ClassVar, Mapping

import jax.numpy as jnp

from transformer_jax.errors import ConfigError
from transformer_jax import kernels
from transformer_jax.layers import attention, block, linear, mlp
from transformer_jax.ranges import COUNT, FRACTION, OPTIONAL_FRACTION, Range

__all__ = [
    'BLOCK_CHOICES', 'check_choice', 'compute_dtype_of', 'defaults', 'ModelConfig', 'names',
    'NORMS', 'POSITIONS']

NORMS = ('layernorm', 'rmsnorm')
# 'relative': T5's learned bias per head and bucket of key-minus-query distance, added to the
# attention logits (a family whose config sets RELATIVE_POSITIONS builds it).
POSITIONS = ('learned', 'sinusoidal', 'rope', 'relative', 'none')
# What each option of the blocks may be, from the layers that take it.
BLOCK_CHOICES = {'norm': NORMS, 'norm_position': block.NORM_POSITIONS, 'mlp': mlp.KINDS,
                 'positions': POSITIONS, 'remat_policy': tuple(block.REMAT_POLICIES),
                 'init': linear.INITS}
# The compute dtype model.dtype='auto' means on each platform (jax.Device.platform), and why.
_AUTO_DTYPES = {'cpu': ('float32', 'bfloat16 products run slower than float32 ones on XLA:CPU')}
_AUTO_DTYPE_DEFAULT = ('bfloat16', 'the matrix units of TPUs and GPUs run bfloat16 at full rate')


def compute_dtype_of(dtype: str, platform: str) -> tuple[str, str]:
  """(name, why) of the compute dtype `dtype` means on `platform` ('cpu', 'gpu', 'tpu': the
  platform the step is compiled for). Only 'auto' reads the platform: bfloat16 on TPUs and GPUs,
  float32 on XLA:CPU."""
  if dtype != 'auto':
    return dtype, 'chosen by name'
  chosen, why = _AUTO_DTYPES.get(platform, _AUTO_DTYPE_DEFAULT)
  return chosen, f'auto on {platform}: {why}'


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """The family's name, the depth, and the settings of its blocks."""
  family: str = ''  # the registry entry; each family's config sets its own
  # Sizes.
  width: int = 512
  num_layers: int = 6
  num_heads: int = 8
  num_kv_heads: int | None = None  # None: num_heads (MHA); 1: MQA; in between: GQA
  d_ff: int | None = None  # None: 4 * width, or int(8 * width / 3) for SwiGLU
  head_width: int | None = None  # None: width // num_heads; T5 sets its own (d_kv)
  # Block.
  norm: str = 'layernorm'
  norm_eps: float = 1e-5
  norm_bias: bool = True  # the LayerNorm shift; RMSNorm has none
  norm_position: str = 'pre'
  mlp: str = 'gelu'
  use_bias: bool = True  # biases of every dense layer inside the blocks
  key_bias: bool = True  # with use_bias, the key projection's too (Whisper's has none)
  positions: str = 'learned'
  rope_base: float = 10000.0
  # Attention logits times 1 / sqrt(head_dim); False folds it into the queries' initialization
  # (T5).
  scale_attention: bool = True
  # Ablation switches (experiments/ablations.py): a removed sublayer writes nothing into the
  # residual stream.
  use_attention: bool = True
  use_mlp: bool = True
  use_norm: bool = True
  use_residual: bool = True
  # Dropout in training: dropout_rate of the embeddings and of each sublayer's output before the
  # residual add; attention_dropout of the attention probabilities (a kernel that forms them:
  # 'auto' then runs the reference kernel, a fused one fails in training) and mlp_dropout of
  # the MLP's hidden activation. None follows dropout_rate, as T5 (and its style) drops
  # everywhere at one rate.
  dropout_rate: float = 0.0
  attention_dropout: float | None = 0.0
  mlp_dropout: float | None = 0.0
  # Initialization: dense kernels and embeddings ~ N(0, std); None means LeCun normal (fan-in).
  init_std: float | None = 0.02
  # The blocks' dense kernels (attention, MLP): 'normal' as init_std says, or 'xavier_uniform'
  # (layers.Linear's INITS; DiT's), which reads no init_std.
  init: str = 'normal'
  # GPT-2's residual scaling (Radford et al. 2019, section 2.3): the kernels that write into the
  # residual stream, each attention's output and each MLP's down projection, start
  # 1 / sqrt(N) as large, N being the residual branches of their stack (2 a block, 3 with
  # cross-attention): nanoGPT's c_proj, N(0, 0.02 / sqrt(2 n_layer)), as transformers' GPT-2.
  scale_residual_init: bool = False
  embed_init_std: float = 0.02
  # Execution.
  # A name of transformer_jax.kernels; 'auto' picks by the platform the step is compiled for.
  attention_kernel: str = 'auto'
  scan_layers: bool = False
  remat_policy: str = 'none'
  # The compute dtype; 'auto' is the platform's (compute_dtype_of). The parameters, and so the
  # optimizer state and checkpoints, stay in param_dtype.
  dtype: str = 'auto'
  param_dtype: str = 'float32'

  # The valid range of each numeric setting and the options of each string one; a family's
  # config adds its own.
  RANGES: ClassVar[dict[str, Range]] = {
      'width': COUNT, 'num_layers': COUNT, 'num_heads': COUNT,
      'num_kv_heads': Range(1, integer=True, optional=True),
      'd_ff': Range(1, integer=True, optional=True),
      'head_width': Range(1, integer=True, optional=True),
      'norm_eps': Range(0, open_low=True),
      'rope_base': Range(1, open_low=True),  # frequencies base^(-i/h) must fall with i
      'dropout_rate': FRACTION, 'attention_dropout': OPTIONAL_FRACTION,
      'mlp_dropout': OPTIONAL_FRACTION,
      'init_std': Range(0, optional=True), 'embed_init_std': Range(0),
  }
  CHOICES: ClassVar[dict[str, tuple[str, ...]]] = BLOCK_CHOICES
  # Whether the family builds positions='relative' (and has its relative_* settings).
  RELATIVE_POSITIONS: ClassVar[bool] = False

  def __post_init__(self):
    self.check()

  @classmethod
  def from_dict(cls, values: Mapping[str, Any]) -> 'ModelConfig':
    """The config of `values` (a model section as a dict); unknown keys fail, naming the known
    ones."""
    known = names(cls)
    unknown = sorted(set(values) - set(known))
    relative = [name for name in unknown if name.startswith('relative_')]
    if relative and not cls.RELATIVE_POSITIONS:
      raise ConfigError(f"model.{relative[0]} sets T5's relative position bias, which family "
                        f'{values.get("family", cls.family)!r} does not have: remove it, or '
                        "choose model.family='encoder_decoder' with model.positions='relative'.")
    if unknown:
      raise ConfigError(f'Unknown model config key(s) {unknown} for family '
                        f'{values.get("family", cls.family)!r}. Known keys: {sorted(known)}.')
    return cls(**values)

  def check(self) -> None:
    """Fails on any out-of-range or inconsistent setting with a ConfigError naming the setting
    to change. A family's config extends it (calling super().check() first)."""
    default = defaults(type(self))
    for name, valid in self.RANGES.items():
      valid.check(f'model.{name}', getattr(self, name), default.get(name))
    for name, allowed in self.CHOICES.items():
      check_choice(name, getattr(self, name), allowed)
    check_choice('attention_kernel', self.attention_kernel, tuple(kernels.names()))
    for name in ('dtype', 'param_dtype'):
      value = getattr(self, name)
      if name == 'dtype' and value == 'auto':
        continue
      try:
        jnp.dtype(value)
      except TypeError:
        auto = '"auto", ' if name == 'dtype' else ''
        raise ConfigError(f'model.{name}={value!r} is not a dtype: use {auto}"float32" '
                          'or "bfloat16".') from None
    if self.positions == 'relative' and not self.RELATIVE_POSITIONS:
      raise ConfigError(f"model.positions='relative' (T5's relative position bias) is built by "
                        f'the encoder_decoder family only, not {self.family!r}: choose one of '
                        f'{[p for p in POSITIONS if p != "relative"]}.')
    if self.head_width is None and self.width % self.num_heads:
      raise ConfigError(f'model.num_heads={self.num_heads} does not divide model.width='
                        f'{self.width}: choose a head count that divides the width (for example '
                        f'{_divisors_near(self.width, self.num_heads)}), or set '
                        'model.head_width.')
    attention.check_kv_heads(self.num_heads, self.num_kv_heads, prefix='model.')
    if self.positions == 'rope':
      attention.check_rope(self.head_dim, self.rope_base, prefix='model.')

  # Derived sizes.
  @property
  def kv_heads(self) -> int:
    return self.num_kv_heads or self.num_heads

  @property
  def head_dim(self) -> int:
    return self.head_width or self.width // self.num_heads

  @property
  def attention_dropout_rate(self) -> float:
    """The rate attention probabilities are dropped at in training."""
    return self.dropout_rate if self.attention_dropout is None else self.attention_dropout

  @property
  def mlp_dropout_rate(self) -> float:
    """The rate the MLP's hidden activation is dropped at in training."""
    return self.dropout_rate if self.mlp_dropout is None else self.mlp_dropout

  @property
  def dropout_rates(self) -> dict[str, float]:
    """Every dropout rate the model applies in training, by setting (a family adds its own)."""
    return {'dropout_rate': self.dropout_rate, 'attention_dropout': self.attention_dropout_rate,
            'mlp_dropout': self.mlp_dropout_rate}

  @property
  def drops_in_training(self) -> bool:
    """Whether a train step runs the model with deterministic=False: a dropout rate above 0 (a
    family adds a random drop of its own: DiT's labels). Evaluation never does."""
    return any(rate > 0 for rate in self.dropout_rates.values())

  @property
  def hidden_dim(self) -> int:
    if self.d_ff:
      return self.d_ff
    return int(8 * self.width / 3) if self.mlp == 'swiglu' else 4 * self.width

  def on(self, platform: str) -> 'ModelConfig':
    """This config with its compute dtype resolved for `platform` (see compute_dtype_of)."""
    if self.dtype != 'auto':
      return self
    return dataclasses.replace(self, dtype=compute_dtype_of(self.dtype, platform)[0])

  @property
  def compute_dtype(self):
    """The compute dtype, once 'auto' is resolved for a platform (`on`, models.resolved)."""
    if self.dtype == 'auto':
      raise ValueError("model.dtype='auto' means the platform's dtype: resolve the config for the "
                       'platform its steps are compiled for first (models.resolved(cfg, '
                       "platform), or ModelConfig.on).")
    return jnp.dtype(self.dtype)

  @property
  def weight_dtype(self):
    return jnp.dtype(self.param_dtype)

  @property
  def final_norm(self) -> bool:
    """A pre-LN stack never normalizes its residual stream, so it ends with a norm."""
    return self.use_norm and self.norm_position == 'pre'


def names(config_class: type[ModelConfig]) -> list[str]:
  """The settings of a config class, in order."""
  return [field.name for field in dataclasses.fields(config_class)]


def defaults(config_class: type[ModelConfig]) -> dict[str, Any]:
  """{setting: default} of a config class."""
  return {field.name: field.default for field in dataclasses.fields(config_class)}


def check_choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
  if value not in allowed:
    raise ConfigError(f'Unknown {name} {value!r}: set model.{name} to one of {list(allowed)}.')


def _divisors(n: int) -> list[int]:
  return [d for d in range(1, n + 1) if n % d == 0]


def _divisors_near(n: int, target: int) -> list[int]:
  return sorted(_divisors(n), key=lambda d: abs(d - target))[:3]
