"""The peak memory of a command run in a process of its own (the memory benchmarks'): its peak
resident set (ru_maxrss, which counts the pages of memory-mapped files it has touched) and its
peak anonymous memory (heap and stacks, sampled from /proc every 50 ms), which a memory-mapped
dataset leaves alone."""
import os
import subprocess
import sys
import tempfile
import time

_PEAK_OF_CHILD = ('import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True); '
                  'print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)')


def peak_rss_mib(command: list[str]) -> float:
  """The peak resident memory of `command`, run in a process of its own."""
  out = subprocess.run([sys.executable, '-c', _PEAK_OF_CHILD, *command], check=True,
                       capture_output=True, text=True).stdout
  return int(out.split()[-1]) / 1024  # ru_maxrss is in KiB on Linux


def peak_memory_mib(command: list[str]) -> dict[str, float]:
  """{'peak_rss_mib', 'peak_anon_mib'} of `command`; raises if it fails."""
  with tempfile.TemporaryFile() as log:
    process = subprocess.Popen(command, stdout=log, stderr=log)
    peak_anon = 0
    while True:
      pid, status, usage = os.wait4(process.pid, os.WNOHANG)
      if pid:
        break
      peak_anon = max(peak_anon, _anonymous_kib(process.pid))
      time.sleep(0.05)
    if os.waitstatus_to_exitcode(status):
      log.seek(0)
      raise RuntimeError(f'{command} failed:\n{log.read().decode()[-3000:]}')
  return {'peak_rss_mib': usage.ru_maxrss / 1024, 'peak_anon_mib': peak_anon / 1024}


def _anonymous_kib(pid: int) -> int:
  try:
    with open(f'/proc/{pid}/status') as status:
      return next(int(line.split()[1]) for line in status if line.startswith('RssAnon:'))
  except (FileNotFoundError, StopIteration, ProcessLookupError):
    return 0
