"""[both] Config (each setting declared once, in SETTINGS), where it is found, validation; the roots; the audit log."""
import dataclasses
import functools
import json
import math
import os
import re
import stat
import time
from pathlib import Path
from typing import Any

from .network import NETWORK_MODES, PACKAGE_REGISTRIES, rules_problem
from .preflight import SERVER_DIR, user_dir
from .safe_io import IS_WINDOWS, NOFOLLOW, Refused, case_normalised, locked, read_capped, shown, within_any
from .sandbox import SANDBOX_MODES

MAX_WAIT_CEILING_S = 50.0
APPROVAL_MODES = ("deny", "ask", "yolo")
DRIVER_NAMES = ("acp", "cli")  # the ways to drive Hermes; DRIVERS (Hermes drivers) holds their classes
ISOLATIONS = ("none", "worktree")  # where a job works: in its folder, or in a git worktree of its own
START_GRACE_S = 30.0  # a launched job whose supervisor has not reported by then is orphaned


@dataclasses.dataclass(frozen=True)
class Setting:
    """One config.json key, declared once, beside its Config field: the JSON types it takes (and the same in
    words), its bounds or its choices (the first choice is the default), and what it is for."""

    described: str
    types: tuple[type, ...]
    purpose: str
    low: float | None = None  # below it, or not finite, the default is used
    high: float | None = None  # above it the value is clamped
    choices: tuple[str, ...] = ()


def one_of(words: tuple[str, ...], quote: str = "") -> str:
    """'"deny", "ask" or "yolo"': the choices of a setting, in words."""
    quoted = [f"{quote}{word}{quote}" for word in words]
    return f"{', '.join(quoted[:-1])} or {quoted[-1]}"


def setting(default: Any, described: str, types: tuple[type, ...], purpose: str, *, low: float | None = None,
            high: float | None = None, choices: tuple[str, ...] = ()) -> Any:
    """A Config field that is a setting: its default and its Setting (read back through SETTINGS). A setting
    of choices is described by them (described is then left empty)."""
    meta = {"setting": Setting(described or one_of(choices, '"'), types, purpose, low, high, choices)}
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=functools.partial(type(default), default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


PATH_OR_NULL = ("a path string or null", (str, type(None)))
FOLDER_OR_NULL = ("a folder path or null", (str, type(None)))
SECONDS = ("a number of seconds", (int, float))
WHOLE = ("a whole number", (int,))
FLAG = ("true or false", (bool,))


@dataclasses.dataclass
class Config:
    """config.json as the server uses it: each setting is declared here once (setting), and every problem
    found while loading is kept, never raised."""

    path: Path
    hermes_exe: str | None = setting(None, *PATH_OR_NULL, "the hermes executable (else `hermes` on PATH)")
    hermes_home: str | None = setting(None, *PATH_OR_NULL, "Hermes' home: skills and sessions")
    allowed_roots: list[str] = setting([], "a list of folder paths", (list,), "the folders jobs may start in")
    default_cwd: str | None = setting(None, *FOLDER_OR_NULL, "the folder of a job given no cwd")
    default_timeout_s: float = setting(1800, *SECONDS, "a job's timeout when the call gives none", low=1)
    max_timeout_s: float = setting(14400, *SECONDS, "the most timeout_s a call may ask", low=1)
    default_max_turns: int | None = setting(None, "a whole number or null", (int, type(None)),
                                            "max_turns when the call gives none (null: Hermes' own)", low=1)
    default_max_tokens: int | None = setting(None, "a whole number or null", (int, type(None)),
                                             "a job's token budget when the call gives none (null: none)", low=1)
    max_tokens_limit: int | None = setting(None, "a whole number or null", (int, type(None)),
                                           "the most max_tokens a call may ask (null: no ceiling)", low=1)
    default_max_cost_usd: float | None = setting(None, "a number of dollars or null", (int, float, type(None)),
                                                 "a job's cost budget when the call gives none (null: none)",
                                                 low=0.000001)
    max_cost_usd_limit: float | None = setting(None, "a number of dollars or null", (int, float, type(None)),
                                               "the most max_cost_usd a call may ask (null: no ceiling)",
                                               low=0.000001)
    max_wait_s: float = setting(45, *SECONDS, "the longest a tool call waits; hosts cut calls off at about 60 s",
                                low=1, high=MAX_WAIT_CEILING_S)
    max_output_chars: int = setting(8000, *WHOLE, "how much of Hermes' output a final block quotes", low=200)
    max_running_jobs: int = setting(4, *WHOLE, "how many jobs may run at once", low=1)
    max_queued_jobs: int = setting(20, *WHOLE, "how many jobs may wait for a free slot (past it a launch is refused)",
                                   low=0)
    yolo: bool = setting(False, *FLAG, 'the older spelling of approvals "yolo"')
    approvals: str | None = setting(None, "", (str,),
                                    "what the bridge answers when Hermes asks before a dangerous command",
                                    choices=APPROVAL_MODES)  # unset: the older yolo decides (approval_mode)
    approval_timeout_s: float = setting(300, *SECONDS, "how long Hermes waits for an answer", low=5)
    hermes_driver: str = setting("auto", "", (str,), "how jobs drive Hermes",
                                 choices=("auto", *DRIVER_NAMES))
    hermes_cli_form: str = setting("auto", "", (str,),
                                   "the CLI's options (auto: as `hermes chat --help` declares them)",
                                   choices=("auto", "query-file", "query-arg"))
    extra_args: list[str] = setting([], "a list of strings", (list,), "more options for `hermes chat`")
    default_isolation: str = setting("none", "", (str,), "where a job given no isolation works: in its folder "
                                     "(none) or in a git worktree of its own (worktree)", choices=ISOLATIONS)
    sandbox: str = setting("auto", "", (str,), "whether the operating system keeps a job's writes in its folders "
                           "(auto: where it can; required: refuse a job it cannot; off)", choices=SANDBOX_MODES)
    sandbox_writable: list[str] = setting([], "a list of folder paths", (list,),
                                          "more folders a sandboxed job may write (a shared cache)")
    sandbox_unreadable: list[str] = setting([], "a list of absolute paths", (list,),
                                            "more paths a sandboxed job may not read, outside your home too")
    sandbox_readable: list[str] = setting([], "a list of absolute paths", (list,),
                                          "more of your home a sandboxed job may read (it reads only the "
                                          "toolchains' public files there, its own folders and Hermes')")
    network: str = setting("ask", "", (str,), "what a job may reach over the network (ask: network_allow and "
                           "Hermes' model, and the user is asked about any other host; allow-list: those alone; "
                           "model-only; open: any host)", choices=NETWORK_MODES)
    network_allow: list[str] = setting(list(PACKAGE_REGISTRIES), "a list of hosts (pypi.org, *.pythonhosted.org, "
                                       "127.0.0.1:8080)", (list,), "the hosts a job may reach under network ask or "
                                       "allow-list (the default: the package registries everyday installs use)")
    pass_credentials: list[str] = setting([], "a list of environment variable names", (list,),
                                          "credentials in the server's environment a job may have (others are "
                                          "left out of Hermes' environment)")
    pass_environment: list[str] = setting([], "a list of environment variable names (NAME* for a prefix)", (list,),
                                          "more of the server's environment a job is handed (it gets only what a "
                                          "shell, a toolchain and Hermes need)")
    executors: dict[str, Any] = setting({}, "a table of names, each {\"kind\": \"docker\", \"image\": ...} or "
                                        "{\"kind\": \"ssh\", \"host\": ..., \"user\": ..., \"key\": ...}",
                                        (dict,), "where a job may run besides this machine (docs/executors.md)")
    default_executor: str = setting("local", "an executor's name", (str,),
                                    "where a job given no executor runs (local: this machine)")
    jobs_dir: str | None = setting(None, *FOLDER_OR_NULL, "the jobs folder (else the per-user state folder)")
    logs_dir: str | None = setting(None, *FOLDER_OR_NULL, "the audit log's folder (else the per-user one)")
    read_anywhere: bool = setting(False, *FLAG, "let hermes_read read outside the allowed roots")
    kill_grace_s: float = setting(5, *SECONDS, "how long a stopped Hermes gets before it is killed", low=0)
    warm_start: bool = setting(True, *FLAG, "keep a `hermes acp` started and warmed for the next ACP job in the "
                               "same folder and settings, for each of the last jobs' folders (warm_start_folders): "
                               "its start drops from seconds to under one")
    standby_idle_s: float = setting(600, *SECONDS, "how long a warm Hermes waits for a job before it exits", low=5)
    warm_start_folders: int = setting(2, *WHOLE, "how many folders keep a warm Hermes waiting at once (those of the "
                                      "last jobs; each costs about 100-170 MB while it waits)", low=1, high=4)
    warm_start_any_folder: bool = setting(True, *FLAG, "Linux, with the sandbox: one more warm Hermes waits, "
                                          "bound late to the folder of the next default job that has no standby "
                                          "of its own (docs/performance.md)")
    retention_days: float = setting(30, "a number of days", (int, float), "how long finished jobs are kept",
                                    low=0)
    retention_max_jobs: int = setting(1000, *WHOLE, "how many finished jobs are kept at most", low=1)
    audit_max_bytes: int = setting(1_000_000, "a whole number of bytes", (int,), "the audit log's size before it "
                                   "rotates", low=10_000)
    max_log_bytes: int = setting(16 << 20, "a whole number of bytes", (int,), "a job log's size past which it "
                                 "keeps its head and its newest output", low=65536)
    changed_files_skip: list[str] = setting([".git", "node_modules", ".venv", "__pycache__"],
                                            "a list of folder names", (list,), "folders CHANGED_FILES leaves out")
    changed_files_max_entries: int = setting(20_000, *WHOLE, "how many entries CHANGED_FILES lists at most", low=0)
    changed_files_max_s: float = setting(10, *SECONDS, "how long listing a job's folder may take", low=0)
    problems: list[str] = dataclasses.field(default_factory=list)
    sources: dict[str, str] = dataclasses.field(default_factory=dict)
    file_stamp: tuple[int, int] | None = None  # the config file's mtime and size when it was read

    def _dir(self, value: str | None, kind: str, legacy: str) -> Path:
        """A configured folder (relative = beside the config file); by default the per-user one, except
        in a clone that already keeps its jobs beside server.py, which goes on answering for them."""
        if value:
            path = Path(os.path.expanduser(value))
            return path if path.is_absolute() else self.path.parent / path
        if (SERVER_DIR / legacy).is_dir():
            return SERVER_DIR / legacy
        return user_dir("state") / "jobs" if kind == "state" else user_dir("log")

    @property
    def jobs_path(self) -> Path:
        return self._dir(self.jobs_dir, "state", "jobs")

    @property
    def logs_path(self) -> Path:
        return self._dir(self.logs_dir, "log", "logs")

    @property
    def roots(self) -> list[str]:
        """The allowed roots that are absolute and exist, resolved: the only places a job may start.

        A relative entry ("." or "") would resolve against the server's own folder, which the host picks,
        so it is ignored, never resolved."""
        resolved = []
        for root in self.allowed_roots:
            expanded = os.path.expanduser(root)
            if not os.path.isabs(expanded):
                continue
            real = os.path.realpath(expanded)
            if os.path.isdir(real):
                resolved.append(real)
        return resolved

    @property
    def hermes_exe_path(self) -> str | None:
        """hermes_exe as configured; a relative path is taken from the config file's folder, never the job's."""
        if not self.hermes_exe:
            return None
        expanded = os.path.expanduser(self.hermes_exe)
        return expanded if os.path.isabs(expanded) else str(self.path.parent / expanded)

    @property
    def approval_mode(self) -> str:
        """What the bridge answers when Hermes asks before a dangerous command: deny (the default), ask
        (relay the question to the user), or yolo (allow). `yolo: true` is the older spelling of yolo, and wins
        over deny: the bundle passes its "Auto-approve" box as --yolo beside --approvals deny, its default."""
        if self.yolo and self.approvals in (None, "deny"):
            return "yolo"
        return self.approvals or "deny"

    @property
    def hermes_home_path(self) -> Path:
        if self.hermes_home:
            return Path(os.path.expanduser(self.hermes_home))
        if os.environ.get("HERMES_HOME"):
            return Path(os.environ["HERMES_HOME"])
        if IS_WINDOWS and os.environ.get("LOCALAPPDATA"):
            return Path(os.environ["LOCALAPPDATA"]) / "hermes"
        return Path.home() / ".hermes"


SETTINGS: dict[str, Setting] = {field.name: field.metadata["setting"] for field in dataclasses.fields(Config)
                                if "setting" in field.metadata}


SETTINGS_ENV = "HERMES_BRIDGE_SETTINGS"  # settings the host passed on the command line, for supervisors


def config_override() -> Path | None:
    override = os.environ.get("HERMES_BRIDGE_CONFIG")
    return Path(override).expanduser().resolve() if override else None


def config_places() -> list[tuple[str, Path | None]]:
    """Where the config is looked for, in order: (what, path); the first that exists is used, and with none
    the per-user one (where --init-config writes)."""
    return [("HERMES_BRIDGE_CONFIG", config_override()), ("beside server.py", SERVER_DIR / "config.json"),
            ("the per-user folder", user_dir("config") / "config.json")]


def config_path() -> Path:
    """HERMES_BRIDGE_CONFIG (what a supervisor always gets: it then never asks for the per-user folders),
    else config.json beside server.py (the clone route), else the per-user one."""
    override = config_override()
    if override:
        return override
    beside = SERVER_DIR / "config.json"
    return beside if beside.exists() else user_dir("config") / "config.json"


def config_search() -> str:
    """Every place looked at for the config, in order, and what was there: for --check."""
    found = []
    for what, path in config_places():
        state = "not set" if path is None else ("found" if path.exists() else "none")
        found.append(f"{what}: {path or ''} ({state})".replace(":  (", " ("))
    return "; ".join(found)


def config_fix() -> str:
    """How to make a config, in the words that fit this install: a clone has config.example.json to copy."""
    if (SERVER_DIR / "config.example.json").exists():
        return ("run `python server.py --init-config --allowed-roots DIR --hermes-exe PATH` (or copy "
                "config.example.json to config.json and set allowed_roots)")
    return "run `claude-hermes-bridge --init-config --allowed-roots DIR` (or server.py --init-config)"


def read_config_file(path: Path, cfg: Config) -> dict[str, Any]:
    """The file's settings; every problem is kept in cfg.problems, never raised."""
    try:
        data = read_capped(path, 1 << 20, follow=True)
        info = os.stat(path)
        cfg.file_stamp = (info.st_mtime_ns, info.st_size)
        raw = json.loads(data.decode("utf-8"))
    except FileNotFoundError:
        if not host_settings():
            cfg.problems.append(f"no config file at {path}: {config_fix()} (or pass --allowed-roots)")
        return {}
    except json.JSONDecodeError as exc:
        cfg.problems.append(f"{path} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}; "
                            "fix that spot (config.example.json shows the format)")
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        cfg.problems.append(f"cannot read {path}: {exc}")
        return {}
    if not isinstance(raw, dict):
        cfg.problems.append(f"{path} must hold a JSON object {{...}}, not {type(raw).__name__}")
        return {}
    return raw


def host_settings() -> dict[str, Any]:
    """Settings the host passed on the server's command line (main() puts them in the environment, so the
    supervisors it starts see them too); they win over the config file."""
    try:
        settings = json.loads(os.environ.get(SETTINGS_ENV) or "{}")
    except ValueError:
        return {}
    return {k: v for k, v in settings.items() if k in HOST_SETTING_KEYS} if isinstance(settings, dict) else {}


HOST_SETTING_KEYS = ("allowed_roots", "hermes_exe", "hermes_home", "yolo", "approvals", "sandbox")


def load_config(path: Path | None = None) -> Config:
    """Defaults, then config.json, then the host's command-line settings; a missing or broken file yields
    defaults plus a list of problems, never an error. cfg.sources says where each setting came from."""
    path = path or config_path()
    cfg = Config(path=path)
    for key, value in read_config_file(path, cfg).items():
        if key.startswith("_"):
            continue  # "_comment" keys document the file
        if key not in SETTINGS:
            cfg.problems.append(f"unknown key {key!r} in {path.name} (ignored); known keys: "
                                + ", ".join(SETTINGS))
            continue
        known = SETTINGS[key]
        wrong_bool = isinstance(value, bool) and bool not in known.types
        if wrong_bool or not isinstance(value, known.types) or (
                isinstance(value, list) and not all(isinstance(v, str) for v in value)):
            cfg.problems.append(f"{key} must be {known.described} ({known.purpose}), got {json.dumps(value)[:60]} "
                                "(default used)")
            continue
        setattr(cfg, key, value)
        cfg.sources[key] = f"config file {path}"
    pinned = host_settings()
    for key, value in pinned.items():
        setattr(cfg, key, value)
        cfg.sources[key] = "command line"
    cfg.problems += guard_file_settings(cfg, pinned)
    cfg.problems += validate_config(cfg)
    return cfg


# Options of `hermes chat` the bridge sets itself (task, folder, session, approvals, limits): extra_args may
# not carry them, or a file a job can write could move the next job out of the roots (Hermes keeps the last
# --in) or approve every command.
BRIDGE_OPTIONS = ("--query", "--query-file", "--in", "--resume", "--continue", "--oneshot", "--quiet", "--yolo",
                  "--max-turns", "--skills", "--toolsets", "--no-restore-cwd")
BRIDGE_SHORT_OPTIONS = "qQrcst"


def bridge_option(arg: str) -> bool:
    """True when a command-line word sets (or could be read as) an option the bridge sets itself: exact or
    with =value, any unambiguous prefix argparse would accept, or a short option, alone or bundled."""
    if arg.startswith("--"):
        name = arg.split("=", 1)[0]
        return len(name) > 2 and any(option.startswith(name) for option in BRIDGE_OPTIONS)
    return arg.startswith("-") and len(arg) > 1 and any(flag in BRIDGE_SHORT_OPTIONS for flag in arg[1:])


def guard_file_settings(cfg: Config, pinned: dict[str, Any]) -> list[str]:
    """What a config file (which a job can write) may not do: carry an option the bridge sets in extra_args,
    or widen what the host pinned on the command line (read_anywhere reads outside the pinned roots). The
    value is put right, and the problem returned."""
    problems = []
    claimed = [arg for arg in cfg.extra_args if bridge_option(arg)]
    if claimed:
        problems.append(f"extra_args holds options the bridge sets itself ({shown(', '.join(claimed), 200)}); "
                        "extra_args is ignored until they are removed")
        cfg.extra_args = []
    if "approvals" not in pinned and pinned.get("yolo") is False and cfg.approvals == "yolo":
        problems.append(f"approvals yolo in {cfg.path} is lowered to ask: the host pinned --yolo false")
        cfg.approvals = "ask"
    if "sandbox" in pinned and cfg.sandbox_writable:
        problems.append(f"sandbox_writable in {cfg.path} is ignored: the host pinned --sandbox, and a file cannot "
                        "widen what the host pinned")
        cfg.sandbox_writable = []
    if "allowed_roots" in pinned and cfg.read_anywhere:
        problems.append(f"read_anywhere in {cfg.path} is ignored: the host pinned allowed_roots on the command "
                        "line, and a file cannot widen what the host pinned")
        cfg.read_anywhere = False
    return problems


def validate_config(cfg: Config) -> list[str]:
    """Problems that only show once the values are read: missing roots, unknown choices, out-of-range
    numbers, a Hermes or a default folder that is not there. Each bad value is replaced by its default."""
    problems = root_problems(cfg) + choice_problems(cfg) + number_problems(cfg)
    if problem := rules_problem(cfg.network_allow):
        problems.append(f"network_allow: {problem} (write a host name, *.domain, an address, each with an optional "
                        ":port); network_allow is ignored until it is fixed")
        cfg.network_allow = []
    table, executor_problems = parse_executors(cfg.executors)
    problems += [f"executors: {problem}; executors is ignored until it is fixed (docs/executors.md)"
                 for problem in executor_problems]
    if executor_problems:
        cfg.executors = {}
    if cfg.default_executor != LOCAL and cfg.default_executor not in table:
        problems.append(f"default_executor {cfg.default_executor!r} is not in executors (local used)")
        cfg.default_executor = LOCAL
    if cfg.hermes_exe_path and not os.path.exists(cfg.hermes_exe_path):
        problems.append(f"hermes_exe {cfg.hermes_exe!r} does not exist (looked at {cfg.hermes_exe_path})")
    if cfg.default_cwd and not within_any(os.path.realpath(os.path.expanduser(cfg.default_cwd)), cfg.roots):
        problems.append(f"default_cwd {cfg.default_cwd!r} is not an existing folder inside allowed_roots")
    return problems


def roots_missing(cfg: Config) -> str:
    """Why no job can start for want of roots, naming the real cause: none listed, or the listed ones absent."""
    listed = [root for root in cfg.allowed_roots if isinstance(root, str)]
    if not listed:
        return f"no allowed roots: pass --allowed-roots DIR, or {config_fix()}"
    return (f"none of the allowed roots is an existing folder ({shown(', '.join(listed), 600)}, from "
            f"{cfg.sources.get('allowed_roots', 'the config')}): create them (mkdir -p), or list folders that exist")


def root_problems(cfg: Config) -> list[str]:
    problems = []
    if not cfg.allowed_roots:
        problems.append("allowed_roots is empty: no job can start until you list at least one folder")
    for root in cfg.allowed_roots:
        expanded = os.path.expanduser(root)
        if not os.path.isabs(expanded):
            problems.append(f"allowed root {root!r} is not an absolute path (ignored)")
        elif not os.path.isdir(expanded):
            problems.append(f"allowed root {root!r} does not exist or is not a folder (ignored)")
        elif why := broad_root(os.path.realpath(expanded)):
            problems.append(f"allowed root {root!r} is {why}: every folder under it is open to jobs and "
                            "hermes_read; list project folders instead")
    return problems


def choice_problems(cfg: Config) -> list[str]:
    """Settings that take one of a few words; another word is replaced by the first, the default. approvals
    may also be unset (None): then the older yolo setting decides."""
    problems = []
    for key, known in SETTINGS.items():
        value = getattr(cfg, key)
        if known.choices and value is not None and value not in known.choices:
            problems.append(f"{key} {shown(value, 40)} is not {one_of(known.choices)} ({known.choices[0]} used)")
            setattr(cfg, key, known.choices[0])
    return problems


def number_problems(cfg: Config) -> list[str]:
    """Numbers outside their bounds: below the lowest sensible value (or not finite) the default is used,
    above the highest they are clamped."""
    problems = []
    for key, known in SETTINGS.items():
        value = getattr(cfg, key)
        if known.low is None or value is None:
            continue
        if known.high is not None and not known.low <= value <= known.high:
            clamped = min(max(value, known.low), known.high)
            problems.append(f"{key} {value} is outside {known.low:g}..{known.high:g} ({known.purpose}); clamped")
            setattr(cfg, key, clamped)
        elif not math.isfinite(value) or value < known.low:
            default = getattr(Config(path=cfg.path), key)
            instead = "Hermes' own default" if default is None else f"default {default}"
            problems.append(f"{key} {value} must be at least {known.low:g} ({instead} used)")
            setattr(cfg, key, default)
    return problems


def broad_root(resolved: str) -> str | None:
    """Why a root opens far more than a project (the file system root, a drive root, the home folder)."""
    if os.path.dirname(resolved) == resolved:
        return "the root of a drive or of the file system"
    if case_normalised(resolved) == case_normalised(os.path.realpath(os.path.expanduser("~"))):
        return "your home folder itself"
    return None


def path_advice(path_env: str, platform: str, home: str) -> str | None:
    """What the server's PATH lacks, on macOS, where Claude Desktop starts servers with launchd's PATH
    (/usr/bin:/bin:/usr/sbin:/sbin): `hermes` in ~/.local/bin is not found, nor the tools Hermes runs from
    Homebrew, though the same command works in a terminal."""
    if platform != "darwin":
        return None
    present = set(path_env.split(":"))
    usual = [f"{home}/.local/bin", "/opt/homebrew/bin", "/usr/local/bin"]
    missing = [folder for folder in usual if folder not in present]
    if not missing:
        return None
    return (f"the server's PATH lacks {', '.join(missing)} (Claude Desktop starts servers with launchd's PATH). "
            "Set hermes_exe to Hermes' absolute path, and give the server a PATH with the folders Hermes' tools "
            "need: register_with_claude.py writes both into the host entry")


def resolve_path(path: str, what: str) -> str:
    """An absolute path with every symlink followed, or Refused saying what is wrong with it."""
    if not isinstance(path, str) or not path.strip():
        raise Refused(f"{what} is empty: give an absolute path")
    if "\x00" in path:
        raise Refused(f"{what} contains a NUL byte: give a plain absolute path")
    expanded = os.path.expanduser(path)
    if not os.path.isabs(expanded):
        raise Refused(f"{what} '{shown(path)}' is relative: give an absolute path")
    try:
        return os.path.realpath(expanded, strict=True)
    except FileNotFoundError:
        raise Refused(f"{what} '{shown(path)}' does not exist") from None
    except OSError as exc:  # symlink loop, name too long, permission
        raise Refused(f"{what} '{shown(path)}' cannot be resolved: {exc.strerror or exc}") from None


LOCAL = "local"  # the executor that is this machine
EXECUTOR_KINDS = ("docker", "ssh")
EXECUTOR_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,39}$")
# Each kind's keys: required, then optional with their JSON types.
EXECUTOR_KEYS: dict[str, tuple[tuple[str, ...], dict[str, tuple[type, ...]]]] = {
    "docker": (("image",), {"docker_host": (str,), "network": (str,)}),
    "ssh": (("host", "user", "key"), {"port": (int,), "remote_root": (str,)}),
}
CONTAINER_NETWORKS = ("job", "none")  # follow the job's network mode, or never any
SAFE_WORD_RE = re.compile(r"^[A-Za-z0-9./_~][A-Za-z0-9_.:/@+~-]{0,199}$")  # one word on a command line, no option


@dataclasses.dataclass(frozen=True)
class Executor:
    """Where a job's commands run, one entry of the executors table: a container made for the job by a docker
    daemon, or another host over ssh. Hermes itself, its model calls, approvals and budgets stay here."""

    name: str
    kind: str
    image: str = ""
    docker_host: str = ""
    network: str = "job"
    host: str = ""
    user: str = ""
    key: str = ""
    port: int = 22
    remote_root: str = ".hermes-bridge"

    def described(self) -> str:
        """The EXECUTOR line's words: the name and what it is (never the key)."""
        if self.kind == "docker":
            daemon = f", daemon {self.docker_host}" if self.docker_host else ""
            return f"{self.name} (docker image {self.image}{daemon})"
        port = f" port {self.port}" if self.port != 22 else ""
        return f"{self.name} (ssh {self.user}@{self.host}{port})"

    def as_record(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def of_record(cls, saved: dict[str, Any]) -> "Executor":
        known = {field.name for field in dataclasses.fields(cls)}
        return cls(**{key: value for key, value in saved.items() if key in known})


def parse_executors(table: Any) -> tuple[dict[str, Executor], list[str]]:
    """The executors table read (a config file is untrusted input): every name, kind and key checked, each
    value one safe word (it goes on docker's and ssh's command lines). Any problem: the problems, and no table."""
    if not isinstance(table, dict):
        return {}, ["it must be a table of names"]
    found: dict[str, Executor] = {}
    problems: list[str] = []
    for name, entry in table.items():
        if name == LOCAL or not EXECUTOR_NAME_RE.match(name):
            problems.append(f"{shown(name, 60)!r} is not a name for an executor (letters, digits, _ . -; not local)")
            continue
        if not isinstance(entry, dict) or entry.get("kind") not in EXECUTOR_KINDS:
            problems.append(f"{name}: kind must be {one_of(EXECUTOR_KINDS, chr(34))}")
            continue
        required, optional = EXECUTOR_KEYS[entry["kind"]]
        values = {key: value for key, value in entry.items() if key != "kind"}
        missing = [key for key in required if key not in values]
        unknown = [key for key in values if key not in required and key not in optional]
        wrong = [key for key, value in values.items() if key not in unknown and (
            not isinstance(value, optional.get(key, (str,))) or isinstance(value, bool)
            or (isinstance(value, str) and not SAFE_WORD_RE.match(value)))]
        if missing or unknown or wrong:
            said = [f"{', '.join(missing)} missing" if missing else "", f"unknown {', '.join(unknown)}" if unknown
                    else "", f"{', '.join(wrong)} not one word of letters, digits and _ . : / @ + -" if wrong else ""]
            problems.append(f"{name} ({entry['kind']}): " + "; ".join(part for part in said if part))
            continue
        if values.get("network", "job") not in CONTAINER_NETWORKS:
            problems.append(f"{name}: network must be {one_of(CONTAINER_NETWORKS, chr(34))}")
            continue
        if "port" in values and not 0 < values["port"] < 65536:
            problems.append(f"{name}: port must be 1 to 65535")
            continue
        if entry["kind"] == "ssh" and not os.path.isabs(os.path.expanduser(values["key"])):
            problems.append(f"{name}: key must be an absolute path")
            continue
        found[name] = Executor(name=name, kind=entry["kind"], **values)
    return ({}, problems) if problems else (found, [])


def executor_named(cfg: Config, name: str | None) -> Executor | None:
    """The executor a job asks for (None: the default_executor); None for local. An unknown name is refused,
    naming the known ones."""
    wanted = name or cfg.default_executor
    if wanted == LOCAL:
        return None
    table, _ = parse_executors(cfg.executors)
    if wanted not in table:
        known = ", ".join([LOCAL, *table])
        broken = [problem for problem in cfg.problems if problem.startswith("executors: ")]
        raise Refused(f"executor {shown(wanted, 60)!r} is not in the executors table of {cfg.path} (known: {known}); "
                      "name one of those, or add it there (docs/executors.md)"
                      + (f". The table is ignored: {shown('; '.join(broken), 400)}" if broken else ""))
    return table[wanted]


def confine_cwd(cfg: Config, cwd: str | None) -> str:
    """The job's working folder, resolved and inside an allowed root; never 'allow all'."""
    roots = cfg.roots
    listed = [root for root in cfg.allowed_roots if isinstance(root, str) and os.path.isabs(os.path.expanduser(root))]
    if not roots and listed:
        raise Refused(f"no job may start: the allowed_roots listed ({shown(', '.join(listed), 600)}, from "
                      f"{cfg.sources.get('allowed_roots', 'the config')}) are gone or are not folders. Fix: create "
                      f"them again (mkdir -p), or list folders that exist under allowed_roots in {cfg.path}")
    if not roots:
        raise Refused("no allowed_roots are configured, so no job may start. Fix: " + config_fix())
    chosen = cwd if cwd not in (None, "") else (cfg.default_cwd or roots[0])
    resolved = resolve_path(chosen, "cwd")
    if not within_any(resolved, roots):
        raise Refused(f"cwd '{shown(chosen)}' resolves to {shown(resolved)}, which is outside the allowed roots "
                      f"({', '.join(roots)}). Use a folder inside one of them, or add a root in {cfg.path}")
    if not os.path.isdir(resolved):
        raise Refused(f"cwd '{shown(chosen)}' is not a folder")
    return resolved


def confine_read(cfg: Config, path: str) -> str:
    """A path hermes_read may open: inside the roots or the bridge's own job files, unless read_anywhere."""
    resolved = resolve_path(path, "path")
    if cfg.read_anywhere:
        return resolved
    readable = cfg.roots + [os.path.realpath(cfg.jobs_path)]
    if not within_any(resolved, readable):
        raise Refused(f"path '{shown(path)}' resolves to {shown(resolved)}, outside the allowed roots and the job "
                      "files "
                      f"({', '.join(readable)}). Set read_anywhere in {cfg.path} to widen hermes_read")
    return resolved


AUDIT_FIELD_CHARS = 300
AUDIT_BACKUPS = 3


def first_words(text: Any, count: int = 8) -> str:
    """Enough of a task to recognise it in a log, never the whole (it may hold what the user typed)."""
    words = str(text or "").split()
    shown = " ".join(words[:count])[:80]
    return shown + (" ..." if len(words) > count or len(shown) == 80 else "")


def audit(cfg: Config, **fields: Any) -> None:
    """One JSON line per tool call or job state change in logs/audit.log, rotated by size. Never raises and
    never prints: a full disk must not fail a tool call, and a supervisor's stderr is the job log the model
    reads. The file is opened per line and rotated under a lock, so no process holds it open while another
    renames it (Windows refuses that), and opened without blocking or following a symlink."""
    capped = {key: shown(value, AUDIT_FIELD_CHARS) if isinstance(value, str) else value
              for key, value in fields.items()}
    line = (json.dumps({"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "pid": os.getpid(), **capped}) + "\n").encode()
    path = cfg.logs_path / "audit.log"
    try:
        cfg.logs_path.mkdir(parents=True, exist_ok=True)
        with locked(Path(str(path) + ".lock"), 2):
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | NOFOLLOW | getattr(os, "O_NONBLOCK", 0)
                         | getattr(os, "O_BINARY", 0), 0o600)
            try:
                info = os.fstat(fd)
                if not stat.S_ISREG(info.st_mode):
                    return
                if info.st_size and info.st_size + len(line) > cfg.audit_max_bytes:
                    os.close(fd)
                    fd = -1
                    for index in range(AUDIT_BACKUPS, 1, -1):
                        if os.path.exists(f"{path}.{index - 1}"):
                            os.replace(f"{path}.{index - 1}", f"{path}.{index}")
                    os.replace(path, f"{path}.1")
                    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | NOFOLLOW | getattr(os, "O_BINARY", 0),
                                 0o600)
                os.write(fd, line)
            finally:
                if fd >= 0:
                    os.close(fd)
    except Exception:  # noqa: BLE001
        pass
