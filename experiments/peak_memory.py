"""The peak resident memory of a command run in a process of its own (the memory benchmarks')."""
import subprocess
import sys

_PEAK_OF_CHILD = ('import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True); '
                  'print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)')


def peak_rss_mib(command: list[str]) -> float:
  """The peak resident memory of `command`, run in a process of its own."""
  out = subprocess.run([sys.executable, '-c', _PEAK_OF_CHILD, *command], check=True,
                       capture_output=True, text=True).stdout
  return int(out.split()[-1]) / 1024  # ru_maxrss is in KiB on Linux
