"""The package's layout as server.py's map promises it: one module per layer in the order data flows, each
marked with the program that uses it, importing only from the modules above it in the map, none too long, and
the supervisor (`--supervise`), a program of its own, kept free of the MCP stack and of the server's modules."""
import ast
import re
import subprocess
from dataclasses import dataclass

from claude_hermes_bridge.config import load_config
from claude_hermes_bridge.job_queue import supervisor_argv
from claude_hermes_bridge.jobs import JobState, JobStore
from claude_hermes_bridge.launch import JobRequest
from claude_hermes_bridge.preflight import PACKAGE_DIR, SERVER_DIR
from claude_hermes_bridge.processes import JOB_MARKER
from claude_hermes_bridge.safe_io import open_append
from harness import REPO, SERVER

MAP_LINE_RE = re.compile(r"^  (\w+) \.+ \[(server|supervisor|both)\]")
PROGRAM_RE = re.compile(r"^\[(server|supervisor|both)\] ")
MAX_LINES = 800
MAX_CLASS_LINES = 250


@dataclass
class Module:
    name: str
    program: str
    rank: int
    source: str


def package_map() -> list[tuple[str, str]]:
    """server.py's map of the package: (module, program) in layer order."""
    doc = ast.get_docstring(ast.parse(SERVER.read_text(encoding="utf-8"))) or ""
    return [(m.group(1), m.group(2)) for line in doc.splitlines() if (m := MAP_LINE_RE.match(line))]


def modules() -> list[Module]:
    ranked = {name: (rank, program) for rank, (name, program) in enumerate(package_map())}
    found = []
    for path in sorted(PACKAGE_DIR.glob("*.py")):
        if path.stem in ("__init__", "__main__"):
            continue
        assert path.stem in ranked, f"{path.name} is not in server.py's map of the package"
        rank, program = ranked[path.stem]
        found.append(Module(path.stem, program, rank, path.read_text(encoding="utf-8")))
    return found


def package_imports(module: Module) -> list[tuple[str, int]]:
    """Every module of the package this one imports, at the top or inside a function: (name, line)."""
    found = []
    for node in ast.walk(ast.parse(module.source)):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level == 1 and base:
                found.append((base.split(".")[0], node.lineno))
            elif node.level == 1 or base == "claude_hermes_bridge":
                found += [(alias.name, node.lineno) for alias in node.names]
            elif base.startswith("claude_hermes_bridge."):
                found.append((base.split(".")[1], node.lineno))
        elif isinstance(node, ast.Import):
            found += [(alias.name.split(".")[1], node.lineno) for alias in node.names
                      if alias.name.startswith("claude_hermes_bridge.")]
    return found


def test_the_map_lists_every_module_once_and_each_says_its_program_first():
    listed = [name for name, _ in package_map()]
    assert len(listed) == len(set(listed)) >= 15
    on_disk = {path.stem for path in PACKAGE_DIR.glob("*.py")} - {"__init__", "__main__"}
    assert set(listed) == on_disk
    for module in modules():
        doc = ast.get_docstring(ast.parse(module.source)) or ""
        assert PROGRAM_RE.match(doc), f"{module.name}'s docstring does not open with its program"
        assert f"[{module.program}]" in doc.split("\n")[0], f"{module.name}: the map and its docstring disagree"


def test_a_module_imports_only_from_the_modules_above_it():
    """The layer order, and so no cycle: every edge points up the map."""
    rank = {module.name: module.rank for module in modules()}
    upward = [f"{module.name} line {line} imports {name}" for module in modules()
              for name, line in package_imports(module) if rank[name] >= module.rank]
    assert upward == []


def test_the_supervisors_modules_import_nothing_of_the_servers():
    """entry, which picks the program, is the one module that names both."""
    program = {module.name: module.program for module in modules()}
    crossing = [f"{module.name} line {line} imports the [server] module {name}" for module in modules()
                if module.program in ("supervisor", "both") and module.name != "entry"
                for name, line in package_imports(module) if program[name] == "server"]
    assert crossing == []


def test_no_module_is_longer_than_the_limit():
    assert [(m.name, m.source.count("\n")) for m in modules() if m.source.count("\n") > MAX_LINES] == []


def test_no_class_is_longer_than_the_limit():
    """A class past MAX_CLASS_LINES holds more than one thing (the supervisor's phases, the ACP conversation's
    questions and steers were split out of two such)."""
    long = [(m.name, node.name, (node.end_lineno or node.lineno) - node.lineno + 1) for m in modules()
            for node in ast.walk(ast.parse(m.source)) if isinstance(node, ast.ClassDef)
            and (node.end_lineno or node.lineno) - node.lineno + 1 > MAX_CLASS_LINES]
    assert long == []


def test_only_the_mcp_edge_and_the_command_lines_client_import_mcp():
    importers = sorted(module.name for module in modules()
                       if re.search(r"^\s*(from|import) mcp\b", module.source, re.MULTILINE))
    assert importers == ["cli", "mcp_edge"]


def test_server_py_is_a_short_entry_that_guards_stdio_before_any_other_import():
    source = SERVER.read_text(encoding="utf-8")
    code = ast.parse(source).body[1:]  # after the docstring
    assert len(source.splitlines()) < 80
    assert [ast.unparse(node) for node in code][:4] == [
        "import os", "import sys", "sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))",
        "from claude_hermes_bridge.entry import console_main"]
    entry = (PACKAGE_DIR / "entry.py").read_text(encoding="utf-8")
    top_level = [node for node in ast.parse(entry).body if isinstance(node, (ast.Import, ast.ImportFrom))]
    assert [ast.unparse(node) for node in top_level] == [
        "import sys", "from claude_hermes_bridge.stdio_guard import guard_stdio, serves_protocol"]
    package_init = ast.parse((PACKAGE_DIR / "__init__.py").read_text(encoding="utf-8")).body
    assert all(isinstance(node, ast.Expr) for node in package_init)  # a docstring, nothing imported


SERVER_STACK = ("mcp", "anyio", "pydantic", "argparse", "starlette", "httpx")


def test_a_supervisor_running_a_job_never_imports_the_mcp_stack(bridge):
    """The supervisor is started as start_job starts it, with -X importtime added (a flag of this process
    only: Hermes, a child, does not inherit it), runs a whole job, and its stderr lists every module it
    imported, including those imported late, inside functions."""
    launched = JobRequest(kind="run", task="say hi !sleep=1", cwd=str(bridge.root), max_turns=None,
                                 timeout_s=60, skills=[], toolsets=[])
    cfg = load_config(bridge.config)
    store = JobStore.of(cfg)
    store.ensure()
    job_id = store.claim_id(launched.task.encode())
    record = launched.record(job_id, str(store.log_path(job_id)))
    store.write(record)
    store.mark_active(job_id)
    env = dict(bridge.env, **{JOB_MARKER: record.marker})
    boot = supervisor_argv(job_id)
    with open_append(store.log_path(job_id)) as log:
        done = subprocess.run([boot[0], "-X", "importtime", *boot[1:]], stdin=subprocess.DEVNULL, stdout=log,
                              stderr=log, env=env, timeout=120, cwd=str(SERVER_DIR))
    assert done.returncode == 0
    final = store.read(job_id)
    assert final.state is JobState.OK, final.reason
    listing = store.log_path(job_id).read_text()
    imported = set(re.findall(r"^import time:\s+\d+ \|\s+\d+ \|\s*([\w.]+)", listing, re.MULTILINE))
    assert "psutil" in imported and "json" in imported  # the listing is real
    assert sorted(name for name in imported if name.split(".")[0] in SERVER_STACK) == []


def test_a_fast_tier_test_that_reaches_for_a_real_component_fails_naming_the_marker() -> None:
    """Issue 68: the split cannot rot: a test not marked e2e that asks for a real component (require_component,
    require_tool) fails, saying to mark it; this test itself is in the fast tier."""
    import pytest

    from conftest import require_component, require_tool

    for reach in (lambda: require_component(REPO / "no-such-component", "a component"), lambda: require_tool("sh")):
        with pytest.raises(pytest.fail.Exception, match="a real component: mark it e2e"):
            reach()
