"""The ways users install the bridge (issue 12): settings from the host's command line, state outside the
install, the MCP Bundle started exactly as Claude Desktop starts it, the wheel through uvx, the first-run
`--try`, and the uvx entry of the registration script."""
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any, cast

import pytest

from conftest import require_component
from harness import MCPB, REPO, SERVER, UV, BridgeClient, make_fake_hermes

pytestmark = pytest.mark.posix("the fake hermes is a shell script")


def user_dirs(tmp: Path) -> dict[str, str]:
    """Per-user folders pointed into the test's own folder (platformdirs reads these on Linux)."""
    return {"HOME": str(tmp / "home"), "XDG_STATE_HOME": str(tmp / "state"), "XDG_CONFIG_HOME": str(tmp / "conf"),
            "XDG_CACHE_HOME": str(tmp / "cache")}


def test_settings_on_the_command_line_win_over_the_config_and_health_says_where_each_came_from(bridge):
    other = bridge.tmp / "roots" / "cli-root"
    other.mkdir()
    command = [sys.executable, str(SERVER), "--allowed-roots", str(other), "--yolo"]
    with BridgeClient(bridge.env, command=command) as client:
        health = client.call("hermes_health")
        assert health.field("ALLOWED_ROOTS") == str(other.resolve())
        assert health.field("APPROVALS").startswith("yolo")
        settings = health.field("SETTINGS")
        assert "allowed_roots from command line" in settings and "yolo from command line" in settings
        assert f"hermes_exe from config file {bridge.config}" in settings
        result = client.call("hermes_run", task="from the host's settings", wait_s=20)
    assert result.field("STATUS") == "ok", result.text
    run = bridge.runs()[0]
    assert run["cwd"] == str(other.resolve()) and "--yolo" in run["argv"]  # the supervisor saw them too
    with bridge.client() as client:
        assert client.call("hermes_health").field("ALLOWED_ROOTS") == str(bridge.root.resolve())


@pytest.mark.parametrize(("argv", "words"), [
    (["--no-such-option"], "unrecognized arguments"),
    (["--allowed-roots"], "expected at least one argument"),
    (["--allowed-roots", "relative/dir"], "is not an absolute path"),
    (["--yolo", "maybe"], "invalid choice"),
    (["--cwd", "/tmp"], "--cwd goes with --try"),
])
def test_a_bad_option_is_one_line_on_stderr_and_exit_2(argv, words):
    done = subprocess.run([sys.executable, str(SERVER), *argv], capture_output=True, text=True, timeout=30,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1 and words in done.stderr


def test_state_defaults_to_per_user_folders_and_health_prints_every_path(bridge):
    """A fresh install (a copy of server.py with no jobs/ beside it) keeps its state in per-user folders."""
    del bridge.settings["jobs_dir"], bridge.settings["logs_dir"]
    bridge.configure()
    install = bridge.tmp / "install"
    install.mkdir()
    shutil.copy(SERVER, install / "server.py")
    env = dict(bridge.env, **user_dirs(bridge.tmp))
    with BridgeClient(env, command=[sys.executable, str(install / "server.py")]) as client:
        health = client.call("hermes_health")
        result = client.call("hermes_run", task="state outside the install", wait_s=20)
    assert result.field("STATUS") == "ok", result.text
    assert health.field("JOBS_DIR").startswith(str(bridge.tmp / "state" / "claude-hermes-bridge" / "jobs"))
    assert health.field("LOGS_DIR") == str(bridge.tmp / "state" / "claude-hermes-bridge" / "log")
    assert result.field("FULL_LOG").startswith(str(bridge.tmp / "state" / "claude-hermes-bridge" / "jobs"))
    assert (bridge.tmp / "state" / "claude-hermes-bridge" / "log" / "audit.log").exists()
    assert sorted(p.name for p in install.iterdir()) == ["server.py"]  # nothing written beside it


def test_a_clone_with_jobs_beside_server_py_keeps_answering_for_them(bridge):
    del bridge.settings["jobs_dir"]
    bridge.configure()
    install = bridge.tmp / "install"
    install.mkdir()
    shutil.copy(SERVER, install / "server.py")
    command = [sys.executable, str(install / "server.py")]
    (install / "jobs").mkdir()
    env = dict(bridge.env, **user_dirs(bridge.tmp))
    with BridgeClient(env, command=command) as client:
        job_id = client.call("hermes_run", task="an older clone's job", wait_s=20).field("JOB_ID")
    assert (install / "jobs" / f"{job_id}.json").exists()
    with BridgeClient(env, command=command) as client:
        assert client.call("hermes_status", job_id=job_id).field("STATUS") == "ok"


def test_try_runs_one_task_as_a_host_would_and_exits_0_only_on_ok(bridge):
    done = subprocess.run([sys.executable, str(SERVER), "--try", "first run !sleep=14"], env=bridge.env,
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "STATUS: running" in done.stdout and "STATUS: ok" in done.stdout
    assert "FAKE DONE: first run" in done.stdout and "... job " in done.stdout  # a progress line while it waited
    failed = subprocess.run([sys.executable, str(SERVER), "--try", "fails !exit=3", "--cwd", str(bridge.root)],
                            env=bridge.env, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert failed.returncode == 1 and "STATUS: error" in failed.stdout and "EXIT_CODE: 3" in failed.stdout


@pytest.mark.uv_environment
def test_the_bundle_validates_packs_and_runs_as_claude_desktop_starts_it_with_fields_left_empty(bridge):
    mcpb = require_component(MCPB, "the MCP Bundle CLI")
    uv = require_component(UV, "uv")
    validated = subprocess.run([str(mcpb), "validate", str(REPO / "manifest.json")], capture_output=True, text=True,
                               timeout=120)
    assert validated.returncode == 0, validated.stdout + validated.stderr
    bundle = bridge.tmp / "claude-hermes-bridge.mcpb"
    packed = subprocess.run([str(mcpb), "pack", str(REPO), str(bundle)], capture_output=True, text=True, timeout=300)
    assert packed.returncode == 0, packed.stdout + packed.stderr
    names = zipfile.ZipFile(bundle).namelist()
    assert {"manifest.json", "server.py", "pyproject.toml", "uv.lock", ".python-version"} <= set(names)
    assert not [n for n in names if n.startswith(("tests/", ".venv/", "jobs/", "logs/", ".e2e/", "bench/"))]

    extension_id = "local.mcpb.claude-hermes-bridge-contributors.claude-hermes-bridge"
    folder = bridge.tmp / "home" / "Claude Extensions" / extension_id
    zipfile.ZipFile(bundle).extractall(folder)
    env = {k: v for k, v in bridge.env.items() if k != "HERMES_BRIDGE_CONFIG"}
    env.update(user_dirs(bridge.tmp), UV_PYTHON_DOWNLOADS="never", PATH=f"{uv.parent}:{os.environ['PATH']}")
    installed = subprocess.run([str(uv), "sync", "--directory", str(folder)], env=env, capture_output=True,
                               text=True, timeout=600)  # what Claude Desktop's uv does when it installs a bundle
    assert installed.returncode == 0, installed.stderr
    before = {p for p in folder.rglob("*") if ".venv" not in p.relative_to(folder).parts}

    second_root = bridge.tmp / "roots" / "b"
    second_root.mkdir()
    env["PATH"] = f"{bridge.hermes.parent}:{env['PATH']}"  # where an empty hermes_exe must find Hermes
    settings_cases: list[tuple[dict[str, Any], Path]] = [
        ({"allowed_roots": [str(bridge.root)]}, bridge.root),  # only the folders: the rest left empty
        ({"allowed_roots": [str(bridge.root)], "hermes_exe": str(bridge.hermes), "yolo": True}, bridge.root),
        ({"allowed_roots": [str(bridge.root), str(second_root)]}, second_root),  # several folders
    ]
    for user_config, cwd in settings_cases:
        config = desktop_command(folder, user_config)
        command = [shutil.which(config["command"], path=env["PATH"]), *config["args"]]
        with BridgeClient(env, command=command) as client:
            assert sorted(t.name for t in client.portal.call(client.session.list_tools).tools)[0] == "hermes_approve"
            health = client.call("hermes_health")
            assert health.field("HERMES_EXE") == str(bridge.hermes), (user_config, health.text)
            result = client.call("hermes_run", task=f"from the bundle !write=made.txt:{len(user_config)}",
                                 cwd=str(cwd), wait_s=30)
            if result.field("STATUS") == "running":
                result = client.wait_final(result.field("JOB_ID"))
        assert result.field("STATUS") == "ok", (user_config, result.text)
        assert (cwd / "made.txt").read_text() == str(len(user_config))
        assert ("--yolo" in bridge.runs()[-1]["argv"]) == bool(user_config.get("yolo"))
    after = {p for p in folder.rglob("*") if ".venv" not in p.relative_to(folder).parts}
    assert after == before, f"written inside the bundle's folder: {sorted(map(str, after - before))}"


def desktop_command(folder: Path, user_config: dict[str, Any]) -> dict[str, Any]:
    """The command Claude Desktop builds for the installed bundle: mcpb's own getMcpConfigForManifest."""
    helper = Path(__file__).with_name("mcpb_config.mjs")
    package = MCPB.parent.parent / "@anthropic-ai" / "mcpb"
    done = subprocess.run(["node", str(helper), str(package), str(folder / "manifest.json"), str(folder),
                           json.dumps(user_config)], capture_output=True, text=True, timeout=60, check=True)
    config = json.loads(done.stdout)
    assert config and config["command"] == "uv", done.stdout
    return cast(dict[str, Any], config)


@pytest.mark.uv_environment
def test_the_wheel_runs_through_uvx(tmp_path):
    uv = require_component(UV, "uv")
    built = subprocess.run([str(uv), "build", "--wheel", "--out-dir", str(tmp_path / "dist"), str(REPO)],
                           capture_output=True, text=True, timeout=600, env=dict(os.environ, **user_dirs(tmp_path)))
    assert built.returncode == 0, built.stderr
    wheel = next((tmp_path / "dist").glob("claude_hermes_bridge-*.whl"))
    assert "claude_hermes_bridge_server.py" in zipfile.ZipFile(wheel).namelist()
    root = tmp_path / "root"
    root.mkdir()
    env = dict(os.environ, **user_dirs(tmp_path), UV_PYTHON_DOWNLOADS="never")
    env.pop("HERMES_BRIDGE_CONFIG", None)
    hermes = make_fake_hermes(tmp_path / "hermes-venv")
    done = subprocess.run([str(uv.parent / "uvx"), "--from", str(wheel), "claude-hermes-bridge", "--allowed-roots",
                           str(root), "--hermes-exe", str(hermes), "--check"], capture_output=True, text=True,
                          timeout=600, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "CHECK: OK" in done.stdout and f"ALLOWED_ROOTS: {root}" in done.stdout
    assert "HERMES_RUNS: yes: Hermes Agent v0.19.0 (fake)" in done.stdout


@pytest.mark.uv_environment
def test_register_writes_the_uvx_from_entry_with_the_roots(tmp_path):
    uv = require_component(UV, "uv")
    home = tmp_path / "home"
    (home / ".config" / "Claude").mkdir(parents=True)
    root = tmp_path / "root"
    root.mkdir()
    done = subprocess.run([sys.executable, str(REPO / "register_with_claude.py"), "--platform", "linux", "--uvx-from",
                           str(REPO), "--allowed-roots", str(root), "--print"], capture_output=True, text=True,
                          timeout=600, env=dict(os.environ, PATH=f"{uv.parent}:{os.environ['PATH']}", HOME=str(home),
                                                UV_CACHE_DIR=str(tmp_path / "uv-cache"), UV_PYTHON_DOWNLOADS="never",
                                                XDG_CONFIG_HOME=str(home / ".config")))
    assert done.returncode == 0, done.stdout + done.stderr
    assert '"command": "uvx"' in done.stdout
    assert (f'"--from",\n+        "{REPO}",\n+        "claude-hermes-bridge",\n+        "--allowed-roots",\n+'
            f'        "{root}"') in done.stdout
