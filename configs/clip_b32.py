"""CLIP ViT-B/32 (Radford et al. 2021) as transformers' CLIPConfig defaults describe it: a ViT-B/32
image tower at 224x224 with CLIP's pre-norm and [CLS] pooling, a causal 12-layer text tower of
width 512 over 77 positions pooled at the first EOS, both projected to 512, QuickGELU, and a
learned temperature: 151,277,313 parameters.

Its recipe is the paper's for the ViT-B/32 (its tables of hyperparameters) as open_clip trains
it: AdamW with b1 0.9, b2 0.98, eps 1e-6, peak learning rate 5e-4 and weight decay 0.2 on every
weight but the gains, biases, the class token and the temperature (optimizer.decay_embeddings:
open_clip_train/main.py decays the position, token and patch embeddings), no gradient clipping;
the temperature starts at 1/0.07 and is clamped at 100 after every update. Images: open_clip's
training crop of 90-100% of the area resized bicubically (RandomResizedCrop(scale=(0.9, 1.0))),
transformers' CLIPImageProcessor for evaluation (the shorter side to 224, bicubic, the centre
crop), both with OpenAI's mean and std (convert.image_processor writes these specs).
Where it differs: it trains for training.steps with the default warmup (the paper: 2,000 warmup
iterations of 32 epochs of 400M pairs at batch 32,768) on generated pairs at batch 256.

Its web-scale image-text data is not part of this project: this config describes the model
(--mode=describe), compiles its steps (--mode=compile) and trains on generated pairs.
"""
from transformer_jax import config_lib
from transformer_jax.convert import clip, image_processor


def get_config(arg=None):
  config = config_lib.base_config('clip')
  config.model.update(
      width=768, num_layers=12, num_heads=12, image_size=224, patch_size=32, image_pool='cls',
      pre_norm=True, patch_bias=False, mlp='quick_gelu', norm_eps=1e-5, text_width=512,
      text_layers=12, text_heads=8, vocab_size=49408, max_len=77, text_causal=True,
      text_pool='eos', eos_id=49407, embed_dim=512, loss='softmax')
  pp_train, pp_eval = image_processor.specs(clip.PROCESSOR, None, 224, 'configs/clip_b32.py')
  config.data.update(name='synthetic', batch_size=256, pp_train=pp_train, pp_eval=pp_eval)
  config.optimizer.update(learning_rate=5e-4, b1=0.9, b2=0.98, eps=1e-6, weight_decay=0.2,
                          decay_embeddings=True, grad_clip_norm=0.0)
  return config
