"""Where a compiled step's time goes: a jax.profiler trace's XLA op events, matched by name to
the step's optimized HLO, summed by the kind of work (matrix products, elementwise fusions,
reductions, data movement) and by the model's part (the pass and the module path that JAX
records in each op's metadata).

Op events are named by their HLO instruction (XLA:CPU's thunks, GPU kernels and TPU ops all
are); a trace event whose name the HLO does not hold (the runtime's own, Python's) is not an op.
Control ops (while, conditional, call) are left out: the ops of their bodies are counted.
XLA:CPU runs independent ops side by side on its threads, so each op is given its share of the
wall time: a stretch during which n ops run is split evenly among them. The shares then add up
to the time during which some op ran, and an op slowed by a neighbour (an elementwise loop
beside a matmul that wants every core) is not counted twice. Beside them, the summed op time
(each op's own duration): its ratio to the shares says how much the ops overlapped.
"""
import collections
import dataclasses
import glob
import gzip
import json
import os
import re

_INSTRUCTION = re.compile(
    r'^\s*(?:ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=\s*.*?\s(?P<opcode>[a-z][\w\-]*)\((?P<rest>.*)$')
_COMPUTATION = re.compile(r'^(?:ENTRY\s+)?%?(?P<name>[\w.\-]+)\s.*\{\s*$')  # unindented
_CALLS = re.compile(r'calls=%?([\w.\-]+)')
_APPLIES = re.compile(r'to_apply=%?([\w.\-]+)')  # a reduction's or a scatter's scalar body
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_CONTROL_SCOPE = re.compile(r'cond|branch_\d+_fun|while|body_fun|cond_fun')
_CONTROL = {'while', 'conditional', 'call', 'async-start', 'async-done'}
_MOVEMENT = {'copy', 'transpose', 'bitcast', 'broadcast', 'slice', 'concatenate', 'reshape',
             'dynamic-slice', 'dynamic-update-slice', 'pad', 'parameter', 'constant', 'tuple',
             'get-tuple-element', 'gather', 'scatter', 'iota', 'reverse', 'copy-start',
             'copy-done'}
MATMUL, ELEMENTWISE, REDUCTION, MOVEMENT = ('matrix products', 'elementwise',
                                            'reductions', 'data movement')


@dataclasses.dataclass(frozen=True)
class Op:
  """One instruction of the optimized HLO: its kind of work and the model part it came from."""
  name: str
  kind: str
  part: str


def _kind(opcode: str, called: set[str]) -> str:
  """The kind of work of an instruction of `opcode` whose fused computation (if any) holds the
  opcodes `called`."""
  opcodes = called or {opcode}
  if opcodes & {'dot', 'convolution'}:
    return MATMUL
  if opcodes & {'reduce', 'reduce-window', 'all-reduce', 'reduce-scatter'}:
    return REDUCTION
  if opcodes <= _MOVEMENT:
    return MOVEMENT
  if opcode == 'custom-call':
    return 'custom calls'
  return ELEMENTWISE


def model_part(op_name: str, depth: int = 4) -> str:
  """'forward', 'backward' or 'update' and the module path of an op's metadata, its layer
  numbers dropped: 'jit(step)/transpose(jvp(Whisper))/Whisper.encode/encoder/block_1/
  block_1._sublayer/attn/dot_general' -> 'backward encoder/block/attn'. Ops outside the
  model's forward and backward (the optimizer's update, the loss's sums) are 'update'; ops
  without metadata (some that XLA makes) 'unattributed'."""
  if not op_name:
    return 'unattributed'
  segments = op_name.split('/')
  model = next((i for i, s in enumerate(segments) if s.startswith(('jvp(', 'transpose('))), None)
  if model is None:
    return 'update'
  direction = 'backward' if segments[model].startswith('transpose(') else 'forward'
  modules = []
  for segment in segments[model + 1:-1]:  # the last is the primitive
    if ('(' in segment or '.' in segment or '->' in segment or ',' in segment
        or _CONTROL_SCOPE.fullmatch(segment)):
      continue  # transformations, a module's methods, einsum specs, platform_dependent's cond
    name = re.sub(r'_\d+$', '', segment)
    if not modules or modules[-1] != name:
      modules.append(name)
  return f'{direction} {"/".join(modules[:depth]) or "(model)"}'


def hlo_ops(hlo_text: str, depth: int = 4) -> dict[str, Op]:
  """The optimized HLO's instructions that run as ops of their own, by name: not control flow,
  not the inside of a fusion or of a reduction's body (the bodies of loops and conditionals
  run as ops)."""
  computations, current = collections.defaultdict(set), None
  instructions = []
  for line in hlo_text.splitlines():
    header = _COMPUTATION.match(line)
    if header:
      current = header['name']
      continue
    found = _INSTRUCTION.match(line)
    if found is None:
      continue
    computations[current].add(found['opcode'])
    instructions.append((current, found))
  inlined = {name for _, found in instructions
             for name in (_CALLS.findall(found['rest']) if found['opcode'] == 'fusion' else [])
             + _APPLIES.findall(found['rest'])}
  ops = {}
  for computation, found in instructions:
    if computation in inlined or found['opcode'] in _CONTROL:
      continue
    called = set().union(*(computations[name] for name in _CALLS.findall(found['rest'])))
    op_name = _OP_NAME.search(found['rest'])
    ops[found['name']] = Op(found['name'], _kind(found['opcode'], called),
                            model_part(op_name[1] if op_name else '', depth))
  return ops


def trace_events(directory: str) -> list[dict]:
  """The complete events of the newest *.trace.json.gz under `directory` (jax.profiler's)."""
  traces = glob.glob(os.path.join(directory, '**', '*.trace.json.gz'), recursive=True)
  if not traces:
    raise FileNotFoundError(f'No *.trace.json.gz under {directory}: trace with '
                            'jax.profiler.trace(directory) first.')
  with gzip.open(max(traces, key=os.path.getmtime)) as trace:
    payload = json.load(trace)
  events = payload['traceEvents'] if isinstance(payload, dict) else payload
  return [event for event in events if event.get('ph') == 'X']


@dataclasses.dataclass
class Summary:
  """Seconds per step, each op's share of the wall time (see the module's docstring): by kind
  of work, by model part, by op (its kind and part); `summed`: the ops' own durations added."""
  steps: int
  by_kind: dict[str, float]
  by_part: dict[str, float]
  by_op: dict[Op, float]
  summed: float

  @property
  def total(self) -> float:
    return sum(self.by_kind.values())

  def lines(self, top: int = 10) -> list[str]:
    """The summary as text: each kind, the `top` model parts and ops, in ms a step and %."""
    share = lambda seconds: f'{1e3 * seconds:8.2f} ms {seconds / self.total:6.1%}'
    lines = [f'ops ran {1e3 * self.total:.1f} ms a step, their own durations adding up to '
             f'{1e3 * self.summed:.1f} ms ({self.steps} steps traced; shares of the wall time '
             'where ops overlap)']
    for title, table in (('by kind', self.by_kind), ('by model part', self.by_part)):
      lines.append(f'  {title}:')
      lines += [f'    {share(s)}  {key}' for key, s in _largest(table, top)]
    lines.append('  largest ops:')
    lines += [f'    {share(s)}  {op.name} ({op.kind}, {op.part})'
              for op, s in _largest(self.by_op, top)]
    return lines


def _largest(table: dict, count: int) -> list:
  return sorted(table.items(), key=lambda item: -item[1])[:count]


def wall_shares(intervals: list[tuple[float, float, Op]]) -> dict[Op, float]:
  """Seconds of each op's share of the wall time: intervals (start, end, op) in microseconds,
  each stretch between consecutive starts and ends split evenly among the ops running in it."""
  boundaries = sorted({time for start, end, _ in intervals for time in (start, end)})
  starting = collections.defaultdict(list)
  for number, (start, _, _) in enumerate(intervals):
    starting[start].append(number)
  shares, running = collections.Counter(), set()
  for left, right in zip(boundaries, boundaries[1:]):
    running = {n for n in running | set(starting[left]) if intervals[n][1] > left}
    for number in running:
      shares[intervals[number][2]] += (right - left) * 1e-6 / len(running)
  return dict(shares)


def summarize(directory: str, hlo_text: str, steps: int, depth: int = 4) -> Summary:
  """The Summary of the newest trace under `directory` of `steps` runs of the executable whose
  optimized HLO is `hlo_text` (compiled.as_text())."""
  ops = hlo_ops(hlo_text, depth)
  intervals = [(float(event['ts']), float(event['ts']) + float(event.get('dur', 0)),
                ops[event['name']]) for event in trace_events(directory) if event['name'] in ops]
  if not intervals:
    raise ValueError(f'The trace under {directory} holds no op of this executable: was it '
                     'traced while the executable ran?')
  by_op = {op: seconds / steps for op, seconds in wall_shares(intervals).items()}
  summed = sum(end - start for start, end, _ in intervals) * 1e-6 / steps
  by_kind, by_part = collections.Counter(), collections.Counter()
  for op, seconds in by_op.items():
    by_kind[op.kind] += seconds
    by_part[op.part] += seconds
  return Summary(steps, dict(by_kind), dict(by_part), by_op, summed)
