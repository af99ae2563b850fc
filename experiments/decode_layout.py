"""The KV-cache layout each platform wants, measured on the real decoding loop.

  python experiments/decode_layout.py            # GPT-2 small, batch 8, 1024 slots: cpu, v5e:1x1,
                                                 # h100x1 (about 5 minutes on 2 cores)
  python experiments/decode_layout.py --targets=cpu --dtype=float32 --batch=32

For each target and each layout of `kernels.cache.LAYOUTS`, compiles
`decode.generation._generate` (the one program `generate` runs: the prefill, then a
`lax.while_loop` of one token per step) for GPT-2 small (configs/gpt2_small.py) with abstract
parameters, a prompt of --prompt_len tokens and enough new ones to fill --context cache slots,
and prints XLA's temporary and total bytes and the copies and transposes in the compiled HLO
whose shape is one layer's key or value cache (dimensions of size 1 aside), inside the loop (paid
at every step) and outside it. The TPU and GPU targets compile on compile-only devices
(`pip install -e '.[compile]'`); 'cpu' is this machine's XLA. The models build the layout of their
attention kernel (`kernels.cache.layout_for`); this binds each layout in turn.
Measured figures: the docstring of transformer_jax/kernels/cache.py.
"""
import collections
import contextlib
import pathlib
import re
from unittest import mock

from absl import app, flags
import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer_jax import config_lib, decode, kernels, models, targets

ROOT = pathlib.Path(__file__).resolve().parent.parent
_TARGETS = flags.DEFINE_list('targets', ['cpu', 'v5e:1x1', 'h100x1'],
                             "'cpu' or names of transformer_jax.targets.")
_LAYOUTS = flags.DEFINE_list('layouts', list(kernels.cache.LAYOUTS), 'KV-cache layouts.')
_BATCH = flags.DEFINE_integer('batch', 8, 'Rows decoded at once.')
_CONTEXT = flags.DEFINE_integer('context', 1024, 'Cache slots: the prompt plus the new tokens fed.')
_PROMPT_LEN = flags.DEFINE_integer('prompt_len', 16, 'Prompt tokens (prefilled in one pass).')
_DTYPE = flags.DEFINE_string('dtype', 'bfloat16', 'Compute dtype (GPT-2 small: bfloat16).')

# A copy or transpose instruction of the compiled HLO: its shape's dimensions and its opcode.
_COPY = re.compile(r'= \w+\[([\d,]*)\]\S* (copy|transpose)\(')
_CALLED = re.compile(r'(?:calls|body|condition|to_apply|branch_computations|called_computations)'
                     r'=\{?([%\w.\-, ]+)\}?')


def device_of(target: str) -> jax.Device:
  return jax.devices('cpu')[0] if target == 'cpu' else targets.target(target).devices[0]


@contextlib.contextmanager
def cache_layout(layout: str):
  """Our models built inside keep their caches in `layout`. Their configs do not say so, so the
  traces jax caches by config are dropped on the way in and out."""
  jax.clear_caches()
  with mock.patch.object(kernels.cache, 'layout_for', lambda kernel: layout):
    yield
  jax.clear_caches()


def compiled_generate(model_config, device: jax.Device, batch: int, prompt_len: int,
                      new_tokens: int, window: int | None = None):
  """`decode.generation._generate` of the model for `device`'s platform, compiled with abstract
  parameters and prompts (greedy, no stop token)."""
  cfg = models.model_config(model_config)
  model = models.build(cfg, device.platform)
  on_device = jax.sharding.SingleDeviceSharding(device)
  abstract = lambda dtype, shape=(): jax.ShapeDtypeStruct(shape, dtype, sharding=on_device)
  params = jax.tree.map(lambda x: abstract(x.dtype, x.shape),
                        nn.meta.unbox(models.abstract_variables(cfg)['params']))
  key = jax.eval_shape(lambda: jax.random.key(0))
  return decode.generation._generate.lower(  # pylint: disable=protected-access
      model, params, abstract(jnp.int32, (batch, prompt_len)), abstract(jnp.int32, (batch,)),
      None, None, abstract(key.dtype, key.shape), abstract(jnp.int32), abstract(jnp.int32),
      max_new_tokens=new_tokens, temperature=0.0, top_k=0, top_p=1.0, window=window,
      return_logits=False, token_limit=None).compile()


def _computations(hlo: str) -> dict[str, list[str]]:
  """{name: instruction lines} of an HLO module's text."""
  bodies, name = {}, None
  for line in hlo.splitlines():
    if not line.startswith(' ') and line.rstrip().endswith('{'):
      name = line.removeprefix('ENTRY ').split(' ', 1)[0].lstrip('%')
      bodies[name] = []
    elif name and line.startswith(' '):
      bodies[name].append(line)
  return bodies


def _loop_computations(computations: dict[str, list[str]]) -> set[str]:
  """The while loops' bodies and every computation they call."""
  todo = [name for lines in computations.values() for line in lines
          for name in re.findall(r'body=%?([\w.\-]+)', line)]
  seen = set()
  while todo:
    name = todo.pop()
    if name in seen or name not in computations:
      continue
    seen.add(name)
    for line in computations[name]:
      todo += [ref.strip().lstrip('%') for refs in _CALLED.findall(line)
               for ref in refs.split(',')]
  return seen


def cache_layer_dims(cfg, batch: int, slots: int) -> list[tuple[int, ...]]:
  """One layer's key (or value) cache in each layout, as sorted dimensions without 1s."""
  dims = ((batch * cfg.kv_heads, slots, cfg.head_dim), (batch, cfg.kv_heads, slots, cfg.head_dim))
  return [tuple(sorted(d for d in shape if d != 1)) for shape in dims]


def whole_cache_copies(hlo: str, layer_dims) -> collections.Counter:
  """{('loop' | 'outside', 'copy' | 'transpose', shape): count} of the copies and transposes
  (fused ones included) whose dimensions are one of `layer_dims` (see cache_layer_dims)."""
  computations = _computations(hlo)
  in_loop = _loop_computations(computations)
  found = collections.Counter()
  for name, lines in computations.items():
    for line in lines:
      match = _COPY.search(line)
      if match and tuple(sorted(int(d) for d in match[1].split(',') if d not in ('', '1'))) in (
          layer_dims):
        found['loop' if name in in_loop else 'outside', match[2], f'[{match[1]}]'] += 1
  return found


def measure(target: str, layout: str, model_config, batch: int, prompt_len: int,
            context: int) -> dict:
  cfg = models.model_config(model_config)
  with cache_layout(layout):
    compiled = compiled_generate(cfg, device_of(target), batch, prompt_len,
                                 context - prompt_len + 1)  # the last new token is never fed
  memory = compiled.memory_analysis()
  copies = whole_cache_copies(compiled.as_text(), cache_layer_dims(cfg, batch, context))
  return {'target': target, 'layout': layout,
          'temp_mib': memory.temp_size_in_bytes / 2**20,
          'total_mib': (memory.argument_size_in_bytes + memory.output_size_in_bytes
                        - memory.alias_size_in_bytes + memory.temp_size_in_bytes) / 2**20,
          'copies': {' '.join(key): n for key, n in sorted(copies.items())}}


def main(argv):
  del argv
  model_config = config_lib.from_file(ROOT / 'configs' / 'gpt2_small.py').model
  model_config.dtype = _DTYPE.value
  print(f'GPT-2 small, {_DTYPE.value}, batch {_BATCH.value}, {_CONTEXT.value} cache slots, a '
        f'prompt of {_PROMPT_LEN.value}')
  for target in _TARGETS.value:
    for layout in _LAYOUTS.value:
      row = measure(target, layout, model_config, _BATCH.value, _PROMPT_LEN.value, _CONTEXT.value)
      per_step = sum(n for key, n in row['copies'].items() if key.startswith('loop'))
      print(f"{target:8} {layout:12} temp {row['temp_mib']:8.1f} MiB  total "
            f"{row['total_mib']:8.1f} MiB  whole-cache copies per step {per_step:3}  "
            f"{row['copies']}", flush=True)


if __name__ == '__main__':
  app.run(main)
