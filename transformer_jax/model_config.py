"""The model description shared by every family: a frozen, validated dataclass.

Configs under `configs/` hold the model as an `ml_collections.ConfigDict`; `ModelConfig.from_dict`
turns it into this dataclass (unknown keys fail with the list of known ones) and `validate` checks
every combination before anything is built or compiled, with a message that names the fix.
"""
import dataclasses
from typing import Any, Mapping

import jax.numpy as jnp

from transformer_jax.errors import ConfigError
from transformer_jax import kernels
from transformer_jax.layers import block, mlp
from transformer_jax.ranges import COUNT, FRACTION, Range

NORMS = ('layernorm', 'rmsnorm')
POSITIONS = ('learned', 'sinusoidal', 'rope', 'none')
POOLS = ('cls', 'mean')
# What each option may be, from the layers that take it.
CHOICES = {'norm': NORMS, 'norm_position': block.NORM_POSITIONS, 'mlp': mlp.KINDS,
           'positions': POSITIONS, 'pool': POOLS,
           'remat_policy': tuple(block.REMAT_POLICIES)}
# The valid range of every numeric field.
RANGES = {
    'width': COUNT, 'num_layers': COUNT, 'num_heads': COUNT,
    'num_decoder_layers': Range(1, integer=True, optional=True),
    'num_kv_heads': Range(1, integer=True, optional=True),
    'd_ff': Range(1, integer=True, optional=True),
    'vocab_size': Range(0, integer=True, example=65), 'max_len': COUNT,
    'type_vocab_size': Range(0, integer=True),
    'norm_eps': Range(0, open_low=True),
    'rope_base': Range(1, open_low=True),  # frequencies base^(-i/h) must fall with i
    'dropout_rate': FRACTION,
    'image_size': COUNT, 'patch_size': COUNT, 'num_channels': COUNT, 'num_classes': COUNT,
    'init_std': Range(0, optional=True), 'embed_init_std': Range(0),
}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Every option of every family. Fields a family does not use are ignored by it."""
  family: str = 'decoder'
  # Sizes.
  width: int = 512
  num_layers: int = 6  # encoder layers for 'encoder_decoder'
  num_decoder_layers: int | None = None  # 'encoder_decoder' only; None: num_layers
  num_heads: int = 8
  num_kv_heads: int | None = None  # None: num_heads (MHA); 1: MQA; in between: GQA
  d_ff: int | None = None  # None: 4 * width, or int(8 * width / 3) for SwiGLU
  vocab_size: int = 0
  max_len: int = 1024  # rows of a learned position table; longest sequence
  # Block.
  norm: str = 'layernorm'
  norm_eps: float = 1e-5
  norm_bias: bool = True  # the LayerNorm shift; RMSNorm has none
  norm_position: str = 'pre'
  mlp: str = 'gelu'
  use_bias: bool = True  # biases of every dense layer inside the blocks
  positions: str = 'learned'
  rope_base: float = 10000.0
  # Ablation switches (experiments/ablations.py): a removed sublayer writes nothing into the
  # residual stream.
  use_attention: bool = True
  use_mlp: bool = True
  use_norm: bool = True
  use_residual: bool = True
  dropout_rate: float = 0.0
  # Ends.
  tie_embeddings: bool = True
  # Token rows times sqrt(width) before the positions are added (Vaswani et al. 2017, section
  # 3.4): small embedding rows would otherwise be swamped by sinusoidal positions of amplitude 1.
  scale_embeddings: bool = False
  embed_norm: bool = False  # a norm right after the embeddings (BERT)
  type_vocab_size: int = 0  # token-type (segment) embeddings (BERT); 0: none
  image_size: int = 32
  patch_size: int = 4
  num_channels: int = 3
  num_classes: int = 10
  pool: str = 'cls'  # 'cls' prepends a [CLS] token; 'mean' averages the patch tokens
  # Initialization: dense kernels and embeddings ~ N(0, std); None means LeCun normal (fan-in).
  init_std: float | None = 0.02
  embed_init_std: float = 0.02
  # Execution.
  # A name of transformer_jax.kernels; 'auto' picks by the platform the step is compiled for.
  attention_kernel: str = 'auto'
  scan_layers: bool = False
  remat_policy: str = 'none'
  dtype: str = 'float32'
  param_dtype: str = 'float32'

  @classmethod
  def from_dict(cls, values: Mapping[str, Any]) -> 'ModelConfig':
    values = dict(values)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
      raise ConfigError(f'Unknown model config key(s) {unknown}. Known keys: {sorted(known)}.')
    return cls(**values)

  # Derived sizes.
  @property
  def kv_heads(self) -> int:
    return self.num_kv_heads or self.num_heads

  @property
  def head_dim(self) -> int:
    if self.width % self.num_heads:  # even before validate(): never a silently rounded width
      raise ConfigError(f'model.num_heads={self.num_heads} does not divide model.width='
                        f'{self.width}: the heads would not cover the width.')
    return self.width // self.num_heads

  @property
  def hidden_dim(self) -> int:
    if self.d_ff:
      return self.d_ff
    return int(8 * self.width / 3) if self.mlp == 'swiglu' else 4 * self.width

  @property
  def decoder_layers(self) -> int:
    return self.num_decoder_layers or self.num_layers

  @property
  def num_patches(self) -> int:
    return (self.image_size // self.patch_size) ** 2

  @property
  def compute_dtype(self):
    return jnp.dtype(self.dtype)

  @property
  def weight_dtype(self):
    return jnp.dtype(self.param_dtype)

  @property
  def final_norm(self) -> bool:
    """A pre-LN stack never normalizes its residual stream, so it ends with a norm."""
    return self.use_norm and self.norm_position == 'pre'


def _choice(name: str, value: str, allowed: tuple[str, ...]):
  if value not in allowed:
    raise ConfigError(f'Unknown {name} {value!r}: set model.{name} to one of {list(allowed)}.')


def validate(cfg: ModelConfig) -> ModelConfig:
  """Fails on any out-of-range or inconsistent option with a ConfigError naming the setting to
  change."""
  defaults = ModelConfig()
  for name, valid in RANGES.items():
    valid.check(f'model.{name}', getattr(cfg, name), getattr(defaults, name))
  for name, allowed in CHOICES.items():
    _choice(name, getattr(cfg, name), allowed)
  _choice('attention_kernel', cfg.attention_kernel, tuple(kernels.names()))
  for name in ('dtype', 'param_dtype'):
    try:
      jnp.dtype(getattr(cfg, name))
    except TypeError:
      raise ConfigError(f'model.{name}={getattr(cfg, name)!r} is not a dtype: use "float32" or '
                        '"bfloat16".') from None
  if cfg.width % cfg.num_heads:
    raise ConfigError(f'model.num_heads={cfg.num_heads} does not divide model.width={cfg.width}: '
                      f'choose a head count that divides the width (for example '
                      f'{_divisors_near(cfg.width, cfg.num_heads)}).')
  if cfg.num_heads % cfg.kv_heads:
    raise ConfigError(f'model.num_kv_heads={cfg.num_kv_heads} does not divide '
                      f'model.num_heads={cfg.num_heads}: each group of query heads shares one '
                      f'key-value head, so choose a divisor of {cfg.num_heads} '
                      f'({_divisors(cfg.num_heads)}).')
  if cfg.positions == 'rope' and cfg.head_dim % 2:
    raise ConfigError(f'RoPE rotates pairs of channels, but the head width {cfg.head_dim} is odd: '
                      'choose model.width / model.num_heads even, or another model.positions.')
  return cfg


def _divisors(n: int) -> list[int]:
  return [d for d in range(1, n + 1) if n % d == 0]


def _divisors_near(n: int, target: int) -> list[int]:
  return sorted(_divisors(n), key=lambda d: abs(d - target))[:3]
