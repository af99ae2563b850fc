"""Helpers for the config files under configs/: the base config and argument strings."""
import dataclasses
import importlib.util
import pathlib
import types
import typing

import ml_collections
from ml_collections import config_dict

from transformer_jax.model_config import ModelConfig


def model_defaults() -> ml_collections.ConfigDict:
  """Every ModelConfig field with its default, so a typo in --config.model.x fails."""
  hints = typing.get_type_hints(ModelConfig)
  model = ml_collections.ConfigDict()
  for field in dataclasses.fields(ModelConfig):
    if field.default is None:  # an `X | None` field: a typed placeholder that flags can set
      (kind,) = [t for t in typing.get_args(hints[field.name]) if t is not types.NoneType]
      model[field.name] = config_dict.placeholder(kind)
    else:
      model[field.name] = field.default
  return model


def parse_arg(arg: str | None, **defaults) -> ml_collections.ConfigDict:
  """'variant=S/4,smoke' -> {'variant': 'S/4', 'smoke': True}, typed like `defaults`.

  Unknown names fail, naming the known ones.
  """
  values = ml_collections.ConfigDict(defaults)
  for item in filter(None, (arg or '').split(',')):
    key, _, value = item.partition('=')
    if key not in defaults:
      raise ValueError(f'Unknown config argument {key!r}; known: {sorted(defaults)}.')
    default = defaults[key]
    if isinstance(default, bool):
      values[key] = value.lower() in ('', '1', 'true', 'yes')
    else:
      values[key] = type(default)(value) if default is not None else value
  return values


# Block styles of the named families; a config applies one, then sets the sizes.
STYLES = {
    'gpt2': dict(norm='layernorm', norm_eps=1e-5, mlp='gelu_tanh', positions='learned',
                 use_bias=True, tie_embeddings=True, norm_position='pre'),
    'llama': dict(norm='rmsnorm', norm_eps=1e-6, mlp='swiglu', positions='rope', use_bias=False,
                  tie_embeddings=False, norm_position='pre'),
    'bert': dict(norm='layernorm', norm_eps=1e-12, mlp='gelu', positions='learned', use_bias=True,
                 tie_embeddings=True, norm_position='post', embed_norm=True, type_vocab_size=2),
    'vit': dict(norm='layernorm', norm_eps=1e-6, mlp='gelu', positions='learned', use_bias=True,
                norm_position='pre', pool='cls'),
    # Vaswani et al. 2017: post-LN, ReLU, sinusoidal positions, one shared and tied embedding.
    'transformer': dict(norm='layernorm', norm_eps=1e-6, mlp='relu', positions='sinusoidal',
                        use_bias=True, tie_embeddings=True, norm_position='post'),
}

# ViT sizes by name: (width, depth, heads).
VIT_SIZES = {'XS': (128, 6, 4), 'Ti': (192, 12, 3), 'S': (384, 12, 6), 'M': (512, 12, 8),
             'B': (768, 12, 12), 'L': (1024, 24, 16)}


def vit_variant(variant: str) -> dict:
  """'S/4' -> width, depth, heads of ViT-S and patch size 4."""
  name, _, patch = variant.partition('/')
  if name not in VIT_SIZES or not patch.isdigit():
    raise ValueError(f'ViT variant {variant!r} is not NAME/PATCH with NAME in '
                     f'{list(VIT_SIZES)} (for example "S/4").')
  width, depth, heads = VIT_SIZES[name]
  return dict(width=width, num_layers=depth, num_heads=heads, patch_size=int(patch))


# Every key make_data reads from config.data, with its default (None or missing: the default).
DATA_DEFAULTS = {
    'name': None,  # 'cifar10' | 'tiny_shakespeare' | 'text_file' | 'seq2seq_reverse' | ...
    'tfds_data_dir': None,  # TFDS data dir; None: TFDS's default (TFDS_DATA_DIR or ~/...)
    'manual_dir': None,  # local source files to prepare a dataset from (see sources.py)
    'download': True,  # whether a dataset that is not prepared may be downloaded
    'path': None,  # text_file: any UTF-8 file
    'seq_len': 64,  # characters per window; source and target length of seq2seq
    'batch_size': 128,  # the GLOBAL batch, split evenly over the processes
    'eval_batch_size': None,  # None: batch_size
    'eval_steps': -1,  # eval batches; -1 or None: every full batch of the held-out split
    'eval_examples': 1024,  # held-out size of generated data; synthetic trains on 9x as much
    'augment': True,  # image training batches: random crop of the 4-pixel-padded image + flip
    'mlm_probability': 0.15,  # encoder: share of positions selected for the MLM loss
    'alphabet': 'abcdefghijklmnopqrstuvwxyz',  # symbols of generated text and seq2seq data
    'seq2seq_min_len': 1,  # shortest source, in symbols
    'seq2seq_max_len': None,  # longest source; None: seq_len - 1 (the target needs its EOS)
    'image_size': 32,  # synthetic images: height and width
    'num_classes': 10,  # synthetic images: classes
    'num_threads': 2,  # grain threads assembling training batches ahead of the device
    'prefetch_buffer_size': 4,  # training batches grain keeps ready
}
DATA_TYPES = {'name': str, 'tfds_data_dir': str, 'manual_dir': str, 'path': str,
              'eval_batch_size': int, 'seq2seq_max_len': int}


def base_config() -> ml_collections.ConfigDict:
  """Every section and key a run reads, with defaults; each config file overrides what it needs.

  With `lock_config`, `--config.x.y=...` can only set keys that exist here, so a typo fails.
  """
  config = ml_collections.ConfigDict()
  config.seed = 0
  config.model = model_defaults()
  config.data = data_defaults()
  config.optimizer = ml_collections.ConfigDict(dict(
      learning_rate=1e-3,
      warmup_steps=0,
      schedule='cosine',  # 'cosine' decays to min_lr_ratio * learning_rate; 'constant'
      min_lr_ratio=0.0,
      b1=0.9, b2=0.95, eps=1e-8,
      weight_decay=0.1,
      # Decay only the matmul kernels by default: norms, biases and embeddings are not decayed.
      decay_norms_and_biases=False,
      decay_embeddings=False,
      grad_clip_norm=1.0,  # 0: no clipping
  ))
  config.training = ml_collections.ConfigDict(dict(
      steps=1000,
      grad_accum_steps=1,  # the global batch is split into this many sequential microbatches
      label_smoothing=0.0,  # classification only
      log_every=50,
      eval_every=500,
      checkpoint_every=500,
      keep_checkpoints=3,
      peak_flops_per_device=config_dict.placeholder(float),  # for MFU where the table has none
  ))
  # 'jit': GSPMD shards from in/out shardings; 'shard_map': the same step per device with an
  # explicit pmean of the gradients over the data axis.
  config.parallelism = 'jit'
  # The device mesh: axis names and sizes; -1 takes all remaining devices of all processes.
  config.mesh = ml_collections.ConfigDict(dict(axes=('data',), shape=(-1,)))
  # Logical parameter axes -> mesh axes; unlisted axes are replicated. Data parallel: none.
  # FSDP: [('embed', 'data')] shards every weight's model-width axis over the data axis.
  config.sharding_rules = ()
  # A Hugging Face checkpoint directory to start from instead of a random init (see
  # transformer_jax.convert); a checkpoint of the run's own, once there is one, wins.
  config.init_from_hf = ''
  # --mode=sample: the keyword arguments of decode.sample_text. window: each new token attends
  # to its last `window` tokens; unset: data.seq_len, the context the run trained on; 0: all.
  config.sample = ml_collections.ConfigDict(dict(
      prompt='ROMEO:', max_new_tokens=256, temperature=0.8, top_k=0, top_p=1.0, seed=0,
      num_samples=1, window=config_dict.placeholder(int)))
  return config


def data_defaults() -> ml_collections.ConfigDict:
  """DATA_DEFAULTS as a ConfigDict; keys whose default is None become typed placeholders."""
  data = ml_collections.ConfigDict()
  for key, default in DATA_DEFAULTS.items():
    data[key] = config_dict.placeholder(DATA_TYPES[key]) if default is None else default
  return data


def smoke(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Shrinks a run to seconds: 2 blocks, 3 steps of batch 8, one eval batch."""
  config.model.num_layers = min(config.model.num_layers, 2)
  if config.model.num_decoder_layers:
    config.model.num_decoder_layers = min(config.model.num_decoder_layers, 2)
  config.data.update(batch_size=8, eval_batch_size=8, eval_steps=1)
  config.training.update(steps=3, log_every=1, eval_every=3, checkpoint_every=3)
  return config


def from_file(path, arg: str | None = None) -> ml_collections.ConfigDict:
  """get_config(arg) of a config file, loaded as config_flags loads it (by path, so that a
  config can derive from a sibling: from_file(pathlib.Path(__file__).with_name('x.py')))."""
  path = pathlib.Path(path)
  spec = importlib.util.spec_from_file_location(f'config_{path.stem}', path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg)
