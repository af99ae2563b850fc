"""How one Hugging Face tensor holds parameters of ours, in both directions.

A `Tensor` names one tensor of a checkpoint and the parameter paths of ours it holds (several
when HF fuses them, as GPT-2's q|k|v); its layout turns our shapes into the shape HF must store
(so a mismatch is caught and named before anything is copied), HF's array into ours, and ours
back into HF's.
"""
import dataclasses
import math

import numpy as np

__all__ = [
    'Array', 'decoder_ends', 'Dense', 'linear', 'norm', 'Shape', 'Tensor', 'tied_to', 'Vectors']

Shape = tuple[int, ...]


def _split(matrix: np.ndarray, sizes: list[int], axis: int) -> list[np.ndarray]:
  return np.split(matrix, np.cumsum(sizes)[:-1], axis=axis)


@dataclasses.dataclass(frozen=True)
class Dense:
  """Kernels side by side along HF's output axis.

  torch.nn.Linear stores (out, in); GPT-2's Conv1D stores (in, out) (`transposed=False`). Ours
  keep (input dims..., output dims...) with `num_in` input dims: (D, heads, head_dim) for a query,
  (heads, head_dim, D) for the attention output. HF's features are head-major, as a row-major
  flattening of ours is, so a reshape is all the head axes need.
  """
  num_in: int = 1
  transposed: bool = True

  def _fan_outs(self, shapes: list[Shape]) -> list[int]:
    return [math.prod(shape[self.num_in:]) for shape in shapes]

  def hf_shape(self, shapes: list[Shape]) -> Shape:
    fan_in, fan_out = math.prod(shapes[0][:self.num_in]), sum(self._fan_outs(shapes))
    return (fan_out, fan_in) if self.transposed else (fan_in, fan_out)

  def to_ours(self, array: np.ndarray, shapes: list[Shape]) -> list[np.ndarray]:
    matrix = array.T if self.transposed else array
    parts = _split(matrix, self._fan_outs(shapes), axis=1)
    return [part.reshape(shape) for part, shape in zip(parts, shapes)]

  def to_hf(self, arrays: list[np.ndarray]) -> np.ndarray:
    fan_in = math.prod(arrays[0].shape[:self.num_in])
    matrix = np.concatenate([a.reshape(fan_in, -1) for a in arrays], axis=1)
    return matrix.T if self.transposed else matrix


@dataclasses.dataclass(frozen=True)
class Vectors:
  """Our arrays flattened and side by side: a bias, possibly fused (GPT-2's q|k|v bias) or of
  shape (heads, head_dim) on our side."""

  def hf_shape(self, shapes: list[Shape]) -> Shape:
    return (sum(math.prod(shape) for shape in shapes),)

  def to_ours(self, array: np.ndarray, shapes: list[Shape]) -> list[np.ndarray]:
    parts = _split(array, [math.prod(shape) for shape in shapes], axis=0)
    return [part.reshape(shape) for part, shape in zip(parts, shapes)]

  def to_hf(self, arrays: list[np.ndarray]) -> np.ndarray:
    return np.concatenate([a.reshape(-1) for a in arrays])


@dataclasses.dataclass(frozen=True)
class Array:
  """One array, ours transposed by `perm` and given `lead` leading axes of size 1 on HF's side:
  ViT's patch convolution (ours (P, P, C, D) for NHWC images, HF's (D, C, P, P)), its [CLS]
  token (1, 1, D) and its position table (1, N, D). By default an exact copy."""
  perm: tuple[int, ...] | None = None
  lead: int = 0

  def hf_shape(self, shapes: list[Shape]) -> Shape:
    (shape,) = shapes
    return (1,) * self.lead + (tuple(shape[i] for i in self.perm) if self.perm else tuple(shape))

  def to_ours(self, array: np.ndarray, shapes: list[Shape]) -> list[np.ndarray]:
    array = array.reshape(array.shape[self.lead:])
    return [array.transpose(np.argsort(self.perm)) if self.perm else array]

  def to_hf(self, arrays: list[np.ndarray]) -> np.ndarray:
    (array,) = arrays
    array = array.transpose(self.perm) if self.perm else array
    return array.reshape((1,) * self.lead + array.shape)


@dataclasses.dataclass(frozen=True)
class Tensor:
  """HF tensor `name` holds our parameters `paths` ('decoder/block_0/attn/query/kernel')."""
  name: str
  paths: tuple[str, ...]
  layout: Dense | Vectors | Array = Array()


def linear(hf: str, ours: str | list[str], *, bias: bool, num_in: int = 1,
           transposed: bool = True) -> list[Tensor]:
  """The weight (and bias) of HF layer `hf`, holding our Linear module(s) `ours`."""
  ours = [ours] if isinstance(ours, str) else ours
  specs = [Tensor(f'{hf}.weight', tuple(f'{p}/kernel' for p in ours), Dense(num_in, transposed))]
  if bias:
    specs.append(Tensor(f'{hf}.bias', tuple(f'{p}/bias' for p in ours), Vectors()))
  return specs


def norm(hf: str, ours: str, *, bias: bool = True) -> list[Tensor]:
  """HF's LayerNorm (weight, bias) or RMSNorm (weight) as our norm's scale (and bias)."""
  return ([Tensor(f'{hf}.weight', (f'{ours}/scale',))] +
          ([Tensor(f'{hf}.bias', (f'{ours}/bias',))] if bias else []))


def decoder_ends(cfg, final_norm: str, *, norm_bias: bool = True) -> list[Tensor]:
  """A decoder checkpoint's final norm, and its lm_head unless the head is tied."""
  head = [] if cfg.tie_embeddings else linear('lm_head', 'head/unembed', bias=False)
  return norm(final_norm, 'final_norm', bias=norm_bias) + head


def tied_to(embedding: str):
  """The `tied` of an Architecture whose lm_head, when tied, is `embedding`."""
  return lambda cfg: {'lm_head.weight': embedding} if cfg.tie_embeddings else {}
