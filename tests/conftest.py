"""Eight simulated CPU devices, set before jax is imported, and strict rank promotion."""
import os

if '--xla_force_host_platform_device_count=8' not in os.environ.get('XLA_FLAGS', ''):
  os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') +
                             ' --xla_force_host_platform_device_count=8').strip()
os.environ.setdefault('JAX_PLATFORMS', 'cpu')

import tempfile  # noqa: E402

# Tokenized corpora and trained tokenizers go to a folder of the session's own, never the user's
# cache.
os.environ['TRANSFORMER_JAX_CACHE'] = tempfile.mkdtemp(prefix='transformer_jax_cache_')

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update('jax_numpy_rank_promotion', 'raise')
# XLA's CPU compiles dominate the suite's time, and many tests compile the same programs (the
# same tiny train step, say): a compilation cache shared by the session's tests skips repeats.
# pytest-xdist's workers inherit the folder the controlling process made, so they share it.
if 'TRANSFORMER_JAX_TEST_XLA_CACHE' not in os.environ:
  os.environ['TRANSFORMER_JAX_TEST_XLA_CACHE'] = tempfile.mkdtemp(prefix='transformer_jax_xla_')
jax.config.update('jax_compilation_cache_dir', os.environ['TRANSFORMER_JAX_TEST_XLA_CACHE'])
jax.config.update('jax_persistent_cache_min_compile_time_secs', 0)
jax.config.update('jax_persistent_cache_min_entry_size_bytes', 0)


@pytest.fixture
def rng():
  return jax.random.key(0)
