"""Image-text losses over the global batch: CLIP's softmax contrastive loss (Radford et al. 2021)
and SigLIP's sigmoid loss (Zhai et al. 2023).

Each loss comes in two forms that compute the same numbers:
- on the whole batch (`softmax_contrastive_loss`, `sigmoid_loss`): under jit with the embeddings
  sharded P('data'), GSPMD partitions it; inside `sharding.activation_rules` the similarities
  are kept split by rows (`layers.axes.constrain`), so that no device holds all B x B of them;
- per device, inside `jax.shard_map` over the data axis (`*_per_device`): CLIP's gathers every
  device's embeddings and computes its own rows of both directions; SigLIP's passes the text
  embeddings around the ring of devices (jax.lax.ppermute), one device's share at a time, so
  that no device holds more than its images against one device's texts (the paper's chunked
  implementation). `on_mesh` wraps either in shard_map.

The embeddings are L2-normalised here, and everything runs in float32. Both forms return the
loss and metrics of the global batch, the same on every device; in shard_map, the gradient with
respect to a device's embeddings is the gradient of the global loss with respect to them.
Negatives come from the same batch, so unlike the cross-entropy of one example the loss of a
batch is no sum over its microbatches: accumulating gradients over microbatches changes it.
"""
import dataclasses
import functools
import math
from typing import Callable

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from transformer_jax.errors import ConfigError
from transformer_jax.layers import axes
from transformer_jax.ranges import Range
from transformer_jax.settings import Settings

__all__ = ['ContrastiveSettings', 'MAX_SCALE', 'on_mesh', 'sigmoid_loss',
           'sigmoid_loss_per_device', 'softmax_contrastive_loss',
           'softmax_contrastive_loss_per_device']

MAX_SCALE = 100.0  # CLIP clips its logit scale exp(t) here, "to prevent scaling the logits by more
# than 100, which we found necessary to prevent training instability" (Radford et al. 2021): the
# parameter t, clamped to [0, ln 100] after every update (open_clip's train.py), never in the
# forward pass, where a clip would leave t no gradient to come back with (`constrained`)

# The initial temperature exp(t) and bias of each loss, as their papers give them.
_INITIAL = {'softmax': (1 / 0.07, None), 'sigmoid': (10.0, -10.0)}

DATA_AXIS = 'data'  # the mesh axis of data parallelism (train.sharding's, which imports this)
_HIGHEST = jax.lax.Precision.HIGHEST  # the similarities in full float32 on every platform


@dataclasses.dataclass(frozen=True)
class ContrastiveSettings(Settings):
  """The loss of a dual encoder and the initial values of its learned scalars: the temperature
  exp(t) that scales the cosine similarities (CLIP: 1/0.07; SigLIP: 10) and SigLIP's bias (-10;
  big_vision's LiT-on-COCO config starts at temperature 10 and bias -2.71). Unset: the paper's."""
  SECTION = 'contrastive'
  loss: str = 'softmax'  # 'softmax' (CLIP) or 'sigmoid' (SigLIP)
  temperature: float | None = None
  bias: float | None = None

  CHOICES = {'loss': tuple(_INITIAL)}
  RANGES = {'temperature': Range(0, open_low=True, optional=True, example=10),
            'bias': Range(optional=True, example=-10)}

  def check(self) -> None:
    super().check()
    if self.loss == 'softmax' and self.bias is not None:
      raise ConfigError(f'contrastive.bias={self.bias} is for the sigmoid loss (the softmax is '
                        'the same for any bias): unset it, or set contrastive.loss="sigmoid".')
    if self.loss == 'softmax' and not 1 <= (self.temperature or 1) <= MAX_SCALE:
      raise ConfigError(f'contrastive.temperature={self.temperature}: the softmax loss keeps it '
                        f'in [1, {MAX_SCALE:g}] (open_clip clamps it there after every update); '
                        'choose one in that range.')

  def constrained(self, scalars: dict) -> dict:
    """The learned scalars after an optimizer update: for the softmax loss, t clamped to
    [0, ln MAX_SCALE] as open_clip clamps its logit_scale (train.py: `logit_scale.clamp_(0,
    math.log(100))`); the sigmoid loss's t and bias are left free, as big_vision's SigLIP
    trainer leaves them."""
    if self.loss != 'softmax' or 'log_temperature' not in scalars:
      return scalars
    clamped = jnp.clip(scalars['log_temperature'], 0.0, math.log(MAX_SCALE))
    return {**scalars, 'log_temperature': clamped}

  def initial_scalars(self) -> dict[str, float]:
    """The learned scalars the loss takes, by the names of its arguments, at their initial
    values: 'log_temperature' (t, the temperature being exp(t)) and for the sigmoid loss
    'bias'."""
    temperature, bias = _INITIAL[self.loss]
    scalars = {'log_temperature': math.log(self.temperature or temperature)}
    if self.loss == 'sigmoid':
      scalars['bias'] = bias if self.bias is None else self.bias
    return scalars

  def loss_fn(self, per_device: bool = False) -> Callable:
    """fn(image_emb, text_emb, **scalars) -> (loss, metrics), the scalars named as
    `initial_scalars` names them: the form for the whole batch, or with `per_device` the form
    for inside shard_map."""
    forms = {'softmax': (softmax_contrastive_loss, softmax_contrastive_loss_per_device),
             'sigmoid': (sigmoid_loss, sigmoid_loss_per_device)}
    return forms[self.loss][per_device]


def _normalized(x_BD: jax.Array) -> jax.Array:
  """Rows scaled to unit L2 norm, in float32 (a zero row stays zero)."""
  x_BD = x_BD.astype(jnp.float32)
  norm = jnp.sqrt(jnp.sum(jnp.square(x_BD), axis=-1, keepdims=True))
  return x_BD / jnp.maximum(norm, 1e-12)


def _similarities(image_BD, text_CD):
  return jnp.einsum('bd,cd->bc', image_BD, text_CD, precision=_HIGHEST)


def _positive(sims_BC, positive_BC):
  """Per row, the similarity of its positive."""
  return jnp.sum(jnp.where(positive_BC, sims_BC, 0.0), axis=1)


def _best_other(sims_BC, positive_BC):
  """Per row, the highest similarity but its positive's (-inf for a row of one)."""
  return jnp.max(jnp.where(positive_BC, -jnp.inf, sims_BC), axis=1)


def _retrieved(sims_BC, positive_BC):
  """How many rows rank their positive above every other."""
  return jnp.sum(_positive(sims_BC, positive_BC) > _best_other(sims_BC, positive_BC))


def _softmax_rows(sims_BC, positive_BC, scale):
  """(sum of the rows' cross-entropies of scale * sims against their positive, how many rows
  rank their positive above every other)."""
  cross_entropy = (jax.nn.logsumexp(scale * sims_BC, axis=1)
                   - scale * _positive(sims_BC, positive_BC))
  return jnp.sum(cross_entropy), _retrieved(sims_BC, positive_BC)


def _scale(log_temperature):
  return jnp.exp(jnp.asarray(log_temperature, jnp.float32))


def softmax_contrastive_loss(image_emb, text_emb, log_temperature):
  """CLIP's loss of a batch of B matching pairs, image_emb (B, D) and text_emb (B, D): the
  logits are exp(t) times the cosine similarities (t is kept at most ln MAX_SCALE by
  `ContrastiveSettings.constrained` after each update, not here), and the loss is the mean of
  the image-to-text and text-to-image cross-entropies, each averaged over the batch.

  Returns (loss, metrics): 'image_to_text_accuracy' and 'text_to_image_accuracy' (the fraction
  of images, texts, whose partner is more similar than any other in the batch) and
  'temperature' (exp(t)).
  """
  image, text = _normalized(image_emb), _normalized(text_emb)
  scale = _scale(log_temperature)
  sims = axes.constrain(_similarities(image, text), None)
  eye = jnp.eye(sims.shape[0], dtype=bool)
  image_ce, image_correct = _softmax_rows(sims, eye, scale)
  text_ce, text_correct = _softmax_rows(sims.T, eye, scale)
  return _softmax_result(image_ce, text_ce, image_correct, text_correct, sims.shape[0], scale)


def _softmax_result(image_ce, text_ce, image_correct, text_correct, batch, scale):
  metrics = {'image_to_text_accuracy': image_correct / batch,
             'text_to_image_accuracy': text_correct / batch, 'temperature': scale}
  return (image_ce + text_ce) / (2 * batch), metrics


def softmax_contrastive_loss_per_device(image_emb, text_emb, log_temperature,
                                        axis_name: str = DATA_AXIS):
  """`softmax_contrastive_loss` of the global batch, inside shard_map over `axis_name`: each
  device's rows (its images against every text, its texts against every image) from the
  gathered embeddings, summed over the devices."""
  image, text = _normalized(image_emb), _normalized(text_emb)
  scale = _scale(log_temperature)
  rows = image.shape[0]
  all_images = jax.lax.all_gather(image, axis_name, tiled=True)
  all_texts = jax.lax.all_gather(text, axis_name, tiled=True)
  partner = jax.lax.axis_index(axis_name) * rows + jnp.arange(rows)
  positive = partner[:, None] == jnp.arange(all_texts.shape[0])[None, :]
  image_ce, image_correct = _softmax_rows(_similarities(image, all_texts), positive, scale)
  text_ce, text_correct = _softmax_rows(_similarities(text, all_images), positive, scale)
  sums = jax.lax.psum((image_ce, text_ce, image_correct, text_correct), axis_name)
  return _softmax_result(*sums, all_texts.shape[0], scale)


def _sigmoid_sum(sims_BC, positive_BC, scale, bias):
  """-sum of log sigmoid(z * (scale * sims + bias)), z = +1 for the positives, -1 otherwise."""
  sign = jnp.where(positive_BC, 1.0, -1.0)
  return -jnp.sum(jax.nn.log_sigmoid(sign * (scale * sims_BC + bias)))


def _sigmoid_result(loss_sum, image_correct, text_correct, batch, scale, bias):
  metrics = {'image_to_text_accuracy': image_correct / batch,
             'text_to_image_accuracy': text_correct / batch, 'temperature': scale, 'bias': bias}
  return loss_sum / batch, metrics


def sigmoid_loss(image_emb, text_emb, log_temperature, bias):
  """SigLIP's loss of a batch of B matching pairs, image_emb (B, D) and text_emb (B, D): with
  x, y the normalised embeddings, t = exp(log_temperature) and z = +1 for a matching pair, -1
  otherwise, -(1/B) sum_i sum_j log sigmoid(z_ij (t x_i.y_j + b)): the mean over the images of
  their summed losses against every text (big_vision's normalisation).

  Returns (loss, metrics): the in-batch accuracies as `softmax_contrastive_loss`'s,
  'temperature' (exp(t)) and 'bias'.
  """
  image, text = _normalized(image_emb), _normalized(text_emb)
  scale = _scale(log_temperature)
  bias = jnp.asarray(bias, jnp.float32)
  sims = axes.constrain(_similarities(image, text), None)
  eye = jnp.eye(sims.shape[0], dtype=bool)
  return _sigmoid_result(_sigmoid_sum(sims, eye, scale, bias), _retrieved(sims, eye),
                         _retrieved(sims.T, eye), sims.shape[0], scale, bias)


def sigmoid_loss_per_device(image_emb, text_emb, log_temperature, bias,
                            axis_name: str = DATA_AXIS):
  """`sigmoid_loss` of the global batch, inside shard_map over `axis_name`, as SigLIP's chunked
  implementation: each device scores its images against its own texts, then N - 1 times passes
  the texts it holds to the next device and scores its images against the texts it receives.
  Beside each text share travels the best similarity its texts have to another image so far
  (for the text-to-image accuracy), which comes home in one last pass."""
  image, text = _normalized(image_emb), _normalized(text_emb)
  scale = _scale(log_temperature)
  bias = jnp.asarray(bias, jnp.float32)
  devices = jax.lax.axis_size(axis_name)
  to_next = functools.partial(jax.lax.ppermute, axis_name=axis_name,
                              perm=[(i, (i + 1) % devices) for i in range(devices)])

  own_sims = _similarities(image, text)
  eye = jnp.eye(own_sims.shape[0], dtype=bool)
  positive = _positive(own_sims, eye)  # the diagonal: by rows the images', by columns the texts'
  image_best, text_best = _best_other(own_sims, eye), _best_other(own_sims.T, eye)

  def visit(carry, _):
    texts, texts_best, image_best, loss_sum = carry
    texts, texts_best = to_next((texts, texts_best))
    sims = _similarities(image, texts)
    image_best = jnp.maximum(image_best, jnp.max(sims, axis=1))
    texts_best = jnp.maximum(texts_best, jnp.max(sims, axis=0))
    return (texts, texts_best, image_best, loss_sum + _sigmoid_sum(sims, False, scale, bias)), None

  start = (text, text_best, image_best, _sigmoid_sum(own_sims, eye, scale, bias))
  (_, text_best, image_best, loss_sum), _ = jax.lax.scan(visit, start, length=devices - 1)
  text_best = to_next(text_best) if devices > 1 else text_best
  sums = jax.lax.psum((loss_sum, jnp.sum(positive > image_best), jnp.sum(positive > text_best)),
                      axis_name)
  return _sigmoid_result(*sums, devices * image.shape[0], scale, bias)


def on_mesh(loss_per_device: Callable, mesh: jax.sharding.Mesh) -> Callable:
  """loss(image_emb, text_emb, *scalars) -> (loss, metrics) of the global batch, for embeddings
  sharded P('data') on `mesh`: `loss_per_device` (softmax_contrastive_loss_per_device or
  sigmoid_loss_per_device) under jax.shard_map, its scalars replicated."""
  def loss(image_emb, text_emb, *scalars):
    specs = (P(DATA_AXIS), P(DATA_AXIS)) + (P(),) * len(scalars)
    return jax.shard_map(loss_per_device, mesh=mesh, in_specs=specs, out_specs=P())(
        image_emb, text_emb, *scalars)
  return loss
