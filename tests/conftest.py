"""Eight simulated CPU devices and LLVM level 0, set before jax is imported; a compilation cache
shared by the tests and the processes they start; strict rank promotion."""
import os

from process_env import FAST_COMPILE

for flag in ('--xla_force_host_platform_device_count=8', FAST_COMPILE):
  if flag not in os.environ.get('XLA_FLAGS', ''):
    os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') + ' ' + flag).strip()
os.environ.setdefault('JAX_PLATFORMS', 'cpu')

import tempfile  # noqa: E402

# Tokenized corpora and trained tokenizers go to a folder of the session's own, never the user's
# cache.
os.environ['TRANSFORMER_JAX_CACHE'] = tempfile.mkdtemp(prefix='transformer_jax_cache_')
# XLA's CPU compiles dominate the suite's time, and many tests compile the same programs (the
# same tiny train step, say): a compilation cache shared by the session's tests skips repeats.
# Set by environment before jax is imported, so that pytest-xdist's workers and the processes
# tests start (launch.py, multi-process runs) share the folder the controlling process made.
if 'TRANSFORMER_JAX_TEST_XLA_CACHE' not in os.environ:
  os.environ['TRANSFORMER_JAX_TEST_XLA_CACHE'] = tempfile.mkdtemp(prefix='transformer_jax_xla_')
os.environ['JAX_COMPILATION_CACHE_DIR'] = os.environ['TRANSFORMER_JAX_TEST_XLA_CACHE']
os.environ['JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS'] = '0'
os.environ['JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES'] = '0'

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update('jax_numpy_rank_promotion', 'raise')


@pytest.fixture
def rng():
  return jax.random.key(0)
