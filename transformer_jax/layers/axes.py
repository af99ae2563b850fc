"""Logical axis names of activations. The layers constrain their activations with them, so that
XLA's sharding propagation keeps the layout the rules ask for (for example tensor parallel
heads through attention); without rules in context (`flax.linen.logical_axis_rules`) the
constraint is a no-op, so a layer used alone is unaffected. They are names of their own, apart
from the parameters' ('embed', 'heads', ...), so that a rule for parameters (FSDP shards
'embed' over 'data') never claims an activation's axis that the batch already uses."""
import flax.linen as nn
import jax

__all__ = ['constrain']

BATCH, LENGTH, EMBED = 'act_batch', 'act_length', 'act_embed'
HEADS, KV_HEADS, MLP, VOCAB = 'act_heads', 'act_kv_heads', 'act_mlp', 'act_vocab'


def constrain(x: jax.Array, *trailing: str | None) -> jax.Array:
  """x with its leading axis named BATCH, the last ones `trailing`, any between LENGTH."""
  names = (BATCH,) + (LENGTH,) * (x.ndim - 1 - len(trailing)) + trailing
  return nn.with_logical_constraint(x, names)
