"""Imports point down: bin/ → vkit/cli/ → the library, and the library never imports vkit.cli."""

from __future__ import annotations

import ast
import os

import pytest

pytestmark = pytest.mark.unit

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "vkit")


def _absolute(module: str, node: ast.ImportFrom) -> str:
    """The absolute name a ``from ... import`` refers to, inside the package ``module`` belongs to."""
    if not node.level:
        return node.module or ""
    parts = module.split(".")[:-node.level]
    return ".".join(parts + ([node.module] if node.module else []))


def imported(source: str, module: str) -> list[tuple[int, str]]:
    """(line, module name) for every import in ``source``, the module ``module``'s text:
    import statements at any depth, ``from`` imports (relative ones resolved, each imported
    name as a possible submodule) and ``importlib.import_module`` / ``__import__`` of a literal."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, node)
            out.append((node.lineno, base))
            out += [(node.lineno, f"{base}.{a.name}" if base else a.name) for a in node.names]
        elif isinstance(node, ast.Call) and node.args:
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            target = _literal_prefix(node.args[0])
            if name in ("import_module", "__import__") and target:
                out.append((node.lineno, target))
    return out


def _literal_prefix(arg: ast.expr) -> str | None:
    """A string literal, or the literal start of an f-string (``f"vkit.cli.{tool}"`` → ``vkit.cli.``)."""
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
        return str(arg.values[0].value)
    return None


def cli_edges(source: str, module: str) -> list[str]:
    return [f"{module}:{line} imports {name}" for line, name in imported(source, module)
            if name == "vkit.cli" or name.startswith("vkit.cli.")]


def library_modules() -> list[tuple[str, str]]:
    mods = []
    for d, dirs, files in os.walk(ROOT):
        rel = os.path.relpath(d, os.path.dirname(ROOT))
        if rel.split(os.sep)[:2] == ["vkit", "cli"]:
            dirs[:] = []
            continue
        for f in sorted(files):
            if f.endswith(".py"):
                name = ".".join(rel.split(os.sep) + ([] if f == "__init__.py" else [f[:-3]]))
                mods.append((name, os.path.join(d, f)))
    return mods


def test_the_library_never_imports_the_cli():
    mods = library_modules()
    assert len(mods) > 20 and ("vkit.tune.context", os.path.join(ROOT, "tune", "context.py")) in mods
    edges = []
    for name, path in mods:
        with open(path, encoding="utf-8") as f:
            edges += cli_edges(f.read(), name)
    assert edges == []


@pytest.mark.parametrize("source", [
    "import vkit.cli.gate\n",
    "from vkit.cli import check_invariants\n",
    "from vkit import cli\n",
    "def f():\n    from vkit.cli._common import IO\n",
    "from ..cli import gate\n",
    "import importlib\nm = importlib.import_module('vkit.cli.rollback')\n",
    "import importlib\ndef call(tool):\n    return importlib.import_module(f'vkit.cli.{tool}')\n",
])
def test_an_edge_is_found(source):
    assert cli_edges(source, "vkit.search.space")


def test_no_edge_in_library_imports():
    src = "import vkit.client\nfrom vkit import gate\nfrom . import space\nfrom vkit.climate import x\n"
    assert cli_edges(src, "vkit.search.front") == []


def signal_setups(source: str) -> list[int]:
    """Lines that install a signal handler: ``signal.signal``, ``signal(...)`` imported from
    signal, ``loop.add_signal_handler``."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute) and (f.attr == "add_signal_handler"
                                                 or (f.attr == "signal" and isinstance(f.value, ast.Name) and f.value.id == "signal")):
                lines.append(node.lineno)
            elif isinstance(f, ast.Name) and f.id == "signal":
                lines.append(node.lineno)
    return lines


def module_state(source: str) -> list[int]:
    """Lines that rebind module state from inside a function (``global``)."""
    return [n.lineno for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Global)]


def test_the_library_installs_no_signal_handler_and_keeps_no_module_state():
    found = []
    for name, path in library_modules():
        with open(path, encoding="utf-8") as f:
            src = f.read()
        found += [f"{name}:{n} installs a signal handler" for n in signal_setups(src)]
        found += [f"{name}:{n} rebinds module state (global)" for n in module_state(src)]
    assert found == []


@pytest.mark.parametrize("source, finder", [
    ("import signal\nsignal.signal(signal.SIGINT, print)\n", signal_setups),
    ("from signal import signal, SIGTERM\nsignal(SIGTERM, print)\n", signal_setups),
    ("async def f(loop, stop):\n    loop.add_signal_handler(15, stop.set)\n", signal_setups),
    ("_SEL = None\ndef f():\n    global _SEL\n    _SEL = 1\n", module_state),
])
def test_signal_and_state_finders_find(source, finder):
    assert finder(source)


def test_sending_a_signal_is_not_installing_one():
    assert signal_setups("import os, signal\nos.killpg(1, signal.SIGTERM)\n") == []


SHARED = {"errors", "state", "interrupts", "jsonio"}
# What each stage package may import besides the shared modules: data flows measure → validate →
# decide → apply → tune; the parameter policy (apply.policy) is read by validate and decide too.
STAGE_DEPS = {
    "measure": set(),
    "validate": {"apply.policy"},
    "decide": {"validate", "apply.policy"},
    "apply": {"measure"},
    # the tune runs on the simulator's virtual backend (tune.virtual) as on a process
    "tune": {"measure", "validate", "decide", "apply", "search", "sim"},
    "search": set(),
    # a virtual run (predict.bench_summary, sim.virtual) takes bench_stream's workload and summarises its
    # requests with bench_stream's own code: the simulator sits beside the measurement, not after it
    "sim": {"measure"},
    "report": {"tune.result"},  # the report renders the tune's typed result
}


def stage_violations(source: str, module: str) -> list[str]:
    stage = module.split(".")[1]
    allowed = STAGE_DEPS.get(stage)
    if allowed is None:
        return []
    bad = []
    for line, name in imported(source, module):
        parts = name.split(".")
        if parts[0] != "vkit" or len(parts) < 2 or parts[1] in SHARED or parts[1] == stage or parts[1].startswith("__"):
            continue
        if parts[1] in STAGE_DEPS and not any(".".join(parts[1:]).startswith(a) for a in allowed):
            bad.append(f"{module}:{line} imports {name}")
    return bad


def test_stages_import_only_the_stages_before_them():
    found = []
    for name, path in library_modules():
        if name.count(".") >= 2:
            with open(path, encoding="utf-8") as f:
                found += stage_violations(f.read(), name)
    assert found == []


def test_a_stage_importing_a_later_one_is_found():
    assert stage_violations("from vkit.tune.context import Tune\n", "vkit.measure.gauge")
    assert stage_violations("from vkit.apply import lifecycle\n", "vkit.validate.formats")
    assert stage_violations("from vkit.apply.policy import same_value\n", "vkit.validate.invariants") == []


def test_no_tool_writes_state_keys():
    """The state document is written through vkit.state's accessors; a tool only calls them."""
    cli = os.path.join(ROOT, "cli")
    found = []
    for f in sorted(os.listdir(cli)):
        if f.endswith(".py"):
            tree = ast.parse(open(os.path.join(cli, f), encoding="utf-8").read())
            found += [f"vkit/cli/{f}:{n.lineno}" for n in ast.walk(tree) if isinstance(n, ast.Call)
                      and isinstance(n.func, ast.Attribute) and n.func.attr == "transaction"]
    assert found == []


# -- no import circles ------------------------------------------------------------------------------
def top_level_imports(source: str, module: str, known: set[str]) -> set[str]:
    """The library modules ``module`` imports when it is loaded: import statements in its body and
    in blocks there (``if TYPE_CHECKING:``, ``try:``), not those inside a function (a deferred
    import is loaded when called, and does not tie the two modules' loading together), nor the
    packages ``module`` lies in (Python loads a package before any module inside it)."""
    out: set[str] = set()
    body = list(ast.parse(source).body)
    while body:
        node = body.pop()
        if isinstance(node, (ast.If, ast.Try)):
            body += [*node.body, *node.orelse, *getattr(node, "finalbody", []),
                     *(s for h in getattr(node, "handlers", []) for s in h.body)]
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [f"{_absolute(module, node)}.{a.name}" for a in node.names] + [_absolute(module, node)]
            out |= {n for n in names if n in known}
    return {n for n in out if not (module == n or module.startswith(n + "."))}


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                group = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    group.append(w)
                    if w == v:
                        break
                if len(group) > 1:
                    out.append(sorted(group))
    return out


def test_no_two_library_modules_import_each_other_when_loaded():
    mods = dict(library_modules())
    known = set(mods)
    graph = {m: top_level_imports(open(path).read(), m, known) for m, path in mods.items()}
    assert import_circles(graph) == []


def test_an_import_circle_is_found_even_through_type_checking_blocks():
    known = {"vkit.a", "vkit.b", "vkit.c", "vkit.d"}
    src = {"vkit.a": "from vkit.b import x\n",
           "vkit.b": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from vkit.c import y\n",
           "vkit.c": "import vkit.a\n",
           "vkit.d": "def f():\n    from vkit.a import x\n"}
    graph = {m: top_level_imports(s, m, known) for m, s in src.items()}
    assert graph["vkit.d"] == set()  # a deferred import inside a function is not a loading edge
    assert top_level_imports("from vkit.p import q\n", "vkit.p.r", {"vkit.p", "vkit.p.q"}) == {"vkit.p.q"}
    assert import_circles(graph) == [["vkit.a", "vkit.b", "vkit.c"]]
    graph["vkit.c"] = set()
    assert import_circles(graph) == []


# -- the code's shape, held: small modules, small classes, no reach into another object's private parts --------
def _code_shape():
    """bench/code_shape.py, the module that measures the shape for the before/after table (one definition)."""
    from tests.conftest import load_script

    return load_script(os.path.join(os.path.dirname(ROOT), "bench", "code_shape.py"), "vkit_code_shape")


def test_no_module_is_over_600_lines():
    shape = _code_shape()
    big = [f"{os.path.relpath(p, ROOT)}: {n}" for p in shape.modules(os.path.dirname(ROOT))
           if (n := shape.module_lines(open(p, encoding="utf-8").read())) > shape.MODULE_LINES]
    assert big == []


def test_the_tune_driver_stays_a_driver_of_at_most_300_lines():
    # what it runs lives beside it: the phases on the tune's parts, the run's inputs and results
    # (tune/runplan.py), slots (tune/slotrun.py), the result's assembly (tune/assemble.py)
    shape = _code_shape()
    path = os.path.join(ROOT, "tune", "driver.py")
    assert shape.module_lines(open(path, encoding="utf-8").read()) <= 300


def methods_of(source: str, name: str) -> list[str]:
    """The functions defined in class ``name``'s body (properties included)."""
    cls = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == name)
    return [n.name for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def test_the_tune_is_a_parameter_object_with_no_methods():
    # each phase is its own narrow object over it (seat, measurer, trials, ...); the one-object runner is gone
    assert not os.path.exists(os.path.join(ROOT, "tune", "runner.py"))
    assert methods_of(open(os.path.join(ROOT, "tune", "context.py"), encoding="utf-8").read(), "Tune") == []


def test_a_method_on_a_class_is_found():
    src = "class Tune:\n    x: int = 0\n\n    @property\n    def ledger(self):\n        return 1\n\n\nclass Other:\n    pass\n"
    assert methods_of(src, "Tune") == ["ledger"] and methods_of(src, "Other") == []


def test_no_class_has_over_25_methods_or_400_code_lines():
    shape = _code_shape()
    big = []
    for p in shape.modules(os.path.dirname(ROOT)):
        text = open(p, encoding="utf-8").read()
        big += [c for c in shape.class_shapes(p, ast.parse(text), text, os.path.dirname(ROOT))
                if c["methods"] > shape.CLASS_METHODS or c["code_lines"] > shape.CLASS_CODE_LINES]
    assert big == []


def test_a_class_of_26_methods_or_401_code_lines_is_found():
    shape = _code_shape()
    many = "class A:\n" + "".join(f"    def m{i}(self):\n        return {i}\n" for i in range(26))
    long = "class B:\n    '''doc\n    more doc'''\n    def m(self):\n" + "        x = 1\n" * 400 + "        # a comment\n\n"
    short = "class C:\n    def m(self):\n" + "        x = 1\n" * 398
    rows = {c["class"].split(":")[-1]: c for text in (many, long, short) for c in shape.class_shapes("m.py", ast.parse(text), text, ".")}
    assert rows["A"]["methods"] == 26 and rows["B"]["code_lines"] == 402 and rows["C"]["code_lines"] == 400
    assert rows["B"]["methods"] == 1


# argparse offers no public way to list a parser's actions: sim_predict's --grid reads them to type each value as
# the flag itself would (the one reach into a private member, and into the standard library's, not vkit's)
PRIVATE_READS_ALLOWED = {("cli/sim_predict.py", "parser._actions")}


def private_reaches(source: str) -> list[tuple[int, str]]:
    """(line, expression) for each ``x._name`` whose ``x`` is not ``self`` or ``cls``: another object's private member."""
    out = []
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, ast.Attribute) and n.attr.startswith("_") and not n.attr.startswith("__"):
            if isinstance(n.value, ast.Name) and n.value.id in ("self", "cls"):
                continue
            out.append((n.lineno, ast.unparse(n)))
    return out


def test_no_module_reaches_into_another_objects_private_members():
    found = []
    for p in _code_shape().modules(os.path.dirname(ROOT)):
        rel = os.path.relpath(p, ROOT)
        found += [f"{rel}:{line}: {expr}" for line, expr in private_reaches(open(p, encoding="utf-8").read())
                  if (rel, expr) not in PRIVATE_READS_ALLOWED]
    assert found == []


def test_a_reach_into_a_private_member_is_found():
    src = "def f(r):\n    r._measure_once()\n    self._ok()\n    return r.fleet._call, obj.__dict__\n"
    assert private_reaches(src) == [(2, "r._measure_once"), (4, "r.fleet._call")]


# the state file's readers: a StateFile's read() is called on these names (runner.sf, runner.svc, a worker's slot, sf)
STATE_FILE_NAMES = {"sf", "svc", "slot", "state_file"}
TRIAL_STATUSES = {"proposed", "applied", "done", "eliminated", "start_failed", "invalid", "skipped", "probe_started",
                  "probe_failed"}


def state_reads(source: str) -> list[tuple[int, str]]:
    """(line, expression) for each ``X.read()`` whose ``X`` is a state file (one of STATE_FILE_NAMES, or ``StateFile(...)``)."""
    out = []
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "read" and not n.args:
            x = n.func.value
            name = x.attr if isinstance(x, ast.Attribute) else x.id if isinstance(x, ast.Name) else \
                getattr(x.func, "id", "") if isinstance(x, ast.Call) else ""
            if name in STATE_FILE_NAMES or name == "StateFile":
                out.append((n.lineno, ast.unparse(n)))
    return sorted(out)


def status_literals(source: str) -> list[tuple[int, str]]:
    """(line, expression) for each trial status written as a string: ``t["status"] == "done"``, ``... in ("done", ...)``,
    ``status="done"``."""
    def literal(e: ast.expr) -> bool:
        consts = e.elts if isinstance(e, (ast.Tuple, ast.List, ast.Set)) else [e]
        return any(isinstance(c, ast.Constant) and c.value in TRIAL_STATUSES for c in consts)

    out = []
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, ast.Compare):
            sides = [n.left, *n.comparators]
            is_status = any(isinstance(s, ast.Subscript) and isinstance(s.slice, ast.Constant) and s.slice.value == "status"
                            for s in sides)
            if is_status and any(literal(s) for s in sides):
                out.append((n.lineno, ast.unparse(n)))
        elif isinstance(n, ast.keyword) and n.arg == "status" and literal(n.value):
            out.append((n.value.lineno, ast.unparse(n)))
    return sorted(out)


def _tune_modules() -> list[tuple[str, str]]:
    return [(os.path.relpath(p, ROOT), p) for _, p in library_modules() if os.path.relpath(p, ROOT).startswith("tune" + os.sep)]


def test_the_tune_reads_its_state_only_through_the_ledger():
    # vkit/tune/ledger.py: typed views of one read each (the kept configuration, trials, baselines, the server)
    found = [f"{rel}:{line}: {expr}" for rel, p in _tune_modules() if rel != os.path.join("tune", "ledger.py")
             for line, expr in state_reads(open(p, encoding="utf-8").read())]
    assert found == []


def test_a_state_read_is_found_and_a_decision_log_read_is_not():
    src = ("def f(runner, sf, p):\n    a = runner.sf.read()['kept']\n    b = sf.read()\n    c = runner.sf.log.read()\n"
           "    d = StateFile(p).read()\n    e = self.slot.read()\n    with open(p) as fh:\n        return fh.read()\n")
    assert [line for line, _ in state_reads(src)] == [2, 3, 5, 6]


def test_a_trials_status_is_never_a_string_in_the_tune():
    # vkit.tune.ledger.Status and its groups (PENDING, RANKED, FINISHED, PROBING)
    found = [f"{rel}:{line}: {expr}" for rel, p in _tune_modules() if rel != os.path.join("tune", "ledger.py")
             for line, expr in status_literals(open(p, encoding="utf-8").read())]
    assert found == []


def test_a_status_written_as_a_string_is_found():
    src = ("def f(t, r):\n    if t['status'] == 'done':\n        pass\n    if t['status'] in ('proposed', 'applied'):\n"
           "        r.update(t, status='invalid')\n    if t['status'] == Status.DONE or t['verdict'] == 'done':\n"
           "        r.update(t, status=Status.SKIPPED, decision='reject')\n")
    assert [line for line, _ in status_literals(src)] == [2, 4, 5]


# what a trial or confirmation is compared on travels as one vkit.tune.compare.Versus, never as loose arguments
LOOSE_COMPARISON_ARGS = {"guards", "baseline_key"}


def loose_comparisons(source: str) -> list[tuple[int, str]]:
    """(line, function) for each function that takes a guards list or a baseline key as its own parameter."""
    out = []
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names = {a.arg for a in n.args.args + n.args.kwonlyargs + n.args.posonlyargs}
            if names & LOOSE_COMPARISON_ARGS:
                out.append((n.lineno, n.name))
    return sorted(out)


def test_what_is_compared_travels_as_one_object():
    found = [f"{rel}:{line}: {name}" for rel, p in _tune_modules() for line, name in loose_comparisons(open(p, encoding="utf-8").read())]
    assert found == []


def test_a_loose_comparison_argument_is_found():
    src = ("def run(tid, baseline_key='baseline'):\n    pass\n\n\nclass C:\n    def gate(self, a, b, *, guards=None):\n        pass\n\n"
           "    def ok(self, versus, primary):\n        pass\n")
    assert loose_comparisons(src) == [(1, "run"), (6, "gate")]


def test_a_ray_worker_hosts_a_server_and_one_run_never_a_runner():
    # the node side restarts with vkit.tune.server.ProcessServer and measures with vkit.tune.onerun.OneRun: the
    # tune's decisions (its Tune and the phases on it) stay on the driver
    path = os.path.join(ROOT, "tune", "fleet.py")
    names = {name for _, name in imported(open(path, encoding="utf-8").read(), "vkit.tune.fleet")}
    assert "vkit.tune.server.ProcessServer" in names and "vkit.tune.onerun.OneRun" in names
    assert not any(n.split(".")[:3] == ["vkit", "tune", m] for n in names for m in ("context", "seat"))


# tests build a tune's objects as tune builds them: no instance conjured past its constructor
def bare_instances(source: str) -> list[tuple[int, str]]:
    """(line, class) for each ``X.__new__(X)`` or ``object.__new__(X)``: an object whose __init__ never ran."""
    out = []
    for n in ast.walk(ast.parse(source)):
        if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "__new__" and n.args
                and isinstance(n.args[0], ast.Name) and n.args[0].id != "cls"):  # cls: a class's own __new__
            out.append((n.lineno, n.args[0].id))
    return sorted(out)


def test_no_test_builds_an_object_without_its_constructor():
    tests = os.path.dirname(os.path.abspath(__file__))
    found = [f"{f}:{line}: {cls}" for f in sorted(os.listdir(tests)) if f.endswith(".py")
             for line, cls in bare_instances(open(os.path.join(tests, f), encoding="utf-8").read())]
    assert found == []


def test_a_bare_instance_is_found():
    src = "r = Tune.__new__(Tune)\nm = object.__new__(Measurer)\nx = super().__new__(cls)\nnew_tune(sf)\n"
    assert bare_instances(src) == [(1, "Tune"), (2, "Measurer")]
