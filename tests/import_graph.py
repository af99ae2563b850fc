"""Who imports whom inside transformer_jax, one node per package or top-level module.

    python tests/import_graph.py [ROOT]   # ROOT: a checkout (default: this one)

prints one line per node, 'models -> errors, layers, model_config', read from every module's
import statements (those inside functions included) without importing anything.
"""
import ast
import pathlib
import sys

PACKAGE = 'transformer_jax'


def node_of(module: str) -> str:
  """'transformer_jax.train.setup' -> 'train'; the package itself is PACKAGE."""
  parts = module.split('.')
  return parts[1] if len(parts) > 1 else PACKAGE


def _module_name(path: pathlib.Path, root: pathlib.Path) -> str:
  parts = path.relative_to(root).with_suffix('').parts
  return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)


def _imported(tree: ast.AST, modules: set[str]) -> set[str]:
  """The modules of PACKAGE that a module's import statements name."""
  found = set()
  for statement in ast.walk(tree):
    if isinstance(statement, ast.Import):
      found.update(alias.name for alias in statement.names)
    elif isinstance(statement, ast.ImportFrom) and statement.module:
      for alias in statement.names:  # `from pkg import module` imports that module
        submodule = f'{statement.module}.{alias.name}'
        found.add(submodule if submodule in modules else statement.module)
  return {name for name in found if name == PACKAGE or name.startswith(PACKAGE + '.')}


def module_imports(root: pathlib.Path) -> dict[str, set[str]]:
  """{module: the package's modules it imports} for every module under root/PACKAGE."""
  paths = sorted((root / PACKAGE).rglob('*.py'))
  modules = {_module_name(path, root) for path in paths}
  return {_module_name(path, root): _imported(ast.parse(path.read_text()), modules)
          for path in paths}


def graph(root: pathlib.Path) -> dict[str, set[str]]:
  """{node: the other nodes its modules import}."""
  edges = {}
  for module, imported in module_imports(root).items():
    node = node_of(module)
    edges.setdefault(node, set()).update(node_of(name) for name in imported)
    edges[node].discard(node)
  return edges


def lines(edges: dict[str, set[str]]) -> list[str]:
  return [f'{node} -> {", ".join(sorted(targets)) or "(nothing)"}'
          for node, targets in sorted(edges.items())]


if __name__ == '__main__':
  checkout = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parents[1])
  print('\n'.join(lines(graph(checkout))))
