"""[supervisor] A job's first phase: everything checked and made before Hermes starts (Hermes itself, the
worktree, the repository's guard, the folder, the sandbox, the network) and what its blocks say about them."""
import os
import threading
from pathlib import Path
from typing import Any, cast

from .config import Config, Executor
from .drivers import (
    LaunchPlan,
    WarmStart,
    executor_terminal,
    install_fingerprint,
    install_mounts,
    job_unreadable,
    plan_launch,
    private_tmp_of,
    project_cache,
    sandbox_mounts,
    sandbox_writable,
    usable_hermes,
)
from .executors import (
    carry_out,
    container_network,
    docker_environment,
    docker_socket,
    keep_fetching,
    link_short_tmp,
    probe_mount,
)
from .git_calls import GitFailed, git
from .hermes_cli import sandbox_extra
from .home_guard import guard_home
from .job_network import JobNetwork
from .jobs import MAX_TASK_BYTES, JobState, Outcome
from .repo_guard import guard_repository, repository_around
from .safe_io import Refused, plural, read_capped, shown, within_any
from .sandbox import mechanism as sandbox_mechanism
from .sandbox import private_devices_refusal, private_folders
from .supervised_job import SupervisedJob
from .worktrees import add_worktree, common_folder_refusal, object_environment, own_objects, worktree_git


class JobPlanner:
    """Plans one job's start. What it decides stays here for the later phases: where the operating system will
    let the job write (writable; empty: not sandboxed) and the job's private temporary folder."""

    def __init__(self, job: SupervisedJob, network: JobNetwork, warm: WarmStart | None) -> None:
        self.job, self.network, self.warm = job, network, warm
        self.writable: list[str] = []
        self.mounts: list[str] = []  # what the job's mount namespace makes (drivers.sandbox_mounts)
        self.cache: Path | None = None  # its project's tool cache (drivers.project_cache)
        self.private_tmp: Path | None = None
        self.terminal: dict[str, Any] | None = None  # Hermes' terminal backend for a job on an executor
        self.executor_env: dict[str, str] = {}  # what Hermes' own process needs to reach it (DOCKER_HOST)
        self.also_ports: tuple[int, ...] = ()  # an ssh executor's port, which Hermes' own ssh connects to

    def plan(self) -> LaunchPlan | Outcome:
        """The launch plan, or the outcome that says why Hermes was not started."""
        job = self.job
        record, cfg = job.record, job.cfg
        if job.cancel_requested():
            return Outcome(JobState.CANCELLED, None, "cancelled before Hermes started")
        try:
            exe = usable_hermes(cfg)
            if record.worktree and not os.path.isdir(record.worktree["path"]):
                self.make_worktree(record.worktree)
            elif record.worktree and self.warm and not record.worktree.get("job"):
                job.note(f"worktree {record.worktree['path']} on branch {record.worktree['branch']} at "
                         f"{record.worktree['base'][:12]}, readied by the warm standby before the job")
            if record.worktree:
                own_objects(job.store, record)
                guard_repository(job.store, record)
            folder = self.confined_folder()
            if folder is None:
                return Outcome(JobState.ERROR, None, f"the job's folder {shown(record.cwd)} no longer resolves to "
                               "itself inside the allowed roots (moved, removed or replaced by a symlink); Hermes "
                               "was not started")
            if not record.worktree and (top := repository_around(folder)):
                if planted := common_folder_refusal(top):
                    raise Refused(planted)
                record.guarded_repo = top
                guard_repository(job.store, record)
            task_path = job.store.task_path(job.job_id)
            task = read_capped(task_path, MAX_TASK_BYTES).decode("utf-8")
            if refusal := self.plan_sandbox(folder, exe):
                return refusal
            if record.executor:
                self.plan_executor(folder)
            if refused := self.network.start(sandboxed=bool(self.writable),
                                             warm_proxy=self.warm.proxy if self.warm else None):
                return Outcome(JobState.ERROR, None, refused)
            return cast(LaunchPlan, plan_launch(cfg, exe, record, task, folder, task_path))  # probe_cli never None
        except Refused as exc:
            return Outcome(JobState.ERROR, None, f"{exc}. Nothing was run")
        except GitFailed as exc:
            return Outcome(JobState.ERROR, None, f"the job's worktree could not be made ({exc}); nothing was left "
                           "behind and Hermes was not started")
        except OSError as exc:
            return Outcome(JobState.ERROR, None, f"the job's repository could not be recorded before Hermes started "
                           f"({exc.strerror or exc}), so what the job changes in it could not be put back; Hermes was "
                           "not started")

    def plan_executor(self, folder: str) -> None:
        """A job on an executor: over ssh, its start pushed to the host and a remote worktree made there; its
        Hermes' terminal section (self.terminal); docker's socket left reachable to Hermes' own process."""
        job = self.job
        record = job.record
        executor = Executor.of_record(cast(dict[str, Any], record.executor))
        if executor.kind == "ssh":
            worktree = cast(dict[str, Any], record.worktree)
            start = git(worktree["repo"], "rev-parse", "--verify", f"refs/heads/{worktree['branch']}^{{commit}}"
                        ).stdout.decode().strip()
            bare, remote = carry_out(executor, worktree["repo"], start, job.job_id, worktree["branch"])
            worktree.update(remote=remote, remote_bare=bare)
            job.note(f"the job's start {start[:12]} pushed to {executor.host}: its worktree there is {remote}")
            job.save()
            self.also_ports = (executor.port,)
            objects = object_environment(str(job.store.worktree_objects_path(worktree.get("job", job.job_id))),
                                         worktree["repo"])
            stop = threading.Event()
            fetcher = threading.Thread(target=keep_fetching, name="progress", daemon=True,
                                       args=(executor, worktree, worktree_git(worktree), objects, job.job_id, stop))
            fetcher.start()
            job.fetching = (stop, fetcher)
            if self.private_tmp is not None:
                try:
                    link = link_short_tmp(self.private_tmp, job.job_id, job.store.root)
                except OSError as exc:
                    raise Refused(f"a short name for the job's temporary folder (Hermes' ssh control socket) could "
                                  f"not be made ({exc.strerror or exc})") from None
                self.executor_env = {"TMPDIR": str(link), "TEMP": str(link), "TMP": str(link)}
        else:
            own = record.worktree["path"] if record.worktree else folder
            networked = container_network(executor, record.network_mode or "open")
            if problem := probe_mount(executor, job.job_id, job.store.root, own, networked):
                raise Refused(problem)
            socket = docker_socket(executor)
            self.mounts = [mount for mount in self.mounts if mount != f"hide:{socket}"]
            self.executor_env = {"DOCKER_HOST": host} if (host := docker_environment(executor).get("DOCKER_HOST")) \
                else {}
        self.terminal = executor_terminal(job.store, record, folder)

    def confined_folder(self) -> str | None:
        """Check, then use the very thing checked: the folder is re-resolved and re-confined right before
        Hermes starts, so a folder swapped for a symlink out after the launch check is not followed."""
        folder = self.job.record.cwd
        if not folder:
            return None
        real = os.path.realpath(folder)
        if real != folder or not within_any(real, self.job.roots) or not os.path.isdir(real):
            return None
        return real

    def make_worktree(self, worktree: dict[str, Any]) -> None:
        """The job's worktree, made before Hermes starts (a fresh one on its branch, or a resumed job's again
        from its branch), recorded with where git keeps it."""
        for note in add_worktree(self.job.store, self.job.job_id, worktree):
            self.job.note(note)
        self.job.note(f"worktree {worktree['path']} on branch {worktree['branch']} at {worktree['base'][:12]}")
        self.job.save()

    def plan_sandbox(self, folder: str, exe: str) -> Outcome | None:
        """Where the operating system will let the job write (self.writable), what its mount namespace holds
        read-only (self.mounts), and what its blocks say about them (record.sandbox, record.read_only); an
        Outcome when the setting requires a sandbox this machine cannot give."""
        job = self.job
        cfg, record = job.cfg, job.record
        if cfg.sandbox == "off":
            record.sandbox = "off (setting sandbox: off): the job writes wherever your account can"
            return None
        found = sandbox_mechanism()
        if not found.name:
            if cfg.sandbox == "required":
                return Outcome(JobState.ERROR, None, f"sandbox is required, and this machine cannot give one "
                               f"({found.why_not}); Hermes was not started. Set sandbox to auto or off to run "
                               "unconfined")
            record.sandbox = f"not available here ({found.why_not}): the job writes wherever your account can"
            return None
        own = [record.worktree["path"]] if record.worktree else [folder]
        self.private_tmp = self.warm.private_tmp if self.warm and self.warm.private_tmp else private_tmp_of(
            job.store, job.job_id)
        self.writable = sandbox_writable(cfg, own[0], self.private_tmp, record.worktree)
        self.cache = project_cache(self.private_tmp, own[0], record.worktree)
        self.mounts = sandbox_mounts(exe, folder, record.worktree, self.writable)
        held = [spec[len("ro:"):] for spec in install_mounts(exe, self.writable)]
        if held and private_devices_refusal():  # nothing holds it read-only: what the job changes there is said
            job.install_kept = (held[0], install_fingerprint(held[0]))
        record.read_only = read_only_words(self.mounts, bool(record.worktree))
        home = cfg.hermes_home_path
        extra = sandbox_extra(cfg)
        try:
            guard_home(job.store, job.job_id, str(home))
        except OSError as exc:
            return Outcome(JobState.ERROR, None, f"Hermes' settings in {shown(str(home))} could not be recorded before "
                           f"the job ({exc.strerror or exc}), so what it changed there could not be put back; Hermes "
                           "was not started")
        scoped = "; no signal to a process outside the job" if found.signals_scoped else ""
        record.sandbox = (f"writes limited to {shown(own[0])}, {shown(str(self.private_tmp))} (TMPDIR), Hermes' home "
                          f"{shown(str(home))} (its settings, skills, hooks and cron put back at the end), the tool "
                          f"cache {shown(str(self.cache))} (this project's: npm, uv, pip, go, cargo, ...)"
                          + (", the job's own git objects and branch" if record.worktree else "")
                          + (f", {shown(', '.join(extra), 600)}" if extra else "") + f" ({found.name}{scoped}); "
                          + reading_words(cfg, self.writable, exe))
        return None


def read_only_words(mounts: list[str], worktree: bool) -> str | None:
    """What the job's mount namespace holds read-only, or why it holds nothing (then the repository guard alone
    keeps the git folder, put back at the end); None when there is nothing to hold."""
    if not mounts:
        return None
    refusal = private_devices_refusal()
    if refusal:
        return (f"nothing: no mount namespace can be made here ({refusal}); the repository's git folder is guarded "
                "instead (what the job changes there is put back at the end and named under REPOSITORY)")
    held = [path for kind, _, path in (spec.partition(":") for spec in mounts) if kind == "ro"]
    hidden = [path for kind, _, path in (spec.partition(":") for spec in mounts) if kind == "hide"]
    words = []
    if held:
        words.append(shown(", ".join(held[:4]), 500) + (" (but the job's own branch, index and objects)" if worktree
                                                       else ""))
    if hidden:
        words.append(f"the daemons' sockets hidden ({shown(', '.join(hidden), 300)}: no command of the job reaches "
                     "them)")
    if held and not worktree:
        words.append("a `git commit` in this job is refused: commits belong in isolation=\"worktree\" jobs, "
                     "reviewed before they land")
    return "; ".join(words) + " (the job's own mount namespace)"


def reading_words(cfg: Config, writable: list[str], exe: str) -> str:
    """What a sandboxed job may read of your home and the other private folders, and which of them lie inside
    what the job may write (and so are readable whole)."""
    unreadable = job_unreadable(cfg, writable, exe)
    home = os.path.realpath(os.path.expanduser("~"))
    present = sorted(("~/" + os.path.relpath(path, home) if path.startswith(home + os.sep) else path
                      for path in unreadable if os.path.lexists(path)), key=lambda path: (path[:1] != "~", path))
    exposed = [path for path in private_folders(os.path.expanduser("~"))
               if within_any(path, [os.path.realpath(folder) for folder in writable])]
    words = ("reading: of your home only the toolchains' public files, the job's own folders and Hermes' ("
             + (f"{plural(len(present), 'path')} unreadable here, as {shown(', '.join(present[:6]), 400)}"
                f"{', ...' if len(present) > 6 else ''}" if present else "nothing else is there now")
             + "; sandbox_readable adds more)")
    return words + (f"; EXCEPT {shown(', '.join(exposed), 400)}, inside what the job may write: readable whole"
                    if exposed else "")
