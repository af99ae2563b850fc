"""transformer_jax: every transformer family as Flax Linen modules, with one training loop, one
decoding loop and their accounting.

    from transformer_jax import layers, kernels, models, decode, accounting, train, convert

layers: Attention, MLP, Block, BlockStack, norms and embeddings, each usable alone with plain
arguments. kernels: the softmax(QK^T)V kernels attention runs, chosen for the platform compiled
for. models: the families (ViT, decoder, encoder, encoder-decoder), `build(config.model)`,
and the registry a family of your own joins. decode: samplers and cached generation for any
module that follows its cache protocol. accounting: parameters, FLOPs and KV-cache bytes, by
formula for our families and from the tree or XLA for any model. train: the training loop and
evaluation. data: the datasets and their batches. convert: Hugging Face checkpoints in and out.

Each subpackage is imported when first used (PEP 562), so that `import transformer_jax.layers`
imports the layers alone, not the models, training or data code above them.
"""
import importlib

__version__ = '0.1.0'
__all__ = ['accounting', 'convert', 'data', 'decode', 'kernels', 'layers', 'models', 'train']


def __getattr__(name: str):
  if name in __all__:
    return importlib.import_module(f'{__name__}.{name}')
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


def __dir__() -> list[str]:
  return sorted(set(globals()) | set(__all__))
