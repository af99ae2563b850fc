"""A Hugging Face checkpoint directory (GPT-2, LLaMA, ViT, BERT, CLIP, SigLIP, Whisper or T5): the
model from its config.json, the parameters from its safetensors.

  python launch.py --config configs/from_hf.py:path=/ckpt/gpt2 --mode=sample
  python launch.py --config configs/from_hf.py:path=/ckpt/vit-cifar10 --mode=eval
  python launch.py --config configs/from_hf.py:path=/ckpt/t5-small --mode=describe

`config.init_from_hf` names the directory that run.py takes the parameters from
(transformer_jax.convert.load_params(config.init_from_hf, config.model)) instead of a checkpoint
of ours; a causal LM samples with the directory's tokenizer.json (transformer_jax.convert.
Tokenizer) and the settings of config.sample. A ViT evaluates on CIFAR-10 when it is a 10-class
model of 32x32 images; otherwise set --config.data.name to a dataset of its classes and size. A
Whisper model reads an audiofolder (set --config.data.audio_dir) with the checkpoint's
tokenizer.json (data.tokenizer: the directory) and its window and Mel bins.
A T5ForConditionalGeneration (1.0 or 1.1) is an encoder-decoder of the T5 style: evaluating or
fine-tuning it takes a text-to-text task (--config.data.name).
A CLIPModel or SiglipModel sees the images its weights expect: data.pp_eval is the steps of the
directory's preprocessor_config.json (resize, centre crop, normalisation; absent: its processor
class's defaults), data.pp_train the training recipe's (CLIP: open_clip's random-resized crop of
0.9-1 of the area, bicubic, then the same normalisation; SigLIP: the held-out steps,
unaugmented, its recipe's augmentation not being public), both as convert.image_processor
writes them. A CLIP fine-tunes with
open_clip's weight decay (optimizer.decay_embeddings: every weight but the gains, biases, the
class token and the temperature; open_clip's main.py); a SigLIP with the optimizer's defaults,
big_vision's kernels only but the patch embedding's, which optimizer.decay_embeddings decides.
Without a path the model is the shape of transformers' GPT2Config() defaults (GPT-2 small), so
that --mode=describe has something to describe; sampling and evaluation need path=.
"""
from transformer_jax import config_lib, convert, models


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, path='')
  fields = (convert.load_model_config(arg.path) if arg.path else
            convert.model_config_of({'architectures': ['GPT2LMHeadModel']}))
  config = config_lib.base_config(fields['family'])
  config.model.update(fields)
  config.init_from_hf = arg.path
  model = config.model
  if model.family == 'vit':
    cifar = (model.num_classes, model.image_size, model.num_channels) == (10, 32, 3)
    config.data.update(name='cifar10' if cifar else None, augment=False, batch_size=128,
                       eval_batch_size=500)
  elif model.family == 'whisper':
    config.data.update(name='audiofolder', seq_len=model.max_len, tokenizer=arg.path)
  else:
    config.data.seq_len = model.max_len
  preprocessing = convert.image_preprocessing(arg.path) if arg.path else None
  if preprocessing:
    config.data.pp_train, config.data.pp_eval = preprocessing
  if models.registry.get(model.family).chunked_logits:
    config.training.logits_chunk = 128
  if model.family == 'clip' and model.loss == 'softmax':
    config.optimizer.decay_embeddings = True
  if model.family == 'decoder':
    config.sample.update(prompt='The meaning of life is', max_new_tokens=64)
  return config
