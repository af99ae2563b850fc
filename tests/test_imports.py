"""Imports go one way: each part of the package imports only the parts below it, so that the
layers are usable without the models, and the models without training or data code."""
import os
import subprocess
import sys

import pytest

import import_graph
from helpers import ROOT

# From the bottom up: a node may import only nodes of lower rows.
LAYERING = (
    ('errors', 'kernels'),
    ('ranges', 'layers', 'targets', 'diffusion'),
    ('settings',),
    ('model_config', 'lora', 'contrastive'),
    ('models',),
    ('accounting', 'decode', 'data', 'quantization'),
    ('convert',),  # a checkpoint's image processor becomes data.preprocess specs
    ('config_lib',),
    ('image_scores',),
    ('train',),
    ('memory',),
    ('aot',),
    ('describe',),  # with XLA's memory of the compiled step
    ('run',),
    ('sweep',),
    (import_graph.PACKAGE,),  # its subpackages are imported when first used (PEP 562)
)
RANK = {node: rank for rank, row in enumerate(LAYERING) for node in row}


def imported_modules(statement: str) -> list[str]:
  """The package's modules that `statement` imports, run in a fresh interpreter."""
  code = (f'{statement}; import sys; '
          f'print(*sorted(m for m in sys.modules if m.startswith("{import_graph.PACKAGE}")))')
  env = dict(os.environ, PYTHONPATH=str(ROOT))
  out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, cwd=ROOT,
                       env=env, timeout=300, check=True)
  return out.stdout.split()


def test_the_layers_import_nothing_but_the_layers_their_kernels_and_errors():
  modules = imported_modules('import transformer_jax.layers')
  assert 'transformer_jax.layers.attention' in modules
  outside = [m for m in modules
             if import_graph.node_of(m) not in ('layers', 'kernels', 'errors',
                                                import_graph.PACKAGE)]
  assert not outside, outside


def test_the_models_import_no_training_data_or_accounting_code():
  modules = imported_modules('import transformer_jax.models')
  assert 'transformer_jax.models.vit' in modules
  above = {'train', 'data', 'accounting', 'config_lib', 'decode', 'convert', 'run', 'describe',
           'memory', 'sweep'}
  assert not [m for m in modules if import_graph.node_of(m) in above]


def test_every_import_goes_down_the_layering():
  edges = import_graph.graph(ROOT)
  assert set(edges) == set(RANK), 'declare each node in LAYERING'
  assert {'models', 'model_config'} <= edges['accounting']  # the graph sees the imports
  assert edges['layers'] == {'errors', 'kernels'} and edges['kernels'] == set()
  upward = [f'{node} -> {target}' for node, targets in edges.items() for target in targets
            if RANK[target] >= RANK[node]]
  assert not upward, upward


@pytest.mark.parametrize('source,expected', [
    ('from transformer_jax import models, errors', {'models', 'errors'}),
    ('from transformer_jax.train import sharding', {'train'}),
    ('import transformer_jax.layers.attention', {'layers'}),
    ('def f():\n  from transformer_jax.models import registry', {'models'}),
    ('import jax', set()),
])
def test_the_graph_reads_every_form_of_import(tmp_path, source, expected):
  package = tmp_path / import_graph.PACKAGE
  for sub in ('models', 'train', 'layers'):
    (package / sub).mkdir(parents=True)
    (package / sub / '__init__.py').write_text('')
  (package / '__init__.py').write_text('')
  (package / 'errors.py').write_text('')
  (package / 'user.py').write_text(source)
  assert import_graph.graph(tmp_path)['user'] == expected
