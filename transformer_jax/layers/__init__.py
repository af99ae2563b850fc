"""Layers shared by every family: one attention, one MLP, one block, the norms and embeddings."""
from transformer_jax.layers.attention import (Attention, cached_attention, causal_mask, padding_mask,
                                              reference_attention)
from transformer_jax.layers.block import Block, BlockStack
from transformer_jax.layers.embeddings import (PatchEmbed, TextEmbed, apply_rope,
                                               resize_position_grid, sinusoidal)
from transformer_jax.layers.linear import Linear
from transformer_jax.layers.mlp import Mlp
from transformer_jax.layers.norms import LayerNorm, RMSNorm, make_norm
