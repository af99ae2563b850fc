"""What one of Hugging Face's model classes is in our terms: its config.json options as
settings of our model config (and back), and its tensors as our parameters."""
import dataclasses
from typing import Any, Callable

from transformer_jax.convert.tensors import Tensor
from transformer_jax.errors import UserError
from transformer_jax.model_config import ModelConfig

__all__ = [
    'ACTIVATIONS', 'ATTENTION_DROPOUT_ONLY', 'Architecture', 'CheckpointError', 'hf_activation',
    'HF_ACTIVATIONS', 'HfConfig', 'NO_ABLATIONS']

# HF's activation names (transformers.activations.ACT2FN) -> our model.mlp, and back.
ACTIVATIONS = {'gelu': 'gelu', 'gelu_new': 'gelu_tanh', 'gelu_pytorch_tanh': 'gelu_tanh',
               'relu': 'relu', 'quick_gelu': 'quick_gelu'}
HF_ACTIVATIONS = {'gelu': 'gelu', 'gelu_tanh': 'gelu_new', 'relu': 'relu',
                  'quick_gelu': 'quick_gelu'}
# Every HF class here has every sublayer, norm and residual (none of our ablations); the text
# ones add their embedding rows unscaled (scale_embeddings=False).
NO_ABLATIONS = dict(use_attention=True, use_mlp=True, use_norm=True, use_residual=True)
# The dropout of an HF class that drops the attention probabilities only (LLaMA, CLIP, SigLIP):
# none of the embeddings, the residual branches or the MLP's hidden activation.
ATTENTION_DROPOUT_ONLY = dict(dropout_rate=0.0, mlp_dropout=0.0)


class CheckpointError(UserError, ValueError):
  """A checkpoint or config that does not convert exactly, with what to change."""


class HfConfig:
  """config.json's values, read as transformers reads them: a key that is absent or null takes
  the default of HF's config class. `tensor_names`: the names of the checkpoint's tensors where
  the model depends on them (T5's head is untied where the checkpoint holds one), None where
  config.json is all there is."""

  def __init__(self, architecture: str, values: dict[str, Any],
               tensor_names: frozenset[str] | None = None):
    self.architecture, self.values, self.tensor_names = architecture, values, tensor_names

  def get(self, key: str, default: Any) -> Any:
    value = self.values.get(key)
    return default if value is None else value

  def require(self, key: str, default: Any, supported: tuple, what_we_do: str) -> Any:
    """The value of `key`, failing where it is not one of `supported`."""
    return self.check(key, self.get(key, default), supported, what_we_do)

  def check(self, key: str, value: Any, supported: tuple, what_we_do: str) -> Any:
    """Fails where `value` of option `key` is not one of `supported`: converting anyway would
    give a model that computes something else."""
    if value not in supported:
      raise CheckpointError(
          f'{self.architecture}: config.json sets {key}={value!r}, but transformer_jax '
          f'{what_we_do} (supported: {list(supported)}); the converted model would compute '
          'something else, so nothing was converted. Add the option to the shared layers first.')
    return value

  def rate(self, key: str, default: float) -> float:
    """A dropout probability, which transformers' configs may hold as an int (0)."""
    return float(self.get(key, default))

  def one_rate(self, rates: dict[str, float], setting: str) -> float:
    """The one dropout rate of config.json's `rates` ({key: value}), which our model.`setting`
    applies at every place where transformers applies one of them: they must be equal."""
    if len(set(rates.values())) > 1:
      given = ', '.join(f'{key}={rate!r}' for key, rate in rates.items())
      raise CheckpointError(
          f'{self.architecture}: config.json sets {given}, but transformer_jax drops at all '
          f'these places at one model.{setting}: give them one rate in config.json.')
    return float(next(iter(rates.values())))

  def activation(self, key: str, default: str) -> str:
    """Our model.mlp for HF's activation name."""
    name = self.require(key, default, tuple(ACTIVATIONS), 'implements only these activations')
    return ACTIVATIONS[name]


def hf_activation(cfg: ModelConfig, architecture: str) -> str:
  if cfg.mlp not in HF_ACTIVATIONS:
    raise CheckpointError(f'{architecture} has no {cfg.mlp!r} MLP: model.mlp must be one of '
                          f'{list(HF_ACTIVATIONS)}.')
  return HF_ACTIVATIONS[cfg.mlp]


@dataclasses.dataclass(frozen=True)
class Architecture:
  """One HF model class, as config.json's "architectures" names it."""
  name: str
  model_type: str
  family: str
  prefix: str  # HF's base_model_prefix, which checkpoints of the bare base model omit
  model_fields: Callable[[HfConfig], dict]  # config.json -> ModelConfig fields
  hf_config: Callable[[ModelConfig], dict]  # ModelConfig -> config.json
  tensors: Callable[[ModelConfig], list[Tensor]]
  tied: Callable[[ModelConfig], dict[str, str]]  # a tensor HF ties -> the one it is tied to
  ignored: tuple[str, ...] = ()  # regexes: tensors a checkpoint may hold that are no weights here
  # The bare base model (BertModel): no head, so only a tower (train.towers) starts from it.
  headless: bool = False
  # Its image processor (convert.image_processor.ImageProcessor): how images are prepared for
  # it, read from and written to preprocessor_config.json; None: none is read or written.
  image_processor: Any = None
