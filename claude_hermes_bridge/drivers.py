"""[both] The driver seam (HermesRun, CliRun, AcpRun, DRIVERS) and the launch plan (plan_launch)."""
import contextlib
import dataclasses
import functools
import hashlib
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, cast

from .acp_conversation import AcpConversation
from .config import Config, Executor
from .executors import ssh_wrappers, terminal_section, volume_mounts
from .git_calls import GitFailed
from .hermes_acp import (
    ACP_CANCEL_GRACE_S,
    ACP_EXIT_GRACE_S,
    COMMAND_SHOWN_CHARS,
    WarmHermes,
    approval_policy_dir,
)
from .hermes_cli import (
    QUERY_OPTION,
    UNKNOWN_OPTION_RE,
    USAGE_ERROR_RE,
    HermesCli,
    argv_problem,
    describe_exit,
    ends_with_session_line,
    forget_probe,
    hermes_command,
    hermes_env,
    known_cli,
    locate_hermes,
    probe_cli,
    read_tail,
    sandbox_extra,
    session_id_from_log,
)
from .hermes_store import StoreUnavailable, Usage, blocked_commands, read_store, session_started_in, session_usage
from .jobs import JobRecord, JobState, JobStore, Outcome, write_record
from .network import NO_PROXY_VARIABLES, JobProxy, proxy_environment
from .processes import WindowsJob, hermes_creation_flags, interrupt_group, popen_kwargs
from .repo_guard import repository_around
from .safe_io import IS_WINDOWS, Refused, open_regular, read_json, shown, shown_whole, within_any
from .sandbox import READABLE_IN_HOME, SESSION_SERVICES, handed_descriptors, step_argv, unreadable_paths
from .sandbox import devices as sandbox_devices
from .worktrees import common_git_folder, object_environment, worktree_git_paths


# The ways to drive Hermes, behind one seam: `hermes chat` with the task on its command line or stdin (CliRun)
# and `hermes acp` spoken to over JSON-RPC (AcpRun). The server plans a launch with them to refuse early; the
# supervisor starts, pumps, stops and reads the outcome of one. A third driver is one class and one entry in
# DRIVERS (its name in DRIVER_NAMES, and where choose_driver picks it).
@dataclasses.dataclass(frozen=True)
class LaunchPlan:
    """The command the supervisor will start, once every check before it passed."""

    argv: list[str]
    shown_argv: list[str]  # the argv with the task elided, for the record
    folder: str
    stdin_path: Path | None  # the task file, for a Hermes that reads the task on stdin
    cli_flags: list[str]
    task: str = ""


def usable_hermes(cfg: Config) -> str:
    """The Hermes executable a job would start, or Refused naming the path, where it came from, and why."""
    hermes = locate_hermes(cfg)
    if not hermes.usable:
        raise Refused(f"Hermes cannot be started: {hermes.problem}. hermes_health (or `server.py --check` in a "
                      "terminal) shows what the bridge finds")
    return hermes.usable


def start_hermes(argv: list[str], folder: str, env: dict[str, str], stdin: Any, stdout: Any,
                 stderr: Any, handed: tuple[int, ...] | None = None) -> subprocess.Popen[bytes]:
    """Hermes in the job's folder, in a process group of its own, never through a shell (every driver); the
    descriptors the sandbox's step is handed (its network namespace's channel, or `handed`) given to it, not
    kept."""
    handed = handed_descriptors(argv) if handed is None else handed
    try:
        return subprocess.Popen(argv, cwd=folder, stdin=stdin, stdout=stdout, stderr=stderr, env=env, close_fds=True,
                                pass_fds=handed, **popen_kwargs(hermes_creation_flags(IS_WINDOWS)))
    finally:
        for descriptor in handed:
            os.close(descriptor)


@dataclasses.dataclass
class WarmStart:
    """What a standby hands the supervisor of the job that took it: its Hermes, readied (WarmHermes), the managed
    policy folder Hermes was started with, the sandbox's private temporary folder (None: not sandboxed), on
    Windows the job object that has held Hermes since it started (None: none could), and under a limited network
    the proxy Hermes was started behind, whose questions and refusals the job's network takes over (None: open)."""

    hermes: WarmHermes
    policy_dir: Path
    private_tmp: Path | None
    windows_job: WindowsJob | None
    proxy: JobProxy | None = None
    proxy_enforced: bool = False


def hermes_launch(cfg: Config, argv: list[str], marker: str, writable: list[str], private_tmp: Path | None,
                  extra_env: dict[str, str] | None = None, proxy: JobProxy | None = None,
                  confine_network: bool = False, mounts: list[str] | None = None,
                  cache: Path | None = None, also_ports: tuple[int, ...] = ()) -> tuple[list[str], dict[str, str]]:
    """Hermes' command and environment (with extra_env, the bridge's own, last: a docker job's DOCKER_HOST is
    its executor's daemon, not a session service): through the sandbox's step when writable is given, with
    its private temporary folder, its mounts (sandbox_mounts), its project's tool cache (project_cache) and
    without the addresses of the user's session services; given proxy,
    every HTTP client pointed at the job's proxy (nothing sent around it), and with confine_network the
    operating system holding the job to it (and to also_ports: an ssh executor's, for Hermes' own ssh); on Linux
    without also_ports, in a network of the job's own (sandbox.hand_listener)."""
    env = hermes_env(cfg, marker)
    if proxy is not None:
        env = {key: value for key, value in env.items() if key not in NO_PROXY_VARIABLES}
        env.update(proxy_environment(proxy.port))
    if not writable:
        return argv, {**env, **(extra_env or {})}
    env = {key: value for key, value in env.items() if key not in SESSION_SERVICES}
    env.update(TMPDIR=str(private_tmp), TEMP=str(private_tmp), TMP=str(private_tmp))
    env.update(cache_environment(cast(Path, cache)))
    unreadable = job_unreadable(cfg, writable, argv[0])
    held = proxy if confine_network else None
    own_network = (held.namespace_channel() if held and not also_ports and sys.platform.startswith("linux")
                   else None)
    return step_argv(writable, argv, unreadable, held.port if held else None, mounts, also_ports, own_network), {
        **env, **(extra_env or {})}


# Where the tools a job runs keep their caches, redirected from the user's home (which a sandboxed job cannot
# write: npm, uv, pip, go, cargo's registry, gradle, pre-commit and most others through XDG_CACHE_HOME, pnpm's
# store and uv's tools through XDG_DATA_HOME) to a cache the bridge owns, one per project (project_cache), never
# read by the user's own tools: a job cannot poison them, nor another project's jobs. uv installs from it by copy
# (UV_LINK_MODE), not by hard link, so no environment shares a file with the cache.
CACHE_VARIABLES = {"XDG_CACHE_HOME": "xdg", "XDG_DATA_HOME": "xdg-data", "npm_config_cache": "npm",
                   "YARN_CACHE_FOLDER": "yarn", "UV_CACHE_DIR": "uv", "PIP_CACHE_DIR": "pip",
                   "GOMODCACHE": "go/mod", "GOCACHE": "go/build", "CARGO_HOME": "cargo",
                   "GRADLE_USER_HOME": "gradle", "PRE_COMMIT_HOME": "pre-commit"}


def tool_cache(private_tmp: Path) -> Path:
    """The bridge's tool caches: beside the jobs' private temporary folders, in the jobs folder."""
    return private_tmp.parent.parent / "cache"


def project_cache(private_tmp: Path, folder: str, worktree: dict[str, Any] | None) -> Path:
    """The tool cache of the project a job works in (a worktree job's repository, or the job's folder), made now."""
    import hashlib  # here: it maps OpenSSL into the process, which only a sandboxed job's start needs

    project = os.path.realpath(worktree["repo"] if worktree else folder)
    cache = tool_cache(private_tmp) / hashlib.sha256(project.encode()).hexdigest()[:20]
    cache.mkdir(parents=True, exist_ok=True)
    return cache


def cache_environment(cache: Path) -> dict[str, str]:
    return {name: str(cache / folder) for name, folder in CACHE_VARIABLES.items()} | {
        "npm_config_update_notifier": "false", "UV_LINK_MODE": "copy"}


def private_tmp_of(store: JobStore, name: str) -> Path:
    """A sandboxed job's own temporary folder (TMPDIR), made now; removed with the job."""
    folder = store.root / "tmp" / name
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def sandbox_writable(cfg: Config, folder: str, private_tmp: Path, worktree: dict[str, Any] | None) -> list[str]:
    """Everything a sandboxed job may write, in this order: its folder (a worktree job's worktree), its private
    temporary folder, Hermes' home, its project's tool cache, what git needs for a worktree job's commits,
    sandbox_writable, devices."""
    cache = project_cache(private_tmp, folder, worktree)
    return [folder, *any_job_writable(cfg, private_tmp, [str(cache), *worktree_git_paths(worktree)])]


def any_job_writable(cfg: Config, private_tmp: Path, own: list[str] | None = None) -> list[str]:
    """What a sandboxed job here may write whatever its folder (a late standby's first layer): its private
    temporary folder, Hermes' home (made now), then own (a job's project cache and git paths), sandbox_writable,
    devices."""
    home = cfg.hermes_home_path
    home.mkdir(parents=True, exist_ok=True)
    return [str(private_tmp), str(home), *(own or []), *sandbox_extra(cfg), *sandbox_devices()]


# Daemons that act for whoever connects to their socket (Docker, podman, containerd and buildkit are
# root-equivalent; the session bus starts programs): Landlock does not govern connect() to a named socket, so a
# sandboxed job's mount namespace hides each under /dev/null, as bubblewrap-based sandboxes do. System-wide, and
# beneath the user's runtime folder.
DAEMON_SOCKETS = ("/run/docker.sock", "/var/run/docker.sock", "/run/podman/podman.sock",
                  "/run/containerd/containerd.sock", "/run/buildkit/buildkitd.sock", "/run/crio/crio.sock")
RUNTIME_SOCKETS = ("docker.sock", "podman/podman.sock", "containerd/containerd.sock", "buildkit/buildkitd.sock", "bus")


def daemon_sockets() -> list[str]:
    """The daemons' sockets on this machine now (resolved), the one DOCKER_HOST names included."""
    runtime = os.environ.get("XDG_RUNTIME_DIR") or f"/run/user/{os.getuid() if hasattr(os, 'getuid') else 0}"
    found = [*DAEMON_SOCKETS, *(os.path.join(runtime, name) for name in RUNTIME_SOCKETS)]
    docker_host = os.environ.get("DOCKER_HOST", "")
    if docker_host.startswith("unix://"):
        found.append(docker_host[len("unix://"):])
    return list(dict.fromkeys(os.path.realpath(path) for path in found if is_socket(path)))


def is_socket(path: str) -> bool:
    try:
        return stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError:
        return False


def git_folder_mounts(folder: str, worktree: dict[str, Any] | None) -> list[str]:
    """What of a job's repository its mount namespace holds read-only: a job in its folder gets the repository's
    whole git folder read-only (`.git`, a gitdir file and the folder it names, the common folder: hooks, config,
    refs, modules/ and worktrees/ with them), so it cannot commit; a worktree job gets the common folder
    read-only but for what its commits need (worktree_git_paths: its admin folder, its branch's ref and reflog
    folders), with its admin folder's commondir and its worktree's .git file read-only too."""
    if worktree:
        if "admin" not in worktree:
            return []
        admin = worktree["admin"]
        common = os.path.dirname(os.path.dirname(admin))
        regranted = [path for path in worktree_git_paths(worktree) if path.startswith(common + os.sep)]
        return [f"ro:{common}", *(f"rw:{path}" for path in regranted), f"ro:{os.path.join(admin, 'commondir')}",
                f"ro:{os.path.join(worktree['path'], '.git')}"]
    top = repository_around(folder)
    if top is None:
        return []
    dot_git = os.path.join(top, ".git")
    found = [dot_git, os.path.realpath(dot_git)]
    with contextlib.suppress(GitFailed):
        found.append(common_git_folder(top))
    return [f"ro:{path}" for path in dict.fromkeys(found) if os.path.lexists(path)]


def install_mounts(exe: str, writable: list[str]) -> list[str]:
    """Hermes' install read-only when it lies inside a folder the job may write (its official installer puts it
    in Hermes' home): the environment its executable runs from, found from the executable's real path."""
    real = os.path.realpath(exe)
    install = os.path.dirname(os.path.dirname(real))  # <env>/bin/hermes
    inside = any(within_any(install, [os.path.realpath(folder)]) or within_any(real, [os.path.realpath(folder)])
                 for folder in writable if os.path.isdir(folder))
    return [f"ro:{install}"] if inside else []


INSTALL_ENTRIES = 200_000  # an install past this many entries counts as changed: no cap a job can hide behind


def install_fingerprint(install: str) -> str:
    """Hermes' install by every entry's path, inode, size, modification and change time (no program can set a
    change time back): whatever a job changed in it changes this. Symlinks are entries, never followed."""
    digest, count = hashlib.sha256(), 0
    for folder, subfolders, files in os.walk(install):
        subfolders.sort()
        for name in sorted(files + subfolders):
            path = os.path.join(folder, name)
            with contextlib.suppress(OSError):
                info = os.lstat(path)
                digest.update(f"{path}\0{info.st_ino}\0{info.st_size}\0{info.st_mtime_ns}\0{info.st_ctime_ns}\n"
                              .encode(errors="surrogateescape"))
            count += 1
            if count > INSTALL_ENTRIES:
                return "past the bound"
    return digest.hexdigest()


def install_changed_path(store: JobStore) -> Path:
    return store.root / "hermes-install-changed.json"


def install_change_refusal(store: JobStore) -> str | None:
    """Why no job may start: a job changed Hermes' install where nothing held it read-only (job_finishing), and
    it is still as that job left it. None once it is not (reinstalled): the note is then removed."""
    changed = read_json(install_changed_path(store))
    if not isinstance(changed, dict) or not isinstance(changed.get("install"), str):
        return None
    if install_fingerprint(changed["install"]) != changed.get("fingerprint"):
        install_changed_path(store).unlink(missing_ok=True)
        return None
    return (f"Hermes' install {shown(changed['install'])} was changed by job {shown(str(changed.get('job_id')))} "
            "(nothing held it read-only: no mount namespace could be made here), so any Hermes started from it, "
            "yours included, may run what that job wrote. Reinstall Hermes, best outside its home (`uv tool "
            "install` or a virtual environment of its own, then hermes_exe), or delete "
            f"{shown(str(install_changed_path(store)))} to accept it as it is")


def sandbox_mounts(exe: str, folder: str, worktree: dict[str, Any] | None, writable: list[str]) -> list[str]:
    """Everything a sandboxed job's mount namespace makes (sandbox.private_devices), in order: its repository's
    git folder, Hermes' install, the daemons' sockets. The cold start, the warm start and the resume all take it
    from here."""
    return [*git_folder_mounts(folder, worktree), *install_mounts(exe, writable),
            *(f"hide:{path}" for path in daemon_sockets())]


def python_prefixes(exe: str) -> list[str]:
    """The installs a Python program runs from: its environment (found from its executable's real path), that
    environment's base Python (pyvenv.cfg's home), and this process's own."""
    install = os.path.dirname(os.path.dirname(os.path.realpath(exe)))
    found = [install, sys.prefix, sys.base_prefix]
    try:
        with open(os.path.join(install, "pyvenv.cfg"), encoding="utf-8") as config:
            for line in config:
                key, _, value = line.partition("=")
                if key.strip() == "home" and value.strip():
                    found.append(os.path.dirname(value.strip()))
    except OSError:
        pass
    return found


def readable_paths(cfg: Config, writable: list[str], exe: str) -> list[str]:
    """What a sandboxed job may read inside the private folders (sandbox.unreadable_paths): the toolchains' public
    files in the home (READABLE_IN_HOME), what it may write, Hermes' home, install and Python, and
    sandbox_readable."""
    return [*(os.path.join(home, name) for home in homes() for name in READABLE_IN_HOME), *writable,
            str(cfg.hermes_home_path), *python_prefixes(exe),
            *(path for path in cfg.sandbox_readable if os.path.isabs(path))]


def homes() -> list[str]:
    """The home HOME names and the account's own (they differ where a host or a test sets HOME)."""
    found = [os.path.expanduser("~")]
    with contextlib.suppress(ImportError, KeyError):
        import pwd

        found.append(pwd.getpwuid(os.getuid()).pw_dir)
    return list(dict.fromkeys(found))


def job_unreadable(cfg: Config, writable: list[str], exe: str) -> list[str]:
    """What a sandboxed job may not read: everything of the private folders but readable_paths, and
    sandbox_unreadable."""
    return unreadable_paths(os.path.expanduser("~"), cfg.sandbox_unreadable, readable_paths(cfg, writable, exe))


def executor_terminal(store: JobStore, record: JobRecord, folder: str) -> dict[str, Any] | None:
    """Hermes' terminal section for a job on an executor (None: here). docker: the job's folders and what git
    needs there mounted at the same paths, the repository's git folder read-only as the sandbox holds it
    (git_folder_mounts, whether or not this machine has a sandbox). ssh: the remote worktree carry_out made,
    the key copied into the job's policy folder (ssh_wrappers)."""
    if not record.executor:
        return None
    executor = Executor.of_record(record.executor)
    worktree = record.worktree
    if executor.kind == "ssh":
        section = terminal_section(executor, record.id, store.root, str(cast(dict[str, Any], worktree)["remote"]), [],
                                   record.network_mode or "open")
        return dict(section, ssh_key=str(store.policy_path(record.id) / "ssh" / "key"))
    own = worktree["path"] if worktree else folder
    volumes = volume_mounts(own, worktree_git_paths(worktree), git_folder_mounts(folder, worktree))
    objects = object_environment(worktree["objects"], worktree["repo"]) if worktree and "objects" in worktree else {}
    return terminal_section(executor, record.id, store.root, own, volumes, record.network_mode or "open", objects)


def confinement_shape(network: str, worktree: dict[str, Any] | None) -> dict[str, Any]:
    """What of a job's own request decides how its Hermes is confined, beyond the settings and its folder: its
    network mode (a limited one puts Hermes behind the job's own proxy, made by its supervisor) and, for a worktree
    job, whether its worktree is made for it or a resumed job's (whose git folders the sandbox grants). A warm
    Hermes is started for one shape; a job of another starts cold (taking.standby_mismatch)."""
    return {"network": network, "worktree": None if not worktree else "resumed" if worktree.get("job") else "new"}


Probe = Callable[[Config, str], "HermesCli | None"]
ProcessStarter = Callable[[list[str], str, Any, dict[str, str]], subprocess.Popen[bytes]]
LogWriter = Callable[[str], None]


class HermesRun:
    """One job's Hermes, driven one way. The supervisor calls start, then pump on every poll until the
    process exits (ask_to_stop when the job must stop, close once the turn is over while the process still
    runs), then drain, outcome and session. Everything a job has whatever the driver (the record, the
    deadline, the tree stop, the outcome written) stays in Supervisor."""

    stop_grace_s = 0.0  # how long Hermes gets to stop by itself after ask_to_stop, before the tree stop
    stop_request = "nothing asked"  # what ask_to_stop sends, in words
    exit_grace_s = 0.0  # how long Hermes gets to exit by itself after close, before the tree stop
    enforces_max_turns = True  # whether Hermes stops at max_turns by itself; if not, the supervisor does

    def __init__(self, cfg: Config, store: JobStore, record: JobRecord, exe: str, log: LogWriter,
                 start_process: ProcessStarter | None = None, save: Callable[[], None] | None = None):
        self.cfg, self.store, self.record, self.exe, self.log = cfg, store, record, exe, log
        self.start_process = start_process or self.start_default
        self.save = save or functools.partial(write_record, store, record)
        self.policy_dir: Path | None = None
        self.terminal: dict[str, Any] | None = None  # Hermes' terminal backend for a job on an executor

    @classmethod
    def plan(cls, cfg: Config, exe: str, record: JobRecord, task: str, folder: str, task_path: Path | None,
             probe: Probe) -> LaunchPlan | None:
        raise NotImplementedError

    @staticmethod
    def start_default(argv: list[str], folder: str, stdin: Any, env: dict[str, str]) -> subprocess.Popen[bytes]:
        raise NotImplementedError

    def start(self, plan: LaunchPlan, env: dict[str, str]) -> subprocess.Popen[bytes]:
        raise NotImplementedError

    def adopt(self, plan: LaunchPlan, warm: WarmStart) -> subprocess.Popen[bytes]:
        """Go on with a Hermes a standby started and readied (only a driver that keeps Hermes between requests)."""
        raise NotImplementedError

    def pump(self) -> None:
        """Handle what Hermes sent since the last poll."""

    @property
    def finished(self) -> bool:
        """Whether Hermes' turn is over while its process still runs (then close ends it)."""
        return False

    def close(self) -> None:
        """Let a Hermes whose turn is over exit by itself."""

    def ask_to_stop(self) -> None:
        """Ask Hermes to stop by itself, before the tree stop that follows after stop_grace_s."""

    def drain(self) -> None:
        """After the process exited: what it wrote last."""

    def outcome(self, exit_code: int) -> Outcome:
        raise NotImplementedError

    def session(self, exit_code: int | None) -> tuple[str | None, str | None]:
        """The session the job ran in, and where that came from (None: as the record already says)."""
        raise NotImplementedError

    def usage(self, session_id: str) -> "Usage | None":
        """The session's counters, from Hermes' session store (StoreUnavailable when it cannot answer)."""
        return read_store(self.cfg, lambda db: session_usage(db, session_id))

    def report(self, session_id: str | None) -> None:
        """What the driver adds to the record once the job's session is known."""

    def with_policy(self, env: dict[str, str], timeout_s: int) -> dict[str, str]:
        """The environment with this job's own managed policy (approval_policy_dir), removed by cleanup."""
        self.policy_dir = approval_policy_dir(timeout_s, self.store.policy_path(self.record.id), self.terminal)
        env = dict(env, HERMES_MANAGED_DIR=str(self.policy_dir))
        if self.record.executor and self.record.executor["kind"] == "ssh":
            found = ssh_wrappers(Executor.of_record(self.record.executor), self.policy_dir)
            env["PATH"] = found + os.pathsep + env.get("PATH", "")
        return env

    def cleanup(self) -> None:
        """Remove what the driver made for the job: its managed policy folder."""
        if self.policy_dir is not None:
            import shutil

            shutil.rmtree(self.policy_dir, ignore_errors=True)


CLI_INTERRUPT_GRACE_S = 3.0  # how long a CLI Hermes gets to end its turn after Ctrl-C, before the tree stop


class CliRun(HermesRun):
    """`hermes chat` answering one task and exiting: the task on its command line or on stdin, its output
    straight into the job's log, its exit code the outcome, its session id from its last `session_id:` line
    (or from the session store, for a Hermes that prints none). A stop is Ctrl-C first, as at a terminal."""

    stop_grace_s = CLI_INTERRUPT_GRACE_S
    stop_request = "Ctrl-C: SIGINT to its process group"
    popen: subprocess.Popen[bytes] | None = None

    @classmethod
    def plan(cls, cfg: Config, exe: str, record: JobRecord, task: str, folder: str, task_path: Path | None,
             probe: Probe) -> LaunchPlan | None:
        cli = known_cli(cfg, exe) or probe(cfg, exe)
        if cli is None:
            return None
        argv = hermes_command(cli, exe, record, task, cfg)
        if problem := argv_problem(argv):
            raise Refused(problem)
        shown_argv = [QUERY_OPTION + "<task>" if part == QUERY_OPTION + task else part for part in argv]
        return LaunchPlan(argv, shown_argv, folder, task_path if cli.task_on_stdin else None,
                          sorted(cli.flags & {"--query-file", "--in", "--oneshot"}), task)

    @staticmethod
    def start_default(argv: list[str], folder: str, stdin: Any, env: dict[str, str]) -> subprocess.Popen[bytes]:
        """Hermes' output goes to the supervisor's stderr, which is the job's log."""
        return start_hermes(argv, folder, env, stdin, sys.stderr.fileno(), subprocess.STDOUT)

    def start(self, plan: LaunchPlan, env: dict[str, str]) -> subprocess.Popen[bytes]:
        """Unless yolo, with a policy that denies a dangerous command at once: a one-shot CLI has nobody to
        ask, and Hermes 0.19 would otherwise wait its approval timeout (60 s) for an answer that never comes."""
        if (self.record.approval_mode or self.cfg.approval_mode) != "yolo":
            env = self.with_policy(env, 0)
        with open_regular(plan.stdin_path) if plan.stdin_path else open(os.devnull, "rb") as stdin:
            self.popen = self.start_process(plan.argv, plan.folder, stdin, env)
            return self.popen

    def ask_to_stop(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            interrupt_group(self.popen.pid)

    def report(self, session_id: str | None) -> None:
        """The commands Hermes denied by itself (nobody can answer the CLI), read from its session store."""
        if not session_id or self.record.started_at is None:
            return
        since = self.record.started_at
        with contextlib.suppress(StoreUnavailable):
            for number, command in enumerate(read_store(self.cfg, lambda db: blocked_commands(db, session_id, since))):
                self.record.add_decision({"id": f"cli-{number + 1}",
                                          "what": f"run `{shown_whole(command, COMMAND_SHOWN_CHARS)}`",
                                          "decision": "deny", "by": "Hermes itself: the CLI driver cannot ask "
                                          "anyone, so a command Hermes deems dangerous is denied at once"})

    def outcome(self, exit_code: int) -> Outcome:
        """Its exit code; a command line Hermes rejected forgets the cached options, so the next launch asks."""
        if exit_code == 0:
            return Outcome(JobState.OK, exit_code, None)
        log = self.store.log_path(self.record.id)
        tail = read_tail(log, 65536)[0]
        if exit_code == 2 and UNKNOWN_OPTION_RE.search(tail):
            forget_probe(self.cfg, self.exe)
        return Outcome(JobState.ERROR, exit_code, describe_exit(exit_code, ends_with_session_line(log),
                                                                USAGE_ERROR_RE.search(tail) is not None))

    def session(self, exit_code: int | None) -> tuple[str | None, str | None]:
        record = self.record
        session_id = session_id_from_log(self.store.log_path(record.id))
        if session_id is not None:
            return session_id, None
        if record.session_requested and exit_code == 0:
            return record.session_requested, "the session resumed (this Hermes prints no session line)"
        if record.started_at and record.cwd:
            return session_started_in(self.cfg, record.cwd, record.started_at)
        return None, None


class AcpRun(HermesRun):
    """`hermes acp` in the job's folder, spoken to over its stdin and stdout (AcpConversation): Hermes' questions
    are decided or relayed, a stop is asked with session/cancel first, and a finished turn closes its input.
    Each job has its own managed policy folder (approval_policy_dir), removed at the end."""

    enforces_max_turns = False  # Hermes' ACP adapter ignores agent.max_turns
    stop_grace_s = ACP_CANCEL_GRACE_S
    stop_request = "session/cancel"
    exit_grace_s = ACP_EXIT_GRACE_S

    def __init__(self, cfg: Config, store: JobStore, record: JobRecord, exe: str, log: LogWriter,
                 start_process: ProcessStarter | None = None, save: Callable[[], None] | None = None):
        super().__init__(cfg, store, record, exe, log, start_process, save)
        self.conversation: AcpConversation | None = None

    @classmethod
    def plan(cls, cfg: Config, exe: str, record: JobRecord, task: str, folder: str,  # noqa: ARG003 (the seam's)
             task_path: Path | None, probe: Probe) -> LaunchPlan | None:  # noqa: ARG003
        return LaunchPlan([exe, "acp"], [exe, "acp"], folder, None, [], task)  # the task goes in the prompt

    @staticmethod
    def start_default(argv: list[str], folder: str, stdin: Any, env: dict[str, str]) -> subprocess.Popen[bytes]:
        """Pipes for the protocol; its stderr (Hermes' own log lines) goes to the job's log."""
        return start_hermes(argv, folder, env, stdin, subprocess.PIPE, sys.stderr.fileno())

    def start(self, plan: LaunchPlan, env: dict[str, str]) -> subprocess.Popen[bytes]:
        proc = self.start_process(plan.argv, plan.folder, subprocess.PIPE,
                                  self.with_policy(env, int(self.cfg.approval_timeout_s)))
        self.conversation = AcpConversation(proc, self.record, self.cfg, self.store, plan.task, self.log, self.save)
        return proc

    def adopt(self, plan: LaunchPlan, warm: WarmStart) -> subprocess.Popen[bytes]:
        self.policy_dir = warm.policy_dir
        self.conversation = AcpConversation(warm.hermes.proc, self.record, self.cfg, self.store, plan.task, self.log,
                                            self.save, warm.hermes)
        return warm.hermes.proc

    @property
    def talk(self) -> AcpConversation:
        return cast(AcpConversation, self.conversation)

    def pump(self) -> None:
        self.talk.pump()

    @property
    def finished(self) -> bool:
        return self.talk.finished

    def close(self) -> None:
        self.talk.close()

    def ask_to_stop(self) -> None:
        self.talk.cancel()

    def drain(self) -> None:
        self.talk.drain()

    def outcome(self, exit_code: int) -> Outcome:
        """The conversation's outcome; a `hermes acp` that did not even open a session forgets the cached
        "speaks ACP" answer, so the next launch asks again."""
        talk = self.talk
        if talk.session_id is None and talk.failure is None:
            forget_probe(self.cfg, self.exe, "|acp")
        return talk.outcome(exit_code)

    def session(self, exit_code: int | None) -> tuple[str | None, str | None]:  # noqa: ARG002 (the seam's)
        return self.record.session_id, None  # the protocol's, or none when Hermes never opened one


DRIVERS: dict[str, type[HermesRun]] = {"cli": CliRun, "acp": AcpRun}


def driver_of(record: JobRecord) -> type[HermesRun]:
    """The driver a job runs with (a record of an older bridge names none: the CLI)."""
    return DRIVERS[record.driver or "cli"]


def plan_launch(cfg: Config, exe: str, record: JobRecord, task: str, folder: str, task_path: Path | None = None,
                probe: Probe = probe_cli) -> LaunchPlan | None:
    """The one launch plan, made by the server to refuse a launch early and by the supervisor to start
    Hermes: the command line for the record's driver and this Hermes' options, the folder, and where the
    task goes. Refused when the command line cannot hold the task; None while the options are unknown (the
    server's probe failed: the supervisor probes again and reports what it finds)."""
    return driver_of(record).plan(cfg, exe, record, task, folder, task_path, probe)
