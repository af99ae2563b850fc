"""Dual encoders trained contrastively on image-text pairs: CLIP (Radford et al. 2021) and SigLIP
(Zhai et al. 2023). The image tower is the ViT family's module; the text tower is the shared
block stack over token embeddings; each is pooled to one vector, projected into a shared
embedding (or not), and a learned temperature (and SigLIP's bias) scales their cosine
similarities in the loss of transformer_jax.contrastive.

The model's settings are flat (config.model): the inherited sizes (width, num_layers, num_heads,
d_ff) are the image tower's, text_* the text tower's, and the block options (norm, mlp, biases,
dropout...) both towers'.
"""
import dataclasses
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer_jax.errors import ConfigError
from transformer_jax.layers import Linear
from transformer_jax.model_config import BLOCK_CHOICES, ModelConfig, check_choice, names
from transformer_jax.models import common, encoder, registry, vit
from transformer_jax.ranges import COUNT, Range
from transformer_jax.contrastive import MAX_SCALE, ContrastiveSettings

__all__ = ['ClipConfig', 'ClipModel', 'FAMILY', 'param_counts', 'TEXT_POOLS', 'TextTower']

TEXT_POOLS = ('eos', 'last', 'first')
# The settings each tower sizes for itself; every other block setting is shared.
_TOWER_SIZES = ('family', 'width', 'num_layers', 'num_heads', 'num_kv_heads', 'd_ff', 'positions')
# The text tower's settings (its encoder config's) and the keys of config.model that set them.
TEXT_KEYS = {'width': 'text_width', 'num_layers': 'text_layers', 'num_heads': 'text_heads',
             'd_ff': 'text_d_ff', 'vocab_size': 'vocab_size', 'max_len': 'max_len',
             'norm_position': 'text_norm_position', 'norm_eps': 'text_norm_eps',
             'mlp': 'text_mlp', 'embed_norm': 'text_embed_norm',
             'type_vocab_size': 'text_type_vocab_size'}


@dataclasses.dataclass(frozen=True)
class ClipConfig(ModelConfig):
  """A dual encoder's settings: the image tower (the inherited sizes and the ViT's image
  settings), the text tower (text_*), the shared embedding and the loss."""
  family: str = 'clip'
  # The image tower, a ViT.
  image_size: int = 32
  patch_size: int = 4
  num_channels: int = 3
  image_pool: str = 'cls'  # 'cls' (CLIP), 'map' (SigLIP's attention pooling) or 'mean'
  pre_norm: bool = True  # a norm after the patch and position embeddings (CLIP)
  patch_bias: bool = False  # the patch embedding's bias (SigLIP has one, CLIP none)
  # The text tower.
  text_width: int = 256
  text_layers: int = 4
  text_heads: int = 4
  text_d_ff: int | None = None  # None: 4 * text_width (as d_ff's None for the image tower)
  vocab_size: int = 0  # 0: the data's tokenizer's
  max_len: int = 32  # text positions: every caption is padded or truncated to this many tokens
  text_causal: bool = True  # CLIP's text tower is causal, SigLIP's bidirectional
  # 'eos': the output at the first EOS token of each caption (CLIP); 'last': at the last
  # position, padding included (SigLIP, which pads every caption to max_len); 'first': at the
  # first, BERT's [CLS] (LiT's BERT towers, Zhai et al. 2022).
  text_pool: str = 'eos'
  eos_id: int | None = None  # the EOS token's id; None: the data's tokenizer's
  text_head: bool = False  # a linear map (with bias) of the pooled text (SigLIP)
  # The text tower's own block and embedding options where they differ from the image tower's,
  # as a BERT tower's do (the encoder family's settings; None: the shared norm_position and
  # norm_eps, mlp): post-LN blocks, a norm of the embeddings, token-type rows (every caption
  # type 0), and the padding id whose tokens no token attends to (None: every token is attended
  # to).
  text_norm_position: str | None = None
  text_norm_eps: float | None = None
  text_mlp: str | None = None
  text_embed_norm: bool = False
  text_type_vocab_size: int = 0
  text_pad_id: int | None = None
  # The shared embedding: both towers are projected (without bias) to embed_dim; 0: no
  # projections, and the towers' widths must be equal.
  embed_dim: int = 128
  # The loss (transformer_jax.contrastive): 'softmax' (CLIP) or 'sigmoid' (SigLIP), and the initial
  # temperature exp(t) and bias; None: the paper's (1/0.07; 10 and -10). CLIP's temperature
  # stays in [1, 100] (clamped after every update, as open_clip's).
  loss: str = 'softmax'
  temperature: float | None = None
  bias: float | None = None
  # LiT (Zhai et al. 2022): a tower started from another run's workdir (WORKDIR or WORKDIR:STEP;
  # a ViT, text encoder or dual encoder run) or a Hugging Face directory (ViT, BERT, CLIP,
  # SigLIP), and a locked tower: no gradient, no optimizer state (train.towers).
  image_init: str = ''
  text_init: str = ''
  lock_image: bool = False
  lock_text: bool = False

  RANGES: ClassVar = {
      **ModelConfig.RANGES, 'image_size': COUNT, 'patch_size': COUNT, 'num_channels': COUNT,
      'text_width': COUNT, 'text_layers': COUNT, 'text_heads': COUNT,
      'text_d_ff': Range(1, integer=True, optional=True),
      'vocab_size': Range(0, integer=True, example=49408), 'max_len': COUNT,
      'eos_id': Range(0, integer=True, optional=True), 'embed_dim': Range(0, integer=True),
      'text_norm_eps': Range(0, open_low=True, optional=True),
      'text_type_vocab_size': Range(0, integer=True),
      'text_pad_id': Range(0, integer=True, optional=True),
      'temperature': Range(0, open_low=True, optional=True, example=10),
      'bias': Range(optional=True, example=-10)}
  CHOICES: ClassVar = {**ModelConfig.CHOICES, 'image_pool': vit.POOLS, 'text_pool': TEXT_POOLS,
                       'loss': ('softmax', 'sigmoid')}

  def check(self) -> None:
    super().check()
    if self.text_width % self.text_heads:
      raise ConfigError(f'model.text_heads={self.text_heads} does not divide model.text_width='
                        f'{self.text_width}: choose a head count that divides it.')
    if not self.embed_dim and self.text_width != self.width:
      raise ConfigError(f'The image tower is {self.width} wide and the text tower '
                        f'{self.text_width}, with no projection between them: set model.embed_dim '
                        'to the width of a shared embedding, or model.text_width = model.width.')
    for name in ('norm_position', 'mlp'):
      if getattr(self, f'text_{name}') is not None:
        check_choice(f'text_{name}', getattr(self, f'text_{name}'), BLOCK_CHOICES[name])
    if self.text_pool == 'first' and self.text_causal:
      raise ConfigError('model.text_pool="first" pools the first token, which a causal tower '
                        'lets see only itself: set model.text_causal=False.')
    if self.loss == 'softmax' and self.bias is not None:
      raise ConfigError(f'model.bias={self.bias} is for the sigmoid loss (the softmax is the same '
                        'for any bias): unset it, or set model.loss="sigmoid".')
    if self.loss == 'softmax' and not 1 <= (self.temperature or 1) <= MAX_SCALE:
      raise ConfigError(f'model.temperature={self.temperature}: the softmax loss keeps it in '
                        f'[1, {MAX_SCALE:g}] (open_clip clamps it there after every update); '
                        'choose one in that range.')
    self.image_config.check()  # the image tower's own rules (the patch size divides the side)

  def _shared(self) -> dict:
    return {name: getattr(self, name) for name in names(ModelConfig) if name not in _TOWER_SIZES}

  @property
  def image_config(self) -> vit.ViTConfig:
    """The image tower's settings: a ViT without a classifier."""
    return vit.ViTConfig(
        **self._shared(), width=self.width, num_layers=self.num_layers,
        num_heads=self.num_heads, num_kv_heads=self.num_kv_heads, d_ff=self.d_ff,
        positions=self.positions, image_size=self.image_size, patch_size=self.patch_size,
        num_channels=self.num_channels, num_classes=0, pool=self.image_pool,
        pre_norm=self.pre_norm, patch_bias=self.patch_bias)

  @property
  def text_config(self) -> encoder.EncoderConfig:
    """The text tower's settings: an encoder's, with learned positions over max_len tokens."""
    return encoder.EncoderConfig(**{
        **self._shared(), **{name: getattr(self, key) for name, key in TEXT_KEYS.items()},
        'family': 'clip_text', 'positions': 'learned',
        'norm_position': self.text_norm_position or self.norm_position,
        'norm_eps': self.text_norm_eps or self.norm_eps, 'mlp': self.text_mlp or self.mlp})

  def tower(self, part: str) -> tuple[ModelConfig, dict[str, str]]:
    """(the settings of the tower `part`, 'image' or 'text'; {its setting: the model.* key
    that sets it} where the two differ)."""
    return (self.image_config, {}) if part == 'image' else (self.text_config, TEXT_KEYS)

  @property
  def text_hidden_dim(self) -> int:
    """The text tower's MLP width, text_d_ff's default resolved."""
    return self.text_config.hidden_dim

  @property
  def contrastive(self) -> ContrastiveSettings:
    return ContrastiveSettings(loss=self.loss, temperature=self.temperature, bias=self.bias)


class TextTower(nn.Module):
  """tokens (B, T) -> (B, width) float32: the encoder family's stack (`encoder.encode`: causal
  or not, tokens at `pad_id` hidden from every token), the output at one position per caption
  (`pool`), and with `head` a linear map of it."""
  cfg: encoder.EncoderConfig
  causal: bool = True
  pool: str = 'eos'
  eos_id: int | None = None
  head: bool = False
  pad_id: int | None = None

  @nn.compact
  def __call__(self, tokens, *, deterministic=True):
    cfg = self.cfg
    positions = common.default_positions(tokens)
    mask = common.decoder_mask(positions) if self.causal else None
    if self.pad_id is not None:
      mask = common.both_masks(mask, common.key_mask(tokens != self.pad_id))
    x, _ = encoder.encode(cfg, tokens, positions, mask, deterministic=deterministic)
    pooled = x[jnp.arange(x.shape[0]), self._pooled_position(tokens)]
    if self.head:
      pooled = Linear((cfg.width,), ('embed',), ('mlp',), init_std=cfg.init_std,
                      dtype=cfg.compute_dtype, param_dtype=cfg.weight_dtype, name='head')(pooled)
    return pooled.astype(jnp.float32)

  def _pooled_position(self, tokens):
    """(B,): the first EOS of each row ('eos'; 0 for a row without one, as transformers'), the
    first position ('first') or the last ('last')."""
    if self.pool != 'eos':
      return jnp.full(tokens.shape[:1], 0 if self.pool == 'first' else tokens.shape[1] - 1)
    if self.eos_id is None:
      raise ConfigError('model.text_pool="eos" pools at the EOS token, whose id is unknown: set '
                        'model.eos_id, or train on data whose tokenizer has an EOS token.')
    return jnp.argmax(tokens == self.eos_id, axis=1)


def _scalar(value: float):
  return nn.with_logical_partitioning(nn.initializers.constant(value), ())


class ClipModel(nn.Module):
  """(images (B, H, W, C), tokens (B, T)) -> float32 logits_per_image (B, B): the scaled cosine
  similarity of image i and caption j (plus the bias of the sigmoid loss). `contrastive` gives
  the loss of the batch, `embed_images` and `embed_texts` the unnormalized embeddings."""
  cfg: ClipConfig

  def setup(self):
    cfg = self.cfg
    text = cfg.text_config
    self.image = vit.ViT(cfg.image_config)
    self.text = TextTower(text, cfg.text_causal, cfg.text_pool, cfg.eos_id, cfg.text_head,
                          cfg.text_pad_id)
    if cfg.embed_dim:
      project = lambda: Linear((cfg.embed_dim,), ('embed',), ('mlp',), use_bias=False,
                               init_std=cfg.init_std, dtype=cfg.compute_dtype,
                               param_dtype=cfg.weight_dtype, out_dtype=jnp.float32)
      self.image_projection, self.text_projection = project(), project()
    scalars = cfg.contrastive.initial_scalars()
    self.scalars = {name: self.param(name, _scalar(value), (), jnp.float32)
                    for name, value in scalars.items()}

  def embed_images(self, images, *, deterministic=True):
    """images (B, H, W, C) -> float32 (B, embed_dim or width)."""
    x = self.image.encode(images, deterministic=deterministic)
    if self.cfg.lock_image:  # LiT's locked tower: nothing of its backward pass is computed
      x = jax.lax.stop_gradient(x)
    return (self.image_projection(x) if self.cfg.embed_dim else x).astype(jnp.float32)

  def embed_texts(self, tokens, *, deterministic=True):
    """tokens (B, T) -> float32 (B, embed_dim or text_width)."""
    x = self.text(tokens, deterministic=deterministic)
    if self.cfg.lock_text:
      x = jax.lax.stop_gradient(x)
    return self.text_projection(x) if self.cfg.embed_dim else x

  def contrastive(self, images, tokens, *, deterministic=True):
    """(the loss of the batch, its metrics): transformer_jax.contrastive's loss over the whole batch
    (under jit, the global batch)."""
    loss_fn = self.cfg.contrastive.loss_fn()
    return loss_fn(self.embed_images(images, deterministic=deterministic),
                   self.embed_texts(tokens, deterministic=deterministic), **self.scalars)

  def __call__(self, images, tokens, *, deterministic=True):
    normed = lambda x: x / jnp.linalg.norm(x, axis=-1, keepdims=True)
    image = normed(self.embed_images(images, deterministic=deterministic))
    text = normed(self.embed_texts(tokens, deterministic=deterministic))
    scale = jnp.exp(self.scalars['log_temperature'])
    logits = scale * jnp.einsum('bd,cd->bc', image, text, precision=jax.lax.Precision.HIGHEST)
    return logits + self.scalars.get('bias', 0.0)


def contrastive_sums(apply, batch: dict, rng, label_smoothing: float) -> dict:
  """The family's loss: the contrastive loss of the batch's B pairs as summed terms (loss * B,
  weight B), with the in-batch image-to-text accuracy as 'correct' and the text-to-image one,
  the temperature and the bias each times B."""
  del rng, label_smoothing  # no noise of its own; the targets are the pairs
  loss, metrics = apply(batch['image'], batch['text'], method='contrastive')
  pairs = jnp.float32(batch['image'].shape[0])
  sums = {'loss': loss * pairs, 'weight': pairs,
          'correct': metrics.pop('image_to_text_accuracy') * pairs}
  return sums | {name: value * pairs for name, value in metrics.items()}


def follow_data(cfg: ClipConfig, sizes: dict, source: str) -> ClipConfig:
  """model.vocab_size and model.eos_id, unset, take the data's tokenizer's."""
  cfg = common.follow_text_data(cfg, sizes, source)
  found = sizes.get('eos_id')
  if found is None or cfg.text_pool != 'eos' or found == cfg.eos_id:
    return cfg
  if cfg.eos_id is not None:
    raise ConfigError(f'{source} ends captions with EOS id {found} but model.eos_id='
                      f'{cfg.eos_id}: leave model.eos_id unset to follow the data.')
  return dataclasses.replace(cfg, eos_id=found)


def check_data(info: dict, cfg: ClipConfig) -> None:
  vit.check_data(info, cfg.image_config)
  if info.get('text_len', cfg.max_len) != cfg.max_len:
    raise ConfigError(f'The captions are {info["text_len"]} tokens but the text tower has '
                      f'model.max_len={cfg.max_len} positions: set them equal.')


def param_counts(cfg: ClipConfig) -> dict[str, int]:
  """By part: the projections and the learned scalars count as 'other'."""
  image, text = vit.param_counts(cfg.image_config), encoder.encoder_params(cfg.text_config)
  d = cfg.text_width
  projections = cfg.embed_dim * (cfg.width + d)
  return common.with_total({
      **{part: image[part] + text[part] for part in ('embedding', 'attention', 'mlp', 'norms')},
      'head': (d * d + d) * cfg.text_head,
      'other': image['other'] + projections + len(cfg.contrastive.initial_scalars())})


def _batch_shapes(cfg: ClipConfig, batch_size: int, seq_len=None) -> dict:
  """The image task's batch, with the captions' token ids."""
  return {**vit.batch_shapes(cfg, batch_size, seq_len),
          'text': jax.ShapeDtypeStruct((batch_size, cfg.max_len), jnp.int32)}


def _stacks(cfg: ClipConfig, seq_len=None) -> list[registry.Stack]:
  del seq_len
  tokens = vit.num_tokens(cfg.image_config)
  return [registry.Stack('image', cfg.num_layers, tokens, (tokens,), cfg.image_config),
          registry.Stack('text', cfg.text_layers, cfg.max_len, (cfg.max_len,), cfg.text_config)]


def _describe(cfg: ClipConfig) -> str:
  return (f'{vit.FAMILY.describe(cfg.image_config)}; captions of {cfg.max_len} tokens; '
          f'{cfg.loss} loss')


def _constrained(cfg: ClipConfig, params: dict) -> dict:
  """The trained parameters after an update: the loss's scalars as ContrastiveSettings.
  constrained keeps them (CLIP's temperature clamped at 100, as open_clip's)."""
  return cfg.contrastive.constrained(params)


def _locked(cfg: ClipConfig) -> tuple[str, ...]:
  return ('image',) * cfg.lock_image + ('text',) * cfg.lock_text


def _started(cfg: ClipConfig) -> dict[str, str]:
  return {tower: path for tower, path in (('image', cfg.image_init), ('text', cfg.text_init))
          if path}


FAMILY = registry.register(registry.Family(
    name='clip', module=ClipModel,
    example_inputs=lambda cfg, batch=1, seq_len=None: (
        jnp.zeros((batch, cfg.image_size, cfg.image_size, cfg.num_channels), jnp.float32),
        jnp.zeros((batch, cfg.max_len), jnp.int32)),
    logits=lambda apply, batch: apply(batch['image'], batch['text']), task='image_text',
    targets='label', config=ClipConfig, unit='image', check_data=check_data,
    param_counts=param_counts, loss=contrastive_sums, loss_over_batch=True, stacks=_stacks,
    batch_shapes=_batch_shapes, describe=_describe, follow_data=follow_data,
    data_sizes=lambda cfg: {'image_size': cfg.image_size, 'vocab_size': cfg.vocab_size or None,
                            'text_len': cfg.max_len},
    depth_keys=('num_layers', 'text_layers'), frozen=_locked, starts=_started,
    tower=ClipConfig.tower, constrain=_constrained))
