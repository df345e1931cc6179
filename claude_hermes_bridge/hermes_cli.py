"""[both] Locating Hermes, the options it declares, its command line and environment, its exit codes in words."""
import contextlib
import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

from .config import SETTINGS_ENV, Config
from .jobs import SESSION_NAME_RE, JobRecord, JobState
from .processes import JOB_MARKER
from .safe_io import IS_WINDOWS, open_regular, read_json, shown, write_atomic
from .sandbox import devices, mechanism, step_argv

# Linux caps one argument at 128 KiB (MAX_ARG_STRLEN counts the terminating NUL); macOS caps the whole
# argv and environment at 1 MiB, which an argument within this limit leaves room for.
POSIX_ARGUMENT_LIMIT = 131072 - 1
QUERY_OPTION = "--query="
SESSION_ID_RE = re.compile(r"^session_id:\s*(\S+)\s*$", re.MULTILINE)
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,127}")
# What each hermes_cli_form override declares; "auto" asks the installed Hermes (`hermes chat --help`).
FORM_FLAGS = {
    "query-arg": frozenset({"--query", "--quiet", "--resume", "--max-turns", "--skills", "--toolsets", "--yolo"}),
    "query-file": frozenset({"--query", "--quiet", "--resume", "--max-turns", "--skills", "--toolsets", "--yolo",
                             "--query-file", "--in", "--oneshot"}),
}
LONG_FLAG_RE = re.compile(rb"(?<![\w-])--[a-z][a-z0-9-]*")


@dataclasses.dataclass(frozen=True)
class HermesExe:
    """The Hermes executable the bridge would start, where that choice came from, and why it cannot be
    started (None when it can)."""

    path: str | None
    source: str
    problem: str | None = None

    @property
    def usable(self) -> str | None:
        return self.path if self.problem is None else None


def locate_hermes(cfg: Config) -> HermesExe:
    """hermes_exe (command line or config file), else `hermes` on PATH; each problem named with the path
    and where it came from, so "not found" never hides which file is wrong and how."""
    if cfg.hermes_exe_path:
        source = ("--hermes-exe on the command line" if cfg.sources.get("hermes_exe") == "command line"
                  else f"hermes_exe in {cfg.path}")
        path = cfg.hermes_exe_path
    else:
        import shutil  # only here: shutil loads three compressors, which a supervisor given hermes_exe never needs

        found = shutil.which("hermes")
        if not found:
            return HermesExe(None, "PATH", "no `hermes` on the server's PATH: install Hermes (see README, Hermes "
                             "first), or set hermes_exe to its absolute path")
        path, source = found, "PATH"
    problem = hermes_file_problem(path) or executable_problem(path)
    return HermesExe(path, source, f"{shown(path)} (from {source}) {problem}" if problem else None)


def hermes_file_problem(path: str) -> str | None:
    """What is wrong with this file as a program to start, in words: missing, a folder, not executable, or a
    script whose interpreter (its #! line) is gone, as when the venv it was installed in was moved."""
    if not os.path.exists(path):
        return "does not exist"
    if os.path.isdir(path):
        return "is a folder, not the hermes program (point at the executable inside it, e.g. bin/hermes)"
    if not IS_WINDOWS and not os.access(path, os.X_OK):
        return "is not executable (no execute permission): chmod +x it, or point at the real hermes"
    try:
        with open_regular(path, follow=True) as handle:
            head = handle.read(4096)
    except OSError as exc:
        return f"cannot be read: {exc.strerror or exc}"
    if IS_WINDOWS or not head.startswith(b"#!"):
        return None
    words = head[2:].split(b"\n", 1)[0].decode("utf-8", "replace").split()
    if not words:
        return "has an empty #! line"
    if os.path.basename(words[0]) == "env" and len(words) > 1:
        import shutil

        if shutil.which(words[1]):
            return None
        return f"names `{shown(words[1], 200)}` in its #! line, which is not on PATH"
    interpreter = words[0]
    if not os.path.exists(interpreter):
        return (f"is a script whose interpreter {shown(interpreter, 300)} (its #! line) does not exist: the "
                "environment Hermes was installed in was moved or removed; reinstall Hermes")
    return None


VERSIONS_SEEN: dict[tuple[str, str], str | None] = {}  # by the executable and its fingerprint (an upgrade rewrites it)


def hermes_version_on_disk(exe: str) -> str | None:
    """Hermes' version from the dist-info beside its install, for display only: the command line is decided
    by the flags Hermes declares, never by its version (no 0.20.x has --query-file, though 0.20 has --in)."""
    key = (exe, exe_fingerprint(exe))
    if key not in VERSIONS_SEEN:
        VERSIONS_SEEN.clear()
        VERSIONS_SEEN[key] = dist_info_version(exe)
    return VERSIONS_SEEN[key]


def dist_info_version(exe: str) -> str | None:
    prefix = Path(os.path.realpath(exe)).parent.parent
    site = "Lib/site-packages" if IS_WINDOWS else "lib/python*/site-packages"
    pattern = f"{site}/hermes_agent*.dist-info"
    for dist_info in sorted(prefix.glob(pattern)):
        match = re.fullmatch(r"hermes_agent(?:_\w+)?-(.+)\.dist-info", dist_info.name)
        if match:
            return match.group(1)
    return None


def flags_cache_path(cfg: Config) -> Path:
    return cfg.jobs_path / "cli_flags_cache.json"


def exe_fingerprint(exe: str) -> str:
    """Path, mtime and size: an upgraded Hermes at the same path is probed again."""
    real = os.path.realpath(exe)
    try:
        info = os.stat(real)
        return f"{real}|{info.st_mtime_ns}|{info.st_size}"
    except OSError:
        return real


@dataclasses.dataclass(frozen=True)
class HermesCli:
    """The options the installed Hermes declares, and where that knowledge came from."""

    flags: frozenset[str]
    source: str

    @property
    def task_on_stdin(self) -> bool:
        return "--query-file" in self.flags

    def describe(self) -> str:
        used = [flag for flag in ("--query-file", "--in", "--oneshot") if flag in self.flags]
        return f"{', '.join(used) or 'only the basic options (task as --query)'} ({self.source})"


def known_cli(cfg: Config, exe: str | None) -> HermesCli | None:
    """The command line's options without starting a process: the config override or an earlier probe."""
    if cfg.hermes_cli_form != "auto":
        return HermesCli(FORM_FLAGS[cfg.hermes_cli_form], f"hermes_cli_form {cfg.hermes_cli_form} set in config")
    if not exe:
        return None
    cache = read_json(flags_cache_path(cfg))
    flags = cache.get(exe_fingerprint(exe)) if isinstance(cache, dict) else None
    if isinstance(flags, list) and all(isinstance(flag, str) for flag in flags):
        return HermesCli(frozenset(flags), "declared by `hermes chat --help`, probed once and cached")
    return None


PROBES_RUNNING: dict[int, str] = {}  # thread id -> the probe it waits on


def sandbox_extra(cfg: Config) -> list[str]:
    """The folders sandbox_writable adds to what a sandboxed job, and the bridge's own calls of Hermes, may write."""
    return [path for path in cfg.sandbox_writable if os.path.isabs(path) and os.path.isdir(path)]


def calls_confined(cfg: Config) -> bool:
    """Whether the bridge's calls of Hermes, and jobs' Hermes, run inside the sandbox here."""
    return cfg.sandbox != "off" and bool(mechanism().name)


@contextlib.contextmanager
def confined_call(cfg: Config, argv: list[str], writable: tuple[str, ...] = ()) -> Iterator[tuple[list[str],
                                                                                                   dict[str, str]]]:
    """The command and environment of one of the bridge's own calls of Hermes (its options, whether it speaks ACP,
    its version, a session deleted): inside the sandbox, with nothing writable but a fresh temporary folder,
    `writable`, sandbox_writable and the devices, because a job may have changed Hermes' install where no mount
    namespace holds it read-only (it lies in Hermes' home, which jobs write, as Hermes' own installer lays it
    out). As it is where the sandbox is off or this machine has none (Windows)."""
    env = hermes_env(cfg)
    if not calls_confined(cfg):
        yield argv, env
        return
    private_tmp = tempfile.mkdtemp(prefix="chb-hermes-call-")
    try:
        confined = step_argv([private_tmp, *writable, *sandbox_extra(cfg), *devices()], argv)
        yield confined, dict(env, TMPDIR=private_tmp, TEMP=private_tmp, TMP=private_tmp)
    finally:
        shutil.rmtree(private_tmp, ignore_errors=True)


# Modules every Hermes version here imports to serve a job (0.19.0-0.22.2); their bytecode stands for the install's.
HERMES_CORE_MODULES = ("run_agent.py", "model_tools.py", os.path.join("hermes_cli", "main.py"))
COMPILE_TIMEOUT_S = 900.0  # 0.22.2's 5,389 modules, one core, beside a job's start


def install_without_bytecode(exe: str) -> str | None:
    """The site-packages of a Python install of Hermes whose core modules have no compiled bytecode, else None.
    A confined Hermes cannot write bytecode into its install, so without it every start compiles every module
    (0.22.2: importing run_agent, model_tools and acp_adapter.server took 3.5 s instead of 1.5 s); uv
    installs without compiling. A few stats, no process: hermes_health asks on every call."""
    install = os.path.dirname(os.path.dirname(os.path.realpath(exe)))  # <env>/bin/hermes
    with contextlib.suppress(OSError):
        for name in sorted(os.listdir(os.path.join(install, "lib"))):
            site = os.path.join(install, "lib", name, "site-packages")
            tag = "cpython-" + name.removeprefix("python").replace(".", "")
            present = [path for path in (os.path.join(site, module) for module in HERMES_CORE_MODULES)
                       if os.path.isfile(path)]
            if name.startswith("python3.") and present and not any(os.path.isfile(os.path.join(
                    os.path.dirname(path), "__pycache__", f"{os.path.basename(path)[:-3]}.{tag}.pyc"))
                    for path in present):
                return site
    return None


def install_python(site: str) -> str:
    """The Python of the install whose site-packages this is (<env>/lib/python3.X/site-packages)."""
    return os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(site))), "bin", "python")


def compile_install(cfg: Config, exe: str, site: str) -> str:
    """Hermes' install compiled by its own Python, confined like every call of Hermes the bridge makes, with
    nothing writable but that site-packages (and a temporary folder): `-I -S` runs the standard library's
    compileall and no code of the install (no .pth file, no sitecustomize); compiling runs none of the code it
    reads. What happened, in words."""
    python = install_python(site)
    if not os.path.isfile(python):
        return f"not compiled: Hermes' install has no {python}"
    try:
        with confined_call(cfg, [python, "-I", "-S", "-m", "compileall", "-q", site], (site,)) as (argv, env):
            done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=COMPILE_TIMEOUT_S,
                                  env=env)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"not compiled: {exc}"
    if install_without_bytecode(exe) is None:
        return "compiled"
    tail = (done.stdout + done.stderr).decode("utf-8", "replace").strip()[-300:]
    return f"not compiled: {python} -m compileall exited {done.returncode}: {tail}"


def run_probe(cfg: Config, exe: str, *args: str) -> "subprocess.CompletedProcess[bytes]":
    """Start Hermes, confined (confined_call), to ask it something (its options, whether it speaks ACP), marked
    running meanwhile: the first start after an install can outlast a tool's deadline, and that deadline's
    message says why."""
    PROBES_RUNNING[threading.get_ident()] = " ".join(("hermes",) + args)
    try:
        with confined_call(cfg, [exe, *args]) as (argv, env):
            return subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=60, env=env)
    finally:
        PROBES_RUNNING.pop(threading.get_ident(), None)


def running_probe() -> str | None:
    """The command of a probe running now in this process, or None."""
    return next(iter(PROBES_RUNNING.values()), None)


def probe_cli(cfg: Config, exe: str) -> HermesCli:
    """Ask `hermes chat --help` once per executable (about 0.5 s) and cache the options it declares."""
    result = run_probe(cfg, exe, "chat", "--help")
    flags = sorted({flag.decode() for flag in LONG_FLAG_RE.findall(result.stdout + result.stderr)})
    path = flags_cache_path(cfg)
    cache = read_json(path)
    cache = cache if isinstance(cache, dict) else {}
    cache[exe_fingerprint(exe)] = flags
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(cache, indent=1).encode())
    except OSError:
        pass  # asked again next time; the answer is still right for this job
    return HermesCli(frozenset(flags), "declared by `hermes chat --help`, probed just now")


UNKNOWN_OPTION_RE = re.compile(rb"unrecognized arguments|no such option|unknown option")
USAGE_ERROR_RE = re.compile(rb"(?m)^usage: |invalid choice|" + UNKNOWN_OPTION_RE.pattern)


def forget_probe(cfg: Config, exe: str, what: str = "") -> None:
    """Drop this executable's cached options (or, with `what="|acp"`, its cached ACP answer), so the next
    launch probes again: a cache rewritten by a job, or an extra removed since, then costs one job, not every
    later one."""
    path = flags_cache_path(cfg)
    cache = read_json(path)
    if isinstance(cache, dict) and cache.pop(exe_fingerprint(exe) + what, None) is not None:
        with contextlib.suppress(OSError):
            write_atomic(path, json.dumps(cache, indent=1).encode())


WINDOWS_COMMAND_LINE_LIMIT = 32_767 - 1_024  # CreateProcess' limit, with a margin


def argv_problem(argv: list[str], windows: bool = IS_WINDOWS) -> str | None:
    """Why this command line cannot be started, or None. Linux caps each argument at 128 KiB; Windows caps
    the whole command line, counted after quoting (list2cmdline doubles backslashes and escapes quotes)."""
    if windows:
        length = len(subprocess.list2cmdline(argv))
        if length <= WINDOWS_COMMAND_LINE_LIMIT:
            return None
        size = f"the command line would be {length} characters once quoted; Windows allows {WINDOWS_COMMAND_LINE_LIMIT}"
    else:
        longest = max(len(arg.encode("utf-8", "surrogateescape")) for arg in argv)
        if longest <= POSIX_ARGUMENT_LIMIT:
            return None
        size = f"one argument would be {longest} bytes; this system allows {POSIX_ARGUMENT_LIMIT}"
    return (f"{size}. This Hermes takes the task on its command line: shorten it, or write the details to a "
            "file under cwd and tell Hermes to read it")


def executable_problem(exe: str, windows: bool = IS_WINDOWS) -> str | None:
    """Why this Hermes executable must not be started, or None. On Windows a .cmd or .bat runs through
    cmd.exe, which parses the task ('&calc&'): never through a shell."""
    if windows and os.path.splitext(exe)[1].lower() in (".cmd", ".bat"):
        return (f"Hermes resolves to a batch file ({exe}), which Windows runs through cmd.exe, where the task "
                "would be parsed as commands. Set hermes_exe to the real executable (hermes.exe in Hermes' "
                "venv Scripts folder)")
    return None


# A job's Hermes is handed what a shell, a toolchain and Hermes need of the server's environment, by name, prefix
# or suffix; everything else is left out, known or not (a list of secrets always misses one: API_KEY, TOKEN,
# DATABASE_URL, BW_SESSION, SENTRY_DSN, PIP_INDEX_URL with a password in it, ...). Hermes' model providers' keys
# pass (Hermes needs its own, and strips them from its tools' environment itself: its provider blocklist, 0.19 to
# 0.22); pass_credentials and pass_environment add names.
ENVIRONMENT_NAMES = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "USERNAME", "SHELL", "LANG", "LANGUAGE", "TERM", "COLORTERM", "TERM_PROGRAM",
    "COLUMNS", "LINES", "TZ", "TMPDIR", "TEMP", "TMP", "PWD", "EDITOR", "VISUAL", "PAGER", "LD_LIBRARY_PATH",
    "DISPLAY", "WAYLAND_DISPLAY", "XAUTHORITY", "NO_COLOR", "FORCE_COLOR", "CLICOLOR", "DO_NOT_TRACK",
    "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "GIT_SSL_CAINFO",
    "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "no_proxy", "all_proxy",
    "VIRTUAL_ENV", "GOROOT", "GOPATH", "JAVA_HOME", "RUSTUP_HOME", "NVM_DIR", "DEBIAN_FRONTEND",
    # Windows: what its programs and Python need to start at all
    "SYSTEMROOT", "WINDIR", "COMSPEC", "PATHEXT", "SYSTEMDRIVE", "USERPROFILE", "APPDATA", "LOCALAPPDATA",
    "PROGRAMDATA", "PROGRAMFILES", "PROGRAMFILES(X86)", "PROGRAMW6432", "COMMONPROGRAMFILES", "ALLUSERSPROFILE",
    "PUBLIC", "HOMEDRIVE", "HOMEPATH", "COMPUTERNAME", "USERDOMAIN", "OS", "NUMBER_OF_PROCESSORS",
    "PROCESSOR_ARCHITECTURE", "PROCESSOR_IDENTIFIER", "PROCESSOR_LEVEL", "PROCESSOR_REVISION"})
ENVIRONMENT_PREFIXES = ("LC_", "XDG_", "HERMES_", "PYTHON", "WINE")  # HERMES_: Hermes' own settings
ENVIRONMENT_SUFFIXES = ("_CA_BUNDLE", "_BASE_URL", "_API_BASE")  # certificate bundles; model endpoints
# Of the names above, those shaped as a credential are still left out (HERMES_GITHUB_TOKEN), unless passed.
CREDENTIAL_NAME_RE = re.compile(r"AWS_ACCESS_KEY_ID|\w*(_TOKEN|_SECRET|_SECRET_KEY|_PASSWORD|_PASSWD|_API_KEY|"
                                r"_ACCESS_KEY|_CREDENTIALS|_AUTH|_PAT|_PASS|_PWD)|NETRC|PGPASSWORD|MYSQL_PWD",
                                re.IGNORECASE)
PROVIDER_KEYS = frozenset({
    "OPENAI_API_KEY", "OPENROUTER_API_KEY", "ANTHROPIC_API_KEY", "ANTHROPIC_TOKEN", "GOOGLE_API_KEY", "GEMINI_API_KEY",
    "DEEPSEEK_API_KEY", "MISTRAL_API_KEY", "GROQ_API_KEY", "TOGETHER_API_KEY", "PERPLEXITY_API_KEY",
    "COHERE_API_KEY", "FIREWORKS_API_KEY", "XAI_API_KEY", "NOUS_API_KEY", "QWEN_API_KEY", "CUSTOM_API_KEY",
    "OLLAMA_API_KEY", "LLM_API_KEY"})
LEFT_OUT_ALWAYS = frozenset({SETTINGS_ENV, "HERMES_KANBAN_TASK"})  # the bridge's own; a mode of Hermes' exits


def is_handed(cfg: Config, name: str) -> bool:
    """Whether a job's Hermes is handed the server's variable of this name."""
    upper = name.upper()
    passed = {entry.upper() for entry in cfg.pass_credentials if isinstance(entry, str)}
    if upper in passed or upper in PROVIDER_KEYS:
        return True
    if name in LEFT_OUT_ALWAYS or CREDENTIAL_NAME_RE.fullmatch(name):
        return False
    for entry in cfg.pass_environment:
        if isinstance(entry, str) and (upper == entry.upper()
                                       or (entry.endswith("*") and upper.startswith(entry[:-1].upper()))):
            return True
    return (upper in ENVIRONMENT_NAMES or name in ENVIRONMENT_NAMES or upper.startswith(ENVIRONMENT_PREFIXES)
            or upper.endswith(ENVIRONMENT_SUFFIXES))


# the server's environment's answer, by its names and the two settings
LEFT_OUT_SEEN: dict[tuple[frozenset[str], str, str], list[str]] = {}


def left_out_environment(cfg: Config, environment: dict[str, str] | None = None) -> list[str]:
    """The names in the environment that a job is not handed (is_handed), sorted (the server's own environment's
    answer kept while its names and the settings stay: hermes_health asks on every call)."""
    if environment is not None:
        return sorted(name for name in environment if not is_handed(cfg, name))
    key = (frozenset(os.environ), repr(cfg.pass_credentials), repr(cfg.pass_environment))
    if key not in LEFT_OUT_SEEN:
        LEFT_OUT_SEEN.clear()
        LEFT_OUT_SEEN[key] = sorted(name for name in os.environ if not is_handed(cfg, name))
    return list(LEFT_OUT_SEEN[key])


def hermes_env(cfg: Config, marker: str | None = None) -> dict[str, str]:
    """What Hermes is handed of the server's environment (is_handed: an allow-list); a job's processes also carry
    its marker, part of the proof that lets the bridge signal them (see Ownership)."""
    env = {key: value for key, value in os.environ.items() if is_handed(cfg, key)}
    if cfg.approval_mode != "yolo":
        env.pop("HERMES_YOLO_MODE", None)  # an approval bypass the user did not choose for the bridge
    if cfg.hermes_home:
        env["HERMES_HOME"] = str(cfg.hermes_home_path)
    if marker:
        env[JOB_MARKER] = marker
    return env


def hermes_command(cli: HermesCli, exe: str, record: JobRecord, task: str, cfg: Config) -> list[str]:
    """The argv for one job, from the options this Hermes declares. Every value is joined to its option
    with '=' so a task or id that starts with '-' can never be read as an option; no shell is involved."""
    argv = [exe, "chat"]
    argv += ["--query-file", "-"] if cli.task_on_stdin else [QUERY_OPTION + task]
    argv.append("-Q")
    if "--oneshot" in cli.flags:
        argv.append("--oneshot")
    if "--in" in cli.flags:
        argv.append(f"--in={record.cwd}")
    if record.max_turns:
        argv.append(f"--max-turns={record.max_turns}")
    if record.session_requested:
        argv.append(f"--resume={record.session_requested}")
    if record.skills:
        argv.append("--skills=" + ",".join(record.skills))
    if record.toolsets:
        argv.append("--toolsets=" + ",".join(record.toolsets))
    if cfg.approval_mode == "yolo":
        argv.append("--yolo")
    return argv + list(cfg.extra_args)


def command_preview(cli: HermesCli, exe: str, cfg: Config) -> str:
    """The command line a job would use, task and folder elided, for hermes_health and --check."""
    example = JobRecord(id="<id>", state=JobState.STARTING, cwd="<cwd>", max_turns=cfg.default_max_turns)
    argv = hermes_command(cli, exe, example, "<task>", cfg)
    return " ".join(argv) + (" (stdin: <task>)" if cli.task_on_stdin else "")


def read_tail(path: Path, max_bytes: int) -> tuple[bytes, int]:
    """The last max_bytes of a regular file by seek, and its size: a log's size never costs memory.
    A symlink, FIFO or device reads as empty."""
    try:
        with open_regular(path) as handle:
            size = os.fstat(handle.fileno()).st_size
            handle.seek(max(0, size - max_bytes))
            return handle.read(max_bytes), size
    except OSError:
        return b"", 0


def session_id_from_log(path: Path) -> str | None:
    """The last `session_id:` line Hermes printed (a compressed session continues under a new id)."""
    tail, _ = read_tail(path, 65536)
    found = [sid for sid in SESSION_ID_RE.findall(tail.decode("utf-8", "replace")) if SESSION_NAME_RE.fullmatch(sid)]
    return found[-1] if found else None


def ends_with_session_line(path: Path) -> bool:
    """Whether the log's last line is a `session_id:` line: a CLI turn prints it last, once the turn is saved."""
    tail, _ = read_tail(path, 4096)
    lines = tail.decode("utf-8", "replace").rstrip().splitlines()
    return bool(lines) and SESSION_ID_RE.fullmatch(lines[-1]) is not None


# Signals a process gets from its own fault, not from another process; and Windows' NTSTATUS codes of a crash
# (0xC0000005 access violation, 0xC0000409 fail-fast, ...) as the exit code of the process that had it.
CRASH_SIGNALS = frozenset({"SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE", "SIGABRT", "SIGSYS", "SIGTRAP"})
WINDOWS_CRASH_CODES = range(0xC0000000, 0x1_0000_0000)


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def crash_name(code: int) -> str | None:
    """The fault an exit code shows ("SIGSEGV, 11", "Windows status 0xC0000005"), or None for any other end."""
    if code < 0:
        return f"{signal_name(-code)}, {-code}" if signal_name(-code) in CRASH_SIGNALS else None
    return f"Windows status 0x{code:08X}" if code in WINDOWS_CRASH_CODES else None


def describe_exit(code: int, turn_saved: bool = False, usage_error: bool = False) -> str:
    """Hermes' failing exit code in words. A crash (a fault in Hermes or its Python) is told from a kill,
    and a crash after Hermes printed its session id, the last thing a CLI turn prints once the turn is saved
    (seen here: Hermes 0.22.2 segfaults on its way out in about one resume of 40), from one during the turn."""
    crash = crash_name(code)
    if crash and turn_saved:
        return (f"Hermes crashed ({crash}) on its way out, after its turn had ended and been saved (its session id "
                "was the last line it printed): the answer is the one it gave and the work is whatever the turn "
                "did. Check the files with hermes_read rather than running the task again")
    if crash:
        return (f"Hermes crashed ({crash}) before its turn was known to have ended: work may be part-done; "
                "inspect the files with hermes_read before re-running")
    if code < 0:
        return f"Hermes was killed by {signal_name(-code)} ({-code}) from outside the bridge"
    if code == 2 and usage_error:
        return ("Hermes exited 2: it rejected its command line (see the output); hermes_health shows the options "
                "this Hermes declared and the command line the bridge built from them")
    if code == 130:
        return "Hermes exited 130: interrupted"
    return f"Hermes exited with code {code}"


RATE_LIMITED_RE = re.compile(rb"(?i)\b429\b|rate.?limit|too many requests")
UNREACHABLE_RE = re.compile(rb"(?i)connection error|connection refused|could not connect|failed to connect|"
                            rb"name or service not known|timed out connecting")


def model_trouble(log_tail: bytes) -> str | None:
    """What the end of a failed job's log says about Hermes' model endpoint, in words a planner can act on."""
    if RATE_LIMITED_RE.search(log_tail):
        return "the model endpoint rate-limited Hermes (HTTP 429 in the log)"
    if UNREACHABLE_RE.search(log_tail):
        return "Hermes could not reach its model endpoint (connection errors in the log)"
    return None


def retry_advice(state: "JobState", reason: str) -> str | None:
    """Whether running the task again as it is can help, for the final block's RETRY line."""
    if state is JobState.OVER_BUDGET:
        return "no: raise the cap the REASON names (max_tokens, max_cost_usd, max_turns) or split the task"
    if state is JobState.TIMEOUT:
        return "no: raise timeout_s or split the task; inspect the files first"
    if state is JobState.CANCELLED:
        return "only if you still want it done: inspect the files first"
    if state is JobState.ORPHANED:
        return "not yet: stop what is left (hermes_cancel) and inspect the files first"
    if state is not JobState.ERROR:
        return None
    if "rate-limited" in reason:
        return "yes, after a pause"
    if "could not reach its model" in reason:
        return "no: fix Hermes' model settings (`hermes chat -q hi` must work by hand)"
    if "rejected its command line" in reason or "Nothing was run" in reason or "Hermes cannot be started" in reason:
        return "no: fix what the REASON names (hermes_health shows the setup)"
    if "stopReason max_tokens" in reason:
        return "maybe: inspect the files, then resume the session (hermes_resume) to go on, or split the task"
    if "stopReason max_turn_requests" in reason:
        return "no: resume the session (hermes_resume) to go on, or raise agent.max_turns in Hermes' config.yaml"
    if "crashed" in reason or "interrupted" in reason:
        return "yes, once the files are checked (the turn may be part-done)"
    return "maybe: read the log (FULL_LOG) for why Hermes failed"


# Hermes 0.19-0.20 print these when a resumed session moves to its recorded folder (cli.py, hermes_cli/main.py).
MOVE_ANNOUNCEMENT_BYTES = 16384
FOLDER_MOVE_RE = re.compile(r"^(?:↻ Working directory|↪ restored workspace dir): (.+?)\s*$", re.MULTILINE)
