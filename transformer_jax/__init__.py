"""transformer_jax: every transformer family as Flax Linen modules, with one training loop, one
decoding loop and their accounting.

    from transformer_jax import layers, models, decode, accounting, train, convert

layers: Attention, MLP, Block, BlockStack, norms and embeddings, each usable alone with plain
arguments. models: the families (ViT, decoder, encoder, encoder-decoder), `build(config.model)`,
and the registry a family of your own joins. decode: samplers and cached generation for any
module that follows its cache protocol. accounting: parameters, FLOPs and KV-cache bytes, by
formula for our families and from the tree or XLA for any model. train: the training loop and
evaluation. convert: Hugging Face checkpoints in and out.
"""
# models first: its families name accounting's formulas as they register, and accounting reads
# the registry, so models must be importing when accounting is first imported.
from transformer_jax import models  # noqa: I001  (the order matters)
from transformer_jax import accounting, convert, decode, layers, train

__version__ = '0.1.0'
__all__ = ['accounting', 'convert', 'decode', 'layers', 'models', 'train']
