"""Issue 65: the late step (late_binding) on this kernel, without Hermes: what runs before a job is known sees the
allowed roots and the tool caches as empty read-only folders; bound to a job, its console script runs in the
job's folder with the job's environment, writes there and in its project's cache, and is refused a sibling folder
and another project's cache; as this user (root in CI) and as another through setpriv."""
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from claude_hermes_bridge import late_binding, sandbox
from conftest import require_sandbox

pytestmark = pytest.mark.posix("Linux's mount namespaces and Landlock")

PROBE = """import json, os
found = {{"listed": sorted(os.listdir({root!r})), "cache": sorted(os.listdir({cache!r}))}}
try:
    open(os.path.join({root!r}, "ahead.txt"), "w").close()
    found["wrote"] = True
except OSError as exc:
    found["wrote"] = exc.strerror
with open(os.path.join({tmp!r}, "ahead.json"), "w") as handle:
    json.dump(found, handle)
"""
SCRIPT = """#!{python}
import os, sys
found = {{"argv": sys.argv, "cwd": os.getcwd(), "marker": os.environ.get("JOB_SAYS"),
         "listed": sorted(os.listdir(os.path.dirname(os.getcwd())))}}
try:
    found["read"] = open({kept!r}).read()
except OSError as exc:
    found["read"] = exc.strerror
for path in ("here.txt", {sibling!r}, {project!r}, {other!r}):
    try:
        with open(path, "w") as handle:
            handle.write("x")
        found[path] = "written"
    except OSError as exc:
        found[path] = exc.strerror
import json
with open("found.json", "w") as handle:
    json.dump(found, handle)
"""


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A folder beside /tmp that another user may enter (pytest's own is root's alone)."""
    folder = Path(tempfile.mkdtemp(prefix="bridge-test-"))
    folder.chmod(0o777)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("where", ["outside the home", "in the home"])
@pytest.mark.parametrize("user", ["this user", "nobody"])
def test_the_late_step_hides_the_roots_until_bound_then_runs_the_job_in_its_folder_only(shared_tmp: Path,
                                                                                          user: str,
                                                                                          where: str) -> None:
    """A root in the user's home (read by allow-list: a sibling folder unreadable, as to a cold job) or outside
    it (readable, as to a cold job; never writable)."""
    require_sandbox()
    if user == "nobody" and os.geteuid() != 0:
        pytest.skip("setpriv to another user needs root (CI runs as root)")
    tmp_path = shared_tmp
    user_home = str(tmp_path / "user-home") if where == "in the home" else str(Path.home())
    root = tmp_path / "user-home" / "work" if where == "in the home" else tmp_path / "root"
    cache, tmp, home = (tmp_path / name for name in ("cache", "tmp", "home"))
    folder, sibling = root / "job", root / "sibling"
    project, other = cache / "project", cache / "other"
    for made in (folder, sibling, project, other, tmp, home, tmp_path / "ahead"):
        made.mkdir(parents=True)
    (sibling / "kept.txt").write_text("the sibling's")
    (tmp_path / "ahead" / "probe_ahead.py").write_text(PROBE.format(root=str(root), cache=str(cache), tmp=str(tmp)))
    script = tmp_path / "hermes"
    script.write_text(SCRIPT.format(python=sys.executable, sibling=str(sibling / "x.txt"),
                                    kept=str(sibling / "kept.txt"), project=str(project / "y.txt"),
                                    other=str(other / "z.txt")))
    script.chmod(0o755)
    package_parent = Path(late_binding.__file__).parents[1]
    if user == "nobody":  # the package copied where another user reads it (as conftest.step_as does)
        package_parent = tmp_path / "step-package"
        (package_parent / "claude_hermes_bridge").mkdir(parents=True)
        for name in ("__init__.py", "sandbox.py", "late_binding.py"):
            shutil.copyfile(Path(late_binding.__file__).parent / name, package_parent / "claude_hermes_bridge" / name)
        subprocess.run(["chmod", "-R", "a+rwX", str(tmp_path)], check=True)
    prefixes = [str(package_parent), sys.prefix, sys.base_prefix, str(tmp_path / "ahead")]
    first_layer = [str(tmp), str(home), str(root), str(cache), *sandbox.devices()]
    ours, helpers = socket.socketpair()
    spec = {"writable": first_layer,
            "unreadable": sandbox.unreadable_paths(user_home, [], [*first_layer, *prefixes, str(script)]),
            "covers": [str(root), str(cache)], "mounts": [], "ports": [], "own_network": None,
            "helper": helpers.fileno(), "folder": str(tmp), "modules": ["probe_ahead"], "tested": False, "import_s": 30}
    as_user = [] if user == "this user" else ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    argv = late_binding.late_step_argv(sys.executable, str(script), spec)
    argv[3] = str(package_parent)
    proc = subprocess.Popen([*as_user, *argv],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=tmp, pass_fds=[helpers.fileno()],
                            env=dict(os.environ, PYTHONPATH=str(tmp_path / "ahead")))
    helpers.close()
    assert proc.stdout and proc.stdin
    said = json.loads(proc.stdout.readline())
    assert said["method"] == late_binding.IMPORTED and said["params"]["threads"] == 1, said
    ahead = json.loads((tmp / "ahead.json").read_text())
    assert ahead == {"listed": [], "cache": [], "wrote": "Read-only file system"}, ahead

    writable = [str(folder), str(tmp), str(home), str(project), *sandbox.devices()]
    unreadable = sandbox.unreadable_paths(user_home, [], [*writable, *prefixes, str(script)])
    request = {"writable": writable, "unreadable": unreadable, "mounts": []}
    ours.sendall((json.dumps(request) + "\n").encode())
    assert ours.recv(4096) == b"bound\n"
    job = {"folder": str(folder), "writable": writable, "unreadable": unreadable, "environment": {"JOB_SAYS": "hi"}}
    proc.stdin.write((json.dumps(job) + "\n").encode())
    proc.stdin.close()
    assert proc.wait(30) == 0
    found = json.loads((folder / "found.json").read_text())
    assert found["argv"] == [str(script), "acp"] and found["cwd"] == str(folder) and found["marker"] == "hi"
    assert found["here.txt"] == "written" and (project / "y.txt").exists()
    assert found[str(sibling / "x.txt")] != "written" and not (sibling / "x.txt").exists()
    assert found[str(other / "z.txt")] != "written" and not (other / "z.txt").exists()
    assert not (root / "ahead.txt").exists()
    if where == "in the home":
        assert found["read"] != "the sibling's" and found["listed"] == ["job"], found
    else:
        assert found["read"] == "the sibling's" and found["listed"] == ["job", "sibling"], found


def test_the_modules_python_reports_importing_are_read_in_order_and_nothing_else_is() -> None:
    """What a late standby imports ahead comes from a recording Hermes' stderr (late_standby.record_ahead): Python's
    own import-time report is read, a module before the package that imported it, and no other line counts."""
    from claude_hermes_bridge.late_standby import imported_names

    report = subprocess.run([sys.executable, "-X", "importtime", "-c", "import json"], capture_output=True,
                            check=True).stderr
    forged = b"import time: 1 | 2 | os; rm -rf ~\nimport time: 1 | 2 |   ../evil\nHermes says: import time: 1 | 2 | x\n"
    names = imported_names(report + forged)
    assert names.index("json.decoder") < names.index("json") and "json.scanner" in names
    assert not [name for name in names if not name.replace("_", "a").replace(".", "a").isalnum()], names
    assert "x" not in names


THREAD_STARTERS = """import json, os, sys
sys.path.insert(0, sys.argv[1])
from claude_hermes_bridge.late_binding import without_thread_starters, thread_count
kept, left_out = without_thread_starters(["plain", "uses_starter", "starter", "fails"], 30)
print(json.dumps({"kept": kept, "left_out": left_out, "threads": thread_count(),
                  "imported": sorted(name for name in ("plain", "uses_starter", "starter") if name in sys.modules)}))
"""


def test_modules_that_start_a_thread_at_import_are_left_out_without_this_process_starting_one(
        tmp_path: Path) -> None:
    """A thread started before the job is known would keep only the first layer (the job's is entered by the
    calling thread): the step finds, in forked children, each module whose import starts one, directly or through
    a module it imports, and imports neither in itself."""
    (tmp_path / "plain.py").write_text("VALUE = 1\n")
    (tmp_path / "starter.py").write_text("import threading, time\nthreading.Thread(target=time.sleep, args=(60,), "
                                         "daemon=True).start()\n")
    (tmp_path / "uses_starter.py").write_text("import starter\n")
    (tmp_path / "fails.py").write_text("raise SystemExit(3)\n")
    done = subprocess.run([sys.executable, "-c", THREAD_STARTERS, str(Path(__file__).resolve().parent.parent)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(done.stdout) == {"kept": ["plain", "fails"], "left_out": ["uses_starter", "starter"],
                                       "threads": 1, "imported": []}
