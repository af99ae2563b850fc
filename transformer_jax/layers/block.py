"""The transformer block (pre-LN or post-LN, optional cross-attention, ablations) and its stack."""
import contextlib
import contextvars
import dataclasses
import functools
import inspect
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer_jax.layers import axes
from transformer_jax.layers.norms import RMSNorm

__all__ = [
    'Block', 'BLOCK_ARGUMENTS', 'BLOCK_CONTRACT', 'BLOCK_FIELDS', 'BlockStack', 'block_rows',
    'CPU_BLOCK_TOKENS', 'LAYERS', 'ModuleFactory', 'NORM_POSITIONS', 'REMAT_POLICIES',
    'row_blocks']

NORM_POSITIONS = ('pre', 'post')
REMAT_POLICIES = {
    'none': None,  # keep every activation for the backward pass
    'full': None,  # save nothing: recompute the whole block in the backward pass
    'dots': jax.checkpoint_policies.checkpoint_dots,
    'dots_no_batch': jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
}

ModuleFactory = Callable[..., nn.Module]  # called with name=..., e.g. functools.partial(MLP, ...)
LAYERS = 'layers'  # the scanned stack's name, and the logical name of its parameters' layer axis
# What BlockStack passes a block, positionally, after x (and `bias` after them where the stack is
# given one); and the fields it sets.
BLOCK_ARGUMENTS = ('mask', 'positions', 'encoded', 'cross_mask', 'cache_index')
BLOCK_FIELDS = ('deterministic', 'scanned')
BLOCK_CONTRACT = (
    'a block stacked by BlockStack is a Flax module class bound by functools.partial, with '
    'fields `deterministic` and `scanned` (and neither they nor `name` bound), whose __call__ '
    'takes (x, mask, positions, encoded, cross_mask, cache_index) positionally and returns x '
    "of the input's shape and dtype, (x, None) when scanned=True (see BlockStack's docstring)")


class Block(nn.Module):
  """pre-LN:  x = x + f(norm(x)) for f in (attention, [cross-attention], mlp);
  post-LN: x = norm(x + f(x)).

    block = Block(attention=functools.partial(Attention, num_heads=4, head_dim=32),
                  mlp=functools.partial(MLP, hidden=512, activation='swiglu'))
    y = block.apply(params, x, mask, positions)

  `attention`, `mlp`, `cross_attention` and `norm` are module factories, called with the
  sublayer's name ('attn', 'cross_attn', 'mlp'; norms '<sublayer>_norm'): pass your own module to
  try a new sublayer. A sublayer whose __call__ takes `deterministic` is called with the
  block's (its own dropout: Attention's of the probabilities, MLP's of the hidden activation);
  one of your own need not take it. `dropout_rate` drops each sublayer's output before the
  residual add. `cross_attention` None: a block without one;
  `norm` None: no norms. The ablations keep a sublayer's place but make it write nothing:
  use_attention=False or use_mlp=False adds zero to the residual stream (a post-LN block still
  normalizes there), and use_residual=False drops the `x +` of every sublayer.

  A conditioned norm (a class with `conditioned = True`, such as AdaLNZero: DiT's adaLN-Zero)
  is called as norm(x, encoded) -> (h, gate), `encoded` being the conditioning vector (B, C),
  and the sublayer adds gate * f(h): pre-LN only, in a block without cross-attention.

  Block meets the contract of a block that BlockStack stacks (BLOCK_CONTRACT; see BlockStack):
  a block of one's own that meets it can replace this one.
  """
  attention: ModuleFactory
  mlp: ModuleFactory
  norm: ModuleFactory | None = RMSNorm
  cross_attention: ModuleFactory | None = None
  norm_position: str = 'pre'
  use_attention: bool = True
  use_mlp: bool = True
  use_residual: bool = True
  dropout_rate: float = 0.0
  deterministic: bool = True
  scanned: bool = False  # under nn.scan the block returns (carry, None)

  def __post_init__(self):
    if self.norm_position not in NORM_POSITIONS:
      raise ValueError(f'Unknown norm_position {self.norm_position!r}: use "pre" or "post".')
    if not 0 <= self.dropout_rate < 1:
      raise ValueError(f'dropout_rate={self.dropout_rate} must be in [0, 1).')
    if _conditioned(self.norm) and (self.norm_position != 'pre' or self.cross_attention):
      raise ValueError('A conditioned norm reads the block\'s `encoded` as its conditioning '
                       'vector: use it pre-LN, in a block without cross-attention.')
    super().__post_init__()

  @nn.compact
  def __call__(self, x, mask=None, positions=None, encoded=None, cross_mask=None,
               cache_index=None, bias=None):
    """x (B, T, D) -> (B, T, D); ((B, T, D), None) when `scanned`.

    mask: boolean, broadcastable to (B, heads, T, S), True where a query sees a key (None: every
    key); positions (B, T), RoPE's (None: 0..T-1); encoded (B, S_enc, D), the keys and values of
    cross-attention (None after a decoding prefill, which cached them), or with a conditioned
    norm the conditioning vector (B, C); cross_mask over them;
    cache_index: the 'cache' slot of x's first token when decoding (None: no cache); bias:
    float (B | 1, heads | 1, T, S), added to the self-attention logits (T5's relative positions;
    cross-attention takes none), or None.
    """
    x = axes.constrain(x, axes.EMBED)  # the residual stream between blocks
    attend = lambda h: self._called(self.attention(name='attn'))(
        h, mask=mask, positions=positions, cache_index=cache_index,
        **({} if bias is None else {'bias': bias}))
    x = self._sublayer(x, attend, 'attn', self.use_attention, encoded)
    if self.cross_attention is not None:
      cross = lambda h: self._called(self.cross_attention(name='cross_attn'))(
          h, encoded, mask=cross_mask, cache_index=cache_index)
      x = self._sublayer(x, cross, 'cross_attn', self.use_attention)
    x = axes.constrain(self._sublayer(x, self._called(self.mlp(name='mlp')), 'mlp', self.use_mlp,
                                      encoded), axes.EMBED)
    return (x, None) if self.scanned else x

  def _called(self, sublayer: nn.Module) -> Callable:
    """The sublayer, given the block's `deterministic` where its __call__ takes one."""
    if 'deterministic' in inspect.signature(type(sublayer).__call__).parameters:
      return functools.partial(sublayer, deterministic=self.deterministic)
    return sublayer

  def _sublayer(self, x, fn, name, present, encoded=None):
    norm = (lambda h: h) if self.norm is None else self.norm(name=f'{name}_norm')
    if self.norm_position == 'pre':
      if _conditioned(self.norm):  # adaLN: the norm's gate scales the sublayer's output
        h, gate = norm(x, encoded)
        y = gate * fn(h) if present else jnp.zeros_like(x)
      else:
        y = fn(norm(x)) if present else jnp.zeros_like(x)
      y = nn.Dropout(self.dropout_rate)(y, deterministic=self.deterministic)
      return x + y if self.use_residual else y
    y = fn(x) if present else jnp.zeros_like(x)
    y = nn.Dropout(self.dropout_rate)(y, deterministic=self.deterministic)
    return norm(x + y if self.use_residual else y)


def _conditioned(norm: ModuleFactory | None) -> bool:
  """Whether a norm factory (a class, or a class bound by functools.partial) is conditioned."""
  return getattr(getattr(norm, 'func', norm), 'conditioned', False)


class BlockStack(nn.Module):
  """`num_layers` blocks, unrolled (block_0, block_1, ...) or stacked with nn.scan (`scan`:
  one module named LAYERS whose parameters have a leading layer axis named LAYERS, so that
  compile time does not grow with depth), each rematerialized by `remat_policy` (a key of
  REMAT_POLICIES).

  `block` is a block class with its arguments bound: functools.partial(Block, attention=...,
  mlp=...), or a block of one's own that meets the same contract (BLOCK_CONTRACT, checked when
  the stack is built and when it calls the block):
  - a Flax module class with the fields `deterministic` and `scanned`, which BlockStack
    constructs as block(deterministic=..., name='block_<i>') unrolled and as
    block(deterministic=..., scanned=True, name=LAYERS) under nn.scan (so the partial binds
    none of these three);
  - its __call__ takes (x, mask, positions, encoded, cross_mask, cache_index) positionally, as
    BlockStack.__call__ received them (each but x may be None), x the residual stream (B, T, D),
    and `bias` after them where the stack is given one (one bias shared by every layer: T5's);
  - it returns the new x, of x's shape and dtype: with scanned=True, (x, None), nn.scan's carry
    and its (empty) per-layer output.
  Under nn.scan, the 'params' and 'cache' variables get the leading layer axis, the 'params' and
  'dropout' rngs differ per layer, and every layer gets the same arguments after x.

  Inside `row_blocks`, a deterministic call without a cache index runs the whole stack on one
  block of rows after another (see row_blocks): the same values, for inference on the CPU.
  """
  block: Any
  num_layers: int
  scan: bool = False
  remat_policy: str = 'none'

  def __post_init__(self):
    _check_block(self.block)
    if self.remat_policy not in REMAT_POLICIES:
      raise ValueError(f'Unknown remat_policy {self.remat_policy!r}: use one of '
                       f'{list(REMAT_POLICIES)}.')
    if self.num_layers < 1:
      raise ValueError(f'num_layers={self.num_layers} must be at least 1.')
    super().__post_init__()

  def __call__(self, x, mask=None, positions=None, encoded=None, cross_mask=None,
               cache_index=None, bias=None, deterministic=True):
    """x (B, T, D) -> (B, T, D) through every block; the other arguments as Block takes them
    (`bias` passed on only where given)."""
    args = (mask, positions, encoded, cross_mask, cache_index) + (
        () if bias is None else (bias,))
    block_tokens = _ROW_BLOCK_TOKENS.get()
    if block_tokens and deterministic and cache_index is None and not self.is_initializing():
      rows = block_rows(x.shape[0], x.shape[1], block_tokens)
      if rows < x.shape[0]:
        return _in_row_blocks(lambda stack, x, *args: stack._layers(x, args, deterministic),
                              self, x, args, rows)
    return self._layers(x, args, deterministic)

  @nn.compact
  def _layers(self, x, args, deterministic):
    block = self.block.func
    if self.remat_policy != 'none':
      block = nn.remat(block, policy=REMAT_POLICIES[self.remat_policy], prevent_cse=not self.scan)
    bound = dict(self.block.keywords, deterministic=deterministic)
    if self.scan:
      def scanned_layer(layer, carry, *args):
        return _checked_output(layer(carry, *args), carry, self.block.func, scanned=True)
      stack = nn.scan(scanned_layer, variable_axes={'params': 0, 'cache': 0},
                      split_rngs={'params': True, 'dropout': True},
                      in_axes=(nn.broadcast,) * len(args), length=self.num_layers,
                      metadata_params={nn.PARTITION_NAME: LAYERS})
      x, _ = stack(block(*self.block.args, **bound, scanned=True, name=LAYERS), x, *args)
      return x
    for i in range(self.num_layers):
      y = block(*self.block.args, **bound, name=f'block_{i}')(x, *args)
      x = _checked_output(y, x, self.block.func, scanned=False)
    return x


# XLA:CPU runs a stack's forward pass over many tokens at once slower than the same rows a block
# at a time, whose activations stay in cache between the ops it does not fuse. Measured on a
# 2-core Xeon: CLIP B/32's text tower on 256 captions of 77 tokens 7.2-7.7 s at once, 5.3-5.9 s
# in blocks of 16-32 captions; whisper-tiny's encoder on 8 windows of 1,500 positions 1.65 s at
# once, 1.38-1.45 s one window at a time; blocks of 1,000-3,000 tokens were the fastest.
CPU_BLOCK_TOKENS = 2048
_ROW_BLOCK_TOKENS = contextvars.ContextVar('row_block_tokens', default=None)


@contextlib.contextmanager
def row_blocks(tokens: int | None = None):
  """Within it, BlockStack runs inference (a deterministic call without a cache index) on blocks
  of rows in turn, each of at most `tokens` tokens (at least one row; the largest such block
  whose size divides the batch), in a scan over the blocks; arguments with the batch's leading
  size are split with x, the others (a shared bias, a broadcast mask) given to every block.
  The values are the unblocked ones to float rounding. tokens None: CPU_BLOCK_TOKENS where the
  computation runs on one CPU device, no blocks elsewhere (an accelerator, or a mesh, runs the
  batch best whole). Read when the stack is traced: enter it inside the jitted function.
  The package enters it for inference only (evaluation, embeddings, encoding before decoding,
  DiT's sampling), not in a train step, deterministic as one usually is: gradients through the
  scan were slower (CLIP B/32's step at batch 64: 15-18 s with its towers in blocks of 8-16
  rows, 12.4 s whole)."""
  if tokens is None and jax.default_backend() == 'cpu' and jax.device_count() == 1:
    tokens = CPU_BLOCK_TOKENS
  reset = _ROW_BLOCK_TOKENS.set(tokens)
  try:
    yield
  finally:
    _ROW_BLOCK_TOKENS.reset(reset)


def block_rows(batch: int, row_tokens: int, block_tokens: int) -> int:
  """The rows of a block: the largest divisor of `batch` whose rows hold at most `block_tokens`
  tokens of `row_tokens` each, or 1."""
  most = max(1, block_tokens // row_tokens)
  return max(d for d in range(1, min(batch, most) + 1) if batch % d == 0)


def _in_row_blocks(fn, module, x, args, rows: int):
  """fn(module, x, *args) computed on blocks of `rows` rows in turn: a block takes rows i,
  i + count, i + 2 * count, ... (a strided block keeps a sharded batch spread), and the leaves of
  args whose leading size is the batch's are split with x."""
  batch = x.shape[0]
  count = batch // rows
  leaves, tree = jax.tree.flatten(args)
  batched = [jnp.ndim(leaf) > 0 and leaf.shape[0] == batch for leaf in leaves]
  blocked = lambda a: a.reshape(rows, count, *a.shape[1:]).swapaxes(0, 1)
  split = [blocked(leaf) for leaf, b in zip(leaves, batched) if b]
  shared = [leaf for leaf, b in zip(leaves, batched) if not b]

  def one_block(module, carry, x, split, shared):
    split, shared = iter(split), iter(shared)
    leaves = [next(split) if b else next(shared) for b in batched]
    return carry, fn(module, x, *jax.tree.unflatten(tree, leaves))

  scan = nn.scan(one_block, variable_broadcast='params', split_rngs={'params': False},
                 in_axes=(0, 0, nn.broadcast), length=count)
  _, out = scan(module, None, blocked(x), split, shared)
  return jax.tree.map(lambda y: y.swapaxes(0, 1).reshape(batch, *y.shape[2:]), out)


def _contract_error(problem: str) -> ValueError:
  return ValueError(f'{problem}: {BLOCK_CONTRACT}.')


def _check_block(block: Any) -> None:
  """Raises the contract's error where `block` cannot be stacked: its class, fields and call."""
  if not (isinstance(block, functools.partial) and isinstance(block.func, type)
          and issubclass(block.func, nn.Module)):
    raise _contract_error(f'BlockStack.block is {block!r}, not a module class bound by '
                          'functools.partial, such as functools.partial(Block, attention=..., '
                          'mlp=...)')
  name = block.func.__name__
  missing = set(BLOCK_FIELDS) - {field.name for field in dataclasses.fields(block.func)}
  if missing:
    raise _contract_error(f'Block class {name} has no field {" or ".join(sorted(missing))}')
  if bound := {*BLOCK_FIELDS, 'name'} & set(block.keywords):
    raise _contract_error(f'The partial of {name} binds {", ".join(sorted(bound))}, which '
                          'BlockStack sets')
  try:
    inspect.signature(block.func.__call__).bind(None, None, *BLOCK_ARGUMENTS)
  except TypeError as e:
    raise _contract_error(f'{name}.__call__ cannot be called as BlockStack calls it ({e})') from e


def _checked_output(out: Any, x: jax.Array, block_class: type, scanned: bool) -> Any:
  """`out` where it is what the contract says a block returns for x, else the contract's error."""
  name = block_class.__name__
  if scanned:
    if not (isinstance(out, tuple) and len(out) == 2 and out[1] is None):
      what = (f'a tuple of {len(out)}' if isinstance(out, tuple)
              else f'an array {out.shape}' if hasattr(out, 'shape') else type(out).__name__)
      raise _contract_error(f'{name} returned {what} with scanned=True, not (x, None)')
    shape, dtype = getattr(out[0], 'shape', None), getattr(out[0], 'dtype', None)
    if (shape, dtype) != (x.shape, x.dtype):
      raise _contract_error(f'{name} turned x {x.shape} {x.dtype} into {shape} {dtype}, which '
                            'nn.scan cannot carry')
  elif isinstance(out, tuple):
    raise _contract_error(f'{name} returned a tuple with scanned=False, not x')
  return out
