"""[server] hermes_health and the server's instructions to the model."""
import os
import sys

from .config import HOST_SETTING_KEYS, Config, parse_executors, path_advice, roots_missing
from .drivers import install_mounts
from .hermes_acp import driver_line, known_acp
from .hermes_cli import (
    calls_confined,
    command_preview,
    hermes_version_on_disk,
    install_python,
    install_without_bytecode,
    known_cli,
    left_out_environment,
    locate_hermes,
)
from .jobs import JobStore, disk_problem
from .launch import bytecode_lock_path, bytecode_note, worktree_count
from .network import support_line as network_support
from .preflight import VERSION, dependency_version, version_tuple
from .safe_io import LockTimeout, clock_words, disk_error, locked, plural, read_json, shown
from .sandbox import support_line
from .skills import HEALTH_RECENT_JOBS
from .standby import is_alive_standby, standby_slots


def job_counts(store: JobStore) -> str:
    """Counts by state over every unfinished job (the active markers) and the newest finished ones, plus
    the total on disk: bounded, so hermes_health stays instant whatever the disk holds."""
    ids = store.list_ids()
    active = store.active_ids()
    counted = dict.fromkeys(active + ids[-HEALTH_RECENT_JOBS:])
    counts: dict[str, int] = {}
    for _, observed, _ in store.observed_jobs(counted):
        state = observed.shown_state if observed else "damaged"
        counts[state] = counts.get(state, 0) + 1
    by_state = ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"
    scope = "all" if len(counted) >= len(ids) else f"unfinished and newest {HEALTH_RECENT_JOBS}"
    return f"{len(ids)} on disk; by state ({scope}): {by_state}"


APPROVAL_MEANINGS = {
    "deny": "deny: a command Hermes deems dangerous is denied (no one is asked)",
    "ask": "ask: Hermes' question reaches the user (elicitation, or STATUS: needs_approval and hermes_approve)",
    "yolo": "yolo: every command Hermes deems dangerous is allowed, unasked",
}


def approvals_line(cfg: Config, exe: str | None) -> str:
    line = APPROVAL_MEANINGS[cfg.approval_mode]
    if cfg.approval_mode == "ask" and exe is not None and (
            cfg.hermes_driver == "cli" or known_acp(cfg, exe) is False):
        line += "; BUT this Hermes runs with the CLI driver, which cannot forward questions: they are denied"
    return line + f" (from {cfg.sources.get('approvals') or cfg.sources.get('yolo') or 'default'})"


def hermes_version_line(exe: str | None, version: str | None) -> str:
    if exe is None:
        return "unknown: no usable Hermes"
    return shown(version) if version else "unknown (no hermes_agent dist-info beside the executable)"


def warm_start_line(cfg: Config, store: JobStore) -> str:
    """Whether a warm Hermes waits for the next ACP job, and for which folder."""
    if not cfg.warm_start:
        return "off (setting warm_start: false)"
    slots = standby_slots(store, cfg.warm_start_folders, cfg.warm_start_any_folder)
    waiting = [ready for ready in (read_json(slot / "ready.json") for slot in slots)
               if is_alive_standby(ready) and isinstance(ready.get("folder"), str)]
    if waiting:
        return "; ".join(f"a warm Hermes waits for the next ACP job in {shown(ready['folder'])} (readied in "
                         f"{ready.get('prepared_s', '?')} s{clock_words(ready.get('ready_at'))})" for ready in waiting)
    return ("on; no warm Hermes waits now (one is readied after an ACP job starts, for the next in its folder; "
            f"warm_start_folders: {cfg.warm_start_folders})")


def credentials_line(cfg: Config) -> str:
    """What of the server's environment a job is not handed, by name (never a value)."""
    left_out = left_out_environment(cfg)
    if not left_out:
        return "none of the server's environment is left out of a job's"
    return (f"a job is handed only what a shell, a toolchain and Hermes need of the server's environment; "
            f"{plural(len(left_out), 'variable')} left out: {shown(', '.join(left_out), 1500)} (pass_credentials "
            "passes a credential through, pass_environment any other name)")


def executors_line(cfg: Config) -> str:
    """Where jobs may run, without starting any process (the daemons and hosts are checked at a job's call)."""
    table, _ = parse_executors(cfg.executors)
    named = ", ".join(executor.described() for executor in table.values())
    return (f"local (this machine){'; also ' + shown(named, 600) if named else ''}; a job given none runs on "
            f"{cfg.default_executor} (docs/executors.md)")


def health(cfg: Config, at_start: Config | None = None) -> str:
    """Everything a user needs to see why the bridge cannot work, without starting any process. at_start:
    the config as the server loaded it when it started, so a change of the file since (a job can write it)
    is said, not silently obeyed."""
    hermes = locate_hermes(cfg)
    exe = hermes.usable
    version = hermes_version_on_disk(exe) if exe else None
    cli = known_cli(cfg, exe)
    store = JobStore.of(cfg)
    try:
        store.ensure()
        problem = disk_problem(store.root)
        writable = f"NOT writable: {problem}" if problem else "writable"
    except OSError as exc:
        writable = f"NOT writable: {disk_error(exc)}"
    detach = read_json(store.detach_path)
    survives = detach.get("survives_host", True) if isinstance(detach, dict) else True
    if cli and exe:
        cli_lines = [f"CLI_FLAGS: {cli.describe()}", f"CLI_COMMAND: {shown(command_preview(cli, exe, cfg), 1000)}"]
    else:
        cli_lines = ["CLI_FLAGS: not known yet: the first job asks `hermes chat --help` once and caches the answer"
                     if exe else "CLI_FLAGS: unknown: Hermes not found"]
    lines = [
        f"BRIDGE: claude-hermes-bridge {VERSION}",
        f"PYTHON: {sys.version.split()[0]} at {sys.executable}",
        f"MCP_SDK: {dependency_version('mcp') or 'not installed'}",
        f"TASKS: {tasks_line(dependency_version('mcp'))}",
        f"HERMES_EXE: {shown(exe) if exe else 'NOT USABLE: ' + shown(hermes.problem, 600)}",
        f"HERMES_EXE_SOURCE: {shown(hermes.source, 600)}",
        f"HERMES_VERSION: {hermes_version_line(exe, version)}",
        *cli_lines,
        f"HERMES_HOME: {shown(str(cfg.hermes_home_path))}",
        driver_line(cfg, exe, probe=False),
        f"APPROVALS: {approvals_line(cfg, exe)}",
        f"SANDBOX: {support_line(cfg.sandbox)}",
        f"NETWORK: {network_support(cfg.network, cfg.sandbox, cfg.network_allow)}",
        f"CREDENTIALS: {credentials_line(cfg)}",
        f"WARM_START: {warm_start_line(cfg, store)}",
        f"EXECUTORS: {executors_line(cfg)}",
        f"ALLOWED_ROOTS: {shown(', '.join(cfg.roots), 2000) or 'NONE: no job can start: ' + roots_missing(cfg)}",
        f"READ_SCOPE: {'anywhere' if cfg.read_anywhere else 'allowed roots and job files'}",
        f"JOBS_DIR: {shown(str(store.root))} ({writable})",
        f"LOGS_DIR: {shown(str(cfg.logs_path))}",
        "SETTINGS: " + "; ".join(f"{key} from {cfg.sources.get(key, 'default')}" for key in HOST_SETTING_KEYS),
        "JOBS_SURVIVE_HOST: " + ("yes" if survives else "NO: the host's job object forbids breakaway, so jobs "
                                 "die when the host closes"),
        f"JOBS: {job_counts(store)}",
        f"WORKTREES: {worktree_count(store)}",
        f"CONFIG: {shown(str(cfg.path))} ({plural(len(cfg.problems), 'problem')})" if cfg.file_stamp else
        f"CONFIG: none (no file at {shown(str(cfg.path))}: the settings are the defaults and the host's command line"
        f"; {plural(len(cfg.problems), 'problem')})",
    ]
    if at_start is not None and cfg.file_stamp != at_start.file_stamp:
        lines.append("CONFIG_CHANGED: the config file changed after this server started; the settings above are "
                     "read from it now. If you did not change it, a job may have: check it")
    if exe and install_mounts(exe, [str(cfg.hermes_home_path)]):
        lines.append("HERMES_INSTALL: inside Hermes' home, which every sandboxed job may write (as Hermes' own "
                     "installer lays it out): a job's mount namespace holds it read-only where one can be made (see "
                     "SANDBOX); where none can, a job could change the `hermes` you and the bridge run later. Install "
                     "Hermes outside its home (`uv tool install` or a virtual environment of its own) to be safe")
    if exe and calls_confined(cfg):
        lines += bytecode_lines(store, exe)
    if advice := path_advice(os.environ.get("PATH", ""), sys.platform, os.path.expanduser("~")):
        lines.append(f"PATH_NOTE: {shown(advice, 500)}")
    lines += [f"  - {shown(problem, 500)}" for problem in cfg.problems]
    return "\n".join(lines)


def tasks_line(mcp_version: str | None) -> str:
    """Whether this SDK line can answer a run with a task (the tasks extension needs the 2.x line)."""
    if mcp_version and version_tuple(mcp_version)[:1] >= (2,):
        return ("served: a client that declares io.modelcontextprotocol/tasks on protocol 2026-07-28 (Claude "
                "Code, interactive) gets hermes_run and hermes_resume as background tasks; others get job ids")
    return (f"not served on the 1.x SDK line (mcp {mcp_version or 'not installed'}): every client gets job ids to "
            "poll with hermes_status; mcp 2.x serves them as tasks")


def server_instructions(cfg: Config) -> str:
    roots = ", ".join(cfg.roots) or "none configured yet (every hermes_run is refused until allowed_roots is set)"
    return (
        "This server hands tasks to Hermes, an unattended agent with shell, file and browser tools on this "
        "machine. You plan and verify; Hermes executes.\n"
        "- Write each task self-contained: absolute paths, what to do, and a definition of done. Hermes does "
        "not see this conversation.\n"
        "- hermes_run returns a JOB_ID, with STATUS: running if the job outlasts wait_s. Then call "
        "hermes_status(job_id); it waits up to wait_s for you, so do not call it in a tight loop. A host that runs "
        "hermes_run as a background task (\"started server-side task <id>\") gives you the JOB_ID as that task "
        "id: pass it to hermes_status, hermes_steer and hermes_cancel.\n"
        "- Never re-run a job that is running: that starts the same work twice. STATUS: running is not a "
        "failure.\n"
        "- timeout, cancelled, over_budget or orphaned mean part-done work: inspect the files before re-running. "
        "over_budget: the job passed its max_tokens, max_cost_usd or max_turns (REASON says which).\n"
        "- Do not trust STATUS: ok alone: verify the artifacts with hermes_read.\n"
        "- hermes_resume(session_id) continues a Hermes session (\"latest\" = the newest one captured).\n"
        "- hermes_cancel(job_id) stops a job and its whole process tree. To correct a job going the wrong way, "
        "hermes_steer(job_id, guidance) tells Hermes without stopping it (ACP jobs).\n"
        "- STATUS: needs_approval means Hermes asks before something it deems dangerous (APPROVAL line): ask the "
        "user, then answer with hermes_approve(job_id, approval_id, decision). Never allow on your own. A host "
        "that shows the job view lets the user answer there.\n"
        "- isolation=\"worktree\" runs a job in a git worktree of its own: nothing reaches the user's tree until "
        "hermes_land(job_id, \"merge\"); show the user the DIFF first (\"discard\" drops the work).\n"
        f"- Jobs may only start inside these folders: {roots}. hermes_read reads there and the job logs."
    )


def bytecode_lines(store: JobStore, exe: str) -> list[str]:
    """Whether confined jobs' Hermes starts from compiled bytecode (install_without_bytecode), and what the bridge
    did about it (launch.compile_at_start)."""
    site = install_without_bytecode(exe)
    if site is None:
        note = bytecode_note(store, os.path.dirname(os.path.dirname(os.path.realpath(exe))))
        return [f"HERMES_BYTECODE: compiled by the bridge{clock_words(note['at'])} in {shown(note['site'])} "
                "(Hermes' install had none, and a confined Hermes cannot write it)"] if note and note["state"] == \
            "compiled" else []
    note = bytecode_note(store, site)
    if note and note["state"] == "compiling":
        since = note["at"]
        try:
            with locked(bytecode_lock_path(store), 0):
                note = None  # its server stopped before it was done: the next server's start compiles it
        except (LockTimeout, OSError):
            return [f"HERMES_BYTECODE: being compiled by the bridge since{clock_words(since)} in {shown(site)}: "
                    "until it is, each job's Hermes compiles its modules at start (about 2 s more before it reaches "
                    "the model)"]
    last = f" (the last try: {shown(note['state'], 400)})" if note else ""
    python = install_python(site)
    return [f"HERMES_BYTECODE: none in {shown(site)}: a confined Hermes cannot write it there, so each job's Hermes "
            "compiles its modules at start (about 2 s more before it reaches the model; uv installs without "
            f"compiling). The bridge compiles it when a server starts{last}; or run once: "
            f"`{shown(python)} -m compileall -q {shown(site)}`"]
