"""Accelerators to compile for, present or not: the chips (memory, peak bfloat16 FLOP/s, the
device kinds JAX reports for them) and, for a target name, XLA's compile-only devices of that TPU
topology or of those GPUs.

Target names (`compile.target`):
  a TPU topology       'v5e:2x2', 'v6e:1x1', 'v4:2x2x1' (v4 and v5p chips run as one megacore),
  a Cloud TPU type     'v5litepod-4' (= 'v5e-4'), 'v6e-8', 'v4-8', 'v5p-8': v5e and v6e count
                       chips, v4 and v5p count TensorCores (two per chip);
  GPUs                 'h100x8', 'a100x4', 'h200x1': one host of N GPUs, compiled from an XLA
                       GPU target config in gpu_targets/ (NVIDIA's published device specs).
Compile-only devices need the optional packages of `pip install -e '.[compile]'` (libtpu, the
CUDA plugin and cuDNN); nothing here needs the hardware.
"""
import dataclasses
import functools
import importlib.util
import math
import os
import re

from transformer_jax.errors import ConfigError

__all__ = ['Chip', 'CHIPS', 'chip_of', 'chip_of_kind', 'GPU_TARGETS', 'Target', 'target']


@dataclasses.dataclass(frozen=True)
class Chip:
  name: str
  platform: str  # jax.Device.platform: 'tpu' or 'gpu'
  # What XLA lets one program use (TPUs: as its RESOURCE_EXHAUSTED reports); None: not measured.
  memory_bytes: int | None
  peak_flops: float  # dense bfloat16 FLOP/s of one chip, from its vendor's datasheet
  device_kind: str  # jax.Device.device_kind of its devices (of the compile-only ones, if any)
  # A regular expression searched for in the device kinds of the chip's other variants (a GPU's
  # kind names its board and memory: 'NVIDIA A100-SXM4-40GB', 'NVIDIA A100 80GB PCIe').
  kinds: str | None = None

_GIB = 2**30
# TPU memory: the available HBM XLA:TPU's out-of-memory error states for each chip (compiled
# here); GPU memory: the device_memory_size of the chip's target config. The chips without a
# compile-only target are here for their peak (MFU); V100 and T4 lack bfloat16: float16's peak.
# A TPU's device kind names its generation ('TPU v5' is v5p, 'TPU v5 lite' v5e).
CHIPS = {
    'v2': Chip('TPU v2', 'tpu', None, 45e12, 'TPU v2'),
    'v3': Chip('TPU v3', 'tpu', None, 123e12, 'TPU v3'),
    'v4': Chip('TPU v4', 'tpu', int(30.75 * _GIB), 275e12, 'TPU v4'),
    'v5e': Chip('TPU v5e', 'tpu', int(15.75 * _GIB), 197e12, 'TPU v5 lite', r'^TPU v5e$'),
    'v5p': Chip('TPU v5p', 'tpu', int(95.74 * _GIB), 459e12, 'TPU v5', r'^TPU v5p$'),
    'v6e': Chip('TPU v6e', 'tpu', int(31.25 * _GIB), 918e12, 'TPU v6 lite', r'^TPU v6e$'),
    'a100': Chip('A100 SXM 80GB', 'gpu', 85100068864, 312e12, 'NVIDIA A100-SXM4-80GB',
                 r'\bA100\b.*\b80GB\b'),
    'a100_40gb': Chip('A100 40GB', 'gpu', None, 312e12, 'NVIDIA A100-SXM4-40GB', r'\bA100\b'),
    'h100': Chip('H100 SXM 80GB', 'gpu', 84942979072, 989e12, 'NVIDIA H100 80GB HBM3',
                 r'\bH100\b'),
    'h200': Chip('H200 141GB', 'gpu', 151397597184, 989e12, 'NVIDIA H200 141GB HBM3e',
                 r'\bH200\b'),
    'l4': Chip('L4', 'gpu', None, 121e12, 'NVIDIA L4', r'\bL4\b'),
    'a10': Chip('A10', 'gpu', None, 125e12, 'NVIDIA A10', r'\bA10G?\b'),
    'v100': Chip('V100', 'gpu', None, 125e12, 'Tesla V100-SXM2-16GB', r'\bV100\b'),
    't4': Chip('T4', 'gpu', None, 65e12, 'Tesla T4', r'\bT4\b'),
}
_GPU_TARGET_DIR = os.path.join(os.path.dirname(__file__), 'gpu_targets')
# The GPUs with a target config in gpu_targets/ (NAME.txtpb), which compile-only devices need.
GPU_TARGETS = tuple(name for name, chip in CHIPS.items() if chip.platform == 'gpu' and
                    os.path.exists(os.path.join(_GPU_TARGET_DIR, f'{name}.txtpb')))
_TPU_TARGETS = ('v4', 'v5e', 'v5p', 'v6e')  # the TPUs whose topologies libtpu compiles for
_MEGACORE = ('v4', 'v5p')  # two TensorCores per chip, one device
# Chips -> topology of the Cloud TPU slices: 2-D tori for v5e and v6e, 3-D for v4 and v5p.
_SLICES_2D = {1: '1x1', 4: '2x2', 8: '2x4', 16: '4x4', 32: '4x8', 64: '8x8', 128: '8x16',
              256: '16x16'}
_SLICES_3D = {4: '2x2x1', 8: '2x2x2', 16: '2x2x4', 32: '2x4x4', 64: '4x4x4', 128: '4x4x8',
              256: '4x8x8', 512: '8x8x8'}
_CLOUD_NAMES = {'v5litepod': 'v5e'}
# The module each platform's compile-only devices come from, and what installs it.
_COMPILERS = {'tpu': ('libtpu', 'libtpu (compile-only TPU devices)'),
              'gpu': ('jax_plugins.xla_cuda12', 'the CUDA plugin (jax-cuda12-plugin)')}


@dataclasses.dataclass(frozen=True)
class Target:
  name: str  # as given
  chip: Chip
  topology: str  # 'v5e:2x2', or '1x1x4' (hosts and GPUs) for GPUs
  num_devices: int  # one per chip

  @property
  def platform(self) -> str:
    return self.chip.platform

  @property
  def missing(self) -> str | None:
    """What compiling for the target needs and is not installed ('libtpu (compile-only TPU
    devices)'); None: its compiler is here."""
    module, what = _COMPILERS[self.platform]
    try:
      found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # its parent package is absent
      found = False
    return None if found else what

  @property
  def devices(self) -> tuple:
    """The compile-only jax.Devices, made when first asked for (they need the extra; a plan of
    the target, --mode=describe's, needs only their number)."""
    if self.missing:
      raise ConfigError(f'compile.target={self.name!r} needs {self.missing}, which is not '
                        "installed: pip install -e '.[compile]'.")
    if self.platform == 'gpu':
      return _gpu_devices(self.name.rpartition('x')[0], self.topology)
    return _tpu_devices(self.topology, self.topology.partition(':')[0])


def chip_of(device) -> Chip | None:
  """The chip of a jax.Device (real or compile-only), None for one the table lacks (CPUs)."""
  return chip_of_kind(device.device_kind)


def chip_of_kind(kind: str) -> Chip | None:
  """The chip whose device kind is `kind`, else the first whose `kinds` pattern it matches."""
  exact = next((c for c in CHIPS.values() if c.device_kind == kind), None)
  return exact or next((c for c in CHIPS.values() if c.kinds and re.search(c.kinds, kind)), None)


def target(name: str) -> Target:
  """The target of a name (see the module docstring); its devices are made when first used."""
  gpu = re.fullmatch(r'([a-z]\d+)x(\d+)', name)
  if gpu and gpu.group(1) in GPU_TARGETS:
    return _gpu_target(name, gpu.group(1), int(gpu.group(2)))
  chip, topology = _tpu_topology(name)
  return Target(name, CHIPS[chip], topology, math.prod(int(side) for side in
                                                       topology.partition(':')[2].split('x')))


def _tpu_topology(name: str) -> tuple[str, str]:
  """(chip, topology) of a TPU topology name or a Cloud TPU type."""
  chip, sep, shape = name.partition(':')
  if sep and chip in _TPU_TARGETS:
    sides = shape.split('x')
    if len(sides) == (3 if chip in _MEGACORE else 2) and all(s.isdigit() for s in sides):
      return chip, name
  cloud = re.fullmatch(r'([a-z0-9]+)-(\d+)', name)
  if cloud:
    chip = _CLOUD_NAMES.get(cloud.group(1), cloud.group(1))
    count = int(cloud.group(2))
    chips = count // 2 if chip in _MEGACORE else count
    slices = _SLICES_3D if chip in _MEGACORE else _SLICES_2D
    if chip in _TPU_TARGETS and chips in slices:
      return chip, f'{chip}:{slices[chips]}'
  raise ConfigError(
      f'compile.target={name!r} is not a target: use a TPU topology (v5e:2x2, v6e:2x4, '
      f'v4:2x2x1, v5p:2x2x2), a Cloud TPU type (v5litepod-4, v6e-8, v4-8, v5p-8) or GPUs '
      f'({", ".join(f"{g}x8" for g in GPU_TARGETS)}; 1 to 8 of them).')


@functools.cache
def _tpu_devices(topology: str, chip: str) -> tuple:
  # libtpu locks a file against a second process loading it, as a TPU's owner must; compiling
  # claims no chip, so several compiles (a sweep's, the tests') may run at once.
  os.environ.setdefault('ALLOW_MULTIPLE_LIBTPU_LOAD', '1')
  from jax.experimental import topologies
  options = {'chip_config_name': 'megacore'} if chip in _MEGACORE else {}
  sides = [int(s) for s in topology.split(':')[1].split('x')]
  if math.prod(sides) < 4:  # fewer chips than a host's default 2x2x1 bounds: one host
    options['chips_per_host_bounds'] = tuple(sides + [1] * (3 - len(sides)))
  return tuple(topologies.get_topology_desc(topology_name=topology, platform='tpu',
                                            **options).devices)


def _gpu_target(name: str, gpu: str, count: int) -> Target:
  if not 1 <= count <= 8:
    raise ConfigError(f'compile.target={name!r}: GPU targets are one host of 1 to 8 GPUs.')
  return Target(name, CHIPS[gpu], f'1x1x{count}', count)


@functools.cache
def _gpu_devices(gpu: str, topology: str) -> tuple:
  from jax.experimental import topologies
  path = os.path.join(_GPU_TARGET_DIR, f'{gpu}.txtpb')
  with open(path) as f:
    config = f.read()
  return tuple(topologies.get_topology_desc('gpu', 'cuda', target_config=config,
                                            topology=topology).devices)
