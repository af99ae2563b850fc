"""A family of a researcher's own, as one file and one registry entry: a language model whose
blocks mix tokens with a causal depthwise convolution instead of attention, built from our Block,
MLP, norms and embedding, with a setting of its own (conv_width) beside the text families'.
Importing this module registers 'conv_lm'; a config file can do the same, so that `launch.py`
trains it like the built-in families."""
import dataclasses
import functools
from typing import ClassVar

import flax.linen as nn
import jax.numpy as jnp

from transformer_jax import layers
from transformer_jax.models import common, registry
from transformer_jax.ranges import COUNT


@dataclasses.dataclass(frozen=True)
class ConvLMConfig(common.TextConfig):
  family: str = 'conv_lm'
  conv_width: int = 4  # the tokens each channel mixes

  RANGES: ClassVar = {**common.TextConfig.RANGES, 'conv_width': COUNT}


class CausalConv(nn.Module):
  """Each channel mixes its last `width` tokens; it fills a Block's attention slot, so it takes
  (and ignores) the arguments attention gets."""
  width: int = 4

  @nn.compact
  def __call__(self, x, *, mask=None, positions=None, cache_index=None):
    del mask, positions, cache_index
    padded = jnp.pad(x, ((0, 0), (self.width - 1, 0), (0, 0)))
    return nn.Conv(x.shape[-1], (self.width,), feature_group_count=x.shape[-1], padding='VALID',
                   name='conv')(padded)


class ConvLM(nn.Module):
  cfg: ConvLMConfig

  @nn.compact
  def __call__(self, tokens, *, deterministic=True):
    cfg = self.cfg
    embed = common.text_embed(cfg, name='embed')
    block = functools.partial(
        layers.Block, attention=functools.partial(CausalConv, cfg.conv_width),
        mlp=functools.partial(layers.MLP, hidden=cfg.hidden_dim, activation=cfg.mlp),
        norm=common.norm(cfg))
    x = layers.BlockStack(block, cfg.num_layers, name='blocks')(
        embed(tokens, common.default_positions(tokens)), deterministic=deterministic)
    return embed.attend(common.norm(cfg)(name='final_norm')(x))


FAMILY = registry.register(registry.Family(**common.text_family(
    name='conv_lm', module=ConvLM,
    logits=lambda apply, batch: apply(batch['inputs']), task='next_token', config=ConvLMConfig,
    packed_shapes=registry.text_packed_shapes)))
