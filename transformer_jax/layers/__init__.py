"""Layers shared by every family, each usable alone with plain arguments: one attention, one MLP,
one block and its stack, the norms, the embeddings, T5's relative position bias, DiT's
conditioning (adaLN-Zero, timestep and class embeddings), Whisper's audio stem and (in
layers.log_mel) its log-Mel front end."""
from transformer_jax.layers.attention import Attention, causal_mask, padding_mask, segment_mask
from transformer_jax.layers.audio_stem import AudioStem, stem_frames
from transformer_jax.layers.block import Block, BlockStack, row_blocks
from transformer_jax.layers.conditioning import (AdaLNZero, LabelEmbed, TimestepEmbed,
                                                 timestep_frequencies)
from transformer_jax.layers.embeddings import (PatchEmbed, TextEmbed, apply_rope,
                                               resize_position_grid, sinusoidal)
from transformer_jax.layers.linear import Linear
from transformer_jax.layers.mlp import MLP
from transformer_jax.layers.norms import LayerNorm, RMSNorm
from transformer_jax.layers.relative_position import RelativePositionBias

__all__ = ['AdaLNZero', 'Attention', 'AudioStem', 'Block', 'BlockStack', 'LabelEmbed',
           'LayerNorm', 'Linear', 'MLP', 'PatchEmbed', 'RelativePositionBias', 'RMSNorm',
           'TextEmbed', 'TimestepEmbed', 'apply_rope', 'causal_mask', 'padding_mask',
           'resize_position_grid', 'row_blocks', 'segment_mask', 'sinusoidal', 'stem_frames',
           'timestep_frequencies']
