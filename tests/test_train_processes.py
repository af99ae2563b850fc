"""launch.py in separate processes: SIGKILL and SIGTERM, and a 2-process run on localhost."""
import pathlib
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from process_env import process_env
from train_helpers import losses, small_config
from transformer_jax import train

pytestmark = pytest.mark.slow
ROOT = pathlib.Path(__file__).resolve().parent.parent
CONFIG = str(ROOT / 'tests' / 'train_helpers.py')


def launch(workdir, *flags, devices=1, **popen):
  env = process_env(devices)
  command = [sys.executable, str(ROOT / 'launch.py'), f'--config={CONFIG}:decoder',
             f'--workdir={workdir}', *flags]
  return subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, **popen)


def wait_for(predicate, process, timeout=300):
  start = time.time()
  while not predicate():
    if process.poll() is not None:
      raise AssertionError(f'The run ended early:\n{process.stdout.read()}')
    if time.time() - start > timeout:
      process.kill()
      raise AssertionError('Timed out.')
    time.sleep(0.2)


def finished_checkpoints(workdir):
  directory = pathlib.Path(workdir) / 'checkpoints'
  if not directory.exists():
    return []
  return sorted(int(p.name) for p in directory.glob('*') if p.name.isdigit())


def test_sigkill_after_a_checkpoint_then_restart_reproduces_the_losses(tmp_path):
  flags = ['--config.training.steps=30', '--config.training.checkpoint_every=5']
  reference = launch(tmp_path / 'reference', *flags)
  assert reference.wait(timeout=600) == 0, reference.stdout.read()
  run = launch(tmp_path / 'killed', *flags)
  wait_for(lambda: finished_checkpoints(tmp_path / 'killed'), run)
  run.send_signal(signal.SIGKILL)
  run.wait()
  killed_at = finished_checkpoints(tmp_path / 'killed')[-1]
  assert killed_at < 30
  again = launch(tmp_path / 'killed', *flags)
  output = again.communicate(timeout=600)[0]
  assert again.returncode == 0, output
  assert f'Resumed from the checkpoint at step {killed_at}' in output
  assert losses(tmp_path / 'killed') == losses(tmp_path / 'reference')


def test_sigterm_saves_a_checkpoint_and_exits_cleanly(tmp_path):
  run = launch(tmp_path, '--config.training.steps=100000')
  wait_for(lambda: (tmp_path / 'metrics.jsonl').exists() and len(losses(tmp_path)) >= 3, run)
  run.send_signal(signal.SIGTERM)
  output = run.communicate(timeout=300)[0]
  assert run.returncode == 0, output
  saved = finished_checkpoints(tmp_path)
  assert saved and saved[-1] == max(losses(tmp_path)), output
  assert f'SIGTERM: saved the checkpoint at step {saved[-1]}' in output


def test_a_second_run_on_a_workdir_is_refused_and_a_killed_run_leaves_it_free(tmp_path):
  first = launch(tmp_path, '--config.training.steps=100000')
  wait_for(lambda: (tmp_path / 'metrics.jsonl').exists(), first)
  second = launch(tmp_path, '--config.training.steps=100000')
  output = second.communicate(timeout=300)[0]
  assert second.returncode == 1, output
  assert output.splitlines()[-1].startswith(
      f'{tmp_path} is in use by process {first.pid} on {socket.gethostname()}: '), output
  first.send_signal(signal.SIGKILL)
  first.wait()
  third = launch(tmp_path, '--config.training.steps=3')
  output = third.communicate(timeout=600)[0]
  assert third.returncode == 0 and 'in use' not in output, output


def free_port():
  with socket.socket() as s:
    s.bind(('localhost', 0))
    return s.getsockname()[1]


def test_two_processes_give_the_losses_of_one(tmp_path):
  steps = '--config.training.steps=5'
  address = f'localhost:{free_port()}'
  runs = [launch(tmp_path / 'two', steps, f'--coordinator_address={address}',
                 '--num_processes=2', f'--process_id={i}', devices=2) for i in range(2)]
  for run in runs:
    assert run.wait(timeout=600) == 0, run.stdout.read()
  train.train(small_config('decoder', steps=5, **{'mesh.shape': (1,)}), str(tmp_path / 'one'))
  two, one = losses(tmp_path / 'two'), losses(tmp_path / 'one')
  assert list(two) == list(one) == [1, 2, 3, 4, 5]
  np.testing.assert_allclose(list(two.values()), list(one.values()), atol=1e-5)


def test_two_processes_of_four_devices_with_tensor_parallel_rules_give_the_losses_of_one(tmp_path):
  flags = ['--config.training.steps=5', '--config.model.d_ff=96', '--config.rule_set=tp',
           "--config.mesh.axes=('data', 'model')", '--config.mesh.shape=(4, 2)']
  address = f'localhost:{free_port()}'
  runs = [launch(tmp_path / 'two', *flags, f'--coordinator_address={address}',
                 '--num_processes=2', f'--process_id={i}', devices=4) for i in range(2)]
  for run in runs:
    assert run.wait(timeout=600) == 0, run.stdout.read()
  one = small_config('decoder', steps=5, **{'mesh.shape': (1,), 'model.d_ff': 96})
  train.train(one, str(tmp_path / 'one'))
  two, one = losses(tmp_path / 'two'), losses(tmp_path / 'one')
  assert list(two) == list(one) == [1, 2, 3, 4, 5]
  np.testing.assert_allclose(list(two.values()), list(one.values()), atol=1e-5)
