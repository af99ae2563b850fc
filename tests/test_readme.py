"""The README's examples of using the modules in a model of your own run as they are written."""
import re

import pytest

from helpers import ROOT

SECTION = '## Use the modules in your own model'


def readme_examples() -> list[str]:
  readme = (ROOT / 'README.md').read_text()
  section = readme.split(SECTION, 1)[1].split('\n## ', 1)[0]
  return re.findall(r'```python\n(.*?)```', section, flags=re.S)


@pytest.mark.slow
def test_the_readme_examples_run_in_order():
  examples = readme_examples()
  assert len(examples) >= 5
  namespace = {}
  for number, code in enumerate(examples):
    exec(compile(code, f'README example {number}', 'exec'), namespace)  # pylint: disable=exec-used
  # What the examples claim, checked beyond their own asserts.
  assert namespace['out'].tokens.shape == (1, 6)
  count_params, leaves = namespace['accounting'].count_params, namespace['jax'].tree.leaves
  lm_params, regressor_params = namespace['lm_params'], namespace['regressor_params']
  assert count_params(lm_params)['mlp'] > 0 and count_params(lm_params)['other'] == 0
  assert count_params(regressor_params)['other'] == 64 + 1  # Dense(1) on width 64
  for params in (lm_params, regressor_params):
    assert count_params(params)['total'] == sum(x.size for x in leaves(params))
