"""Hugging Face checkpoints (GPT-2, LLaMA, ViT, BERT, CLIP, SigLIP, Whisper, T5) <-> our model
configs and parameters, and a CLIP's or SigLIP's preprocessor_config.json <-> the run's image
preprocessing (convert.image_processor).

  fields, params = convert.load('/ckpt/gpt2')     # config.model fields, parameter tree
  convert.save('/tmp/out', fields, params)         # back to config.json + model.safetensors
"""
from transformer_jax.convert.architecture import CheckpointError
from transformer_jax.convert.directory import (ARCHITECTURES, decoder_start_token_id,
                                               eos_token_id, image_preprocessing, load,
                                               load_model_config, load_params, model_config_of,
                                               read_tensors, save, tensor_names)

__all__ = ['ARCHITECTURES', 'CheckpointError', 'decoder_start_token_id', 'eos_token_id',
           'image_preprocessing', 'load', 'load_model_config', 'load_params', 'model_config_of',
           'read_tensors', 'save', 'tensor_names']
