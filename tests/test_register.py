"""register_with_claude.py against fake home folders laid out like each OS and host."""
import json
import subprocess
import sys
from typing import Any

import pytest

import server
from harness import REPO, SERVER, BridgeClient

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

pytestmark = pytest.mark.posix("the fake homes are POSIX folders and the check starts the server with the fake hermes")

SCRIPT = REPO / "register_with_claude.py"
MSIX = "Packages/Claude_pzs8sxrjxfjjc/LocalCache/Roaming/Claude"


def register(home, *args, python=None):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "APPDATA": str(home / "AppData" / "Roaming"),
           "LOCALAPPDATA": str(home / "AppData" / "Local")}
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


def test_invalid_json_is_refused_with_line_and_column_and_left_untouched(tmp_path):
    config = tmp_path / ".config/Claude/claude_desktop_config.json"
    config.parent.mkdir(parents=True)
    broken = '{\n  "mcpServers": {\n    "x": {"command": "a",}\n  }\n}\n'
    config.write_text(broken)
    done = register(tmp_path, "--platform", "linux")
    assert done.returncode == 1
    assert "line 3 column" in done.stdout and "left untouched" in done.stdout
    assert config.read_text() == broken and backups(config.parent) == []


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


CODEX = """# my codex settings
model = "o4-mini"

[mcp_servers.other]
command = "other-server"
args = ["--flag"]

[mcp_servers.hermes]
command = "/old/python"
args = ["/old/server.py"]

[mcp_servers.hermes.env]
OLD = "1"

[profiles.fast]
model = "o4-mini" # keep this comment
"""


def test_claude_code_codex_and_cursor_keep_the_rest_of_their_files(tmp_path):
    claude_code = write_json(tmp_path / ".claude.json", {"numStartups": 3, "projects": {"/p": {"x": 1}},
                                                          "mcpServers": {"other": {"command": "o"}}})
    codex = tmp_path / ".codex/config.toml"
    codex.parent.mkdir()
    codex.write_text(CODEX)
    cursor = write_json(tmp_path / ".cursor/mcp.json", {"mcpServers": {}})
    done = register(tmp_path, "--host", "all", "--platform", "linux")
    assert done.returncode == 0, done.stdout
    assert "/mcp" in done.stdout and "new Codex session" in done.stdout
    code_data = json.loads(claude_code.read_text())
    assert code_data["mcpServers"]["hermes"] == {"type": "stdio", **ENTRY}
    assert code_data["numStartups"] == 3 and code_data["mcpServers"]["other"] == {"command": "o"}
    parsed = tomllib.loads(codex.read_text())
    assert parsed["mcp_servers"]["hermes"] == ENTRY
    assert parsed["mcp_servers"]["other"] == {"command": "other-server", "args": ["--flag"]}
    assert parsed["profiles"]["fast"] == {"model": "o4-mini"} and parsed["model"] == "o4-mini"
    text = codex.read_text()
    assert text.startswith("# my codex settings\n") and 'model = "o4-mini" # keep this comment' in text
    assert json.loads(cursor.read_text())["mcpServers"]["hermes"] == ENTRY
    assert not (tmp_path / ".config/Claude").exists()  # --host all touches only hosts it finds

    assert "nothing changed" in register(tmp_path, "--host", "codex").stdout
    assert register(tmp_path, "--host", "codex", "--remove").returncode == 0
    parsed = tomllib.loads(codex.read_text())
    assert "hermes" not in parsed["mcp_servers"] and parsed["mcp_servers"]["other"]["command"] == "other-server"

    codex.write_text("[mcp_servers\nbroken")
    refused = register(tmp_path, "--host", "codex")
    assert refused.returncode == 1 and "not valid TOML" in refused.stdout
    assert codex.read_text() == "[mcp_servers\nbroken"


def test_the_server_starts_from_the_entry_the_script_wrote(tmp_path, bridge):
    assert register(tmp_path, "--platform", "linux").returncode == 0
    entry = json.loads((tmp_path / ".config/Claude/claude_desktop_config.json").read_text())["mcpServers"]["hermes"]
    with BridgeClient(bridge.env, command=[entry["command"], *entry["args"]]) as client:
        assert server.either(client.init, "server_info").name == "hermes"
        assert client.call("hermes_health").field("CONFIG").startswith(str(bridge.config))


def test_the_posix_launcher_serves_mcp(bridge):
    with BridgeClient(bridge.env, command=[str(REPO / "run_server.sh")]) as client:
        assert client.call("hermes_health").field("BRIDGE").startswith("claude-hermes-bridge")


def test_macos_entry_carries_the_absolute_hermes_and_a_path_for_launchd(tmp_path):
    """Claude Desktop starts servers with launchd's PATH, where ~/.local/bin/hermes is not found."""
    mac = tmp_path / "mac"
    (mac / "Library/Application Support/Claude").mkdir(parents=True)
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "hermes").write_text("#!/bin/sh\n")
    (tools / "hermes").chmod(0o755)
    env_path = f"{tools}:/usr/bin:/bin"
    done = subprocess.run([sys.executable, str(SCRIPT), "--platform", "macos"], capture_output=True, text=True,
                          timeout=300, env={"PATH": env_path, "HOME": str(mac)})
    assert done.returncode == 0, done.stdout + done.stderr
    entry = json.loads((mac / "Library/Application Support/Claude/claude_desktop_config.json").read_text())
    entry = entry["mcpServers"]["hermes"]
    assert entry["args"] == [str(SERVER), "--hermes-exe", str(tools / "hermes")]
    assert entry["env"]["PATH"].startswith(f"{tools}:{mac}/.local/bin:/opt/homebrew/bin:/usr/local/bin:/usr/bin")


def test_a_store_python_is_refused_with_the_json_to_paste():
    import register_with_claude as reg

    assert reg.is_store_python(r"C:\Users\me\AppData\Local\Microsoft\WindowsApps\python.exe", r"C:\x")
    store_install = r"C:\Program Files\WindowsApps\PythonSoftwareFoundation.Python.3.12_3.12.2544.0_x64__qbz5n2kf"
    assert reg.is_store_python(r"C:\venv\Scripts\python.exe", store_install)
    assert not reg.is_store_python(r"C:\Python312\python.exe", r"C:\Python312")


def test_windows_home_is_userprofile_not_a_git_bash_home(monkeypatch):
    import register_with_claude as reg

    monkeypatch.setenv("HOME", "/c/Users/me")
    monkeypatch.setenv("USERPROFILE", r"C:\Users\me")
    assert str(reg.home("windows")) == r"C:\Users\me"
    assert str(reg.home("linux")) == "/c/Users/me"

