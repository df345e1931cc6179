"""server.py's layout as its contents promise it: sections in the order data flows, each marked with the
program that uses it, nothing used above the section that defines it, and the supervisor (`--supervise`), a
program of its own in the same file, kept free of the MCP stack and of the server's sections."""
import ast
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import server

SOURCE = Path(server.__file__).read_text(encoding="utf-8")
BANNER_RE = re.compile(r"^# -{5,} (.+?) \[(server|supervisor|both)\]$")
PROGRAMS = {"server", "supervisor", "both"}


@dataclass
class Section:
    title: str
    program: str
    first_line: int
    defines: set[str]


def sections() -> list[Section]:
    """The file's sections in order, from their banners, with the top-level names each defines."""
    found = [Section("(before the first banner)", "both", 1, set())]
    for number, line in enumerate(SOURCE.splitlines(), start=1):
        if line.startswith("# ---"):
            match = BANNER_RE.match(line)
            assert match, f"line {number}: a banner without its program mark: {line!r}"
            found.append(Section(match.group(1), match.group(2), number, set()))
    for node in ast.parse(SOURCE).body:
        for name in defined_names(node):
            section_of(found, node.lineno).defines.add(name)
    return found


def defined_names(node: ast.stmt) -> list[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return [t.id for target in targets for t in ast.walk(target) if isinstance(t, ast.Name)]
    return []


def section_of(found: list[Section], line: int) -> Section:
    return [s for s in found if s.first_line <= line][-1]


def uses() -> list[tuple[Section, str, int]]:
    """Every load of a top-level name of the file, with the section it is loaded in; a function's own
    arguments and locals that share a top-level name are not uses of it."""
    found = sections()
    top = {name for section in found for name in section.defines}
    loads: list[tuple[Section, str, int]] = []

    def visit(node: ast.AST, local: frozenset[str]) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            for default in node.args.defaults + [d for d in node.args.kw_defaults if d is not None]:
                visit(default, local)
            if not isinstance(node, ast.Lambda):
                for decorator in node.decorator_list:
                    visit(decorator, local)
                for annotation in [a.annotation for a in all_arguments(node.args)] + [node.returns]:
                    if annotation is not None:
                        visit(annotation, local)
            names = {a.arg for a in all_arguments(node.args)} | assigned(node)
            body: list[ast.AST] = list(node.body) if isinstance(node.body, list) else [node.body]
            for child in body:
                visit(child, local | names)
            return
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in top and node.id not in local:
            loads.append((section_of(found, node.lineno), node.id, node.lineno))
        for child in ast.iter_child_nodes(node):
            visit(child, local)

    visit(ast.parse(SOURCE), frozenset())
    return loads


def all_arguments(arguments: ast.arguments) -> list[ast.arg]:
    return [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs,
            *[a for a in (arguments.vararg, arguments.kwarg) if a is not None]]


def assigned(function: ast.AST) -> set[str]:
    """The names a function binds itself (not those of the functions inside it)."""
    names: set[str] = set()
    todo = list(ast.iter_child_nodes(function))
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            continue
        if isinstance(node, ast.Lambda):
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        todo.extend(ast.iter_child_nodes(node))
    return names


def definer(found: list[Section], name: str) -> Section:
    return next(section for section in found if name in section.defines)


def contents_entries() -> dict[str, str]:
    """The contents at the top of the file: each chapter's name and its whole entry (continuation lines
    included)."""
    entries: dict[str, str] = {}
    name = ""
    for line in (server.__doc__ or "").splitlines():
        if re.match(r"^  \S", line):
            name = re.split(r" \.\.|  \[", line.strip(), maxsplit=1)[0]
            entries[name] = line
        elif name and line.startswith("    "):
            entries[name] += line
        else:
            name = ""
    return entries


def test_every_section_is_marked_with_its_program_and_listed_in_the_contents():
    found = sections()[1:]
    assert len(found) >= 15
    entries = contents_entries()
    for section in found:
        chapter = section.title.split(":")[0].split(" (")[0]
        assert chapter in entries, f"the contents do not list {chapter!r}"
        assert f"[{section.program}]" in entries[chapter], f"the contents do not mark {chapter!r} [{section.program}]"


def test_nothing_is_used_above_the_section_that_defines_it():
    found = sections()
    upward = [f"line {line}: {name} (defined in {definer(found, name).title!r}, used in {section.title!r})"
              for section, name, line in uses() if definer(found, name).first_line > section.first_line]
    assert upward == []


def test_the_supervisors_sections_use_nothing_of_the_servers():
    """main, which picks the program from the command line, is the one place that names both."""
    found = sections()
    main = next(node for node in ast.parse(SOURCE).body if isinstance(node, ast.FunctionDef) and node.name == "main")
    in_main = range(main.lineno, cast(int, main.end_lineno) + 1)
    crossing = [f"line {line}: {name} (a [server] name from {definer(found, name).title!r}, used in the "
                f"[{section.program}] section {section.title!r})"
                for section, name, line in uses()
                if section.program in ("supervisor", "both") and definer(found, name).program == "server"
                and line not in in_main]
    assert crossing == []


SERVER_STACK = ("mcp", "anyio", "pydantic", "argparse", "starlette", "httpx")


def test_a_supervisor_running_a_job_never_imports_the_mcp_stack(bridge):
    """The supervisor is started as start_job starts it, with -X importtime added (a flag of this process
    only: Hermes, a child, does not inherit it), runs a whole job, and its stderr lists every module it
    imported, including those imported late, inside functions."""
    launched = server.JobRequest(kind="run", task="say hi !sleep=1", cwd=str(bridge.root), max_turns=None,
                                 timeout_s=60, skills=[], toolsets=[])
    cfg = server.load_config(bridge.config)
    store = server.JobStore.of(cfg)
    store.ensure()
    job_id = store.claim_id(launched.task.encode())
    record = launched.record(job_id, str(store.log_path(job_id)))
    store.write(record)
    store.mark_active(job_id)
    env = dict(bridge.env, **{server.JOB_MARKER: record.marker})
    boot = server.supervisor_argv(job_id)
    with server.open_append(store.log_path(job_id)) as log:
        done = subprocess.run([boot[0], "-X", "importtime", *boot[1:]], stdin=subprocess.DEVNULL, stdout=log,
                              stderr=log, env=env, timeout=120, cwd=str(server.SERVER_DIR))
    assert done.returncode == 0
    final = store.read(job_id)
    assert final.state is server.JobState.OK, final.reason
    listing = store.log_path(job_id).read_text()
    imported = set(re.findall(r"^import time:\s+\d+ \|\s+\d+ \|\s*([\w.]+)", listing, re.MULTILINE))
    assert "psutil" in imported and "json" in imported  # the listing is real
    assert sorted(name for name in imported if name.split(".")[0] in SERVER_STACK) == []
