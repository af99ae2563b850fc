"""The environment of the processes tests start (launch.py, multi-process runs): the tests' own
LLVM level, so that their results match the tests' to the bit and compile as fast, on the number
of CPU devices they ask for (one unless told)."""
import os

# LLVM's optimizations of XLA:CPU's code take most of a tiny program's compile (a small CLIP's
# init: 23-28 s at the default level, 5-6.5 s without), and the suite compiles thousands of
# tiny programs. Results differ only in how transcendental functions round (a unit in the last
# place of a few percent of that init's values), so a process compares with the tests' own
# results only at the same level. The benchmarks, which time code, run at the default level.
FAST_COMPILE = '--xla_backend_optimization_level=0'
_TESTS = os.path.dirname(os.path.abspath(__file__))
# A PYTHONPATH for a script run with `python -c`: the tests' modules and the project's package.
TESTS_AND_PROJECT = os.pathsep.join([_TESTS, os.path.dirname(_TESTS)])


def process_env(devices=1, **extra):
  flags = f'{FAST_COMPILE} --xla_force_host_platform_device_count={devices}'
  return dict(os.environ, JAX_PLATFORMS='cpu', XLA_FLAGS=flags, **extra)
