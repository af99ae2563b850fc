"""A Hugging Face checkpoint directory (config.json and safetensors) <-> our model config and
parameter tree.

The tensors are read with safetensors' numpy API (never torch, never pickle); bfloat16 ones come
through ml_dtypes, which jax imports. Every tensor the architecture holds is checked against the
shape our model needs before it is copied, every tensor of the checkpoint must be used (or be a
known buffer), and every parameter of ours must be filled: a conversion is exact or it fails.
"""
import dataclasses
import json
import pathlib
import re

import flax.linen as nn
import numpy as np
import safetensors
import safetensors.numpy
from flax import traverse_util

from transformer_jax import models
from transformer_jax.convert.architecture import Architecture, CheckpointError, HfConfig
from transformer_jax.convert.bert import BERT, BERT_MODEL
from transformer_jax.convert.clip import CLIP
from transformer_jax.convert.gpt2 import GPT2
from transformer_jax.convert import image_processor
from transformer_jax.convert.llama import LLAMA
from transformer_jax.convert.siglip import SIGLIP
from transformer_jax.convert.t5 import T5
from transformer_jax.convert.vit import VIT
from transformer_jax.convert.whisper import WHISPER
from transformer_jax.model_config import ModelConfig

__all__ = [
    'architecture_of', 'ARCHITECTURES', 'decoder_start_token_id', 'eos_token_id',
    'image_preprocessing', 'load', 'load_model_config', 'load_params', 'model_config_of',
    'read_config', 'read_tensors', 'save', 'tensor_names']

ARCHITECTURES = {arch.name: arch
                 for arch in (GPT2, LLAMA, VIT, BERT, BERT_MODEL, WHISPER, CLIP, SIGLIP, T5)}
INDEX, WEIGHTS = 'model.safetensors.index.json', 'model.safetensors'


def architecture_of(hf_values: dict) -> Architecture:
  names = hf_values.get('architectures') or []
  for name in names:
    if name in ARCHITECTURES:
      return ARCHITECTURES[name]
  raise CheckpointError(f'config.json names the architectures {names}, none of which converts: '
                        f'transformer_jax converts {sorted(ARCHITECTURES)} (transformer_jax/'
                        'convert/ has one module per architecture).')


def model_config_of(hf_values: dict, names: frozenset[str] | None = None) -> dict:
  """ModelConfig fields (a dict config.model.update takes) from the contents of a config.json
  and, where known, the names of the checkpoint's tensors."""
  arch = architecture_of(hf_values)
  fields = arch.model_fields(HfConfig(arch.name, hf_values, names))
  models.model_config(fields)  # fails here, not later, on sizes our model rejects
  return fields


def read_config(path) -> dict:
  file = pathlib.Path(path) / 'config.json'
  if not file.is_file():
    raise CheckpointError(f'{file} does not exist: give a Hugging Face model directory '
                          '(config.json and model.safetensors).')
  return json.loads(file.read_text())


def eos_token_id(path) -> int | None:
  """Where generation from the checkpoint stops: config.json's eos_token_id (the first, where
  it lists several)."""
  eos = read_config(path).get('eos_token_id')
  return eos[0] if isinstance(eos, list) else eos


def decoder_start_token_id(path) -> int | None:
  """The token an encoder-decoder checkpoint's decoder writes from: config.json's
  decoder_start_token_id (T5's pad id 0), None where it names none."""
  return read_config(path).get('decoder_start_token_id')


def image_preprocessing(path) -> tuple[str, str] | None:
  """(data.pp_train, data.pp_eval) for the checkpoint in directory `path`: the steps of its
  preprocessor_config.json (absent: its image processor class's defaults at config.json's image
  size) as convert.image_processor reads them; None for an architecture without an image
  processor."""
  hf_values = read_config(path)
  arch = architecture_of(hf_values)
  if arch.image_processor is None:
    return None
  file = pathlib.Path(path) / image_processor.FILE
  values = json.loads(file.read_text()) if file.is_file() else None
  image_size = arch.model_fields(HfConfig(arch.name, hf_values))['image_size']
  return image_processor.specs(arch.image_processor, values, image_size, str(file))


def load_model_config(path) -> dict:
  """ModelConfig fields of the checkpoint in directory `path`; reads config.json and the names
  of the tensors (not the tensors)."""
  return model_config_of(read_config(path), tensor_names(path))


def _weight_files(path: pathlib.Path) -> list[str]:
  """model.safetensors, or the shards model.safetensors.index.json lists."""
  if (path / INDEX).is_file():
    return sorted(set(json.loads((path / INDEX).read_text())['weight_map'].values()))
  if (path / WEIGHTS).is_file():
    return [WEIGHTS]
  raise CheckpointError(f'{path} holds neither {WEIGHTS} nor {INDEX}: transformer_jax reads '
                        'safetensors only (never pickled .bin files); re-save the model with '
                        'save_pretrained(path, safe_serialization=True).')


def tensor_names(path) -> frozenset[str]:
  """The names of the checkpoint's tensors, from the files' headers."""
  path, names = pathlib.Path(path), set()
  for file in _weight_files(path):
    with safetensors.safe_open(path / file, framework='np') as f:
      names.update(f.keys())
  return frozenset(names)


def read_tensors(path) -> dict[str, np.ndarray]:
  """Every tensor of model.safetensors, or of the shards model.safetensors.index.json lists."""
  path, tensors = pathlib.Path(path), {}
  for file in _weight_files(path):
    with safetensors.safe_open(path / file, framework='np') as f:
      tensors.update({name: f.get_tensor(name) for name in f.keys()})
  return tensors


def load_params(path, model: ModelConfig | dict | None = None, head: bool = True) -> dict:
  """Our parameter tree from the checkpoint in directory `path`: host numpy arrays of
  model.param_dtype (stacked under 'layers' if model.scan_layers).

  `model` (default: the checkpoint's own config) may change how the model runs (dtype,
  param_dtype, scan_layers, remat_policy) and trains (its dropout rates) but not what it
  computes: an option that differs from config.json fails, naming it. `head` False leaves out our
  'head' subtree, which a headless architecture (BertModel) does not hold.
  """
  hf_values = read_config(path)
  arch, fields = architecture_of(hf_values), model_config_of(hf_values, tensor_names(path))
  if arch.headless and head:
    raise CheckpointError(f'{path} holds a bare {arch.name}, without the head the model needs: '
                          'start a dual encoder\'s tower from it (model.text_init), or give a '
                          'checkpoint with its head.')
  cfg = models.model_config(fields if model is None else model)
  differences = _differences(fields, cfg, 'config.json', ignored=tuple(cfg.dropout_rates))
  if differences:
    raise CheckpointError(f'The model config differs from the checkpoint {path}: '
                          f'{"; ".join(differences)}. Drop these overrides.')
  shapes = _param_shapes(cfg)
  tensors = _canonical(arch, cfg, read_tensors(path))
  params = {}
  for spec in arch.tensors(cfg):
    if spec.name not in tensors:
      raise CheckpointError(f'{path} has no tensor {spec.name}, which {arch.name} with this '
                            'config.json holds: the weights belong to another model or config.')
    array, ours = tensors.pop(spec.name), [shapes[p] for p in spec.paths]
    expected = spec.layout.hf_shape(ours)
    if array.shape != expected:
      raise CheckpointError(f'Tensor {spec.name} of {path} has shape {array.shape}, but '
                            f'config.json implies {expected} (for our {", ".join(spec.paths)}): '
                            'config.json and the weights disagree.')
    for p, value in zip(spec.paths, spec.layout.to_ours(array, ours)):
      params[p] = value.astype(cfg.weight_dtype)
  needed = {p for p in shapes if head or not p.startswith('head/')}
  _check_complete(arch, tensors, needed - params.keys(), path)
  tree = traverse_util.unflatten_dict(params, sep='/')
  return models.stack_layers(tree) if cfg.scan_layers else tree


def load(path) -> tuple[dict, dict]:
  """(ModelConfig fields, parameter tree) of the checkpoint in directory `path`."""
  return load_model_config(path), load_params(path)


def save(path, model: ModelConfig | dict, params, architecture: str | None = None,
         image_preprocessing: str | None = None):
  """Writes config.json and model.safetensors that transformers loads as the same model, with
  `architecture` (default: the one class that can be `model`), and for an architecture with an
  image processor, the preprocessor_config.json that runs `image_preprocessing` (the run's
  held-out spec, data.pp_eval) where it is given. Fails, naming the options, where HF's classes
  cannot express the model or the spec, before anything is written."""
  cfg = models.model_config(model)
  arch, hf_values = _expressed(cfg, architecture)
  processor = (None if arch.image_processor is None or image_preprocessing is None else
               image_processor.processor_values(arch.image_processor, image_preprocessing))
  flat = traverse_util.flatten_dict(models.unstack_layers(params), sep='/')
  # np.array, not np.ascontiguousarray, which makes a scalar (CLIP's logit scale) 1-D.
  tensors = {spec.name: np.array(spec.layout.to_hf([np.asarray(flat[p]) for p in spec.paths]),
                                 order='C')
             for spec in arch.tensors(cfg)}
  path = pathlib.Path(path)
  path.mkdir(parents=True, exist_ok=True)
  config = {'architectures': [arch.name], 'model_type': arch.model_type, **hf_values}
  (path / 'config.json').write_text(json.dumps(config, indent=2, sort_keys=True) + '\n')
  # transformers refuses safetensors files whose metadata does not name their format.
  safetensors.numpy.save_file(tensors, path / WEIGHTS, metadata={'format': 'pt'})
  if processor is not None:
    (path / image_processor.FILE).write_text(json.dumps(processor, indent=2, sort_keys=True) +
                                             '\n')


def _param_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
  """'decoder/block_0/attn/query/kernel' -> shape, of the unrolled tree (nothing allocated)."""
  unrolled = dataclasses.replace(cfg, scan_layers=False, remat_policy='none')
  params = nn.meta.unbox(models.abstract_variables(unrolled)['params'])
  return {k: v.shape for k, v in traverse_util.flatten_dict(params, sep='/').items()}


def _canonical(arch: Architecture, cfg: ModelConfig, tensors: dict) -> dict:
  """The tensors under the names HF's model class gives them: older LayerNorms' gamma and beta
  renamed weight and bias (the hub's bert-base-uncased), the base model's prefix added where a
  checkpoint of the bare base model omits it (the hub's gpt2), and a tied tensor that a
  checkpoint saved twice checked against the one it is tied to, then dropped."""
  tied = arch.tied(cfg)
  known = {spec.name for spec in arch.tensors(cfg)} | set(tied) | set(tied.values())

  def canonical(name):
    name = re.sub(r'\.gamma$', '.weight', re.sub(r'\.beta$', '.bias', name))
    prefixed = f'{arch.prefix}.{name}'
    return prefixed if prefixed in known or _ignored(arch, prefixed) else name

  tensors = {canonical(name): value for name, value in tensors.items()}
  for alias, source in tied.items():
    if alias not in tensors:
      continue
    copy = tensors.pop(alias)
    if source not in tensors:
      tensors[source] = copy
    elif not np.array_equal(copy, tensors[source]):
      raise CheckpointError(f'{alias} differs from {source}, to which {arch.name} ties it: if '
                            'the head has weights of its own, set "tie_word_embeddings": false '
                            'in config.json.')
  return tensors


def _ignored(arch: Architecture, name: str) -> bool:
  return any(re.fullmatch(pattern, name) for pattern in arch.ignored)


def _check_complete(arch: Architecture, unused: dict, unfilled: set[str], path):
  leftover = sorted(name for name in unused if not _ignored(arch, name))
  if leftover:
    raise CheckpointError(f'{path} holds tensors that {arch.name} with this config.json does '
                          f'not use: {leftover[:8]}{" ..." if len(leftover) > 8 else ""} '
                          f'({len(leftover)} in all): config.json and the weights disagree, or '
                          'the checkpoint is of another model.')
  if unfilled:
    raise CheckpointError(f'No tensor of {arch.name} fills our parameters {sorted(unfilled)}: '
                          'its table in transformer_jax/convert/ lacks them.')


def _effective(cfg: ModelConfig, key: str):
  """An option's value as it takes effect: d_ff=None (a dual encoder's text_d_ff=None) is the
  default width, num_kv_heads=None one key-value head per query head, num_decoder_layers=None the
  encoder's depth, a dropout rate None (attention_dropout, ...) model.dropout_rate."""
  effective = {'d_ff': 'hidden_dim', 'num_kv_heads': 'kv_heads',
               'num_decoder_layers': 'decoder_layers', 'text_d_ff': 'text_hidden_dim',
               'attention_dropout': 'attention_dropout_rate', 'mlp_dropout': 'mlp_dropout_rate',
               'final_dropout': 'final_dropout_rate'}
  return getattr(cfg, effective.get(key, key))


def _differences(fields: dict, cfg: ModelConfig, where: str, ignored: tuple = ()) -> list[str]:
  """The options of `fields` (`where`'s), but the `ignored` ones, that `cfg` sets otherwise."""
  reference = models.model_config(fields)
  return [f'model.{key}={_effective(cfg, key)!r} where {where} has {_effective(reference, key)!r}'
          for key in fields
          if key not in ignored and _effective(cfg, key) != _effective(reference, key)]


def _expressed(cfg: ModelConfig, name: str | None) -> tuple[Architecture, dict]:
  """The architecture (`name`, or the first of cfg's family that can be cfg) and its config.json
  values, checked by reading them back: an option HF's class cannot express fails."""
  if name is not None and name not in ARCHITECTURES:
    raise CheckpointError(f'Unknown architecture {name!r}: choose one of {sorted(ARCHITECTURES)}.')
  candidates = ([ARCHITECTURES[name]] if name else
                [a for a in ARCHITECTURES.values() if a.family == cfg.family and not a.headless])
  reasons = []
  for arch in candidates:
    if arch.family != cfg.family or arch.headless:
      reasons.append(f'{arch.name} holds a {arch.family!r} model' + ' without its head' *
                     arch.headless)
      continue
    try:
      hf_values = arch.hf_config(cfg)
      names = frozenset(spec.name for spec in arch.tensors(cfg))  # what save writes
      differences = _differences(arch.model_fields(HfConfig(arch.name, hf_values, names)), cfg,
                                 arch.name)
    except CheckpointError as error:
      differences = [str(error)]
    if not differences:
      return arch, hf_values
    reasons.append(f'{arch.name} cannot express {"; ".join(differences)}')
  reasons = reasons or [f'transformer_jax exports {sorted(ARCHITECTURES)}']
  raise CheckpointError(f'No Hugging Face architecture can hold this {cfg.family!r} model: '
                        f'{" / ".join(reasons)}.')
