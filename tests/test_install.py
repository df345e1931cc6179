"""Installing and registering: settings from the host's command line, state outside the install, the MCP Bundle
started exactly as Claude Desktop starts it, the wheel through uvx, `--try` and `--check` (starting the Hermes
it found, naming every config place and what is wrong with Hermes' path), `--init-config`, and
register_with_claude.py against fake homes of each OS and host."""
import json
import os
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any, cast

import pytest

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

from claude_hermes_bridge.cli import check_server, either
from claude_hermes_bridge.config import SETTINGS, load_config
from claude_hermes_bridge.jobs import JobState, JobStore
from claude_hermes_bridge.launch import JobRequest
from claude_hermes_bridge.supervisor import Supervisor
from conftest import require_component
from harness import (
    APP_ONLY_TOOLS,
    EXPECTED_ARGS,
    IN_CI,
    MCPB,
    REPO,
    SERVER,
    UV,
    UV_CACHE,
    BridgeClient,
    make_fake_hermes,
    nothing_started,
    refused,
    wait_until,
)

pytestmark = pytest.mark.posix("the fake hermes is a shell script")


def user_dirs(tmp: Path) -> dict[str, str]:
    """Per-user folders pointed into the test's own folder (platformdirs reads these on Linux); uv's cache is the
    tests' shared one (harness.UV_CACHE)."""
    return {"HOME": str(tmp / "home"), "XDG_STATE_HOME": str(tmp / "state"), "XDG_CONFIG_HOME": str(tmp / "conf"),
            "XDG_CACHE_HOME": str(tmp / "cache"), "UV_CACHE_DIR": str(UV_CACHE)}


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
    install = install_copy(bridge.tmp).parent
    env = dict(bridge.env, **user_dirs(bridge.tmp))
    with BridgeClient(env, command=[sys.executable, str(install / "server.py")]) as client:
        health = client.call("hermes_health")
        result = client.call("hermes_run", task="state outside the install", wait_s=20)
    assert result.field("STATUS") == "ok", result.text
    assert health.field("JOBS_DIR").startswith(str(bridge.tmp / "state" / "claude-hermes-bridge" / "jobs"))
    assert health.field("LOGS_DIR") == str(bridge.tmp / "state" / "claude-hermes-bridge" / "log")
    assert result.field("FULL_LOG").startswith(str(bridge.tmp / "state" / "claude-hermes-bridge" / "jobs"))
    assert (bridge.tmp / "state" / "claude-hermes-bridge" / "log" / "audit.log").exists()
    assert sorted(p.name for p in install.iterdir()) == ["claude_hermes_bridge", "server.py"]  # nothing beside
    assert not list(install.rglob("__pycache__")), "bytecode written into the install folder"


def test_a_clone_with_jobs_beside_server_py_keeps_answering_for_them(bridge):
    del bridge.settings["jobs_dir"]
    bridge.configure()
    install = install_copy(bridge.tmp).parent
    command = [sys.executable, str(install / "server.py")]
    (install / "jobs").mkdir()
    env = dict(bridge.env, **user_dirs(bridge.tmp))
    with BridgeClient(env, command=command) as client:
        job_id = client.call("hermes_run", task="an older clone's job", wait_s=20).field("JOB_ID")
    assert (install / "jobs" / f"{job_id}.json").exists()
    with BridgeClient(env, command=command) as client:
        assert client.call("hermes_status", job_id=job_id).field("STATUS") == "ok"


@pytest.mark.sdk_lines
def test_try_runs_one_task_as_a_host_would_and_exits_0_only_on_ok(bridge):
    done = subprocess.run([sys.executable, str(SERVER), "--try", "first run !sleep=14"], env=bridge.env,
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "STATUS: running" in done.stdout and "STATUS: ok" in done.stdout
    assert "FAKE DONE: first run" in done.stdout and "... job " in done.stdout  # a progress line while it waited
    failed = subprocess.run([sys.executable, str(SERVER), "--try", "fails !exit=3", "--cwd", str(bridge.root)],
                            env=bridge.env, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert failed.returncode == 1 and "STATUS: error" in failed.stdout and "EXIT_CODE: 3" in failed.stdout


@pytest.mark.e2e
@pytest.mark.uv_environment
@pytest.mark.sdk_lines
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
    assert {"manifest.json", "server.py", "claude_hermes_bridge/entry.py", "claude_hermes_bridge/job_view.html",
            "pyproject.toml", "uv.lock", ".python-version"} <= set(names)
    assert not [n for n in names if n.startswith(("tests/", ".venv/", "jobs/", "logs/", ".e2e/", "bench/"))]

    extension_id = "local.mcpb.claude-hermes-bridge-contributors.claude-hermes-bridge"
    folder = bridge.tmp / "home" / "Claude Extensions" / extension_id
    zipfile.ZipFile(bundle).extractall(folder)
    env = {k: v for k, v in bridge.env.items() if k != "HERMES_BRIDGE_CONFIG"}
    env.update(user_dirs(bridge.tmp), UV_PYTHON_DOWNLOADS="never", PATH=f"{uv.parent}:{os.environ['PATH']}")
    per_user = Path(env["XDG_CONFIG_HOME"]) / "claude-hermes-bridge" / "config.json"
    per_user.parent.mkdir(parents=True)
    per_user.write_text(json.dumps({"sandbox_writable": [str(bridge.trace)],  # the fake Hermes traces its runs there
                                    "pass_environment": ["FAKE_*"]}))
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


def readme_block(heading: str) -> list[str]:
    """The shell lines of the first code block under a README heading, comments dropped."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    block = text.split(f"### {heading}\n", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    return [line.split("  #", 1)[0].strip() for line in block.splitlines() if line.strip()]


@pytest.mark.e2e
@pytest.mark.uv_environment
def test_the_readmes_uvx_route_runs_as_written_and_its_check_ends_ok(tmp_path):
    """Issue 28: the README's own commands, in a copy of the clone, with its example paths replaced: `uv build`
    puts the wheel in dist/ under the name the README gives, and the check with the settings ends CHECK: OK."""
    uv = require_component(UV, "uv")
    clone = tmp_path / "clone"
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    for name in files:
        (clone / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, clone / name)
    root = tmp_path / "root"
    root.mkdir()
    hermes = make_fake_hermes(tmp_path / "hermes-venv")
    env = dict(os.environ, **user_dirs(tmp_path), UV_PYTHON_DOWNLOADS="never")
    env.pop("HERMES_BRIDGE_CONFIG", None)
    lines = readme_block("uvx")
    assert lines[0] == "python3 -m pip install uv" and lines[1] == "uv build", lines
    built = subprocess.run([str(uv), "build"], cwd=clone, capture_output=True, text=True, timeout=600, env=env)
    assert built.returncode == 0, built.stderr
    check = lines[2].replace("/home/me/claude-work", str(root)).replace("/path/to/hermes-venv/bin/hermes", str(hermes))
    words = check.split()
    assert words[0] == "uvx" and words[-1] == "--check", words
    assert (clone / words[2]).is_file(), f"{words[2]} is not what uv build made: {os.listdir(clone / 'dist')}"
    assert {"claude_hermes_bridge/entry.py", "claude_hermes_bridge/job_view.html"} <= set(
        zipfile.ZipFile(clone / words[2]).namelist())
    done = subprocess.run([str(uv.parent / "uvx"), *words[1:]], cwd=clone, capture_output=True, text=True,
                          timeout=600, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "CHECK: OK" in done.stdout and f"ALLOWED_ROOTS: {root}" in done.stdout
    assert "HERMES_RUNS: yes: Hermes Agent v0.19.0 (fake)" in done.stdout
    assert lines[3].startswith(f"python3 register_with_claude.py --uvx-from {words[2]} --allowed-roots")


@pytest.mark.e2e
@pytest.mark.uv_environment
def test_register_writes_the_uvx_from_entry_with_the_roots(tmp_path):
    uv = require_component(UV, "uv")
    home = tmp_path / "home"
    (home / ".config" / "Claude").mkdir(parents=True)
    root = tmp_path / "root"
    root.mkdir()
    hermes = make_fake_hermes(tmp_path / "hermes-venv")
    done = subprocess.run([sys.executable, str(REPO / "register_with_claude.py"), "--platform", "linux", "--uvx-from",
                           str(REPO), "--allowed-roots", str(root), "--hermes-exe", str(hermes), "--print"],
                          capture_output=True, text=True,
                          timeout=600, env=dict(os.environ, PATH=f"{uv.parent}:{os.environ['PATH']}", HOME=str(home),
                                                UV_CACHE_DIR=str(UV_CACHE), UV_PYTHON_DOWNLOADS="never",
                                                XDG_CONFIG_HOME=str(home / ".config")))
    assert done.returncode == 0, done.stdout + done.stderr
    assert '"command": "uvx"' in done.stdout
    assert (f'"--from",\n+        "{REPO}",\n+        "claude-hermes-bridge",\n+        "--allowed-roots",\n+'
            f'        "{root}",\n+        "--hermes-exe",\n+        "{hermes}"') in done.stdout


SCRIPT = REPO / "register_with_claude.py"


MSIX = "Packages/Claude_pzs8sxrjxfjjc/LocalCache/Roaming/Claude"


def register(home, *args, python=None, extra_env=None):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "APPDATA": str(home / "AppData" / "Roaming"),
           "LOCALAPPDATA": str(home / "AppData" / "Local"), **(extra_env or {})}
    argv = [sys.executable, str(SCRIPT), *args] + (["--python", str(python)] if python else [])
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)


def backups(folder):
    return sorted(p.name for p in folder.glob("*.bak-*"))


def write_json(path, data):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=4))
    return path


EXISTING: dict[str, Any] = {"globalShortcut": "Ctrl+Space", "someFutureKey": {"nested": [1, 2]},
            "mcpServers": {"filesystem": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem"],
                                          "env": {"X": "1"}}}}


ENTRY = {"command": sys.executable, "args": [str(SERVER)]}


CODEX = """# my codex settings
model = "o4-mini"

[mcp_servers.other]
command = "other-server"
args = ["--flag"]

[mcp_servers.hermes]
command = "/old/python"
args = [
  "/old/server.py",  # a comment ]
]
startup_timeout_sec = 30  # the user's own

[mcp_servers.hermes.env]
OLD = "1"

[mcp_servers.hermes.tools.hermes_land]
approval_mode = "prompt"

[profiles.fast]
model = "o4-mini" # keep this comment
"""


def run(argv: list[str], env: dict[str, str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
                          cwd=cwd)


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


def user_env(tmp: Path, **extra: str) -> dict[str, str]:
    """No config anywhere: per-user folders in the test's folder, no HERMES_BRIDGE_CONFIG."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HERMES_", "FAKE_HERMES"))}
    env.update(HOME=str(tmp / "home"), XDG_STATE_HOME=str(tmp / "state"), XDG_CONFIG_HOME=str(tmp / "conf"),
               XDG_CACHE_HOME=str(tmp / "cache"), **extra)
    return env


def install_copy(tmp: Path) -> Path:
    """The server alone in a folder, as a bundle has it: server.py and the package (with the job view's page),
    no config.json or config.example.json beside."""
    folder = tmp / "install"
    folder.mkdir(exist_ok=True)
    shutil.copy(SERVER, folder / "server.py")
    shutil.copytree(REPO / "claude_hermes_bridge", folder / "claude_hermes_bridge",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return folder / "server.py"


def registration_env(tmp: Path) -> dict[str, str]:
    uv = require_component(UV, "uv")
    env = user_env(tmp, PATH=f"{uv.parent}:/usr/bin:/bin", UV_PYTHON_DOWNLOADS="never",
                   UV_CACHE_DIR=str(UV_CACHE))
    del env["XDG_CONFIG_HOME"]  # Claude Desktop's config under HOME, as on a user's Linux machine
    return env


@pytest.mark.posix("the fake homes are POSIX folders and the check starts the server with the fake hermes")
def test_windows_classic_and_msix_are_both_written_keeping_everything_else(tmp_path):
    classic = write_json(tmp_path / "AppData/Roaming/Claude/claude_desktop_config.json", EXISTING)
    store_dir = tmp_path / "AppData/Local" / MSIX
    store_dir.mkdir(parents=True)
    done = register(tmp_path, "--platform", "windows")
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads(classic.read_text())
    assert data["mcpServers"]["hermes"] == ENTRY
    others = {k: v for k, v in EXISTING.items() if k != "mcpServers"}
    assert {k: v for k, v in data.items() if k != "mcpServers"} == others
    assert data["mcpServers"]["filesystem"] == EXISTING["mcpServers"]["filesystem"]
    assert len(backups(classic.parent)) == 1
    assert json.loads((classic.parent / backups(classic.parent)[0]).read_text()) == EXISTING
    assert json.loads((store_dir / "claude_desktop_config.json").read_text())["mcpServers"]["hermes"] == ENTRY
    assert "Restart Claude Desktop" in done.stdout or "restart Claude Desktop" in done.stdout

    again = register(tmp_path, "--platform", "windows")
    assert again.returncode == 0 and again.stdout.count("nothing changed") == 2
    assert len(backups(classic.parent)) == 1

    removed = register(tmp_path, "--platform", "windows", "--remove")
    assert removed.returncode == 0
    assert json.loads(classic.read_text()) == EXISTING


@pytest.mark.posix("the fake homes are POSIX folders and the check starts the server with the fake hermes")
def test_macos_and_linux_locations_and_creating_the_usual_one(tmp_path):
    mac = tmp_path / "mac"
    (mac / "Library/Application Support/Claude").mkdir(parents=True)
    assert register(mac, "--platform", "macos").returncode == 0
    mac_config = mac / "Library/Application Support/Claude/claude_desktop_config.json"
    entry = json.loads(mac_config.read_text())["mcpServers"]["hermes"]
    assert entry["command"] == ENTRY["command"] and entry["args"] == ENTRY["args"]  # no hermes on PATH here
    assert entry["env"]["PATH"].split(":")[:2] == [str(mac / ".local/bin"), "/opt/homebrew/bin"]
    linux = tmp_path / "linux"
    linux.mkdir()
    done = register(linux, "--platform", "linux", "--name", "hermes-work")
    assert done.returncode == 0 and "usual one was created" in done.stdout
    data = json.loads((linux / ".config/Claude/claude_desktop_config.json").read_text())
    assert data == {"mcpServers": {"hermes-work": ENTRY}}


@pytest.mark.posix("the fake homes are POSIX folders and the check starts the server with the fake hermes")
def test_invalid_json_is_refused_with_line_and_column_and_left_untouched(tmp_path):
    config = tmp_path / ".config/Claude/claude_desktop_config.json"
    config.parent.mkdir(parents=True)
    broken = '{\n  "mcpServers": {\n    "x": {"command": "a",}\n  }\n}\n'
    config.write_text(broken)
    done = register(tmp_path, "--platform", "linux")
    assert done.returncode == 1
    assert "line 3 column" in done.stdout and "left untouched" in done.stdout
    assert config.read_text() == broken and backups(config.parent) == []


@pytest.mark.posix("the fake homes are POSIX folders and the check starts the server with the fake hermes")
def test_an_existing_entry_is_updated_and_print_writes_nothing(tmp_path):
    config = write_json(tmp_path / ".config/Claude/claude_desktop_config.json",
                        {"mcpServers": {"hermes": {"command": "/old/python", "args": ["/old/server.py"]}}})
    before = config.read_bytes()
    shown = register(tmp_path, "--platform", "linux", "--print")
    assert shown.returncode == 0
    diff = shown.stdout.splitlines()
    assert any(line.startswith("-") and '"/old/python"' in line for line in diff)
    assert any(line.startswith("+") and f'"{SERVER}"' in line for line in diff)
    assert "nothing written" in shown.stdout
    assert config.read_bytes() == before and backups(config.parent) == []
    assert register(tmp_path, "--platform", "linux").returncode == 0
    assert json.loads(config.read_text())["mcpServers"]["hermes"] == ENTRY
    assert len(backups(config.parent)) == 1


@pytest.mark.posix("the fake homes are POSIX folders and the check starts the server with the fake hermes")
def test_a_failing_check_refuses_and_shows_why(tmp_path):
    shadow = tmp_path / "shadow" / "mcp-3.0.0.dist-info"  # an SDK line the server does not support
    shadow.mkdir(parents=True)
    (shadow / "METADATA").write_text("Metadata-Version: 2.1\nName: mcp\nVersion: 3.0.0\n")
    wrong = tmp_path / "python-with-mcp3"
    wrong.write_text(f'#!/bin/sh\nPYTHONPATH="{shadow.parent}" exec "{sys.executable}" "$@"\n')
    wrong.chmod(0o755)
    config = write_json(tmp_path / ".config/Claude/claude_desktop_config.json", EXISTING)
    before = config.read_bytes()
    done = register(tmp_path, "--platform", "linux", python=wrong)
    assert done.returncode == 1
    assert "--check` failed" in done.stdout and "mcp 3.0.0" in done.stdout
    assert config.read_bytes() == before and backups(config.parent) == []


@pytest.mark.posix("the fake homes are POSIX folders and the check starts the server with the fake hermes")
def test_gemini_cli_gets_its_entry_in_its_settings_and_trust_only_when_asked(tmp_path):
    settings = write_json(tmp_path / ".gemini/settings.json", {"theme": "Dracula", "mcpServers": {}})
    done = register(tmp_path, "--host", "gemini", "--platform", "linux")
    assert done.returncode == 0 and "Gemini CLI" in done.stdout, done.stdout
    data = json.loads(settings.read_text())
    assert data["mcpServers"]["hermes"] == ENTRY and data["theme"] == "Dracula"
    assert register(tmp_path, "--host", "gemini", "--approve-tools").returncode == 0  # for `gemini -p`
    assert json.loads(settings.read_text())["mcpServers"]["hermes"] == {**ENTRY, "trust": True}


def test_the_shells_ca_bundle_goes_into_the_entry_for_a_host_that_starts_servers_with_few_variables(tmp_path):
    settings = write_json(tmp_path / ".gemini/settings.json", {"mcpServers": {}})
    bundle = tmp_path / "corporate-ca.pem"
    bundle.write_text("-----BEGIN CERTIFICATE-----\n")
    done = register(tmp_path, "--host", "gemini", "--platform", "linux",
                    extra_env={"SSL_CERT_FILE": str(bundle), "NODE_EXTRA_CA_CERTS": str(bundle), "API_KEY": "x"})
    assert done.returncode == 0, done.stdout + done.stderr
    entry = json.loads(settings.read_text())["mcpServers"]["hermes"]
    assert entry["env"] == {"SSL_CERT_FILE": str(bundle), "NODE_EXTRA_CA_CERTS": str(bundle)}


@pytest.mark.posix("the fake homes are POSIX folders and the check starts the server with the fake hermes")
def test_claude_code_codex_and_cursor_keep_the_rest_of_their_files(tmp_path):
    claude_code = write_json(tmp_path / ".claude.json", {"numStartups": 3, "projects": {"/p": {"x": 1}},
                                                          "mcpServers": {"other": {"command": "o"},
                                                                         "hermes": {"command": "old", "timeout": 9}}})
    codex = tmp_path / ".codex/config.toml"
    codex.parent.mkdir()
    codex.write_text(CODEX)
    cursor = write_json(tmp_path / ".cursor/mcp.json", {"mcpServers": {}})
    done = register(tmp_path, "--host", "all", "--platform", "linux")
    assert done.returncode == 0, done.stdout
    assert "/mcp" in done.stdout and "new Codex session" in done.stdout
    code_data = json.loads(claude_code.read_text())
    assert code_data["mcpServers"]["hermes"] == {"type": "stdio", **ENTRY, "timeout": 9}  # the user's key kept
    assert code_data["numStartups"] == 3 and code_data["mcpServers"]["other"] == {"command": "o"}
    parsed = tomllib.loads(codex.read_text())
    assert parsed["mcp_servers"]["hermes"] == {**ENTRY, "required": True, "startup_timeout_sec": 30,
                                               "env": {"OLD": "1"},
                                               "tools": {"hermes_land": {"approval_mode": "prompt"}}}
    assert parsed["mcp_servers"]["other"] == {"command": "other-server", "args": ["--flag"]}
    assert parsed["profiles"]["fast"] == {"model": "o4-mini"} and parsed["model"] == "o4-mini"
    text = codex.read_text()
    assert text.startswith("# my codex settings\n") and 'model = "o4-mini" # keep this comment' in text
    assert json.loads(cursor.read_text())["mcpServers"]["hermes"] == ENTRY
    assert not (tmp_path / ".config/Claude").exists()  # --host all touches only hosts it finds

    assert "nothing changed" in register(tmp_path, "--host", "codex").stdout
    assert register(tmp_path, "--host", "codex", "--approve-tools").returncode == 0  # for `codex exec`
    hermes = tomllib.loads(codex.read_text())["mcp_servers"]["hermes"]
    assert hermes["default_tools_approval_mode"] == "approve" and hermes["startup_timeout_sec"] == 30
    assert "nothing changed" in register(tmp_path, "--host", "codex").stdout  # the choice is kept
    assert register(tmp_path, "--host", "codex", "--remove").returncode == 0
    parsed = tomllib.loads(codex.read_text())
    assert "hermes" not in parsed["mcp_servers"] and parsed["mcp_servers"]["other"]["command"] == "other-server"
    assert 'model = "o4-mini" # keep this comment' in codex.read_text()

    codex.write_text("[mcp_servers\nbroken")
    refused = register(tmp_path, "--host", "codex")
    assert refused.returncode == 1 and "not valid TOML" in refused.stdout
    assert codex.read_text() == "[mcp_servers\nbroken"


@pytest.mark.posix("the fake homes are POSIX folders and the check starts the server with the fake hermes")
@pytest.mark.sdk_lines
def test_the_server_starts_from_the_entry_the_script_wrote(tmp_path, bridge):
    assert register(tmp_path, "--platform", "linux").returncode == 0
    entry = json.loads((tmp_path / ".config/Claude/claude_desktop_config.json").read_text())["mcpServers"]["hermes"]
    with BridgeClient(bridge.env, command=[entry["command"], *entry["args"]]) as client:
        assert either(client.init, "server_info").name == "hermes"
        assert client.call("hermes_health").field("CONFIG").startswith(str(bridge.config))


@pytest.mark.posix("the fake homes are POSIX folders and the check starts the server with the fake hermes")
@pytest.mark.sdk_lines
def test_the_posix_launcher_serves_mcp(bridge):
    with BridgeClient(bridge.env, command=[str(REPO / "run_server.sh")]) as client:
        assert client.call("hermes_health").field("BRIDGE").startswith("claude-hermes-bridge")


@pytest.mark.posix("the fake homes are POSIX folders and the check starts the server with the fake hermes")
def test_macos_entry_carries_the_absolute_hermes_and_a_path_for_launchd(tmp_path):
    """Claude Desktop starts servers with launchd's PATH, where ~/.local/bin/hermes is not found."""
    mac = tmp_path / "mac"
    (mac / "Library/Application Support/Claude").mkdir(parents=True)
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "hermes").write_text('#!/bin/sh\n[ "$1" = acp ] && exit 1\nexit 0\n')  # a Hermes without ACP, which
    (tools / "hermes").chmod(0o755)  # --check runs (--version) but opens no session with (no model here)
    env_path = f"{tools}:/usr/bin:/bin"
    done = subprocess.run([sys.executable, str(SCRIPT), "--platform", "macos"], capture_output=True, text=True,
                          timeout=300, env={"PATH": env_path, "HOME": str(mac)})
    assert done.returncode == 0, done.stdout + done.stderr
    entry = json.loads((mac / "Library/Application Support/Claude/claude_desktop_config.json").read_text())
    entry = entry["mcpServers"]["hermes"]
    assert entry["args"] == [str(SERVER), "--hermes-exe", str(tools / "hermes")]
    assert entry["env"]["PATH"].startswith(f"{tools}:{mac}/.local/bin:/opt/homebrew/bin:/usr/local/bin:/usr/bin")


@pytest.mark.posix("the fake homes are POSIX folders and the check starts the server with the fake hermes")
def test_a_store_python_is_refused_with_the_json_to_paste():
    import register_with_claude as reg

    assert reg.is_store_python(r"C:\Users\me\AppData\Local\Microsoft\WindowsApps\python.exe", r"C:\x")
    store_install = r"C:\Program Files\WindowsApps\PythonSoftwareFoundation.Python.3.12_3.12.2544.0_x64__qbz5n2kf"
    assert reg.is_store_python(r"C:\venv\Scripts\python.exe", store_install)
    assert not reg.is_store_python(r"C:\Python312\python.exe", r"C:\Python312")


@pytest.mark.posix("the fake homes are POSIX folders and the check starts the server with the fake hermes")
def test_windows_home_is_userprofile_not_a_git_bash_home(monkeypatch):
    import register_with_claude as reg

    monkeypatch.setenv("HOME", "/c/Users/me")
    monkeypatch.setenv("USERPROFILE", r"C:\Users\me")
    assert str(reg.home("windows")) == r"C:\Users\me"
    assert str(reg.home("linux")) == "/c/Users/me"


@pytest.mark.posix("the fake hermes is a shell script")
def test_check_starts_the_hermes_it_found_and_shows_the_version_it_reported(bridge):
    done = run([sys.executable, str(SERVER), "--check"], bridge.env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "HERMES_RUNS: yes: Hermes Agent v0.19.0 (fake)" in done.stdout and "CHECK: OK" in done.stdout


@pytest.mark.posix("the fake hermes is a shell script")
def test_check_does_not_claim_a_config_file_that_does_not_exist(bridge):
    """Issue 49: `--check` with the settings on its command line only said `CONFIG: <path> (0 problems)` for a
    file that was never written; it says there is none, and where it would be."""
    missing = bridge.tmp / "never-written.json"
    env = dict(bridge.env, HERMES_BRIDGE_CONFIG=str(missing))
    done = run([sys.executable, str(SERVER), "--check", "--allowed-roots", str(bridge.root), "--hermes-exe",
                str(bridge.hermes)], env)
    assert f"CONFIG: none (no file at {missing}: the settings are the defaults and the host's command line" \
        in done.stdout, done.stdout
    assert f"\nCONFIG: {missing} (" not in done.stdout


@pytest.mark.posix("the fake hermes is a shell script")
def test_check_fails_naming_the_cause_when_hermes_cannot_open_a_session_with_its_model(bridge):
    """Issue 67: an empty base_url passed --check, then every job ended `Internal error`, the cause only in the
    log's tail. --check opens a session over ACP (no prompt, no tool) and names the cause; so does the job."""
    env = dict(bridge.env, FAKE_HERMES_ACP="1")
    done = run([sys.executable, str(SERVER), "--check"], env)
    assert done.returncode == 0 and "MODEL: yes: Hermes opened a session" in done.stdout, done.stdout
    done = run([sys.executable, str(SERVER), "--check"], dict(env, FAKE_ACP_NO_MODEL="1"))
    assert done.returncode == 1 and "CHECK: FAILED" in done.stdout, done.stdout
    assert "MODEL: NO: Hermes answered session/new with an error: Internal error: provider 'custom' resolved " \
           "without credentials" in done.stdout, done.stdout
    bridge.extra_env.update(FAKE_HERMES_ACP="1", FAKE_ACP_NO_MODEL="1")
    with bridge.client() as client:
        final = client.wait_final(client.call("hermes_run", task="hi", wait_s=0).field("JOB_ID"))
    assert final.field("STATUS") == "error"
    assert "Internal error: provider 'custom' resolved without credentials" in final.field("REASON"), final.text


@pytest.mark.posix("the fake hermes is a shell script")
def test_check_fails_when_the_hermes_found_does_not_run(bridge):
    broken = bridge.tmp / "broken-hermes"
    broken.write_text("#!/bin/sh\necho 'ImportError: no module named hermes_cli' >&2\nexit 1\n")
    broken.chmod(0o755)
    bridge.configure(hermes_exe=str(broken))
    done = run([sys.executable, str(SERVER), "--check"], bridge.env)
    assert done.returncode == 1 and "CHECK: FAILED" in done.stdout
    assert f"HERMES_RUNS: NO: `{broken} --version` exited 1: ImportError: no module named hermes_cli" in done.stdout


@pytest.mark.posix("the fake hermes is a shell script")
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


@pytest.mark.posix("the fake hermes is a shell script")
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


@pytest.mark.posix("the fake hermes is a shell script")
def test_a_hermes_that_breaks_after_the_launch_ends_in_error_without_a_traceback(bridge):
    """The supervisor re-checks Hermes before it starts it: a Hermes removed in between is a one-line reason."""
    hermes = bridge.tmp / "hermes-copy"
    shutil.copy(bridge.hermes, hermes)
    bridge.configure(hermes_exe=str(hermes))
    record = JobRequest(kind="run", task="never runs", cwd=str(bridge.root), max_turns=None,
                               timeout_s=60, skills=[], toolsets=[])
    cfg = load_config(bridge.config)
    store = JobStore(cfg.jobs_path)
    job_id = store.claim_id(b"never runs")
    store.write(record.record(job_id, str(store.log_path(job_id))))
    hermes.unlink()
    supervisor = Supervisor(job_id, cfg, store)
    supervisor.run()
    final = store.read(job_id)
    assert final.state is JobState.ERROR and final.reason
    assert f"{hermes} (from hermes_exe in {bridge.config}) does not exist" in final.reason
    assert "Traceback" not in store.log_path(job_id).read_text()


@pytest.mark.posix("the fake hermes is a shell script")
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


@pytest.mark.posix("the fake hermes is a shell script")
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
    assert set(config) == set(SETTINGS) - {"yolo"} and config["approvals"] == "deny"
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


@pytest.mark.e2e
@pytest.mark.posix("the fake hermes is a shell script")
def test_uvx_registration_is_refused_when_the_entry_cannot_start(tmp_path):
    env = registration_env(tmp_path)
    (tmp_path / "home" / ".config" / "Claude").mkdir(parents=True)
    done = run([sys.executable, str(REPO / "register_with_claude.py"), "--platform", "linux", "--uvx"], env)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "refused" in done.stdout and "uvx claude-hermes-bridge --check" in done.stdout
    assert "--uvx-from <wheel or folder>" in done.stdout
    assert not (tmp_path / "home" / ".config" / "Claude" / "claude_desktop_config.json").exists()


@pytest.mark.e2e
@pytest.mark.posix("the fake hermes is a shell script")
def test_uvx_from_a_folder_with_no_hermes_is_refused_and_with_hermes_exe_registers_a_server_that_finds_it(tmp_path):
    """Issue 49: the uvx route registered a server with no Hermes on its PATH (it refused every job) after
    printing "check passed"."""
    env = registration_env(tmp_path)
    config = tmp_path / "home" / ".config" / "Claude" / "claude_desktop_config.json"
    config.parent.mkdir(parents=True)
    register = [sys.executable, str(REPO / "register_with_claude.py"), "--platform", "linux", "--uvx-from", str(REPO)]
    done = run(register, env)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "refused" in done.stdout and "no usable Hermes" in done.stdout and "--hermes-exe" in done.stdout
    assert not config.exists()
    hermes = make_fake_hermes(tmp_path / "hermes-venv")
    done = run([*register, "--hermes-exe", str(hermes)], env)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    incomplete = next(i for i, line in enumerate(lines) if line.startswith("check incomplete: `uvx --from"))
    assert "check passed" not in done.stdout and "no usable Hermes" not in done.stdout
    assert any("no allowed roots" in line for line in lines[incomplete:])
    entry = json.loads(config.read_text())["mcpServers"]["hermes"]
    import register_with_claude as reg

    ca = reg.ca_settings(env)  # this machine's CA bundle settings, where its shell has them, go along
    assert entry == {"command": "uvx",
                     "args": ["--from", str(REPO), "claude-hermes-bridge", "--hermes-exe", str(hermes)],
                     **({"env": ca} if ca else {})}
    root = tmp_path / "root"
    root.mkdir()
    done = run([*register, "--hermes-exe", str(hermes), "--allowed-roots", str(root)], env)
    assert done.returncode == 0 and "check passed: `uvx --from" in done.stdout, done.stdout + done.stderr


@pytest.mark.posix("the fake hermes is a shell script")
@pytest.mark.sdk_lines
def test_check_passes_on_a_good_install(bridge):
    done = subprocess.run([sys.executable, str(SERVER), "--check"], env=bridge.env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "CHECK: OK" in done.stdout
    assert f"tools: {len(EXPECTED_ARGS) - len(APP_ONLY_TOOLS)} (exactly the declared tools;" in done.stdout


@pytest.mark.posix("the fake hermes is a shell script")
@pytest.mark.sdk_lines
def test_check_fails_when_the_tools_differ_or_the_server_cannot_start(bridge, tmp_path):
    import anyio

    other = tmp_path / "other_server.py"
    other.write_text("try:\n    from mcp.server.mcpserver import MCPServer as FastMCP  # mcp 2.x\n"
                     "except ImportError:\n    from mcp.server.fastmcp import FastMCP  # mcp 1.x\n"
                     "mcp = FastMCP('x')\n"
                     "@mcp.tool()\ndef hermes_health() -> str:\n    return 'fine'\nmcp.run()\n")
    ok, report = anyio.run(check_server, [sys.executable, str(other)], bridge.env)
    assert not ok and any("MISMATCH" in line for line in report)
    ok, report = anyio.run(check_server, [sys.executable, "-c", "import sys; sys.exit(3)"], bridge.env, 20)
    assert not ok and any("did not complete the handshake" in line for line in report)


@pytest.mark.posix("the fake hermes is a shell script")
@pytest.mark.parametrize("found", ["3.0.0", "1.20.0"])
@pytest.mark.sdk_lines
def test_wrong_mcp_sdk_is_one_line_with_the_fix_and_exit_2(bridge, tmp_path, found):
    shadow = tmp_path / "shadow"
    (shadow / f"mcp-{found}.dist-info").mkdir(parents=True)
    (shadow / f"mcp-{found}.dist-info" / "METADATA").write_text(f"Metadata-Version: 2.1\nName: mcp\nVersion: {found}\n")
    env = dict(bridge.env, PYTHONPATH=str(shadow))
    for args in ([], ["--check"]):
        done = subprocess.run([sys.executable, str(SERVER), *args], env=env, capture_output=True, text=True,
                              timeout=60, stdin=subprocess.DEVNULL)
        assert done.returncode == 2
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1
        assert f"mcp {found}" in lines[0] and sys.executable in lines[0] and "mcp>=1.24,<3" in lines[0]


@pytest.mark.posix("FIFOs, symlinks and POSIX signals")
def test_a_relative_hermes_exe_on_the_command_line_is_refused_at_start(bridge):
    planted = bridge.tmp / "planted"
    planted.mkdir()
    result = subprocess.run([sys.executable, str(SERVER), "--hermes-exe", "./hermes", "--check"],
                            cwd=planted, env=bridge.env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "relative path" in result.stderr and "absolute" in result.stderr


@pytest.mark.posix("FIFOs, symlinks and POSIX signals")
def test_a_bare_hermes_exe_name_is_fixed_to_its_absolute_path_at_start(bridge):
    env = dict(bridge.env, PATH=f"{bridge.hermes.parent}{os.pathsep}{os.environ['PATH']}")
    command = [sys.executable, str(SERVER), "--hermes-exe", "hermes"]
    client = bridge.client(command=command)
    client.params.env = env
    with client:
        assert client.call("hermes_health").field("HERMES_EXE") == str(bridge.hermes)


def test_register_writes_atomically_a_failed_replace_leaves_the_original(tmp_path, monkeypatch):
    import register_with_claude as reg

    config = tmp_path / "claude_desktop_config.json"
    config.write_text('{"keep": true}')
    def failing_replace(_src, _dst):
        raise OSError("disk full")
    monkeypatch.setattr(reg.os, "replace", failing_replace)
    with pytest.raises(OSError, match="disk full"):
        reg.write_safely(config, '{"new": 1}')
    assert config.read_text() == '{"keep": true}'
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]


def test_two_registrations_within_one_second_keep_both_backups(tmp_path, monkeypatch):
    import register_with_claude as reg

    monkeypatch.setattr(reg.time, "strftime", lambda _format: "20261201-120000")  # both in the same second
    config = tmp_path / "claude_desktop_config.json"
    config.write_text('{"first": 1}')
    first = reg.write_safely(config, '{"second": 2}')
    second = reg.write_safely(config, '{"third": 3}')
    assert first and second and first != second
    assert first.read_text() == '{"first": 1}' and second.read_text() == '{"second": 2}'
    assert config.read_text() == '{"third": 3}'


# ------------------------------------------------------------------ settings that silently did not take (issue 28)
@pytest.mark.posix("the fake hermes is a shell script")
def test_init_config_with_a_root_that_does_not_exist_says_so_and_writes_nothing_unless_asked_to_create_it(tmp_path):
    script = install_copy(tmp_path)
    env = user_env(tmp_path)
    absent = tmp_path / "not-yet"
    written = tmp_path / "conf" / "claude-hermes-bridge" / "config.json"
    refused_ = run([sys.executable, str(script), "--init-config", "--allowed-roots", str(absent)], env)
    assert refused_.returncode == 1 and not written.exists()
    assert f"--allowed-roots {absent}: no such folder" in refused_.stderr and "--create-roots" in refused_.stderr
    created = run([sys.executable, str(script), "--init-config", "--allowed-roots", str(absent), "--create-roots"], env)
    assert created.returncode == 0 and absent.is_dir(), created.stdout + created.stderr
    assert json.loads(written.read_text())["allowed_roots"] == [str(absent)]
    missing_hermes = tmp_path / "no-such" / "hermes"
    wrong = run([sys.executable, str(script), "--init-config", "--force", "--allowed-roots", str(absent),
                 "--hermes-exe", str(missing_hermes)], env)
    assert wrong.returncode == 1 and f"--hermes-exe {missing_hermes}: " in wrong.stderr, wrong.stderr
    assert "nothing written" in wrong.stderr and json.loads(written.read_text()).get("hermes_exe") is None
    absent.rmdir()  # removed after the config was written: every later message names the real cause
    checked = run([sys.executable, str(script), "--check"], env)
    assert f"none of the allowed roots is an existing folder ({absent}" in checked.stdout, checked.stdout
    assert "pass --allowed-roots DIR" not in checked.stdout


def test_init_config_refuses_an_empty_hermes_exe_naming_the_fix(tmp_path):
    script = install_copy(tmp_path)
    done = run([sys.executable, str(script), "--init-config", "--hermes-exe", ""], user_env(tmp_path))
    assert done.returncode == 2 and "--hermes-exe is empty" in done.stderr and "bin/hermes" in done.stderr
    assert not (tmp_path / "conf" / "claude-hermes-bridge" / "config.json").exists()


@pytest.mark.posix("the fake hermes is a shell script")
def test_the_start_up_line_says_when_there_is_no_config_file_and_where_it_looked(tmp_path):
    script = install_copy(tmp_path)
    with BridgeClient(user_env(tmp_path), command=[sys.executable, str(script)]) as client:
        client.call("hermes_health")
        line = next(line for line in client.stderr().splitlines() if line.startswith("claude-hermes-bridge "))
    assert "no config file (looked in: HERMES_BRIDGE_CONFIG (not set); beside server.py" in line, line


# ------------------------------------------------------------------ --try gets past a question (issue 28)
def require_tmux() -> str:
    found = shutil.which("tmux")
    if found:
        return found
    message = "tmux is not installed; tests/install_e2e.sh installs it"
    if IN_CI:
        pytest.fail(message)
    pytest.skip(message)


@pytest.mark.sdk_lines
def test_try_on_a_terminal_asks_the_question_itself_and_relays_the_answer(bridge):
    tmux = require_tmux()
    bridge.configure(approvals="ask", approval_timeout_s=120)
    socket = str(bridge.tmp / "tmux.sock")
    env = dict(bridge.env, FAKE_HERMES_ACP="1")
    log = bridge.tmp / "try.out"
    command = (f"{shlex.quote(sys.executable)} {shlex.quote(str(SERVER))} --try '!ask=touch+tried.txt' "
               f"> >(tee {shlex.quote(str(log))}) 2>&1; echo EXIT=$? >> {shlex.quote(str(log))}")
    subprocess.run([tmux, "-S", socket, "new-session", "-d", "-x", "200", "-y", "50", "env", "-i",
                    *(f"{key}={value}" for key, value in env.items()), "bash", "-c", command], check=True)
    try:
        def screen() -> str:
            return subprocess.run([tmux, "-S", socket, "capture-pane", "-p", "-t", "0"], capture_output=True,
                                  text=True).stdout
        asking = wait_until(lambda: s if "Allow it? [y/N]" in (s := screen()) else None, 60, "the question")
        subprocess.run([tmux, "-S", socket, "send-keys", "-t", "0", "y", "Enter"], check=True)
        wait_until(lambda: "EXIT=" in log.read_text() if log.exists() else None, 60, "--try to end")
    finally:
        subprocess.run([tmux, "-S", socket, "kill-server"], check=False)
    out = log.read_text()
    assert "Hermes asks to run `touch tried.txt` (dangerous)" in asking and "Hermes denies this by itself at" in asking
    assert "allow by the user (at the terminal, --try), applied" in out and "STATUS: ok" in out and "EXIT=0" in out, out
    assert (bridge.root / "tried.txt").exists()


@pytest.mark.sdk_lines
def test_try_without_a_terminal_says_how_to_answer_and_still_waits_for_the_end(bridge):
    bridge.configure(approvals="ask", approval_timeout_s=5)
    done = subprocess.run([sys.executable, str(SERVER), "--try", "!ask=touch+untried.txt"],
                          env=dict(bridge.env, FAKE_HERMES_ACP="1"), capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "To answer, call hermes_approve(job_id=\"" in done.stdout and 'decision="allow" or "deny"' in done.stdout
    assert done.stdout.count("QUESTION ") == 1 and "STATUS: ok" in done.stdout
    assert "-> deny by Hermes itself" in done.stdout and not (bridge.root / "untried.txt").exists()
