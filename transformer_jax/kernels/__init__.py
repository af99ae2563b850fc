"""Attention kernels: softmax(Q K^T * scale + bias) V, one signature for all.

    out = kernel(q, k, v, mask=None, *, scale, bias=None)

q (B, T, heads, head_dim); k, v (B, S, kv_heads, head_dim), kv_heads dividing heads (each group
of heads // kv_heads query heads shares one key-value head: MHA, GQA, MQA); mask boolean
(B | 1, heads | 1, T, S), True where a query sees a key, or None; bias float (B | 1, heads | 1,
T, S), added to the scaled logits before the mask (T5's relative positions), or None; out
(B, T, heads, head_dim) in v's dtype. The softmax runs in float32; a query that sees no key
weighs every key alike. The gradient reaches the bias as well. A kernel that takes no bias
(splash) runs XLA's attention when given one; a function of one's own need only take `bias`
if the model passes one (a kernel is called without it when there is none).

Dropout of the attention probabilities (in training, T5's and BERT's) needs a kernel that
computes them: one marked `reference.takes_dropout` takes `dropout_rate` and `dropout_rng`
keywords ('reference'; 'auto', which then runs it on every platform). A kernel is called without
them where nothing is dropped; a layer refuses a kernel that cannot drop together with a rate
(`layers.attention.check_dropout`).

Kernels by name:
  'reference'  plain einsums (`reference.attention`): the definition the others are tested by.
  'xla'        `jax.nn.dot_product_attention(implementation='xla')`: any platform.
  'cpu'        heads before positions, with the backward pass written out: fastest on XLA:CPU.
  'cudnn'      `implementation='cudnn'` where cuDNN takes the case, else 'xla' (`cudnn`): GPUs.
  'splash'     Pallas splash attention where it runs, else 'xla' (`splash`): TPUs.
  'auto'       the kernel of the platform the step is compiled for: resolved by name for a
               known platform (`resolve(kernel, platform)`), else when the step is lowered;
               'reference' wherever attention probabilities are dropped.
A function of that signature may be passed wherever a name is, or registered under a name of its
own (`register`) so that a config can select it (`--config.model.attention_kernel=NAME`); with
a platform, `auto` then picks it there. A kernel marked `masks.takes_structure` (cudnn, splash)
is given the mask as a `masks.Mask` where the model built one (its parts: causal, window,
segment ids, valid keys), so that it computes the mask itself; every other kernel gets the
boolean array.

The dense layers' product has a form per platform too (`contraction.contract`: one 2-D matmul on
XLA:CPU), chosen where the step is lowered; the layers carry no machine of their own.
"""
import dataclasses
import functools
from typing import Callable

import jax

from transformer_jax.kernels import cache, contraction, cpu, cudnn, masks, reference, xla

__all__ = ['bias_argument', 'Choice', 'Kernel', 'cache', 'contraction',
           'current_name', 'dropout_argument', 'function', 'keeps_weights', 'masks', 'names',
           'reference', 'register', 'resolve', 'takes_dropout']

Kernel = Callable  # (q, k, v, mask=None, *, scale, bias=None) -> out


def bias_argument(bias) -> dict:
  """The keyword arguments that pass `bias` to a kernel: none without one, so that a kernel of
  one's own that takes no bias keeps working where there is none."""
  return {} if bias is None else {'bias': bias}


def dropout_argument(rate: float, rng) -> dict:
  """The keyword arguments that make a kernel drop attention probabilities at `rate` with the
  key `rng`: none where nothing is dropped (rate 0, or no key: deterministic), so that every
  kernel keeps working there."""
  return {} if rate == 0 or rng is None else {'dropout_rate': rate, 'dropout_rng': rng}


@masks.takes_structure
def _splash(q, k, v, mask=None, *, scale, bias=None):
  """`splash.attention`, imported when first traced: Pallas takes a while to import."""
  from transformer_jax.kernels import splash  # pylint: disable=g-import-not-at-top
  return splash.attention(q, k, v, mask, scale=scale, bias=bias)


_KERNELS: dict[str, Kernel] = {
    'reference': reference.attention, 'xla': xla.attention, 'cpu': cpu.attention,
    'cudnn': cudnn.attention, 'splash': _splash}
# The kernel 'auto' picks for each platform (jax.Device.platform), and why.
_AUTO = {
    'cpu': ('cpu', 'heads before positions and the backward written out run fastest there'),
    'gpu': ('cudnn', "cuDNN's fused attention where it takes the case, else XLA's"),
    'tpu': ('splash', 'Pallas splash attention where it runs, else XLA\'s'),
}
# jax.Device.platform 'gpu' is lowered as one of these (platform_dependent takes their names).
_LOWERING_PLATFORMS = {'gpu': ('cuda', 'rocm')}
_AUTO_DEFAULT = ('xla', 'no kernel of its own is registered for this platform')
# Names earlier configs saved: the default kernel then meant what 'auto' means now.
_RENAMED = {'dot_product_attention': 'auto', 'heads_first': 'cpu', 'einsum': 'reference'}


@reference.takes_dropout
@masks.takes_structure
def _auto(q, k, v, mask=None, *, scale, bias=None, dropout_rate: float = 0.0, dropout_rng=None):
  """Each platform's kernel, the one of the platform the computation is lowered for; the
  reference kernel on every platform where probabilities are dropped."""
  if dropout_rate > 0:
    return reference.attention(q, k, v, masks.dense(mask, q.shape[1], k.shape[1]), scale=scale,
                               bias=bias, dropout_rate=dropout_rate, dropout_rng=dropout_rng)
  def bound(name):
    fn = _KERNELS[name]
    return lambda q, k, v: fn(q, k, v, masks.for_kernel(fn, mask, q.shape[1], k.shape[1]),
                              scale=scale, **bias_argument(bias))
  return jax.lax.platform_dependent(
      q, k, v, default=bound(_AUTO_DEFAULT[0]),
      **{lowered: bound(name) for platform, (name, _) in _AUTO.items()
         for lowered in _LOWERING_PLATFORMS.get(platform, (platform,))})


@dataclasses.dataclass(frozen=True)
class Choice:
  """A resolved kernel: its name, the function, and why it was chosen."""
  name: str
  fn: Kernel
  reason: str


def register(name: str, fn: Kernel, platform: str | None = None) -> None:
  """Makes `fn` selectable as `name`; with `platform`, 'auto' picks it there."""
  if name == 'auto' or name in _RENAMED:
    raise ValueError(f'{name!r} is reserved: register the kernel under another name.')
  _KERNELS[name] = fn
  if platform is not None:
    _AUTO[platform] = (name, f'registered as the kernel for {platform}')


def keeps_weights(name: str, q, k, v) -> bool:
  """Whether kernel `name` keeps the (T, S) attention weights of q (B, T, heads, head_dim) over
  k, v (B, S, kv_heads, head_dim) (arrays or ShapeDtypeStructs) for the backward pass, as the
  unfused kernels do; a fused one recomputes them where it takes the case."""
  if name == 'splash':
    from transformer_jax.kernels import splash  # pylint: disable=g-import-not-at-top
    return splash.decide(q, k)[0] is None
  if name == 'cudnn':
    return cudnn.decide(q, k, v, training=True)[0] is None
  return True


def takes_dropout(kernel: str | Kernel) -> bool:
  """Whether a kernel (a name or a function) drops attention probabilities when asked."""
  return getattr(function(kernel), 'takes_dropout', False)


def current_name(name: str) -> str:
  """A kernel's name today: a former name (saved by earlier configs) becomes its kernel's."""
  return _RENAMED.get(name, name)


def names() -> list[str]:
  """Every name `resolve` takes."""
  return ['auto', *_KERNELS, *_RENAMED]


def function(kernel: str | Kernel) -> Kernel:
  """The function of a kernel's name (or the function itself), without choosing anything: 'auto'
  is the function that runs each platform's kernel where the step is lowered. An unknown name
  fails, naming those there are."""
  if callable(kernel):
    return kernel
  name = current_name(kernel)
  if name == 'auto':
    return _auto
  if name not in _KERNELS:
    raise ValueError(f'Unknown attention kernel {kernel!r}: use one of {names()}, a function '
                     '(q, k, v, mask=None, *, scale, bias=None) -> out, or register one '
                     '(transformer_jax.kernels.register).')
  return _KERNELS[name]


def resolve(kernel: str | Kernel, platform: str | None = None,
            dropout_rate: float = 0.0) -> Choice:
  """The kernel to run for `platform` ('cpu', 'gpu', 'tpu': the platform of the devices the step
  is compiled for, which need not be the machine's own). Only 'auto' reads the platform; without
  one, 'auto' is the kernel of whichever platform the step is lowered for. Where the model drops
  attention probabilities in training (`dropout_rate` > 0), 'auto' is the reference kernel on
  every platform."""
  if dropout_rate > 0 and isinstance(kernel, str) and current_name(kernel) == 'auto':
    return Choice('reference', _KERNELS['reference'],
                  'auto with attention dropout: the reference kernel forms the probabilities it '
                  'drops')
  if callable(kernel):
    return Choice(getattr(kernel, '__name__', repr(kernel)), kernel, 'passed as a function')
  name = current_name(kernel)
  if name == 'auto' and platform is None:
    return Choice('auto', _auto, 'picked when compiled: ' + ', '.join(
        [f'{chosen} on {where}' for where, (chosen, _) in _AUTO.items()]
        + [f'{_AUTO_DEFAULT[0]} elsewhere']))
  if name == 'auto':
    chosen, why = _AUTO.get(platform, _AUTO_DEFAULT)
    return Choice(chosen, _KERNELS[chosen], f'auto on {platform}: {why}')
  return Choice(name, function(name), 'chosen by name' if name == kernel else
                f'{kernel!r} is the former name of {name!r}')
