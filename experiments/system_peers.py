"""The PyTorch peers of the systems' benchmarks (bench_systems.py): for T5, CLIP, SigLIP, Whisper
and DiT at two shapes each, the same model in the peer library (transformers'
T5ForConditionalGeneration, CLIPModel, SiglipModel, WhisperForConditionalGeneration; diffusers'
DiTTransformer2DModel) with random weights, ours with the same weights (imported by
transformer_jax.convert from the peer's safetensors; DiT's by the table here, the package having
no diffusers converter), batches in our format with their torch form, and the peer's training
step: the same loss and optimizer as our run's, in float32.

Not part of the package: the benchmarks' own module, imported by them; torch, transformers and
diffusers come with the `bench` extra (requirements-bench.txt).

Shapes: 'tiny' runs in seconds (the correctness check of --quick); 'small' is near the smallest
published size: T5 1.1 small (8 + 8 blocks of width 512, 6 heads of 64, gated-GELU 1024, a
vocabulary of 32,128) on 512 input and 114 target tokens, CLIP ViT-B/32 at batch 64, SigLIP
B/16 at 224 (the smallest SigLIP published), whisper-tiny on 30 s windows at batch 8 and
transcripts of 448 tokens (its decoder's length), DiT-S/2 on 32x32x4 latents of 1,000 classes.
"""
import dataclasses
import pathlib
import time

import jax
import numpy as np
import torch
from flax import traverse_util

from transformer_jax import config_lib
from transformer_jax.convert.tensors import Array, Tensor, linear
from transformer_jax.data import image_text
from transformer_jax.train import step as step_lib

ROOT = pathlib.Path(__file__).resolve().parent.parent


@dataclasses.dataclass(frozen=True)
class Shape:
  """A system's shape: its batch, the peer config's keywords, and its lengths."""
  batch_size: int
  hf: dict
  lengths: dict = dataclasses.field(default_factory=dict)


class TorchStep:
  """step(i) -> the seconds of the peer's i-th training step (zero the gradients, the loss of
  batch i % len(batches), backward, clip where the run clips, the optimizer's update, the loss
  read back), the peer's own randomness drawn by torch; `loss` holds the latest step's. The
  first step can be given the draws of our step 0 (`first_draws`) so that both compute the same
  loss."""

  def __init__(self, peer: 'Peer', model, batches: list[dict], opt, first_draws=None):
    self.peer, self.model = peer, model
    self.batches = [peer.torch_batch(batch) for batch in batches]
    self.optimizer = peer.torch_optimizer(model, opt)
    self.clip = opt.grad_clip_norm
    self.first_draws = first_draws
    self.loss = None
    model.train()

  def __call__(self, i: int) -> float:
    start = time.perf_counter()
    self.optimizer.zero_grad(set_to_none=True)
    draws = self.first_draws if i == 0 else None
    loss = self.peer.torch_loss(self.model, self.batches[i % len(self.batches)], draws)
    loss.backward()
    if self.clip:
      torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
    self.optimizer.step()
    self.loss = loss.item()
    return time.perf_counter() - start


class Peer:
  """One system at one shape: the peer model, our run's config, batches, the peer's loss."""
  name = ''
  adamw = 'fused'  # torch.optim.AdamW's implementation (bench_systems --torch_adamw)

  def __init__(self, shape: str):
    self.shape = self.SHAPES[shape]

  @property
  def batch_size(self) -> int:
    return self.shape.batch_size

  def build(self, directory: str):
    """The peer model of seed 0, saved in `directory` (safetensors)."""
    torch.manual_seed(0)
    model = self.make_model()
    model.save_pretrained(directory, safe_serialization=True)
    return model

  def config(self, directory: str):
    """Our run's config: the checkpoint in `directory` imported (configs/from_hf.py), float32,
    generated data of the batch size (the benchmark feeds its own batches), the optimizer."""
    config = config_lib.from_file(ROOT / 'configs' / 'from_hf.py', f'path={directory}')
    config.model.dtype = 'float32'
    config.data.update(name='synthetic', batch_size=self.batch_size,
                       **self.data_settings(directory))
    config.optimizer.update(schedule='constant', warmup_steps=0, **self.optimizer_settings())
    return config

  def data_settings(self, directory: str) -> dict:
    del directory
    return {}

  def optimizer_settings(self) -> dict:
    return {}

  def params(self, model, config):
    """Our parameters of the peer's weights; None: the config's init_from_hf."""
    del model, config
    return None

  def first_draws(self, run, batch: dict):
    """What the peer's loss must draw as our step 0 draws it (None: it draws nothing)."""
    del run, batch
    return None

  def torch_optimizer(self, model, opt):
    """torch.optim.AdamW of the run's optimizer settings (b1, b2, eps, lr), the weight decay on
    the weights of the linear and convolution layers, as ours decays the kernels by default (a
    CLIP's token and position tables, which ours decays as open_clip does, are not decayed
    here: a few tensors' elementwise terms)."""
    decayed = {id(m.weight) for m in model.modules()
               if isinstance(m, (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d))}
    trained = [p for p in model.parameters() if p.requires_grad]
    groups = [{'params': [p for p in trained if (id(p) in decayed) == decay],
               'weight_decay': opt.weight_decay if decay else 0.0} for decay in (True, False)]
    implementation = {'default': {}, 'foreach': {'foreach': True}, 'fused': {'fused': True}}
    return torch.optim.AdamW(groups, lr=opt.learning_rate, betas=(opt.b1, opt.b2), eps=opt.eps,
                             **implementation[self.adamw])

  def make_model(self):
    raise NotImplementedError

  def batch(self, step: int) -> dict:
    raise NotImplementedError

  def torch_batch(self, batch: dict) -> dict:
    raise NotImplementedError

  def torch_loss(self, model, batch: dict, draws=None):
    """The loss the peer model computes itself (given labels, or return_loss)."""
    del draws
    return model(**batch).loss


def _tensor(array, dtype=None):
  tensor = torch.from_numpy(np.array(array))  # a copy: jax's host arrays are read-only
  return tensor if dtype is None else tensor.to(dtype)


class T5(Peer):
  """T5 1.1 (gated-GELU, the head untied, no dropout as it pre-trains) against transformers'
  T5ForConditionalGeneration given labels: the mean cross-entropy of the target tokens on both
  sides, Adafactor on both (ours T5X's, train.optim.scale_by_adafactor; transformers' with the
  same decay rate, clipping, epsilons and parameter scale, a constant rate, no momentum). Our
  run's z-loss and loss normalizer are off: transformers' loss has neither."""
  name = 't5'
  SHAPES = {
      'tiny': Shape(8, dict(vocab_size=512, d_model=64, d_kv=16, d_ff=128, num_layers=2,
                            num_decoder_layers=2, num_heads=4),
                    dict(inputs=64, targets=16)),
      'small': Shape(8, dict(vocab_size=32128, d_model=512, d_kv=64, d_ff=1024, num_layers=8,
                             num_decoder_layers=8, num_heads=6),
                     dict(inputs=512, targets=114)),
  }
  RATE = 1e-2

  def make_model(self):
    import transformers
    return transformers.T5ForConditionalGeneration(transformers.T5Config(
        **self.shape.hf, dropout_rate=0.0, feed_forward_proj='gated-gelu',
        tie_word_embeddings=False, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1))

  def build(self, directory: str):
    """T5 1.1's head is its own: transformers 5 builds and saves T5's head tied to the
    embedding, and unties it where the checkpoint holds an lm_head.weight of its own; one is
    written here (N(0, 1), as transformers initializes an untied T5 head) and the model read
    back."""
    import safetensors.numpy
    import transformers
    super().build(directory)
    path = f'{directory}/model.safetensors'
    weights = safetensors.numpy.load_file(path)
    head = np.random.default_rng(0).standard_normal(weights['shared.weight'].shape)
    safetensors.numpy.save_file(weights | {'lm_head.weight': head.astype(np.float32)}, path,
                                metadata={'format': 'pt'})
    return transformers.T5ForConditionalGeneration.from_pretrained(directory)

  def data_settings(self, directory: str) -> dict:
    del directory
    return dict(seq_len=self.shape.lengths['inputs'])

  def optimizer_settings(self) -> dict:
    return dict(name='adafactor', learning_rate=self.RATE, weight_decay=0.0, grad_clip_norm=0.0)

  def batch(self, step: int) -> dict:
    """Random ids (2 .. V - 1, EOS 1 last) of full-length inputs and targets; the decoder reads
    the start id 0, then the targets."""
    rng = np.random.default_rng(step)
    vocab, (source, target) = self.shape.hf['vocab_size'], self.shape.lengths.values()
    inputs = rng.integers(2, vocab, (self.batch_size, source)).astype(np.int32)
    targets = rng.integers(2, vocab, (self.batch_size, target)).astype(np.int32)
    inputs[:, -1] = targets[:, -1] = 1
    return dict(inputs=inputs, input_valid=np.ones(inputs.shape, bool), targets=targets,
                decoder_inputs=np.pad(targets[:, :-1], ((0, 0), (1, 0))),
                weights=np.ones(targets.shape, np.float32))

  def torch_batch(self, batch: dict) -> dict:
    return dict(input_ids=_tensor(batch['inputs'], torch.long),
                attention_mask=_tensor(batch['input_valid'], torch.long),
                labels=_tensor(batch['targets'], torch.long))

  def torch_optimizer(self, model, opt):
    import transformers
    return transformers.optimization.Adafactor(
        model.parameters(), lr=self.RATE, eps=(opt.adafactor_eps, opt.adafactor_min_param_scale),
        clip_threshold=opt.adafactor_clipping_threshold, decay_rate=-opt.adafactor_decay_rate,
        beta1=None, weight_decay=0.0, scale_parameter=opt.adafactor_param_scale,
        relative_step=False, warmup_init=False)


# The dual encoders' towers at the tiny shape, CLIP's and SigLIP's alike.
TINY_TOWERS = dict(
    text_config=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64, vocab_size=128, max_position_embeddings=12),
    vision_config=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                       intermediate_size=64, image_size=16, patch_size=4))


class Clip(Peer):
  """CLIP against transformers' CLIPModel(return_loss=True): the symmetric softmax loss over the
  batch's pairs, AdamW with CLIP's settings (b2 0.98, eps 1e-6, weight decay 0.2, no
  clipping). Captions: BOS, random ids, EOS at a random position (where both towers pool),
  then padding, which CLIPModel masks and our causal tower never reads."""
  name = 'clip'
  SHAPES = {
      'tiny': Shape(8, dict(TINY_TOWERS, projection_dim=16)),
      # transformers' CLIPConfig defaults: ViT-B/32 and its text tower.
      'small': Shape(64, dict(text_config={}, vision_config={}, projection_dim=512)),
  }
  OPTIMIZER = dict(learning_rate=5e-4, b1=0.9, b2=0.98, eps=1e-6, weight_decay=0.2,
                   grad_clip_norm=0.0)

  def make_model(self):
    import transformers
    hf = self.shape.hf
    vocab = hf['text_config'].get('vocab_size', 49408)
    # CLIP's tokenizer's ids: BOS and EOS its last two, padding '!' (1); an explicit EOS id
    # (not the legacy 2) pools at the first EOS on both sides.
    text = dict(hf['text_config'], pad_token_id=1, bos_token_id=vocab - 2, eos_token_id=vocab - 1)
    return transformers.CLIPModel(transformers.CLIPConfig(
        text_config=text, vision_config=hf['vision_config'],
        projection_dim=hf['projection_dim']))

  def optimizer_settings(self) -> dict:
    return self.OPTIMIZER

  def data_settings(self, directory: str) -> dict:
    """The generated pairs' captions read by a word-level tokenizer.json of the model's
    vocabulary, its BOS and EOS CLIP's ids (the last two): the data and the model agree."""
    import tokenizers
    vocab_size = self._sizes()[0]
    split = tokenizers.pre_tokenizers.Whitespace().pre_tokenize_str
    words = {word for template in image_text.TEMPLATES for name in image_text.CLASS_NAMES
             for word, _ in split(template.format(name))}
    vocab = ['[UNK]', '!'] + sorted(words - {'!'})
    vocab += [f'w{i}' for i in range(len(vocab), vocab_size - 2)]
    vocab += ['<|startoftext|>', '<|endoftext|>']
    made = tokenizers.Tokenizer(tokenizers.models.WordLevel(
        {word: i for i, word in enumerate(vocab)}, unk_token='[UNK]'))
    made.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    made.add_special_tokens(vocab[-2:])
    path = f'{directory}/tokenizer.json'
    made.save(path)
    return dict(tokenizer=path)

  def _sizes(self):
    hf = self.shape.hf
    text, vision = hf['text_config'], hf['vision_config']
    return (text.get('vocab_size', 49408), text.get('max_position_embeddings', 77),
            vision.get('image_size', 224))

  def batch(self, step: int, size: int | None = None) -> dict:
    """Pairs of random images and captions (`size` of them; default the batch size)."""
    rng = np.random.default_rng(step)
    vocab, length, side = self._sizes()
    batch = size or self.batch_size
    images = rng.standard_normal((batch, side, side, 3)).astype(np.float32)
    text = rng.integers(2, vocab - 2, (batch, length)).astype(np.int32)
    text[:, 0] = vocab - 2
    ends = rng.integers(length // 2, length, batch)
    text[np.arange(batch), ends] = vocab - 1
    text[np.arange(length) > ends[:, None]] = 1
    return dict(image=images, text=text, label=np.arange(batch, dtype=np.int32))

  def attention_mask(self, text: np.ndarray) -> dict:
    """CLIPModel's attention_mask keywords of captions: 1 up to EOS, as its processor pads."""
    ends = np.argmax(text == self._sizes()[0] - 1, axis=1)
    return dict(attention_mask=_tensor(np.arange(text.shape[1]) <= ends[:, None], torch.long))

  def torch_batch(self, batch: dict) -> dict:
    return dict(pixel_values=_tensor(batch['image'].transpose(0, 3, 1, 2)),
                input_ids=_tensor(batch['text'], torch.long), return_loss=True,
                **self.attention_mask(batch['text']))


class Siglip(Clip):
  """SigLIP against transformers' SiglipModel(return_loss=True): the sigmoid loss of every
  image-text pair with the learned temperature and bias, AdamW at our config's defaults. Its
  captions fill the 64 positions, as SigLIP's tokenizer pads them (padding to max_length), and
  neither side masks them: the text tower pools at the last position."""
  name = 'siglip'
  SHAPES = {
      'tiny': Shape(8, TINY_TOWERS),
      # google/siglip-base-patch16-224's sizes: transformers' SiglipConfig defaults but the
      # vocabulary and its 64 positions.
      'small': Shape(16, dict(text_config=dict(vocab_size=32000, max_position_embeddings=64),
                              vision_config=dict(image_size=224, patch_size=16))),
  }
  OPTIMIZER = dict(learning_rate=1e-3)

  def make_model(self):
    import transformers
    hf = self.shape.hf
    # SigLIP's tokenizer's </s> (1) pads and ends; transformers' defaults are CLIP's ids.
    text = dict(hf['text_config'], pad_token_id=1, bos_token_id=1, eos_token_id=1)
    return transformers.SiglipModel(transformers.SiglipConfig(
        text_config=text, vision_config=hf['vision_config']))

  def data_settings(self, directory: str) -> dict:
    del directory  # the character captions' ids (98) fit the vocabulary; no EOS to agree on
    return {}

  def _sizes(self):
    hf = self.shape.hf
    return (hf['text_config']['vocab_size'], hf['text_config']['max_position_embeddings'],
            hf['vision_config']['image_size'])

  def batch(self, step: int, size: int | None = None) -> dict:
    rng = np.random.default_rng(step)
    vocab, length, side = self._sizes()
    batch = size or self.batch_size
    return dict(image=rng.standard_normal((batch, side, side, 3)).astype(np.float32),
                text=rng.integers(0, vocab, (batch, length)).astype(np.int32),
                label=np.arange(batch, dtype=np.int32))

  def attention_mask(self, text: np.ndarray) -> dict:
    del text  # none: the captions fill the positions
    return {}


class Whisper(Peer):
  """Whisper against transformers' WhisperForConditionalGeneration given its decoder inputs and
  labels: the mean cross-entropy of the transcript's tokens, AdamW with Whisper's settings (b2
  0.98, eps 1e-6, weight decay 0.1, gradients clipped to a norm of 1). Both read the same log-Mel
  features (ours data.log_mel_on='host': the features in the batch, as transformers takes
  them); transcripts fill the decoder's positions."""
  name = 'whisper'
  SHAPES = {
      'tiny': Shape(4, dict(vocab_size=64, num_mel_bins=16, d_model=32, encoder_layers=2,
                            decoder_layers=2, encoder_attention_heads=4,
                            decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                            max_source_positions=50, max_target_positions=16, pad_token_id=0,
                            bos_token_id=0, eos_token_id=0, decoder_start_token_id=1,
                            suppress_tokens=[], begin_suppress_tokens=[])),
      # transformers' WhisperConfig defaults: whisper-tiny, its multilingual vocabulary.
      'small': Shape(8, {}),
  }

  def make_model(self):
    import transformers
    return transformers.WhisperForConditionalGeneration(self.hf_config())

  def hf_config(self):
    import transformers
    return transformers.WhisperConfig(**self.shape.hf)

  def data_settings(self, directory: str) -> dict:
    del directory
    # The characters of the generated tones' transcripts (the batches are the benchmark's own).
    return dict(seq_len=self.hf_config().max_target_positions, log_mel_on='host',
                tokenizer='chars')

  def optimizer_settings(self) -> dict:
    return dict(learning_rate=1e-3, b1=0.9, b2=0.98, eps=1e-6, weight_decay=0.1,
                grad_clip_norm=1.0)

  def batch(self, step: int) -> dict:
    hf, rng = self.hf_config(), np.random.default_rng(step)
    frames, length = 2 * hf.max_source_positions, hf.max_target_positions
    features = rng.uniform(-1, 1, (self.batch_size, frames, hf.num_mel_bins)).astype(np.float32)
    targets = rng.integers(2, hf.vocab_size, (self.batch_size, length)).astype(np.int32)
    decoder_inputs = np.pad(targets[:, :-1], ((0, 0), (1, 0)),
                            constant_values=hf.decoder_start_token_id)
    return dict(features=features, decoder_inputs=decoder_inputs, targets=targets,
                weights=np.ones(targets.shape, np.float32))

  def torch_batch(self, batch: dict) -> dict:
    return dict(input_features=_tensor(batch['features'].transpose(0, 2, 1)),
                decoder_input_ids=_tensor(batch['decoder_inputs'], torch.long),
                labels=_tensor(batch['targets'], torch.long))


class DiT(Peer):
  """DiT (no learned sigma: out_channels = in_channels) against diffusers'
  DiTTransformer2DModel: the noise's MSE at uniform timesteps of the linear schedule of 1,000
  steps, labels dropped to the null class 10% of the time, as diffusers' DDPM training computes
  it (DDPMScheduler.add_noise, F.mse_loss); AdamW at DiT's settings (1e-4, b2 0.999, no weight
  decay or clipping). With learned sigma ours adds the variational bound, which diffusers has
  no loss for: both leave it out. The labels are dropped by the loss (diffusers' own drop, in
  each block's embedder, is turned off) so that step 0 can take our draws.

  diffusers' model keeps a copy of the timestep and class embedders in every block (its
  conversion of DiT's checkpoints copies DiT's one embedder into each), and its final layer
  reads block 0's: the weights here are those copies of our one embedder, the same model at
  step 0; diffusers trains each copy (12 in DiT-S), more parameters than DiT's for AdamW.
  diffusers' timestep frequencies are exp(-ln(10^4) i / (half - 1)) where DiT's are
  exp(-ln(10^4) i / half) (its Timesteps' downscale_freq_shift of 1): set to DiT's (0) here,
  the same cost."""
  name = 'dit'
  SHAPES = {
      'tiny': Shape(8, dict(num_attention_heads=2, attention_head_dim=16, num_layers=2,
                            sample_size=8, num_embeds_ada_norm=10)),
      'small': Shape(32, dict(num_attention_heads=6, attention_head_dim=64, num_layers=12,
                              sample_size=32, num_embeds_ada_norm=1000)),  # DiT-S/2
  }
  CHANNELS, PATCH, CLASS_DROPOUT = 4, 2, 0.1

  def make_model(self, learn_sigma: bool = False):
    import diffusers
    model = diffusers.DiTTransformer2DModel(
        **self.shape.hf, in_channels=self.CHANNELS, patch_size=self.PATCH, norm_eps=1e-6,
        out_channels=self.CHANNELS * (2 if learn_sigma else 1))
    for block in model.transformer_blocks:
      block.norm1.emb.time_proj.downscale_freq_shift = 0
      block.norm1.emb.class_embedder.dropout_prob = 0.0
    # Every block's embedders are block 0's, as DiT's one embedder converted.
    first = model.transformer_blocks[0].norm1.emb.state_dict()
    for block in model.transformer_blocks[1:]:
      block.norm1.emb.load_state_dict(first)
    return model

  def build(self, directory: str):
    torch.manual_seed(0)
    return self.make_model()

  def model_fields(self, learn_sigma: bool = False) -> dict:
    hf = self.shape.hf
    return dict(family='dit', image_size=hf['sample_size'], num_channels=self.CHANNELS,
                patch_size=self.PATCH,
                width=hf['num_attention_heads'] * hf['attention_head_dim'],
                num_layers=hf['num_layers'], num_heads=hf['num_attention_heads'],
                num_classes=hf['num_embeds_ada_norm'], learn_sigma=learn_sigma,
                class_dropout=self.CLASS_DROPOUT, dtype='float32')

  def config(self, directory: str):
    del directory
    config = config_lib.base_config('dit')
    config.model.update(self.model_fields())
    config.data.update(name='synthetic', batch_size=self.batch_size, augment=False,
                       eval_batch_size=self.batch_size, eval_examples=self.batch_size)
    config.optimizer.update(learning_rate=1e-4, warmup_steps=0, schedule='constant', b2=0.999,
                            weight_decay=0.0, grad_clip_norm=0.0)
    return config

  def params(self, model, config):
    from transformer_jax import models
    return dit_params(model, models.model_config(config.model))

  def batch(self, step: int) -> dict:
    rng = np.random.default_rng(step)
    size, classes = self.shape.hf['sample_size'], self.shape.hf['num_embeds_ada_norm']
    return dict(image=rng.standard_normal((self.batch_size, size, size, self.CHANNELS)).astype(
        np.float32), label=rng.integers(0, classes, self.batch_size).astype(np.int32))

  def first_draws(self, run, batch: dict):
    """Our step 0's timesteps, noise and dropped labels: its loss key (train.step's dropout
    root folded with the step, then 1, as train.losses.batch_sums passes it) split as
    DiT.diffusion_losses splits it."""
    rng = jax.random.fold_in(jax.random.fold_in(step_lib.dropout_root(run.settings.seed), 0), 1)
    t_rng, noise_rng, drop_rng = jax.random.split(rng, 3)
    size = batch['image'].shape[0]
    t = jax.random.randint(t_rng, (size,), 0, run.model_config.diffusion_steps)
    noise = jax.random.normal(noise_rng, batch['image'].shape, jax.numpy.float32)
    dropped = jax.random.bernoulli(drop_rng, run.model_config.class_dropout, (size,))
    return jax.device_get((t, noise, dropped))

  def torch_batch(self, batch: dict) -> dict:
    return dict(x0=_tensor(batch['image'].transpose(0, 3, 1, 2)),
                labels=_tensor(batch['label'], torch.long))

  def torch_loss(self, model, batch: dict, draws=None):
    x0, labels = batch['x0'], batch['labels']
    if draws is None:
      t = torch.randint(0, 1000, (x0.shape[0],))
      noise = torch.randn_like(x0)
      dropped = torch.rand(x0.shape[0]) < self.CLASS_DROPOUT
    else:
      t, noise, dropped = (_tensor(draws[0], torch.long), _tensor(draws[1].transpose(0, 3, 1, 2)),
                           _tensor(draws[2]))
    labels = torch.where(dropped, self.shape.hf['num_embeds_ada_norm'], labels)
    x_t = ddpm_scheduler().add_noise(x0, noise, t)
    predicted = model(x_t, timestep=t, class_labels=labels).sample
    return torch.nn.functional.mse_loss(predicted, noise)


def ddpm_scheduler(**keywords):
  """diffusers' DDPMScheduler of DiT's linear schedule (betas 1e-4 to 0.02 over 1,000 steps)."""
  import diffusers
  return diffusers.DDPMScheduler(num_train_timesteps=1000, beta_start=1e-4, beta_end=0.02,
                                 beta_schedule='linear', **keywords)


def _dit_tensors(num_layers: int) -> list[Tensor]:
  """Where diffusers' DiTTransformer2DModel holds each of our DiT's parameters (block 0's
  embedders as ours): HF-layout Tensors, read by convert.tensors' layouts."""
  specs = [Tensor('pos_embed.proj.weight', ('patch_embed/conv/kernel',), Array((3, 2, 0, 1))),
           Tensor('pos_embed.proj.bias', ('patch_embed/conv/bias',)),
           Tensor('transformer_blocks.0.norm1.emb.class_embedder.embedding_table.weight',
                  ('y_embed/table',))]
  embedder = 'transformer_blocks.0.norm1.emb.timestep_embedder'
  specs += linear(f'{embedder}.linear_1', 't_embed/dense_in', bias=True)
  specs += linear(f'{embedder}.linear_2', 't_embed/dense_out', bias=True)
  for i in range(num_layers):
    hf, ours = f'transformer_blocks.{i}', f'blocks/block_{i}'
    # adaLN's (shift, scale, gate) of the attention, then of the MLP.
    specs += linear(f'{hf}.norm1.linear', [f'{ours}/attn_norm/modulation',
                                           f'{ours}/mlp_norm/modulation'], bias=True)
    for name, path in (('to_q', 'query'), ('to_k', 'key'), ('to_v', 'value')):
      specs += linear(f'{hf}.attn1.{name}', f'{ours}/attn/{path}', bias=True)
    specs += linear(f'{hf}.attn1.to_out.0', f'{ours}/attn/out', bias=True, num_in=2)
    specs += linear(f'{hf}.ff.net.0.proj', f'{ours}/mlp/up', bias=True)
    specs += linear(f'{hf}.ff.net.2', f'{ours}/mlp/down', bias=True)
  return (specs + linear('proj_out_1', 'final_norm/modulation', bias=True)
          + linear('proj_out_2', 'head', bias=True))


def dit_params(model, cfg) -> dict:
  """Our DiT's parameter tree (cfg's shapes, unrolled blocks) of a diffusers
  DiTTransformer2DModel's weights; its fixed position table is our own (both DiT's 2-D
  sin-cos)."""
  from transformer_jax import models
  shapes = traverse_util.flatten_dict(
      jax.eval_shape(lambda: models.init_params(cfg, jax.random.key(0))), sep='/')
  state = {name: value.detach().numpy() for name, value in model.state_dict().items()}
  params = {'pos_embed': np.asarray(models.dit.sincos_2d(cfg.width, cfg.image_size //
                                                         cfg.patch_size))}
  for spec in _dit_tensors(cfg.num_layers):
    ours = [tuple(shapes[path].shape) for path in spec.paths]
    array = state[spec.name]
    expected = spec.layout.hf_shape(ours)
    if array.shape != expected:
      raise ValueError(f'{spec.name}: {array.shape}, expected {expected} for {spec.paths}')
    for path, value in zip(spec.paths, spec.layout.to_ours(array, ours)):
      params[path] = value.astype(np.float32)
  missing = set(shapes) - set(params)
  if missing:
    raise ValueError(f'DiT parameters not filled from diffusers: {sorted(missing)}')
  return traverse_util.unflatten_dict(params, sep='/')


PEERS = {peer.name: peer for peer in (T5, Clip, Siglip, Whisper, DiT)}



# Inference (bench_inference.py): Whisper's other peers and diffusers' DiT sampling loop.

# Whisper's checkpoints' special ids (the multilingual vocabulary): <|endoftext|> ends, pads
# and begins; a transcript is decoded after <|startoftranscript|> <|en|> <|transcribe|>
# <|notimestamps|>.
WHISPER_IDS = dict(bos_token_id=50257, eos_token_id=50257, pad_token_id=50257,
                   decoder_start_token_id=50258)
WHISPER_PROMPT = (50258, 50259, 50359, 50363)
WHISPER_EOT = 50257
# The inference shapes: OpenAI's tiny and base (transformers' WhisperConfig keywords), and a
# micro model of their vocabulary over 1 s windows for --quick. openai-whisper's MLP is 4x.
WHISPER_SIZES = {
    'micro': dict(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                  decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
                  max_source_positions=50),
    'tiny': {},
    'base': dict(d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8,
                 decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048),
}


def whisper_checkpoint(size: str, directory: str):
  """transformers' WhisperForConditionalGeneration of `size` and seed 0 with Whisper's special
  ids, saved in `directory`; nothing suppressed at its first step (ours, openai-whisper's and
  CTranslate2's runs suppress nothing there either)."""
  import transformers
  torch.manual_seed(0)
  model = transformers.WhisperForConditionalGeneration(transformers.WhisperConfig(
      **WHISPER_SIZES[size], **WHISPER_IDS, suppress_tokens=[], begin_suppress_tokens=[]))
  model.generation_config.begin_suppress_tokens = None
  model.generation_config.suppress_tokens = None
  model.save_pretrained(directory, safe_serialization=True)
  return model.eval()


# transformers' Whisper names -> openai-whisper's (its model.py), in order; None: not held
# (the head, tied to the token embedding).
_OPENAI_NAMES = (
    (r'^proj_out\.weight$', None), (r'^model\.', ''),
    (r'embed_positions\.weight', 'positional_embedding'), (r'embed_tokens', 'token_embedding'),
    (r'\.layers\.', '.blocks.'), (r'encoder_attn_layer_norm', 'cross_attn_ln'),
    (r'self_attn_layer_norm', 'attn_ln'), (r'encoder_attn\.', 'cross_attn.'),
    (r'self_attn\.', 'attn.'), (r'q_proj', 'query'), (r'k_proj', 'key'), (r'v_proj', 'value'),
    (r'out_proj', 'out'), (r'fc1', 'mlp.0'), (r'fc2', 'mlp.2'), (r'final_layer_norm', 'mlp_ln'),
    (r'^encoder\.layer_norm', 'encoder.ln_post'), (r'^decoder\.layer_norm', 'decoder.ln'))


def openai_whisper(model):
  """openai-whisper's Whisper holding the weights of transformers' `model`."""
  import re
  import whisper
  config = model.config
  state = {}
  for name, value in model.state_dict().items():
    for pattern, replacement in _OPENAI_NAMES:
      if replacement is None and re.search(pattern, name):
        break
      if replacement is not None:
        name = re.sub(pattern, replacement, name)
    else:
      state[name] = value
  dims = whisper.model.ModelDimensions(
      n_mels=config.num_mel_bins, n_audio_ctx=config.max_source_positions,
      n_audio_state=config.d_model, n_audio_head=config.encoder_attention_heads,
      n_audio_layer=config.encoder_layers, n_vocab=config.vocab_size,
      n_text_ctx=config.max_target_positions, n_text_state=config.d_model,
      n_text_head=config.decoder_attention_heads, n_text_layer=config.decoder_layers)
  ours = whisper.model.Whisper(dims)
  ours.load_state_dict(state)  # strict: every tensor placed
  return ours.eval()


def ctranslate2_whisper(checkpoint: str, directory: str, compute_type: str):
  """faster-whisper's engine, CTranslate2's Whisper, converted offline from the checkpoint
  (ctranslate2.converters.TransformersConverter; the vocabulary, which it reads from a
  tokenizer the checkpoint does not hold, named from openai-whisper's special tokens: only
  their ids matter to decoding), in `compute_type` ('float32', 'int8') on the CPU."""
  import ctranslate2
  import whisper

  specials = whisper.tokenizer.get_tokenizer(True, num_languages=99).special_tokens

  class Vocabulary:
    additional_special_tokens = []

    def get_vocab(self):
      names = {i: f'<t{i}>' for i in range(WHISPER_EOT)}
      names.update({i: name for name, i in specials.items()})
      return {name: i for i, name in names.items()}

  class Converter(ctranslate2.converters.TransformersConverter):
    def load_tokenizer(self, *unused, **unused_keywords):
      return Vocabulary()

  Converter(checkpoint).convert(directory, quantization=compute_type, force=True)
  return ctranslate2.models.Whisper(directory, device='cpu', compute_type=compute_type,
                                    intra_threads=torch.get_num_threads(), inter_threads=1)


def dit_pipeline_latents(transformer, scheduler, latents, class_labels, guidance_scale: float,
                         steps: int, null_class: int):
  """diffusers' DiTPipeline.__call__ (0.42.1) to its latents, before the VAE decodes them:
  latents (B, C, H, W) given (the pipeline draws them) and its null class a parameter (the
  pipeline's 1000: ImageNet's); the same transformer calls and scheduler steps."""
  channels = transformer.config.in_channels
  batch = latents.shape[0]
  x = torch.cat([latents] * 2) if guidance_scale > 1 else latents
  labels = torch.as_tensor(class_labels).reshape(-1)
  if guidance_scale > 1:
    labels = torch.cat([labels, torch.full((batch,), null_class)], 0)
  scheduler.set_timesteps(steps)
  for t in scheduler.timesteps:
    if guidance_scale > 1:
      half = x[: len(x) // 2]
      x = torch.cat([half, half], dim=0)
    x = scheduler.scale_model_input(x, t)
    timesteps = t[None].expand(x.shape[0])
    noise_pred = transformer(x, timestep=timesteps, class_labels=labels).sample
    if guidance_scale > 1:
      eps, rest = noise_pred[:, :channels], noise_pred[:, channels:]
      cond_eps, uncond_eps = torch.split(eps, len(eps) // 2, dim=0)
      half_eps = uncond_eps + guidance_scale * (cond_eps - uncond_eps)
      noise_pred = torch.cat([torch.cat([half_eps, half_eps], dim=0), rest], dim=1)
    if transformer.config.out_channels // 2 == channels:
      model_output, _ = torch.split(noise_pred, channels, dim=1)
    else:
      model_output = noise_pred
    x = scheduler.step(model_output, t, x).prev_sample
  return x.chunk(2, dim=0)[0] if guidance_scale > 1 else x
