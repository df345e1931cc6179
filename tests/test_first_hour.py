"""A new user's first hour (issue 19): `--check` that proves Hermes runs and names every place it looked for a
config, `--init-config` for users without a repository, errors about Hermes' path that name the path, its
source and what is wrong, and registrations through uvx that are checked before they are written."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import server
from conftest import require_component
from harness import REPO, SERVER, UV, make_fake_hermes, nothing_started, refused

pytestmark = pytest.mark.posix("the fake hermes is a shell script")


def user_env(tmp: Path, **extra: str) -> dict[str, str]:
    """No config anywhere: per-user folders in the test's folder, no HERMES_BRIDGE_CONFIG."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HERMES_", "FAKE_HERMES"))}
    env.update(HOME=str(tmp / "home"), XDG_STATE_HOME=str(tmp / "state"), XDG_CONFIG_HOME=str(tmp / "conf"),
               XDG_CACHE_HOME=str(tmp / "cache"), **extra)
    return env


def install_copy(tmp: Path) -> Path:
    """server.py alone in a folder, as a wheel or bundle has it: no config.json or config.example.json beside."""
    folder = tmp / "install"
    folder.mkdir()
    shutil.copy(SERVER, folder / "server.py")
    return folder / "server.py"


def run(argv: list[str], env: dict[str, str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
                          cwd=cwd)


# ------------------------------------------------------------------ 3. --check starts Hermes once
def test_check_starts_the_hermes_it_found_and_shows_the_version_it_reported(bridge):
    done = run([sys.executable, str(SERVER), "--check"], bridge.env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "HERMES_RUNS: yes: Hermes Agent v0.19.0 (fake)" in done.stdout and "CHECK: OK" in done.stdout


def test_check_fails_when_the_hermes_found_does_not_run(bridge):
    broken = bridge.tmp / "broken-hermes"
    broken.write_text("#!/bin/sh\necho 'ImportError: no module named hermes_cli' >&2\nexit 1\n")
    broken.chmod(0o755)
    bridge.configure(hermes_exe=str(broken))
    done = run([sys.executable, str(SERVER), "--check"], bridge.env)
    assert done.returncode == 1 and "CHECK: FAILED" in done.stdout
    assert f"HERMES_RUNS: NO: `{broken} --version` exited 1: ImportError: no module named hermes_cli" in done.stdout


# ------------------------------------------------------------------ 4. what is wrong with Hermes' path
def broken_exes(tmp: Path) -> dict[str, tuple[Path, str]]:
    """Each way a configured Hermes path is wrong, and the words that must name it."""
    folder = tmp / "a-folder"
    folder.mkdir()
    no_x = tmp / "no-exec-bit"
    no_x.write_text("#!/bin/sh\nexit 0\n")
    moved = tmp / "moved-venv-hermes"
    moved.write_text("#!/gone/venv/bin/python3\nprint('hi')\n")
    moved.chmod(0o755)
    return {"missing": (tmp / "opt" / "nope" / "hermes", "does not exist"),
            "folder": (folder, "is a folder"),
            "not-executable": (no_x, "is not executable"),
            "interpreter-missing": (moved, "is a script whose interpreter /gone/venv/bin/python3 (its #! line) "
                                           "does not exist")}


@pytest.mark.parametrize("case", ["missing", "folder", "not-executable", "interpreter-missing"])
def test_a_wrong_hermes_path_is_named_with_its_source_and_what_is_wrong(bridge, case):
    path, words = broken_exes(bridge.tmp)[case]
    bridge.configure(hermes_exe=str(path))
    with bridge.client() as client:
        health = client.call("hermes_health")
        reason = refused(client.call("hermes_run", task="anything", wait_s=0), str(path), words,
                         f"hermes_exe in {bridge.config}", "server.py --check")
    assert health.field("HERMES_EXE").startswith(f"NOT USABLE: {path} (from hermes_exe in {bridge.config}) {words}")
    assert "Traceback" not in reason
    nothing_started(bridge, settle_s=0)


def test_a_hermes_from_the_command_line_or_from_path_says_so(bridge, tmp_path):
    path, words = broken_exes(tmp_path)["interpreter-missing"]
    with bridge.client(command=[sys.executable, str(SERVER), "--hermes-exe", str(path)]) as client:
        health = client.call("hermes_health")
    assert health.field("HERMES_EXE").startswith(f"NOT USABLE: {path} (from --hermes-exe on the command line) {words}")
    del bridge.settings["hermes_exe"]
    bridge.configure()
    client = bridge.client()
    client.params.env = dict(bridge.env, PATH=f"{bridge.hermes.parent}:{os.environ['PATH']}")
    with client:
        health = client.call("hermes_health")
    assert health.field("HERMES_EXE") == str(bridge.hermes) and health.field("HERMES_EXE_SOURCE") == "PATH"


def test_a_hermes_that_breaks_after_the_launch_ends_in_error_without_a_traceback(bridge):
    """The supervisor re-checks Hermes before it starts it: a Hermes removed in between is a one-line reason."""
    hermes = bridge.tmp / "hermes-copy"
    shutil.copy(bridge.hermes, hermes)
    bridge.configure(hermes_exe=str(hermes))
    record = server.JobRequest(kind="run", task="never runs", cwd=str(bridge.root), max_turns=None,
                               timeout_s=60, skills=[], toolsets=[])
    cfg = server.load_config(bridge.config)
    store = server.JobStore(cfg.jobs_path)
    job_id = store.claim_id(b"never runs")
    store.write(record.record(job_id, str(store.log_path(job_id))))
    hermes.unlink()
    supervisor = server.Supervisor(job_id, cfg, store)
    supervisor.run()
    final = store.read(job_id)
    assert final.state is server.JobState.ERROR and final.reason
    assert f"{hermes} (from hermes_exe in {bridge.config}) does not exist" in final.reason
    assert "Traceback" not in store.log_path(job_id).read_text()


# ------------------------------------------------------------------ 5. config for users with no repository
def test_check_with_no_config_names_every_place_it_looked_in_order(tmp_path):
    script = install_copy(tmp_path)
    done = run([sys.executable, str(script), "--check"], user_env(tmp_path))
    assert done.returncode == 3, done.stdout + done.stderr
    search = next(line for line in done.stdout.splitlines() if line.startswith("config search: "))
    places = ["HERMES_BRIDGE_CONFIG (not set)", f"beside server.py: {script.parent / 'config.json'} (none)",
              f"the per-user folder: {tmp_path / 'conf' / 'claude-hermes-bridge' / 'config.json'} (none)"]
    assert search == "config search: " + "; ".join(places)
    assert "--init-config" in done.stdout and "copy config.example.json" not in done.stdout
    assert "CHECK: INCOMPLETE: the server works, but no job can run yet" in done.stdout


def test_init_config_writes_the_per_user_config_the_next_check_reads(tmp_path):
    script = install_copy(tmp_path)
    root = tmp_path / "work"
    root.mkdir()
    hermes = make_fake_hermes(tmp_path / "hermes-venv")
    env = user_env(tmp_path)
    done = run([sys.executable, str(script), "--init-config", "--allowed-roots", str(root), "--hermes-exe",
                str(hermes)], env)
    written = tmp_path / "conf" / "claude-hermes-bridge" / "config.json"
    assert done.returncode == 0 and done.stdout.strip() == f"wrote {written}", done.stdout + done.stderr
    config = json.loads(written.read_text())
    assert config["allowed_roots"] == [str(root)] and config["hermes_exe"] == str(hermes)
    assert set(config) == set(server.SETTINGS) - {"yolo"} and config["approvals"] == "deny"
    assert json.loads((REPO / "config.example.json").read_text()).keys() - {"_comment"} == config.keys()
    again = run([sys.executable, str(script), "--init-config"], env)
    assert again.returncode == 1 and "exists" in again.stderr and "--force" in again.stderr
    assert json.loads(written.read_text()) == config
    checked = run([sys.executable, str(script), "--check"], env)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"ALLOWED_ROOTS: {root}" in checked.stdout and "HERMES_RUNS: yes" in checked.stdout
    assert f"CONFIG: {written} (0 problems)" in checked.stdout, checked.stdout  # what it wrote is valid
    forced = run([sys.executable, str(script), "--init-config", "--force"], env)
    assert forced.returncode == 0 and json.loads(written.read_text())["allowed_roots"] == []


# ------------------------------------------------------------------ 2. registrations through uvx
def registration_env(tmp: Path) -> dict[str, str]:
    uv = require_component(UV, "uv")
    env = user_env(tmp, PATH=f"{uv.parent}:/usr/bin:/bin", UV_PYTHON_DOWNLOADS="never",
                   UV_CACHE_DIR=str(tmp / "uv-cache"))
    del env["XDG_CONFIG_HOME"]  # Claude Desktop's config under HOME, as on a user's Linux machine
    return env


def test_uvx_registration_is_refused_when_the_entry_cannot_start(tmp_path):
    env = registration_env(tmp_path)
    (tmp_path / "home" / ".config" / "Claude").mkdir(parents=True)
    done = run([sys.executable, str(REPO / "register_with_claude.py"), "--platform", "linux", "--uvx"], env)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "refused" in done.stdout and "uvx claude-hermes-bridge --check" in done.stdout
    assert "--uvx-from <wheel or folder>" in done.stdout
    assert not (tmp_path / "home" / ".config" / "Claude" / "claude_desktop_config.json").exists()


def test_uvx_from_a_folder_registers_after_its_check_and_repeats_why_no_job_can_run(tmp_path):
    env = registration_env(tmp_path)
    config = tmp_path / "home" / ".config" / "Claude" / "claude_desktop_config.json"
    config.parent.mkdir(parents=True)
    done = run([sys.executable, str(REPO / "register_with_claude.py"), "--platform", "linux", "--uvx-from",
                str(REPO)], env)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    passed = next(i for i, line in enumerate(lines) if line.startswith("check passed: `uvx --from"))
    assert any("no usable Hermes" in line for line in lines[passed:])
    assert any("no allowed roots" in line for line in lines[passed:])
    entry = json.loads(config.read_text())["mcpServers"]["hermes"]
    assert entry == {"command": "uvx", "args": ["--from", str(REPO), "claude-hermes-bridge"]}


# ------------------------------------------------------------------ the config's place and the host's settings
def test_a_config_beside_server_py_wins_over_the_per_user_one_and_with_neither_the_per_user_is_named(
        tmp_path, monkeypatch):
    monkeypatch.delenv("HERMES_BRIDGE_CONFIG", raising=False)
    install, per_user = tmp_path / "install", tmp_path / "user"
    install.mkdir()
    per_user.mkdir()
    monkeypatch.setattr(server, "SERVER_DIR", install)
    monkeypatch.setattr(server, "user_dir", lambda kind: per_user / kind)
    assert server.config_path() == per_user / "config" / "config.json"
    (per_user / "config").mkdir()
    (per_user / "config" / "config.json").write_text("{}")
    (install / "config.json").write_text("{}")
    assert server.config_path() == install / "config.json"


@pytest.mark.parametrize(("settings", "approvals"), [({"yolo": True}, "yolo"), ({}, "deny"),
                                                     ({"approvals": "ask"}, "ask")])
def test_init_config_writes_the_approvals_its_settings_say(tmp_path, monkeypatch, settings, approvals):
    monkeypatch.delenv("HERMES_BRIDGE_CONFIG", raising=False)
    monkeypatch.setattr(server, "user_dir", lambda kind: tmp_path / kind)
    assert server.init_config(settings, force=False) == 0
    written = json.loads((tmp_path / "config" / "config.json").read_text())
    assert written["approvals"] == approvals and "yolo" not in written


def test_a_placeholder_among_real_values_of_one_option_is_dropped_and_the_real_values_kept():
    argv = ["--allowed-roots", "/work/a", "${user_config.extra_root}", "/work/b", "--hermes-exe",
            "${user_config.hermes_exe}", "--approvals", "ask"]
    assert server.without_unset_settings(argv) == ["--allowed-roots", "/work/a", "/work/b", "--approvals", "ask"]


@pytest.mark.parametrize(("pinned", "approvals", "problem"), [
    ({"yolo": False}, "ask", True), ({"yolo": True}, "yolo", False), ({}, "yolo", False),
    ({"yolo": False, "approvals": "deny"}, "deny", False),
], ids=["yolo-false-lowers", "yolo-true-leaves", "nothing-leaves", "approvals-pinned"])
def test_a_hosts_yolo_false_lowers_a_files_approvals_yolo_to_ask(tmp_path, monkeypatch, pinned, approvals, problem):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"allowed_roots": [str(tmp_path)], "approvals": "yolo"}))
    monkeypatch.setenv(server.SETTINGS_ENV, json.dumps(pinned))
    cfg = server.load_config(path)
    assert cfg.approvals == approvals
    lowered = [p for p in cfg.problems if "lowered to ask" in p]
    assert bool(lowered) == problem and all("--yolo false" in p for p in lowered)
