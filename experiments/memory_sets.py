"""The fit set and the test set of the memory plan (docs/memory_plan.md): the models whose train
steps experiments/fit_memory.py compiles, fitting memory.ACTIVATION_COPIES to FIT alone and
reporting TEST with the fitted counts. Both were written down before the fit; TEST grows (new
families, new targets) without refitting. No model of TEST has a block of FIT's at its exact
sizes (width, heads, sequence and vocabulary)."""
import dataclasses
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..', 'tests'))
from train_helpers import small_config  # noqa: E402
from transformer_jax import config_lib  # noqa: E402
from transformer_jax.models import styles  # noqa: E402

ROOT = os.path.join(os.path.dirname(__file__), '..')
RULE_MESHES = {'dp': ((-1,), ('data',)), 'fsdp': ((-1,), ('data',)),
               'tp': ((-1, 2), ('data', 'model'))}
# The targets each set is compiled for: the TPUs are fitted together. 'cpu:N': N devices of
# this machine's XLA:CPU.
FIT_TARGETS = {'tpu': ('v5e:2x2', 'v4-8'), 'gpu': ('h100x4',), 'cpu': ('cpu:1', 'cpu:8')}
TEST_TARGETS = {'tpu': ('v5e:2x2',), 'gpu': ('h100x4',), 'cpu': ('cpu:1', 'cpu:8')}


@dataclasses.dataclass(frozen=True)
class Model:
  """A family at a width, blocks, heads, sequence (or image and patch: image // patch squared
  tokens), vocabulary, compute dtype and rule set."""
  family: str
  width: int
  blocks: int
  heads: int
  seq: int
  vocab: int = 64
  dtype: str = 'float32'
  rule_set: str = 'dp'
  patch: int = 8
  batch: int = 32
  remat: str = 'none'
  scan: bool = False
  kv_heads: int | None = None  # None: as many as the heads
  style: str | None = None  # a styles.STYLES name other than the family's test default

  def label(self) -> str:
    tokens = f'img{self.seq}/{self.patch}' if self.family == 'vit' else f'T{self.seq} V{self.vocab}'
    remat = f' remat {self.remat}' if self.remat != 'none' else ''
    return (f'{self.family} w{self.width} L{self.blocks} h{self.heads} {tokens} b{self.batch} '
            f'{self.dtype} {self.rule_set}{remat}' + (' scanned' if self.scan else '')
            + (f' kv{self.kv_heads}' if self.kv_heads else '')
            + (f' {self.style}' if self.style else ''))

  def config(self):
    shape, mesh_axes = RULE_MESHES[self.rule_set]
    overrides = {'model.width': self.width, 'model.num_layers': self.blocks,
                 'model.num_heads': self.heads, 'model.dtype': self.dtype,
                 'model.remat_policy': self.remat, 'model.scan_layers': self.scan,
                 'data.batch_size': self.batch, 'data.eval_batch_size': self.batch,
                 'data.eval_examples': self.batch, 'data.eval_steps': 1,
                 'mesh.shape': shape, 'mesh.axes': mesh_axes}
    if self.family == 'vit':
      overrides.update({'model.image_size': self.seq,
                        'model.patch_size': self.patch})
    else:
      overrides.update({'data.seq_len': self.seq, 'model.max_len': self.seq,
                        'model.vocab_size': self.vocab})
    if self.family == 'encoder_decoder':
      overrides['model.num_decoder_layers'] = self.blocks
    if self.kv_heads:
      overrides['model.num_kv_heads'] = self.kv_heads
    if self.style:
      overrides.update({f'model.{k}': v for k, v in styles.of(self.style, self.family).items()})
    return small_config(self.family, rule_set=self.rule_set, **overrides)


@dataclasses.dataclass(frozen=True)
class Named:
  """A config file of configs/ under a rule set, its data generated in the same shapes (what
  --mode=compile compiles)."""
  name: str
  module: str
  rule_set: str
  overrides: tuple[tuple[str, object], ...] = ()

  def label(self) -> str:
    return f'{self.name} {self.rule_set}'

  def config(self):
    config = config_lib.from_file(os.path.join(ROOT, 'configs', f'{self.module}.py'))
    config.rule_set = self.rule_set
    config.mesh.shape, config.mesh.axes = RULE_MESHES[self.rule_set]
    for key, value in self.overrides:
      section, _, field = key.partition('.')
      config[section][field] = value
    # Its data generated in the same shapes, as --mode=compile's stand-in (aot.stand_in).
    eval_batch = config.data.eval_batch_size or config.data.batch_size
    config.data.update(name='synthetic', tokenizer='chars', token_dir=None, eval_steps=1,
                       eval_examples=eval_batch)
    config.init_from_hf = config.init_from_checkpoint = ''
    return config


def _rule_sets(model: Model, *rule_sets: str) -> list[Model]:
  return [dataclasses.replace(model, rule_set=r) for r in rule_sets]


# The accelerators' fit: models of 0.3 to 6 GiB per device on four devices, the sizes at which a
# plan decides whether a run fits: each family, GPT-2's and LLaMA's blocks (grouped-query heads
# among them), float32 and bfloat16, sequences 512 to 4096, vocabularies 1,024 to 40,000, ViTs of
# 197 to 401 tokens, under DP, FSDP and TP: every term varies apart from the others.
FIT = {'accelerator': [
    Model('decoder', 1024, 4, 8, 2048, vocab=32000, dtype='bfloat16'),
    Model('decoder', 2048, 2, 16, 1024, vocab=32000, dtype='bfloat16', rule_set='fsdp',
          kv_heads=4),
    Model('decoder', 1536, 3, 12, 2048, vocab=8192, dtype='bfloat16', rule_set='tp'),
    *_rule_sets(Model('decoder', 896, 3, 14, 768, vocab=40000, dtype='bfloat16', style='gpt2'),
                'dp', 'fsdp'),
    Model('decoder', 1024, 2, 16, 512, vocab=4096, style='gpt2', batch=64),
    Model('decoder', 4096, 2, 32, 512, vocab=1024, dtype='bfloat16', rule_set='tp', batch=64),
    Model('decoder', 512, 4, 8, 4096, vocab=16384, dtype='bfloat16', batch=16),
    Model('encoder', 1024, 3, 16, 512, vocab=30522, dtype='bfloat16', batch=64),
    Model('encoder', 768, 4, 12, 1024, vocab=4096, dtype='bfloat16', rule_set='fsdp'),
    Model('encoder_decoder', 1024, 2, 16, 512, vocab=32000, dtype='bfloat16'),
    Model('encoder_decoder', 512, 3, 8, 1024, vocab=8192, dtype='bfloat16', rule_set='tp'),
    Model('vit', 1024, 3, 16, 224, patch=14, dtype='bfloat16', batch=128),
    Model('vit', 640, 4, 10, 320, patch=16, dtype='bfloat16', batch=64, rule_set='fsdp'),
    Model('vit', 1280, 2, 16, 224, patch=16, batch=128, rule_set='tp'),
    Model('vit', 384, 4, 6, 224, patch=16, dtype='bfloat16', batch=256),
],
    # XLA:CPU's: each family at widths 64 to 256, sequences 32 to 256 tokens, on one device and
    # on eight under each rule set (CPU runs compute in float32).
    'cpu': [
    Model('decoder', 64, 2, 4, 32, vocab=64),
    Model('decoder', 128, 3, 4, 64, vocab=256, rule_set='fsdp'),
    Model('decoder', 256, 2, 8, 128, vocab=512, batch=16, rule_set='tp'),
    Model('decoder', 192, 4, 6, 96, vocab=128, kv_heads=2),
    Model('encoder', 128, 2, 4, 128, vocab=256),
    Model('encoder', 256, 3, 8, 64, vocab=128, rule_set='tp'),
    Model('encoder_decoder', 128, 2, 4, 64, vocab=256, rule_set='fsdp'),
    Model('encoder_decoder', 192, 2, 6, 128, vocab=128, batch=16),
    Model('vit', 128, 3, 4, 32, patch=4),
    Model('vit', 256, 2, 8, 64, patch=8, rule_set='fsdp'),
    Model('vit', 64, 4, 4, 32, patch=2, batch=16, rule_set='tp'),
]}

_GQA = Model('decoder', 1152, 3, 12, 1536, vocab=20000, dtype='bfloat16', kv_heads=4)
# XLA:CPU's test models in the default suite (tests/test_memory.py), under each rule set.
CPU_DECODER = Model('decoder', 96, 3, 4, 48, vocab=80)
CPU_VIT = Model('vit', 96, 3, 4, 16, patch=4)
# What users compile: GPT-2 small and ViT-B/16 themselves under each rule set, the reference
# character LM; a GQA decoder of LLaMA's blocks, recomputed (remat) and scanned; a long context
# (8,192 tokens); an encoder in float32, an encoder-decoder of Vaswani et al.'s blocks, ViTs at
# 224 and 384; and models under 1 GiB per device.
TEST = {'accelerator': [
    *[Named('GPT-2 small', 'gpt2_small', r) for r in RULE_MESHES],
    *[Named('ViT-B/16', 'vit_b16', r, (('data.batch_size', 128),)) for r in RULE_MESHES],
    _GQA,
    dataclasses.replace(_GQA, rule_set='fsdp', remat='full'),
    dataclasses.replace(_GQA, rule_set='fsdp', remat='dots'),
    dataclasses.replace(_GQA, scan=True),
    Model('decoder', 1024, 2, 16, 8192, vocab=32768, dtype='bfloat16', batch=8, kv_heads=4,
          rule_set='fsdp'),
    Model('encoder', 896, 3, 14, 768, vocab=30522, rule_set='tp'),
    *_rule_sets(Model('encoder_decoder', 768, 3, 12, 768, vocab=12000, dtype='bfloat16'),
                'fsdp', 'tp'),
    Model('vit', 1024, 2, 16, 384, patch=16, dtype='bfloat16', rule_set='tp'),
    *[Named('reference LM', 'llama_shakespeare', r) for r in ('dp', 'fsdp')],
    Model('decoder', 192, 3, 6, 256, vocab=300, dtype='bfloat16'),
    Model('vit', 160, 3, 4, 96, patch=4),
    Model('encoder_decoder', 128, 3, 4, 512, vocab=200, dtype='bfloat16'),
],
    'cpu': [
    *_rule_sets(CPU_DECODER, 'dp', 'fsdp', 'tp'),
    dataclasses.replace(CPU_DECODER, seq=128),
    Model('decoder', 128, 4, 4, 128, vocab=80),
    *_rule_sets(CPU_VIT, 'dp', 'fsdp', 'tp'),
    Model('encoder', 160, 2, 4, 96, vocab=96, rule_set='fsdp'),
    Model('encoder_decoder', 96, 3, 4, 48, vocab=80, rule_set='tp'),
    dataclasses.replace(CPU_DECODER, rule_set='fsdp', remat='full'),
    dataclasses.replace(CPU_DECODER, rule_set='fsdp', remat='dots'),
    dataclasses.replace(CPU_DECODER, scan=True),
]}


def targets_of(case, platform: str, targets: dict[str, tuple[str, ...]]) -> tuple[str, ...]:
  """The targets of `platform` in `targets` that `case` is compiled for: on XLA:CPU, one device
  under DP only."""
  return tuple(t for t in targets[platform] if t != 'cpu:1' or case.rule_set == 'dp')


def set_of(sets: dict, platform: str) -> list:
  return sets['cpu' if platform == 'cpu' else 'accelerator']
