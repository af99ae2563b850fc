"""Hugging Face checkpoints (GPT-2, LLaMA, ViT, BERT) <-> our model configs and parameters.

  fields, params = convert.load('/ckpt/gpt2')     # config.model fields, parameter tree
  convert.save('/tmp/out', fields, params)         # back to config.json + model.safetensors
"""
from transformer_jax.convert.architecture import CheckpointError
from transformer_jax.convert.directory import (ARCHITECTURES, load, load_model_config,
                                               load_params, model_config_of, read_tensors, save)
from transformer_jax.convert.tokenizer import Tokenizer

__all__ = ['ARCHITECTURES', 'CheckpointError', 'Tokenizer', 'load', 'load_model_config',
           'load_params', 'model_config_of', 'read_tensors', 'save']
