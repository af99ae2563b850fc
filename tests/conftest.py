"""Eight simulated CPU devices, set before jax is imported, and strict rank promotion."""
import os

os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') +
                           ' --xla_force_host_platform_device_count=8').strip()
os.environ.setdefault('JAX_PLATFORMS', 'cpu')

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update('jax_numpy_rank_promotion', 'raise')


@pytest.fixture
def rng():
  return jax.random.key(0)
