"""[server] The command line: --check, --try, --init-config, and serving."""
import contextlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, NoReturn, cast

from .config import (
    APPROVAL_MODES,
    SETTINGS,
    SETTINGS_ENV,
    Config,
    config_places,
    config_search,
    load_config,
    parse_executors,
    roots_missing,
)
from .drivers import start_hermes
from .executors import readiness_refusal
from .handshake import EarlyStart
from .health import approvals_line
from .hermes_acp import INITIALIZE, WarmHermes, acp_available, driver_line
from .hermes_cli import confined_call, hermes_env, locate_hermes
from .mcp_edge import JOB_VIEW_URI, TRY_CLIENT_NAME, serve_after_the_script
from .network import support_line as network_support
from .preflight import SERVER_DIR, VERSION, dependency_version, missing_dependencies
from .safe_io import APP_ONLY_TOOL_NAMES, TOOL_NAMES, clean_text, shown, write_atomic
from .sandbox import SANDBOX_MODES, support_line


def result_text(result: Any) -> str:
    """The text of a tool result, on either SDK line."""
    return "\n".join(getattr(item, "text", "") for item in result.content)


def either(result: Any, snake: str) -> Any:
    """A result attribute by its 2.x (snake_case) or 1.x (camelCase) name."""
    if hasattr(result, snake):
        return getattr(result, snake)
    head, *rest = snake.split("_")
    return getattr(result, head + "".join(part.title() for part in rest))


async def check_server(command: list[str], env: dict[str, str] | None = None,
                       timeout_s: float = 60) -> tuple[bool, list[str]]:
    """Start a server as a host would, over stdio with the official client, and check what a host needs."""
    import tempfile

    import anyio
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    report: list[str] = [f"interpreter: {sys.executable} (python {sys.version.split()[0]})",
                         f"mcp: {dependency_version('mcp') or 'not installed'}", f"server command: {' '.join(command)}"]
    params = StdioServerParameters(command=command[0], args=command[1:], env=env or dict(os.environ))
    with tempfile.TemporaryFile("w+") as errlog:
        try:
            with anyio.fail_after(timeout_s):
                async with stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as session:
                    init = await session.initialize()
                    report.append(f"protocol: {either(init, 'protocol_version')}; server "
                                  f"{either(init, 'server_info').name}")
                    tools = sorted(t.name for t in (await session.list_tools()).tools)
                    health_result = (await session.call_tool("hermes_health", {})
                                     if "hermes_health" in tools else None)
                    try:
                        page = (await session.read_resource(cast(Any, JOB_VIEW_URI))).contents
                        page_text = getattr(page[0], "text", "") if page else ""
                    except Exception as exc:  # noqa: BLE001 (the page's absence is reported, not raised)
                        page_text = f"({exc})"
        except BaseException as exc:  # noqa: BLE001 (a cancelled scope or an exception group: report, do not crash)
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            errlog.seek(0)
            stderr_tail = errlog.read()[-2000:].strip()
            report.append(f"FAIL: the server did not complete the handshake: {type(exc).__name__}: {exc}")
            if stderr_tail:
                report.append("server stderr:\n" + stderr_tail)
            return False, report
    ok = tools == sorted(TOOL_NAMES)
    report.append(f"tools: {len(tools)} ({'exactly the declared tools' if ok else 'MISMATCH'}; "
                  f"{len(APP_ONLY_TOOL_NAMES)} more for the job view, listed to hosts with MCP Apps)")
    if not ok:
        report.append(f"FAIL: expected {sorted(TOOL_NAMES)}, got {tools}")
    if "<html" in page_text:
        report.append(f"job view: {JOB_VIEW_URI}, {len(page_text):,} characters")
    else:
        ok = False
        report.append(f"FAIL: the job view's page could not be read {page_text[:300]}; it ships beside server.py "
                      "(job_view.html)")
    if health_result is None or either(health_result, "is_error"):
        report.append("FAIL: hermes_health did not succeed")
        return False, report
    kept = ("HERMES_EXE", "HERMES_VERSION", "HERMES_BYTECODE", "CLI_FLAGS", "CLI_COMMAND", "ALLOWED_ROOTS", "CONFIG",
            "  - ")
    report.extend(line.strip() for line in result_text(health_result).splitlines() if line.startswith(kept))
    return ok, report


def hermes_runs(cfg: Config, exe: str) -> tuple[bool, str]:
    """Start the Hermes found once, `hermes --version`, bounded: a file that exists is not yet a Hermes that
    runs (a broken venv, a wrong architecture, a missing library)."""
    try:
        with confined_call(cfg, [exe, "--version"]) as (argv, env):
            done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=60, env=env)
    except (OSError, subprocess.SubprocessError) as exc:
        return False, f"NO: `{exe} --version` could not run: {exc}"
    said = clean_text(done.stdout + done.stderr).strip().splitlines()
    first = shown(said[0], 200) if said else "(it printed nothing)"
    if done.returncode != 0:
        return False, f"NO: `{exe} --version` exited {done.returncode}: {first}"
    return True, f"yes: {first}"


SESSION_CHECK_S = 60.0


def model_line(cfg: Config, exe: str) -> tuple[bool, str]:
    """Whether Hermes opens a session with its model settings, asked over ACP in a throw-away folder (no prompt is
    sent, no tool runs): a provider with no endpoint or key fails here, not at the first job. Hermes without ACP
    opens no session without a model call: not checked."""
    import tempfile

    if not acp_available(cfg, exe):
        return True, "not checked: this Hermes has no ACP (the CLI opens no session without calling the model)"
    with tempfile.TemporaryDirectory(prefix="hermes-bridge-check-") as folder:
        proc = start_hermes([exe, "acp"], folder, hermes_env(cfg), subprocess.PIPE, subprocess.PIPE, subprocess.DEVNULL)
        hermes = WarmHermes(proc)
        try:
            hermes.request("initialize", INITIALIZE, SESSION_CHECK_S)
            hermes.request("session/new", {"cwd": folder, "mcpServers": []}, SESSION_CHECK_S)
        except OSError as exc:
            return False, f"NO: {shown(str(exc), 800)} (fix the model in {cfg.hermes_home_path}/config.yaml, or run " \
                          "`hermes setup`)"
        finally:
            with contextlib.suppress(OSError):
                cast(Any, proc.stdin).close()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return True, "yes: Hermes opened a session with its model settings"


def executor_lines(cfg: Config) -> list[str]:
    """Each executor checked as a job's call checks it (the daemon and its image, the key, the host and its key)."""
    table, _ = parse_executors(cfg.executors)
    return [f"EXECUTOR {name}: " + (f"NO: {refusal}" if (refusal := readiness_refusal(executor)) else
                                    f"ready: {executor.described()}") for name, executor in table.items()]


def check_command(serve_command: list[str]) -> int:
    """--check: the server as a host starts it, then Hermes started once. Exit 0 (CHECK: OK) when a job can
    run; 3 (CHECK: INCOMPLETE) when the server works but no job can run yet (no Hermes, no roots), saying
    why; 1 (CHECK: FAILED) when the server or the Hermes found does not work."""
    import anyio

    ok, report = anyio.run(check_server, serve_command)
    report.insert(1, f"config search: {config_search()}")
    blockers: list[str] = []
    if ok:
        cfg = load_config()
        hermes = locate_hermes(cfg)
        if hermes.usable:
            ran, line = hermes_runs(cfg, hermes.usable)
            report.append(f"HERMES_RUNS: {line}")
            ok = ran
            if ran:
                opened, model = model_line(cfg, hermes.usable)
                ok = opened
                report += [driver_line(cfg, hermes.usable, probe=True), f"MODEL: {model}",
                           f"APPROVALS: {approvals_line(cfg, hermes.usable)}",
                           f"SANDBOX: {support_line(cfg.sandbox)}",
                           f"NETWORK: {network_support(cfg.network, cfg.sandbox, cfg.network_allow)}",
                           *executor_lines(cfg)]
        else:
            blockers.append(f"no usable Hermes: {hermes.problem}")
        if not cfg.roots:
            blockers.append(roots_missing(cfg))
    print("\n".join(report))
    if not ok:
        print("CHECK: FAILED")
        return 1
    if blockers:
        print("CHECK: INCOMPLETE: the server works, but no job can run yet: " + "; ".join(blockers))
        return 3
    print("CHECK: OK")
    return 0


def init_config(settings: dict[str, Any], force: bool, create_roots: bool = False) -> int:
    """--init-config: a starting config in the per-user folder (the one a bundle or uvx install reads),
    every key at its default and the given settings filled in; an existing file is kept unless force. A root
    that does not exist is refused (it would be ignored), unless create_roots makes it."""
    path = cast(Path, config_places()[-1][1])
    if path.exists() and not force:
        sys.stderr.write(f"claude-hermes-bridge: {path} exists; nothing written (add --force to replace it)\n")
        return 1
    absent = [root for root in settings.get("allowed_roots", []) if not os.path.isdir(root)]
    if absent and not create_roots:
        sys.stderr.write(f"claude-hermes-bridge: --allowed-roots {', '.join(absent)}: no such folder, so jobs could "
                         "not start there; nothing written. Create it (or add --create-roots), then run this again\n")
        return 1
    if settings.get("hermes_exe"):
        hermes = locate_hermes(Config(path=path, hermes_exe=settings["hermes_exe"]))
        if not hermes.usable:
            sys.stderr.write(f"claude-hermes-bridge: --hermes-exe {settings['hermes_exe']}: {hermes.problem}; nothing "
                             "written. Give Hermes' absolute path (`which hermes`), then run this again\n")
            return 1
    for root in absent:
        os.makedirs(root, exist_ok=True)
        print(f"created {root}")
    defaults = Config(path=path)
    values = {key: settings.get(key, getattr(defaults, key)) for key in SETTINGS if key != "yolo"}
    values["approvals"] = Config(path=path, yolo=bool(settings.get("yolo")),
                                 approvals=settings.get("approvals")).approval_mode  # yolo is its older spelling
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, (json.dumps(values, indent=2) + "\n").encode())
    print(f"wrote {path}")
    if not values["allowed_roots"]:
        print("next: list the folders Hermes may work in under allowed_roots, then run --check")
    return 0


TRY_QUESTION_RE = re.compile(r"^APPROVAL_ID: (\S+)\nAPPROVAL: (.*)\nAPPROVAL_WAITS_S: (\d+) \((.*)\)$", re.MULTILINE)


async def try_task(command: list[str], task: str, cwd: str | None, terminal: bool | None = None) -> bool:
    """The first-run smoke test: the server started as a host would, one hermes_run, then hermes_status
    until the job ends, printing each block as it comes; True only on STATUS: ok. When Hermes asks, a terminal
    is asked the question (the command, why, until when Hermes waits; y or n) and its answer relayed; without
    a terminal it says how to answer (the exact hermes_approve arguments) and goes on waiting for the end."""
    import anyio
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client
    from mcp.types import Implementation

    params = StdioServerParameters(command=command[0], args=command[1:], env=dict(os.environ))
    started = time.monotonic()
    terminal = sys.stdin.isatty() if terminal is None else terminal
    told: set[str] = set()

    async def progress(_done: float, _total: Any, message: Any) -> None:
        print(f"... {message or 'running'} ({time.monotonic() - started:.0f} s)", flush=True)

    with anyio.fail_after(24 * 3600):
        terminal_client = Implementation(name=TRY_CLIENT_NAME, version=VERSION)  # its answers are the user's
        async with stdio_client(params) as (read, write), ClientSession(read, write,
                                                                      client_info=terminal_client) as session:
            await session.initialize()
            arguments: dict[str, Any] = {"task": task, "wait_s": 5}
            if cwd:
                arguments["cwd"] = cwd
            text = result_text(await session.call_tool("hermes_run", arguments))
            print(text, flush=True)
            while text.startswith(("STATUS: running", "STATUS: needs_approval")):
                job_id = cast(re.Match[str], re.search(r"^JOB_ID: (\S+)$", text, re.MULTILINE)).group(1)
                new = [found for found in TRY_QUESTION_RE.findall(text) if found[0] not in told]
                if text.startswith("STATUS: needs_approval") and not new:
                    await anyio.sleep(2)  # every question is with the user: the status would answer at once
                for approval_id, question, waits_s, deadline in new:
                    told.add(approval_id)
                    print(f"\nQUESTION {approval_id}: {question}\n{deadline}.", flush=True)
                    decision = await answer_on_terminal(int(waits_s)) if terminal else None
                    if decision is None:
                        print(f"To answer, call hermes_approve(job_id=\"{job_id}\", approval_id=\"{approval_id}\", "
                              "decision=\"allow\" or \"deny\") from your MCP host; this waits for the job's end.",
                              flush=True)
                        continue
                    answered = result_text(await session.call_tool("hermes_approve", {
                        "job_id": job_id, "approval_id": approval_id, "decision": decision}))
                    print(answered.split("\n--- ", 1)[0], flush=True)
                result = await session.call_tool("hermes_status", {"job_id": job_id, "wait_s": 30},
                                                 progress_callback=cast(Any, progress))
                shown_before, text = text, result_text(result)
                if not text.startswith("STATUS: running") and text.split("\n", 1)[0] != shown_before.split("\n", 1)[0]:
                    print(text, flush=True)
    return text.startswith("STATUS: ok")


async def answer_on_terminal(waits_s: int) -> str | None:
    """y or n from the terminal, asked until Hermes stops waiting; None when the time ran out first."""
    import anyio

    print(f"Allow it? [y/N] (Hermes decides by itself in {waits_s} s) ", end="", flush=True)
    with anyio.move_on_after(max(1, waits_s - 1)):
        reply = await anyio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)
        return "allow" if reply.strip().lower() in ("y", "yes") else "deny"
    print("\n(no answer in time: Hermes decides by itself)", flush=True)
    return None


def parse_command_line(argv: list[str]) -> Any:
    """The host's settings and the modes. argparse is imported here, not at the top, so a supervisor
    (`--supervise`, parsed by hand) never loads it."""
    import argparse

    class OneLineParser(argparse.ArgumentParser):
        """A bad option is one line on stderr and exit 2, before any transport opens."""

        def error(self, message: str) -> NoReturn:
            sys.stderr.write(f"claude-hermes-bridge: {message} (server.py --help lists the options)\n")
            sys.exit(2)

    parser = OneLineParser(prog="server.py", description="claude-hermes-bridge: an MCP stdio server that runs "
                           "tasks with Hermes. With no mode option it serves MCP over stdio.")
    settings = parser.add_argument_group("settings (they win over the config file)")
    settings.add_argument("--allowed-roots", nargs="+", metavar="DIR", help="folders jobs may start in")
    settings.add_argument("--hermes-exe", metavar="PATH", help="the hermes executable")
    settings.add_argument("--hermes-home", metavar="DIR", help="Hermes' home (skills, sessions)")
    settings.add_argument("--approvals", choices=APPROVAL_MODES, help="when Hermes asks before a dangerous "
                          "command: deny it (default), ask the user, or allow it (yolo)")
    settings.add_argument("--sandbox", choices=SANDBOX_MODES, help="the operating system keeps a job's writes in "
                          "its folders: where it can (auto, default), or refuse a job it cannot (required), or off")
    settings.add_argument("--yolo", nargs="?", const="true", choices=("true", "false"),
                          help="Hermes auto-approves commands it deems dangerous")
    modes = parser.add_mutually_exclusive_group()
    modes.add_argument("--check", action="store_true", help="start the server as a host would and check it")
    modes.add_argument("--try", dest="try_task", metavar="TASK", help="run one task through the server as a "
                       "host would, and wait for its end")
    modes.add_argument("--version", action="store_true")
    modes.add_argument("--init-config", action="store_true", help="write a starting config.json in the per-user "
                       "folder, with the settings given here filled in")
    parser.add_argument("--force", action="store_true", help="with --init-config: replace an existing file")
    parser.add_argument("--create-roots", action="store_true", help="with --init-config: create the allowed roots "
                        "that do not exist yet")
    parser.add_argument("--cwd", metavar="DIR", help="with --try: the folder to run the task in")
    args = parser.parse_args(argv)
    for root in args.allowed_roots or []:
        if not os.path.isabs(os.path.expanduser(root)):
            parser.error(f"--allowed-roots {root!r} is not an absolute path")
    if args.cwd and not args.try_task:
        parser.error("--cwd goes with --try")
    if args.create_roots and not args.init_config:
        parser.error("--create-roots goes with --init-config")
    if args.init_config and args.hermes_exe is not None and not args.hermes_exe.strip():
        parser.error("--hermes-exe is empty (was it `$(which hermes)` with Hermes in a venv not on PATH?): give "
                     "Hermes' absolute path, e.g. the venv's bin/hermes (Scripts\\hermes.exe on Windows)")
    return args


def host_hermes_exe(value: str) -> str:
    """--hermes-exe as an absolute path, fixed when the server starts: a bare name is looked up on PATH now,
    and a relative path is refused (it would name whatever sits in the folder the host started us in)."""
    import shutil

    expanded = os.path.expanduser(value)
    if os.path.isabs(expanded):
        return expanded
    bare = os.sep not in expanded and (os.altsep is None or os.altsep not in expanded)
    found = shutil.which(expanded) if bare else None
    if found:
        return os.path.abspath(found)
    why = "is not on PATH" if bare else "is a relative path"
    sys.stderr.write(f"claude-hermes-bridge: --hermes-exe {value!r} {why}; give Hermes' absolute path "
                     "(server.py --help lists the options)\n")
    sys.exit(2)


def settings_of(args: Any) -> dict[str, Any]:
    """The host's settings from parsed options; an empty value (an unset bundle field) is no setting."""
    settings: dict[str, Any] = {}
    if args.allowed_roots:
        settings["allowed_roots"] = [os.path.expanduser(root) for root in args.allowed_roots if root]
    if args.hermes_exe:
        settings["hermes_exe"] = host_hermes_exe(args.hermes_exe)
    if args.hermes_home:
        settings["hermes_home"] = os.path.abspath(os.path.expanduser(args.hermes_home))
    if args.yolo is not None:
        settings["yolo"] = args.yolo == "true"
    if args.approvals:
        settings["approvals"] = args.approvals
    if args.sandbox:
        settings["sandbox"] = args.sandbox
    return settings


UNSET_PLACEHOLDER_RE = re.compile(r"\$\{user_config\.[^}]*\}")


def without_unset_settings(argv: list[str]) -> list[str]:
    """The command line without the settings a bundle host left unset. Claude Desktop (mcpb's
    getMcpConfigForManifest) keeps `${user_config.key}` as it is when an optional field is empty, so
    `--hermes-exe '${user_config.hermes_exe}'` means "no --hermes-exe": an option whose every value is such a
    placeholder is dropped with them."""
    kept: list[str] = []
    index = 0
    while index < len(argv):
        end = index + 1
        while end < len(argv) and not argv[end].startswith("-"):
            end += 1
        option, values = argv[index], argv[index + 1:end]
        if not (option.startswith("-") and values and all(UNSET_PLACEHOLDER_RE.fullmatch(v) for v in values)):
            kept += [arg for arg in argv[index:end] if not UNSET_PLACEHOLDER_RE.fullmatch(arg)]
        index = end
    return kept


def server_command() -> list[str]:
    """How --check and --try start the server they talk to: the server.py beside this package in a clone or a
    bundle, the package itself where a wheel installed it (no server.py there)."""
    script = SERVER_DIR / "server.py"
    with contextlib.suppress(OSError):
        if script.is_file() and "claude_hermes_bridge" in script.read_text(encoding="utf-8", errors="replace"):
            return [sys.executable, str(script)]
    return [sys.executable, "-m", "claude_hermes_bridge"]


def main(argv: list[str], protocol_fds: tuple[int, int] | None = None, early: EarlyStart | None = None) -> int:
    args = parse_command_line(without_unset_settings(argv))
    if args.version:
        print(f"claude-hermes-bridge {VERSION}")
        return 0
    settings = settings_of(args)
    if args.init_config:
        return init_config(settings, args.force, args.create_roots)
    if settings:
        os.environ[SETTINGS_ENV] = json.dumps(settings)
    problem = missing_dependencies(need_mcp=True)
    if problem:
        sys.stderr.write(problem + "\n")
        return 2
    import anyio

    serve_command = server_command()
    if args.check:
        return check_command(serve_command)
    if args.try_task is not None:
        return 0 if anyio.run(try_task, serve_command, args.try_task, args.cwd) else 1
    assert protocol_fds is not None, "serves_protocol() and main() disagree about this command line"
    serve_after_the_script(protocol_fds, early or EarlyStart())
    return 0
