"""A run built on compile-only TPU devices computes in bfloat16 under model.dtype='auto' and takes
its chip's peak for MFU (no TPU needed; the devices need the optional extra, which CI installs
for its slow step)."""
import pytest

pytest.importorskip('libtpu', reason="compile-only TPU devices need pip install -e '.[compile]'")

from train_helpers import small_config  # noqa: E402
from transformer_jax import targets  # noqa: E402
from transformer_jax.train import metrics, setup  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.mark.parametrize('name,peak', [('v5e:1x1', 197e12), ('v5p-8', 459e12)])
def test_a_run_for_a_tpu_computes_in_bfloat16_against_its_chips_peak(name, peak):
  target = targets.target(name)
  run = setup.build_run(small_config(), devices=target.devices)
  assert run.model_config.dtype == 'bfloat16' and run.model.cfg.dtype == 'bfloat16'
  assert run.model_config.weight_dtype.name == 'float32'
  assert metrics.peak_flops_per_device(None, run.mesh.devices.flat[0])[0] == peak
  explicit = setup.build_run(small_config(**{'model.dtype': 'float32'}), devices=target.devices)
  assert explicit.model.cfg.dtype == 'float32'
