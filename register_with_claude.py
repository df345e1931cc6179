#!/usr/bin/env python3
"""Register claude-hermes-bridge with Claude Desktop (and Claude Code, Codex, Cursor, Gemini CLI) in one step.

Standard library only, so it runs before anything is installed. It first runs `server.py --check` with the
interpreter that will run the server and refuses to write when that fails. Every write keeps the rest of
the file as it was, leaves a timestamped backup beside it, and is atomic; a file that is not valid JSON is
refused with its line and column and left untouched; a second run changes nothing and says so, and keeps every
key of the entry it does not write (a user's env, timeout, per-tool settings).

    python register_with_claude.py                  # Claude Desktop, this interpreter
    python register_with_claude.py --print          # show the change, write nothing
    python register_with_claude.py --host all       # every host found on this machine
    python register_with_claude.py --remove         # take the entry out again
"""
import argparse
import difflib
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

SERVER = Path(__file__).resolve().parent / "server.py"
HOSTS = ("claude-desktop", "claude-code", "codex", "cursor", "gemini")
NEXT_STEPS = {
    "claude-desktop": "Quit and restart Claude Desktop: it reads its config only at start.",
    "claude-code": "In Claude Code, run /mcp (or start a new session) to see the server. Headless on a busy machine, "
                   "let it wait for the server: MCP_CONNECTION_NONBLOCKING=false claude -p \"...\"",
    "codex": "Start a new Codex session to load the server.",
    "cursor": "Reload Cursor's window (or restart Cursor) to load the server.",
    "gemini": "Start Gemini CLI in a folder it trusts (it asks once per folder) and run /mcp to see the server.",
}
# Headless runs call a tool only where the host's entry approves it ahead (there is nobody to ask)
HEADLESS = {"codex": "codex exec", "gemini": "gemini -p"}


def next_step(host: str, approve_tools: bool) -> str:
    """What to do after registering, with the headless command that works (or the flag it needs)."""
    step = NEXT_STEPS[host]
    if host in HEADLESS:
        command = HEADLESS[host]
        step += (f" Headless: {command} \"...\" calls the hermes tools (--approve-tools approved them ahead)"
                 if approve_tools else f" Headless ({command}) calls no hermes tool unless approved ahead: register "
                 "again with --approve-tools")
    return step


class Refused(Exception):
    """Something the user must fix; printed as one message, nothing written."""


# ------------------------------------------------------------------------------------- where configs live
def this_platform() -> str:
    return {"win32": "windows", "darwin": "macos"}.get(sys.platform, "linux")


def home(platform: str | None = None) -> Path:
    """The user's home as the hosts see it: on Windows USERPROFILE (what Python and Node use), not a HOME
    that Git Bash or MSYS may have set."""
    names = ("USERPROFILE", "HOME") if (platform or this_platform()) == "windows" else ("HOME", "USERPROFILE")
    return Path(next((os.environ[n] for n in names if os.environ.get(n)), None) or Path.home())


def is_store_python(executable: str, base_prefix: str) -> bool:
    """The Microsoft Store Python (or a venv made from it): files it creates under %APPDATA% are redirected
    into its private LocalCache, where Claude Desktop never looks."""
    return any("PythonSoftwareFoundation.Python" in path or "\\WindowsApps\\" in path
               for path in (executable, base_prefix))


MACOS_PATH = ("/opt/homebrew/bin", "/usr/local/bin", "/usr/bin", "/bin", "/usr/sbin", "/sbin")


def macos_launch_settings(hermes: str | None, user_home: Path) -> tuple[list[str], dict[str, str]]:
    """Claude Desktop on macOS starts servers with launchd's PATH (/usr/bin:/bin:/usr/sbin:/sbin), so the
    entry carries Hermes' absolute path and a PATH with the folders Hermes and its tools live in."""
    folders = ([str(Path(hermes).parent)] if hermes else []) + [str(user_home / ".local" / "bin"), *MACOS_PATH]
    path = ":".join(dict.fromkeys(folders))
    return (["--hermes-exe", hermes] if hermes else []), {"PATH": path}


def desktop_configs(platform: str) -> tuple[list[Path], Path]:
    """Claude Desktop configs of installs that exist (both Windows layouts can), and this OS's usual one."""
    name = "claude_desktop_config.json"
    if platform == "windows":
        appdata = Path(os.environ.get("APPDATA") or home(platform) / "AppData" / "Roaming")
        localappdata = Path(os.environ.get("LOCALAPPDATA") or home(platform) / "AppData" / "Local")
        classic = appdata / "Claude" / name
        store = [Path(p) / name for p in sorted(glob.glob(
            str(localappdata / "Packages" / "Claude_*" / "LocalCache" / "Roaming" / "Claude")))]
        candidates, usual = [classic, *store], classic
    elif platform == "macos":
        usual = home(platform) / "Library" / "Application Support" / "Claude" / name
        candidates = [usual]
    else:
        usual = Path(os.environ.get("XDG_CONFIG_HOME") or home(platform) / ".config") / "Claude" / name
        candidates = [usual]
    return [p for p in candidates if p.exists() or p.parent.is_dir()], usual


def host_configs(host: str, platform: str) -> tuple[list[Path], Path]:
    """The config files of one host that exist, and the one to create when none does."""
    if host == "claude-desktop":
        return desktop_configs(platform)
    usual = {
        "claude-code": home(platform) / ".claude.json",
        "codex": Path(os.environ.get("CODEX_HOME") or home(platform) / ".codex") / "config.toml",
        "cursor": home(platform) / ".cursor" / "mcp.json",
        "gemini": home(platform) / ".gemini" / "settings.json",
    }[host]
    return ([usual] if usual.exists() else []), usual


# --------------------------------------------------------------------------------------------- editing
def server_entry(host: str, python: str, platform: str = "linux", hermes: str | None = None,
                 uvx: bool = False, roots: list[str] | None = None, uvx_from: str | None = None,
                 hermes_named: bool = False) -> dict[str, Any]:
    """The host's entry: the clone's interpreter and server.py, `uvx claude-hermes-bridge` (the package from
    the package index), or `uvx --from <wheel or folder> claude-hermes-bridge`; the allowed roots as the
    server's own options when given. Hermes' path goes into the entry when the user named it, and for uvx
    (whose server finds no config beside a clone) and macOS (whose apps start servers with launchd's PATH)."""
    if uvx_from:
        entry: dict[str, Any] = {"command": "uvx", "args": ["--from", uvx_from, "claude-hermes-bridge"]}
    elif uvx:
        entry = {"command": "uvx", "args": ["claude-hermes-bridge"]}
    else:
        entry = {"command": python, "args": [str(SERVER)]}
    if roots:
        entry["args"] += ["--allowed-roots", *roots]
    env: dict[str, str] = {}
    if platform == "macos":
        extra_args, env = macos_launch_settings(hermes, home(platform))
        entry["args"] += extra_args
    elif hermes and (hermes_named or uvx or uvx_from):
        entry["args"] += ["--hermes-exe", hermes]
    env.update(ca_settings(os.environ))
    if env:
        entry["env"] = env
    return {"type": "stdio", **entry} if host == "claude-code" else entry


# Where this machine's network needs a CA bundle of its own, the shell that registers has it set; some hosts
# start servers with a handful of variables (Gemini CLI: 9), and a job's `uv pip install` then fails.
CA_VARIABLES = ("SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS")


def ca_settings(environment: Any) -> dict[str, str]:
    """The CA bundle settings of the registering shell, for the entry's env."""
    return {name: environment[name] for name in CA_VARIABLES if environment.get(name)}


def host_keys(host: str, approve_tools: bool) -> dict[str, Any]:
    """What a host needs beyond the command. Codex: `required`, so that a one-turn `codex exec` waits for the
    tools however slowly a loaded machine starts the server (else it gives a server about a second). With
    --approve-tools, the host calls the bridge's tools without asking the person each time: `codex exec` and
    `gemini -p` have nobody to ask and refuse every call otherwise. It is not the default: an approved
    hermes_run lets whatever steers the planner start an agent unasked; the bridge's own limits (allowed
    roots, the sandbox, the network, Hermes' questions) hold either way."""
    if host == "codex":
        return {"required": True, **({"default_tools_approval_mode": "approve"} if approve_tools else {})}
    if host == "gemini" and approve_tools:
        return {"trust": True}
    return {}


def edit_json(text: str | None, path: Path, name: str, entry: dict[str, Any] | None) -> str | None:
    """The new file text with mcpServers.<name> set (or removed when entry is None); None when unchanged."""
    try:
        data = json.loads(text) if text and text.strip() else {}
    except json.JSONDecodeError as exc:
        raise Refused(f"{path} is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); "
                      "fix it by hand first, it was left untouched") from None
    if not isinstance(data, dict) or not isinstance(data.get("mcpServers", {}), dict):
        raise Refused(f"{path} does not hold a JSON object with an mcpServers object; left untouched")
    servers = data.setdefault("mcpServers", {})
    if entry is None:
        if name not in servers:
            return None
        del servers[name]
    else:
        old = servers.get(name)
        merged = {**old, **entry} if isinstance(old, dict) else entry
        if old == merged:
            return None
        servers[name] = merged
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def toml_string(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)  # a JSON string is a valid TOML basic string


def check_toml(text: str, path: Path) -> None:
    try:
        import tomllib
    except ImportError:  # Python 3.10: no parser in the standard library, so no check
        return
    try:
        tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise Refused(f"{path} is not valid TOML ({exc}); fix it by hand first, it was left untouched") from None


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{toml_string(k)} = {toml_value(v)}" for k, v in value.items()) + " }"
    return toml_string(str(value))


TOML_KEY = re.compile(r'^\s*("?)([A-Za-z0-9_-]+)\1\s*=')


def toml_statements(lines: list[str]) -> list[tuple[str | None, int, int]]:
    """(key or None, first line, end line) of each line or key-value statement of a table's body; a value's
    continuation lines (an array over several lines) belong to its statement."""
    statements = []
    i = 0
    while i < len(lines):
        match = TOML_KEY.match(lines[i])
        end = i + 1
        if match:
            depth = 0
            for j in range(i, len(lines)):
                unquoted = re.sub(r'"(?:[^"\\]|\\.)*"|\'[^\']*\'|#.*', "", lines[j])
                depth += unquoted.count("[") + unquoted.count("{") - unquoted.count("]") - unquoted.count("}")
                end = j + 1
                if depth <= 0:
                    break
        statements.append((match.group(2) if match else None, i, end))
        i = end
    return statements


def edit_toml(text: str | None, path: Path, name: str, entry: dict[str, Any] | None) -> str | None:
    """Codex's config.toml with the keys this script writes set in [mcp_servers.<name>] (added when missing),
    or the table and its sub-tables removed; every other line kept, the user's keys in the table too."""
    text = text or ""
    check_toml(text, path)
    lines = text.splitlines(keepends=True)
    table = re.compile(r"^\s*\[\s*mcp_servers\.(\"?)" + re.escape(name) + r"\1\s*\]")
    own_or_sub = re.compile(r"^\s*\[\s*mcp_servers\.(\"?)" + re.escape(name) + r"\1\s*(\]|\.)")
    start = next((i for i, line in enumerate(lines) if table.match(line)), None)
    if entry is None:
        kept, dropping = [], False
        for line in lines:
            if line.lstrip().startswith("["):
                dropping = bool(own_or_sub.match(line))
            if not dropping:
                kept.append(line)
        new = "".join(kept)
    elif start is None:
        prefix = text if not text or text.endswith("\n") else text + "\n"
        new = prefix + ("\n" if prefix.strip() else "") + f"[mcp_servers.{name}]\n" + "".join(
            f"{key} = {toml_value(value)}\n" for key, value in entry.items())
    else:
        end = next((i for i in range(start + 1, len(lines)) if lines[i].lstrip().startswith("[")), len(lines))
        body = lines[start + 1:end]
        missing = dict(entry)
        new_body: list[str] = []
        for key, first, last in toml_statements(body):
            if key in missing:
                new_body.append(f"{key} = {toml_value(missing.pop(key))}\n")
            elif key not in entry:
                new_body += body[first:last]
        last_key = max((i for i, line in enumerate(new_body) if line.strip() and not line.lstrip().startswith("#")),
                       default=-1)
        new_body[last_key + 1:last_key + 1] = [f"{key} = {toml_value(value)}\n" for key, value in missing.items()]
        new = "".join(lines[:start + 1] + new_body + lines[end:])
    if new == text:
        return None
    check_toml(new, path)
    return new


def write_safely(path: Path, new_text: str) -> Path | None:
    """A timestamped backup of the old file beside it, then an atomic replace. Returns the backup path."""
    backup = None
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        backup = path.with_name(f"{path.name}.bak-{time.strftime('%Y%m%d-%H%M%S')}")
        n = 1
        while backup.exists():
            backup = path.with_name(f"{path.name}.bak-{time.strftime('%Y%m%d-%H%M%S')}-{n}")
            n += 1
        backup.write_bytes(path.read_bytes())
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(new_text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return backup


# ----------------------------------------------------------------------------------------------- main
CHECK_INCOMPLETE = 3  # server.py --check: the server works, but no job can run yet


def run_check(entry: dict[str, Any], uvx: bool, hermes_named: bool) -> None:
    """The server's own self-check, through the very command the entry will hold (its interpreter, or uvx);
    refuse to register when it fails, or when a uvx entry (or a Hermes the user named) would start a server
    with no usable Hermes, which refuses every job; repeat why no job can run yet when it passes incomplete."""
    command = [shutil.which(entry["command"]) or entry["command"], *entry["args"], "--check"]
    shown = " ".join([entry["command"], *entry["args"], "--check"])
    try:
        done = subprocess.run(command, capture_output=True, encoding="utf-8", errors="replace", timeout=600,
                              stdin=subprocess.DEVNULL,
                              env=dict(os.environ, **entry.get("env", {}), PYTHONIOENCODING="utf-8"))
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise Refused(f"could not run `{shown}`: {exc}" + (UVX_ALTERNATIVES if uvx else "")) from None
    said = (done.stdout + done.stderr).strip()
    if done.returncode not in (0, CHECK_INCOMPLETE):
        fix = UVX_ALTERNATIVES if uvx else (
            "\nFix: install the requirements into that interpreter "
            f"(\"{entry['command']}\" -m pip install -r \"{SERVER.parent / 'requirements.txt'}\") or choose another "
            "with --python")
        raise Refused(f"`{shown}` failed (exit {done.returncode}), so nothing was written.\n{said[-3000:]}{fix}")
    if done.returncode != CHECK_INCOMPLETE:
        print(f"check passed: `{shown}` starts the server and Hermes runs")
        return
    if "no usable Hermes" in said and (uvx or hermes_named):
        raise Refused(f"`{shown}` starts a server that finds no usable Hermes, so it would refuse every job; "
                      f"nothing was written.\n{said[-3000:]}\nFix: --hermes-exe <Hermes' absolute path> "
                      "(`which hermes` where Hermes runs)")
    print(f"check incomplete: `{shown}` starts the server, but no job can run yet")
    for line in said.splitlines():
        if line.startswith(("CHECK: INCOMPLETE", "HERMES_EXE: NOT USABLE", "ALLOWED_ROOTS: NONE")):
            print(f"  warning: {line}")


UVX_ALTERNATIVES = (
    "\nThe entry would not start. Alternatives: --uvx-from <wheel or folder> (registers `uvx --from <path> "
    "claude-hermes-bridge`, e.g. a wheel built with `uv build` or this clone's folder), or register this clone "
    "without --uvx.")


def plan(args: argparse.Namespace) -> list[tuple[str, Path, bool]]:
    """(host, config path, created) for every file this run touches."""
    hosts = list(HOSTS) if args.host == "all" else [args.host]
    targets = []
    for host in hosts:
        found, usual = host_configs(host, args.platform)
        if found:
            targets += [(host, path, False) for path in found]
        elif args.host != "all" and not args.remove:
            targets.append((host, usual, True))
    return targets


def parse_arguments(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", choices=HOSTS + ("all",), default="claude-desktop",
                        help="which MCP host to register with (default: claude-desktop; all = every host found)")
    parser.add_argument("--name", default="hermes", help="the server's entry name (default: hermes)")
    parser.add_argument("--python", default=sys.executable,
                        help="the interpreter that will run the server (default: the one running this script)")
    parser.add_argument("--print", action="store_true", help="show each file and the exact change; write nothing")
    parser.add_argument("--remove", action="store_true", help="take the entry out instead")
    parser.add_argument("--uvx", action="store_true",
                        help="register `uvx claude-hermes-bridge` (the package from PyPI) instead of this clone")
    parser.add_argument("--uvx-from", metavar="PATH",
                        help="register `uvx --from PATH claude-hermes-bridge` (a wheel or a source folder)")
    parser.add_argument("--hermes-exe", metavar="PATH",
                        help="Hermes' path, written into the entry (default for --uvx and macOS: hermes on PATH)")
    parser.add_argument("--allowed-roots", nargs="+", metavar="DIR",
                        help="pass the folders Hermes may work in as server options (else config.json's)")
    parser.add_argument("--approve-tools", action="store_true",
                        help="let Codex or Gemini CLI call the bridge's tools without asking each time (needed by "
                             "`codex exec` and `gemini -p`, which have nobody to ask)")
    parser.add_argument("--platform", choices=("windows", "macos", "linux"), default=this_platform(),
                        help="which OS's config locations to use (default: this one)")
    return parser.parse_args(argv)


def refuse_store_python(args: argparse.Namespace, targets: list[tuple[str, Path, bool]], python: str) -> None:
    """Windows redirects what the Microsoft Store Python writes under %APPDATA%: say so, with the JSON to
    paste, instead of writing a file Claude Desktop never reads."""
    if (args.platform == "windows" and not args.print and not args.remove
            and any(host == "claude-desktop" for host, _, _ in targets)
            and is_store_python(sys.executable, sys.base_prefix)):
        to_paste = {"mcpServers": {args.name: server_entry("claude-desktop", python, args.platform)}}
        raise Refused("this is the Microsoft Store Python: Windows redirects the files it writes under "
                      "%APPDATA% into its private LocalCache, where Claude Desktop never looks. Run this script "
                      "with a python.org Python, or paste this into "
                      f"{targets[0][1]} yourself (merge it with what is there):\n"
                      + json.dumps(to_paste, indent=2))


def apply(args: argparse.Namespace, host: str, path: Path, created: bool, entry: dict[str, Any] | None) -> None:
    """One host's file: the entry written (with a backup), removed, or the change shown (--print)."""
    editor: Callable[..., str | None] = edit_toml if host == "codex" else edit_json
    old = path.read_text(encoding="utf-8") if path.exists() else None
    new = editor(old, path, args.name, entry and {**entry, **host_keys(host, args.approve_tools)})
    label = f"{host}: {path}"
    if new is None:
        state = "not registered" if args.remove else "already registered"
        print(f"{label}: {args.name} is {state}; nothing changed")
        return
    if args.print:
        print(f"{label}: would {'create it' if created else 'change it'}; nothing written:")
        sys.stdout.writelines(difflib.unified_diff(
            (old or "").splitlines(keepends=True), new.splitlines(keepends=True),
            fromfile=str(path), tofile=f"{path} (new)"))
        return
    backup = write_safely(path, new)
    verb = "removed" if args.remove else ("created the file and added" if created else "registered")
    print(f"{label}: {verb} {args.name}" + (f" (backup: {backup.name})" if backup else "")
          + (" -- no config existed, so this platform's usual one was created" if created else ""))
    print(f"  next: {next_step(host, args.approve_tools)}")


def main(argv: list[str]) -> int:
    args = parse_arguments(argv)
    if not re.fullmatch(r"[A-Za-z0-9_-]+", args.name):
        print(f"--name {args.name!r}: use letters, digits, - and _ only")
        return 2
    python = str(Path(args.python).absolute()) if os.sep in args.python else args.python
    roots = [str(Path(root).expanduser().absolute()) for root in args.allowed_roots or []]
    uvx_from = str(Path(args.uvx_from).expanduser().absolute()) if args.uvx_from else None

    hermes = str(Path(args.hermes_exe).expanduser().absolute()) if args.hermes_exe else shutil.which("hermes")

    def entry_for(host: str) -> dict[str, Any]:
        return server_entry(host, python, args.platform, hermes, args.uvx, roots, uvx_from,
                            hermes_named=bool(args.hermes_exe))
    try:
        targets = plan(args)
        if not targets:
            print(f"no config of {args.host} found on this machine; nothing to do")
            return 0
        refuse_store_python(args, targets, python)
        if not args.remove:
            run_check(entry_for("claude-desktop"), uvx=bool(args.uvx or uvx_from), hermes_named=bool(args.hermes_exe))
        for host, path, created in targets:
            apply(args, host, path, created, None if args.remove else entry_for(host))
    except Refused as exc:
        print(f"refused: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
