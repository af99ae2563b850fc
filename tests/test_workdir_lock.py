"""One training run per workdir: the lock refuses a second process and dies with its holder."""
import os
import signal
import socket
import subprocess
import sys

import pytest

from transformer_jax import run
from transformer_jax.errors import UserError
from transformer_jax.train import workdir_lock

from train_helpers import small_config

# Holds the workdir's lock until killed, after printing a line once it holds it.
HOLDER = ('import sys, time\n'
          'from transformer_jax.train import workdir_lock\n'
          'with workdir_lock.held(sys.argv[1]):\n'
          '  print("held", flush=True)\n'
          '  time.sleep(600)\n')

# Tries to take the lock once: prints "took" or the refusal.
TAKER = ('import sys\n'
         'from transformer_jax.errors import UserError\n'
         'from transformer_jax.train import workdir_lock\n'
         'try:\n'
         '  with workdir_lock.held(sys.argv[1]):\n'
         '    print("took")\n'
         'except UserError as error:\n'
         '  print(error)\n')


def hold(workdir):
  """A separate process that holds `workdir`'s lock until killed."""
  process = subprocess.Popen([sys.executable, '-c', HOLDER, str(workdir)], stdout=subprocess.PIPE,
                             text=True)
  assert process.stdout.readline() == 'held\n'
  return process


@pytest.fixture
def holder(tmp_path):
  """A process holding tmp_path's lock; killed at the end if still alive."""
  process = hold(tmp_path)
  yield process
  process.kill()
  process.wait()


def test_a_second_process_is_refused_with_the_host_and_pid_of_the_holder(tmp_path, holder):
  with pytest.raises(UserError) as refused:
    with workdir_lock.held(str(tmp_path)):
      pytest.fail('took a lock that another process holds')
  message = str(refused.value)
  assert f'process {holder.pid} on {socket.gethostname()}' in message
  assert str(tmp_path) in message and '\n' not in message


def test_a_lock_left_by_a_killed_process_does_not_block_the_next_run(tmp_path, holder):
  holder.send_signal(signal.SIGKILL)
  holder.wait()
  assert (tmp_path / workdir_lock.LOCK_FILE).read_text().split()[1] == str(holder.pid)  # left
  with workdir_lock.held(str(tmp_path)):
    written = (tmp_path / workdir_lock.LOCK_FILE).read_text().split()
    assert written == [socket.gethostname(), str(os.getpid())]


def test_the_lock_is_held_for_the_body_and_released_after_it_even_on_an_error(tmp_path):
  def take_elsewhere():
    return subprocess.run([sys.executable, '-c', TAKER, str(tmp_path)], capture_output=True,
                          text=True, check=True).stdout

  with pytest.raises(RuntimeError):
    with workdir_lock.held(str(tmp_path)):
      refusal = take_elsewhere()
      raise RuntimeError
  assert f'in use by process {os.getpid()} on {socket.gethostname()}' in refusal
  assert take_elsewhere() == 'took\n'


def test_a_run_refused_writes_nothing_to_the_workdir(tmp_path, holder):
  before = sorted(os.listdir(tmp_path))
  with pytest.raises(UserError, match=f'process {holder.pid} on'):
    run.run(small_config(steps=2), str(tmp_path), 'train')
  assert sorted(os.listdir(tmp_path)) == before == [workdir_lock.LOCK_FILE]


@pytest.mark.slow
def test_evaluation_and_sampling_read_a_workdir_that_a_run_holds(tmp_path):
  config = small_config(steps=2, **{'training.checkpoint_every': 2, 'sample.prompt': 'ab',
                                    'sample.max_new_tokens': 4})
  run.run(config, str(tmp_path), 'train')
  process = hold(tmp_path)
  try:
    assert run.run(config, str(tmp_path), 'eval')['step'] == 2
    assert run.run(config, str(tmp_path), 'sample')
  finally:
    process.kill()
    process.wait()
