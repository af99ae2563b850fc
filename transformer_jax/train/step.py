"""The train and eval steps: one jitted with shardings (GSPMD), one with jax.shard_map.

Both compute the same thing: gradients of (sum of per-position losses over the global batch) /
(its total weight, or training.loss_normalizing_factor), accumulated over `grad_accum_steps`
microbatches, then one optax update.
"""
import dataclasses
import functools

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import optax
from jax.sharding import PartitionSpec as P

from transformer_jax import layers, lora
from transformer_jax.lora import LoraSettings
from transformer_jax.errors import ConfigError
from transformer_jax.models.registry import Family
from transformer_jax.train import losses, sharding
from transformer_jax.train.sharding import DATA_AXIS

__all__ = ['dropout_root', 'ema_decay_at', 'LoraState', 'make_eval_step',
           'make_stacked_train_step', 'make_train_step', 'StepSettings', 'TrainState']


class TrainState(flax.struct.PyTreeNode):
  step: jax.Array
  params: dict  # what the optimizer trains
  opt_state: optax.OptState
  ema: dict | None  # the moving average of params (training.ema_decay > 0), else None

  def model_params(self, params=None):
    """The parameters the model runs with, of the trained `params` (default: the state's)."""
    return self.params if params is None else params


class LoraState(TrainState):
  """A state whose params are low-rank adapters (transformer_jax.lora) of a frozen base, which
  has no gradient and no optimizer state."""
  base: dict
  lora: LoraSettings = flax.struct.field(pytree_node=False)

  def model_params(self, params=None):
    return lora.merged(self.base, self.params if params is None else params, self.lora)


@dataclasses.dataclass(frozen=True)
class StepSettings:
  """What a train step computes besides the model's forward pass and the optimizer's update."""
  seed: int = 0  # the dropout streams are fold_in(key(seed), 1), then the step and microbatch
  grad_accum_steps: int = 1  # sequential microbatches per global batch, one update
  label_smoothing: float = 0.0
  dropout: bool = False  # whether training runs the model with deterministic=False
  parallelism: str = 'jit'  # 'jit' (GSPMD) or 'shard_map' (per device, explicit pmean)
  rules: tuple = ()  # logical axis -> mesh axis, for the activations (sharding.rules_of)
  ema_decay: float = 0.0  # of the state's ema after each update (a state without one: unused)
  z_loss: float = 0.0  # of the cross-entropy's log(Z)^2, added to the objective
  logits_chunk: int = 0  # positions of each sequence whose logits the loss computes at once
  loss_normalizing_factor: float | None = None  # None: the global batch's total weight
  ema_warmup: bool = True  # ema_decay_at's warm-up

  @classmethod
  def of(cls, settings) -> 'StepSettings':
    """The step's part of a run's settings (train.run_settings.RunSettings)."""
    training = settings.training
    return cls(seed=settings.seed, grad_accum_steps=training.grad_accum_steps,
               label_smoothing=training.label_smoothing,
               dropout=settings.model.drops_in_training,
               parallelism=settings.parallelism, rules=settings.rules, ema_decay=training.ema_decay,
               ema_warmup=training.ema_warmup, z_loss=training.z_loss,
               logits_chunk=training.logits_chunk,
               loss_normalizing_factor=training.loss_normalizing_factor)

  def normalizer(self, family: Family, batch) -> jax.Array:
    """What the summed objective of `batch` (the global batch) is divided by."""
    if self.loss_normalizing_factor is not None:
      return jnp.float32(self.loss_normalizing_factor)
    return jnp.sum(family.weights(batch))


def _microbatches(batch, num: int):
  """(B, ...) -> (num, B/num, ...), microbatch i holding rows i, i+num, ... so that every
  device keeps an equal share of every microbatch."""
  return jax.tree.map(lambda x: jnp.moveaxis(x.reshape((-1, num) + x.shape[1:]), 1, 0), batch)


def _grads_and_sums(model, family, settings, state, params, batch, rng, total_weight):
  """Gradient with respect to the trained `params` of the summed objective (losses.objective)
  over the batch / total_weight, and the summed metrics."""
  def loss_fn(p, micro, micro_rng):
    sums = losses.batch_sums(model, family, state.model_params(p), micro, micro_rng,
                             deterministic=not settings.dropout,
                             label_smoothing=settings.label_smoothing, z_loss=settings.z_loss,
                             logits_chunk=settings.logits_chunk)
    return losses.objective(sums) / total_weight, sums

  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
  accum = settings.grad_accum_steps
  if accum == 1:
    (_, sums), grads = grad_fn(params, batch, rng)
    return grads, sums

  # Only the gradients are carried: under shard_map a microbatch's sums vary over the data axis
  # while a zero initial carry would not, so they leave the scan as outputs and are added after.
  def accumulate(grads, indexed):
    index, micro = indexed
    (_, sums), micro_grads = grad_fn(params, micro, jax.random.fold_in(rng, index))
    return jax.tree.map(jnp.add, grads, micro_grads), sums

  grads, sums = jax.lax.scan(accumulate, jax.tree.map(jnp.zeros_like, params),
                             (jnp.arange(accum), _microbatches(batch, accum)))
  return grads, jax.tree.map(lambda s: s.sum(axis=0), sums)


def ema_decay_at(step, decay: float, warmup: bool = True):
  """The moving average's decay in the update of the state at `step` (the updates before it):
  with `warmup`, 0 at step 0 (the average starts as the first updated parameters) and then
  min(decay, (1 + step) / (10 + step)), diffusers' EMAModel.get_decay (use_ema_warmup=False) of
  its optimization_step step + 1; else `decay`. A function of the step alone, so that a resumed
  run averages as an unbroken one."""
  if not warmup:
    return decay
  step = jnp.asarray(step, jnp.float32)
  return jnp.where(step == 0, 0.0, jnp.minimum(decay, (1.0 + step) / (10.0 + step)))


def _apply_update(tx, schedule, state, grads, sums, settings, constrain):
  """One optax update, the parameters then as the family constrains them (`constrain(params)`:
  Family.constrain), and of the state's ema where it has one; the metrics say whether the new
  parameters are all finite, which the loop checks before it can save them."""
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = constrain(optax.apply_updates(state.params, updates))
  params_finite = jnp.all(jnp.stack([jnp.isfinite(p).all() for p in jax.tree.leaves(params)]))
  metrics = dict(sums, grad_norm=optax.tree.norm(grads), learning_rate=schedule(state.step),
                 params_finite=params_finite)
  ema = state.ema
  if ema is not None:
    decay = ema_decay_at(state.step, settings.ema_decay, settings.ema_warmup)
    ema = optax.incremental_update(params, ema, 1.0 - decay)
  return state.replace(step=state.step + 1, params=params, opt_state=opt_state, ema=ema), metrics


def _jit_step(model, family, settings, mesh, tx, schedule, rng_root, state, batch):
  """One step of the whole batch under jit's shardings: the dropout key of step t is
  fold_in(rng_root, t)."""
  rng = jax.random.fold_in(rng_root, state.step)
  total = settings.normalizer(family, batch)
  with sharding.activation_rules(mesh, settings.rules):
    grads, sums = _grads_and_sums(model, family, settings, state, state.params, batch, rng, total)
  return _apply_update(tx, schedule, state, grads, sums, settings,
                       functools.partial(family.constrain, model.cfg))


def dropout_root(seed):
  """The key that every step's dropout key is folded from (key 0 of the seed initializes)."""
  return jax.random.fold_in(jax.random.key(seed), 1)


def make_train_step(model, family: Family, tx, schedule, mesh, state_sharding,
                    settings: StepSettings = StepSettings()):
  """A jitted step(state, batch) -> (state, metrics) with the state donated."""
  rng_root = dropout_root(settings.seed)
  batch_sharding = jax.sharding.NamedSharding(mesh, P(DATA_AXIS))
  replicated = jax.sharding.NamedSharding(mesh, P())
  if settings.parallelism == 'jit':
    step = functools.partial(_jit_step, model, family, settings, mesh, tx, schedule, rng_root)
  elif settings.parallelism == 'shard_map':
    step = _shard_map_step(model, family, tx, schedule, settings, mesh, state_sharding, rng_root)
  else:
    raise ConfigError(f'Unknown parallelism {settings.parallelism!r}: use "jit" or "shard_map".')
  return jax.jit(step, in_shardings=(state_sharding, batch_sharding),
                 out_shardings=(state_sharding, replicated), donate_argnums=0)


def make_stacked_train_step(model, family: Family, make_optimizer, mesh, stacked_sharding,
                            settings: StepSettings):
  """A jitted step(states, batches, numbers, active) -> (states, metrics) over runs stacked on
  a leading axis (jax.vmap): run i takes batches[i] and its own numbers[i], the dict that
  `make_optimizer(numbers) -> (tx, schedule)` builds its optimizer of, with its dropout key
  data under 'dropout_root' and its dropout layers' keep probability under 'dropout_keep'. A
  run whose `active[i]` is False keeps its state (a run that finished or diverged while the
  others go on). The states are donated."""
  if settings.parallelism != 'jit':
    raise ConfigError('A vmapped sweep trains with parallelism="jit": set it, or train the runs '
                      'one after another (vmap=False).')

  def run_step(state, batch, numbers, active):
    tx, schedule = make_optimizer(numbers)
    rng_root = jax.random.wrap_key_data(numbers['dropout_root'])
    with nn.intercept_methods(_dropout_keeping(numbers['dropout_keep'])):
      new, metrics = _jit_step(model, family, settings, mesh, tx, schedule, rng_root, state,
                               batch)
    return jax.tree.map(lambda n, o: jnp.where(active, n, o), new, state), metrics

  stacked = lambda spec: jax.sharding.NamedSharding(mesh, P(None, *spec))
  replicated = jax.sharding.NamedSharding(mesh, P())
  return jax.jit(jax.vmap(run_step),
                 in_shardings=(stacked_sharding, stacked(P(DATA_AXIS)), replicated, replicated),
                 out_shardings=(stacked_sharding, replicated), donate_argnums=0)


def _dropout_keeping(keep_prob):
  """A method interceptor that makes every nn.Dropout that drops (rate > 0: those of
  model.dropout_rate; a rate of its own, such as model.mlp_dropout, is refused in a vmapped sweep)
  keep `keep_prob` (a traced scalar: one run's 1 - dropout_rate) instead of its own constant
  rate, drawing the same mask from the same key as nn.Dropout does (bernoulli(rng, keep_prob,
  shape): uniform draws below keep_prob). One at rate 0 (an MLP's without model.mlp_dropout)
  keeps everything, as it would alone."""
  def intercept(call, args, kwargs, context):
    dropout = context.module
    if (not isinstance(dropout, nn.Dropout) or context.method_name != '__call__'
        or dropout.rate == 0):
      return call(*args, **kwargs)
    inputs, *rest = args
    deterministic = nn.merge_param('deterministic', dropout.deterministic,
                                   kwargs.get('deterministic', rest[0] if rest else None))
    if deterministic:
      return inputs
    shape = [1 if dim in dropout.broadcast_dims else n for dim, n in enumerate(inputs.shape)]
    rng = kwargs.get('rng')
    rng = dropout.make_rng(dropout.rng_collection) if rng is None else rng
    mask = jnp.broadcast_to(jax.random.bernoulli(rng, p=keep_prob, shape=shape), inputs.shape)
    # As nn.Dropout's Python float, the divisor takes the inputs' dtype.
    return jax.lax.select(mask, inputs / keep_prob.astype(inputs.dtype), jnp.zeros_like(inputs))
  return intercept


def _shard_map_step(model, family, tx, schedule, settings, mesh, state_sharding, rng_root):
  """The same step written per device: local gradients, then an explicit pmean over 'data'."""
  if any(axis is not None for s in jax.tree.leaves(state_sharding) for axis in s.spec):
    raise ConfigError('parallelism="shard_map" runs data parallel with replicated parameters: '
                      'use rule_set="dp" without sharding_rules, or parallelism="jit" for FSDP '
                      'and tensor parallel rules.')

  def local_step(state, batch):
    rng = jax.random.fold_in(jax.random.fold_in(rng_root, state.step),
                             jax.lax.axis_index(DATA_AXIS))
    # Each device divides its sum by the normalizer's share per device (the mean weight per
    # device, or the fixed factor over the devices), so that the pmean of the local gradients is
    # the gradient of the global sum over the global normalizer.
    if settings.loss_normalizing_factor is None:
      mean_total = jax.lax.pmean(jnp.sum(family.weights(batch)), DATA_AXIS)
    else:
      mean_total = jnp.float32(settings.loss_normalizing_factor) / jax.lax.axis_size(DATA_AXIS)
    # Marked as varying across devices, the parameters get per-device gradients (otherwise
    # shard_map's autodiff would already sum them); the pmean below is then the only reduction.
    local_params = jax.lax.pcast(state.params, DATA_AXIS, to='varying')
    grads, sums = _grads_and_sums(model, family, settings, state, local_params, batch, rng,
                                  mean_total)
    grads = jax.lax.pmean(grads, DATA_AXIS)
    sums = jax.lax.psum(sums, DATA_AXIS)
    return _apply_update(tx, schedule, state, grads, sums, settings,
                         functools.partial(family.constrain, model.cfg))

  return jax.shard_map(local_step, mesh=mesh, in_specs=(P(), P(DATA_AXIS)), out_specs=(P(), P()))


def make_eval_step(model, family: Family, mesh, param_sharding, rules=(), token_bytes=None,
                   logits_chunk: int = 0):
  """A jitted eval(params, batch) -> summed loss terms (deterministic forward); with
  `token_bytes` (the UTF-8 bytes of each token id) also the weighted bytes of the targets;
  logits_chunk as the train step's (StepSettings)."""
  def eval_step(params, batch):
    with sharding.activation_rules(mesh, rules), layers.row_blocks():
      # A family's own noise is fixed at evaluation: every evaluation scores the same draws.
      sums = losses.batch_sums(model, family, params, batch, jax.random.key(0),
                               top5=family.classification, logits_chunk=logits_chunk)
    if token_bytes is not None:
      sums['bytes'] = jnp.sum(jnp.asarray(token_bytes, jnp.float32)[batch[family.targets]]
                              * family.weights(batch))
    return sums
  batch_sharding = jax.sharding.NamedSharding(mesh, P(DATA_AXIS))
  return jax.jit(eval_step, in_shardings=(param_sharding, batch_sharding))
