"""transformer_jax: every transformer family as Flax Linen modules, with their accounting."""
__version__ = '0.1.0'
