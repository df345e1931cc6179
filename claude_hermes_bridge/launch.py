"""[server] JobRequest, launch_job (dedupe, limits, the queue, the record), start_job, which starts the supervisor
(job_queue.spawn_supervisor) or hands the job to a warm standby."""
import contextlib
import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Any

from .config import Config, audit, parse_executors
from .executors import sweep_leftovers
from .git_calls import GitFailed, git
from .hermes_cli import calls_confined, compile_install, install_without_bytecode, locate_hermes
from .job_queue import (
    LAUNCH_LOCK_S,
    OFFERED,
    occupancy,
    spawn_supervisor,
    start_queued_locked,
)
from .jobs import JOB_ID_RE, JobRecord, JobState, JobStore, job_sort_key, observe
from .repo_guard import check_repository
from .safe_io import (
    DamagedRecord,
    LockTimeout,
    Refused,
    disk_error,
    locked,
    machine_clock,
    open_append,
    read_json,
    running_process,
    shown,
    write_atomic,
)
from .standby import any_standby_running
from .taking import BEING_READIED, ready_standby, served_by_standby, start_standby, warm_startable
from .worktrees import (
    WORKTREE_BRANCH_PREFIX,
    folder_below,
    is_own_folder,
    remove_worktree,
    save_worktree_work,
    worktree_of,
)


@dataclasses.dataclass
class JobRequest:
    kind: str
    task: str
    cwd: str
    max_turns: int | None
    timeout_s: float
    skills: list[str]
    toolsets: list[str]
    session_requested: str | None = None
    cwd_note: str | None = None
    driver: str = "cli"
    approval_mode: str = "deny"
    max_tokens: int | None = None
    max_cost_usd: float | None = None
    worktree: dict[str, Any] | None = None  # isolation "worktree": the repository and base, as the launch found them
    network: str = "open"  # what the job may reach (the setting, or narrower as the call asked)
    executor: dict[str, Any] | None = None  # where its commands run (config.Executor.as_record); None: here

    def dedupe_key(self) -> str:
        import hashlib  # here, not at the top: it maps OpenSSL (3 MB) into every supervisor, which needs none

        identity = [self.kind, self.task, self.cwd, self.session_requested, self.skills, self.toolsets,
                    *([self.worktree.get("from")] if self.worktree else []), self.network,
                    *([self.executor["name"]] if self.executor else [])]
        return hashlib.sha256(json.dumps(identity).encode()).hexdigest()

    def record(self, job_id: str, log: str | None = None) -> JobRecord:
        """The record a launch of this request starts with."""
        return JobRecord(id=job_id, state=JobState.STARTING, created_at=time.time(), created_clock=machine_clock(),
                         task_preview=" ".join(self.task.split())[:120], cwd=self.cwd,
                         session_requested=self.session_requested, skills=self.skills, toolsets=self.toolsets,
                         max_turns=self.max_turns, timeout_s=self.timeout_s, dedupe_key=self.dedupe_key(), log=log,
                         cwd_note=self.cwd_note, driver=self.driver, approval_mode=self.approval_mode,
                         max_tokens=self.max_tokens, max_cost_usd=self.max_cost_usd,
                         worktree=dict(self.worktree) if self.worktree else None, network_mode=self.network,
                         executor=dict(self.executor) if self.executor else None)


def launch_job(cfg: Config, request: JobRequest) -> tuple[JobRecord, str | None]:
    """Start a job, or return the identical one already running; atomic across server processes."""
    store = JobStore.of(cfg)
    try:
        store.ensure()
    except OSError as exc:
        raise Refused(f"cannot create the jobs folder {store.root}: {exc.strerror or exc}") from None
    key = request.dedupe_key()
    try:
        with locked(store.root / "launch.lock", LAUNCH_LOCK_S):
            running, queued = occupancy(store)
            if same := next((record for record in running + queued if record.dedupe_key == key), None):
                return same, (f"an identical job is already {'queued' if same in queued else 'running'}; this is "
                              "that job, no second Hermes was started")
            full = len(running) >= cfg.max_running_jobs or queued  # a free slot goes to the oldest queued job
            if full and len(queued) >= cfg.max_queued_jobs:
                listing = "; ".join(f"{r.id} ({r.task_preview[:40]})" for r in running)
                raise Refused(f"{len(running)} jobs are running (max_running_jobs {cfg.max_running_jobs:g}: "
                              f"{listing}) and {len(queued)} wait in the queue, the most max_queued_jobs allows. "
                              "Wait for one (hermes_status) or cancel one (hermes_cancel)")
            prune_jobs(store, cfg)
            if not full:
                return start_job(cfg, store, request), None
            record = queue_job(store, request)
            start_queued_locked(cfg, store)  # a slot that freed while no one looked
            return store.read(record.id), None
    except LockTimeout:
        raise Refused("another server process holds the launch lock; try again in a moment") from None
    except OSError as exc:  # the launch lock itself could not be made: the disk refuses writes
        raise Refused(f"the jobs folder refuses writes ({disk_error(exc)}); nothing started. Free space on its "
                      f"disk or make {store.root} writable, then try again") from None


def new_record(store: JobStore, request: JobRequest) -> JobRecord:
    """Claim an id and make the record a launch starts with (a fresh worktree's place follows from the id)."""
    import secrets

    try:
        job_id = store.claim_id(request.task.encode())
    except OSError as exc:
        raise Refused(f"cannot write to the jobs folder {store.root} ({disk_error(exc)}); nothing started") from None
    record = request.record(job_id, str(store.log_path(job_id)))
    record.nonce = secrets.token_hex(16)
    if record.worktree and "path" not in record.worktree:
        path = str(store.worktree_path(job_id))
        record.worktree.update(path=path, branch=WORKTREE_BRANCH_PREFIX + job_id)
        record.cwd = folder_below(path, record.worktree["subdir"])
    return record


def keep_record(store: JobStore, record: JobRecord) -> Any:
    """The record written and marked active, and its log opened for the supervisor; nothing is left behind
    when the disk refuses."""
    try:
        store.write(record)
        store.mark_active(record.id)
        return open_append(store.log_path(record.id))
    except OSError as exc:
        with contextlib.suppress(OSError):
            store.clear_active(record.id)
        with contextlib.suppress(OSError):
            store.remove(record.id)
        raise Refused(f"cannot write the job record in {store.root} ({disk_error(exc)}); nothing started") from None


def queue_job(store: JobStore, request: JobRequest) -> JobRecord:
    """A job accepted past max_running_jobs: its record, queued, and no supervisor until a slot frees."""
    record = new_record(store, request)
    record.state = JobState.QUEUED
    keep_record(store, record).close()
    return record


def start_job(cfg: Config, store: JobStore, request: JobRequest) -> JobRecord:
    """Claim an id, write the record, start the supervisor. Runs under the launch lock, so nothing here
    opens, reads or waits on a file a job could have planted (see claim_id, open_append, write_atomic)."""
    record = new_record(store, request)
    job_id = record.id
    planned = dict(record.worktree) if record.worktree else None
    standby = ready_standby(cfg, store, record)
    log = keep_record(store, record)
    with log:
        slot, ready = standby or (None, {})
        why = served_by_standby(cfg, store, slot, ready, record) if slot else None
        if slot and why is None:
            return record
        if record.start == "warm":
            record.standby_marker, record.start = None, f"cold: {why}"
            record.worktree = planned  # made by the job after all
            with contextlib.suppress(OSError):
                store.write(record)
        offered = record.start == f"cold: {BEING_READIED}"  # its program readies the next standby itself
        started = spawn_supervisor(cfg, store, record, log, OFFERED if offered else "--supervise")
    if started and not offered and warm_startable(cfg, record):
        start_standby(cfg, store, job_id)
    return record


STANDBY_AT_START_SCAN = 20  # the newest records a server's start looks through for the place of its first standby


def hermes_at_start(cfg: Config) -> None:
    """A server's start, in a thread of its own: Hermes' install compiled if it must be, then a standby readied
    (which then starts faster too)."""
    compile_at_start(cfg)
    standby_at_start(cfg)


def bytecode_note_path(store: JobStore) -> Path:
    return store.root / "hermes-bytecode.json"


def bytecode_lock_path(store: JobStore) -> Path:
    """Held by the server compiling Hermes' install (compile_at_start), for as long as it does."""
    return store.root / "hermes-bytecode.lock"


def compile_at_start(cfg: Config) -> str | None:
    """Where jobs are confined and Hermes' install has no bytecode (install_without_bytecode), compile it once, one
    server at a time, and note what happened for hermes_health. What happened, or None when nothing was to do."""
    if not calls_confined(cfg):
        return None  # an unconfined Hermes writes its own bytecode
    try:
        exe = locate_hermes(cfg).usable
    except OSError:
        return None  # the standby after it must still be readied; hermes_health says what is wrong with Hermes
    if not exe or not (site := install_without_bytecode(exe)):
        return None
    store = JobStore.of(cfg)
    try:
        with locked(bytecode_lock_path(store), 1.0):
            note_bytecode(store, site, "compiling")
            outcome = compile_install(cfg, exe, site)
            note_bytecode(store, site, outcome)
    except (LockTimeout, OSError):
        return None  # another server compiles it, or the jobs folder refuses: the next start tries again
    audit(cfg, event="hermes_bytecode", site=site, outcome=outcome)
    return outcome


def note_bytecode(store: JobStore, site: str, state: str) -> None:
    write_atomic(bytecode_note_path(store), json.dumps({"site": site, "state": state, "at": time.time()}).encode())


def bytecode_note(store: JobStore, under: str) -> dict[str, Any] | None:
    """What the bridge last noted of compiling a site-packages (compile_at_start), that one or one below it (an
    install's), or None."""
    note = read_json(bytecode_note_path(store))
    if not (isinstance(note, dict) and isinstance(note.get("site"), str) and isinstance(note.get("state"), str)
            and isinstance(note.get("at"), (int, float))):
        return None
    return note if note["site"] == under or note["site"].startswith(under + os.sep) else None


def standby_at_start(cfg: Config) -> str | None:
    """At a server's start, with warm_start on and no standby running (waiting, being readied, or about to be):
    one readied for the place of the newest job that could start warm (warm_startable), so that the server's
    first job there starts warm too. The id of the job it stands for, or None."""
    store = JobStore.of(cfg)
    if not cfg.warm_start or cfg.hermes_driver == "cli" or any_standby_running(store):
        return None
    for job_id in reversed(store.list_ids()[-STANDBY_AT_START_SCAN:]):
        try:
            record = store.read(job_id)
        except (Refused, DamagedRecord):
            continue
        if warm_startable(cfg, record):
            start_standby(cfg, store, job_id)
            return job_id
    return None


def drop_worktree(store: JobStore, job_id: str) -> None:
    """Retention of a worktree job: its worktree, branch and ref go with it (best effort: a repository that
    is gone or busy leaves its branch; the folder in the jobs folder goes regardless)."""
    import shutil

    try:
        worktree = worktree_of(store, store.read(job_id))
    except (Refused, DamagedRecord):
        worktree = None
    if worktree:
        with contextlib.suppress(GitFailed, LockTimeout, OSError):
            remove_worktree(store, worktree, branch_too=True, job_id=job_id)
    shutil.rmtree(store.worktree_path(job_id), ignore_errors=True)


def worktree_count(store: JobStore) -> str:
    """hermes_health's count of the worktrees the bridge keeps, and where."""
    folder = store.root / "worktrees"
    try:
        count = sum(1 for entry in os.scandir(folder) if entry.is_dir(follow_symlinks=False))
    except OSError:
        count = 0
    return (f"{count} kept in {shown(str(folder))} (each until hermes_land merges or discards it, or retention "
            "removes its job)")


def sweep_containers(cfg: Config) -> list[str]:
    """At a server's start: the containers of this jobs folder's docker jobs that no longer run (their supervisor
    was killed before it removed them: orphaned, or ended), removed and said in the audit log."""
    table, _ = parse_executors(cfg.executors)
    if not any(executor.kind == "docker" for executor in table.values()):
        return []
    store = JobStore.of(cfg)

    def still_runs(job_id: str) -> bool:
        try:
            return observe(store.read(job_id), store.root).running
        except (Refused, DamagedRecord):
            return False  # no record of this folder's: nothing to keep it for

    said = sweep_leftovers(list(table.values()), store.root, still_runs)
    for line in said:
        audit(cfg, event="containers", removed=line)
    return said


def recover_worktrees(cfg: Config) -> int:
    """At a server's start: a worktree whose job ended without saving its work (its supervisor died) has it
    saved now, as the patch, the ref and the record's DIFF, then is unlocked (retention or hermes_land removes
    it); nothing of a job still running is touched. Returns how many were saved."""
    store = JobStore.of(cfg)
    try:
        job_ids = [entry.name for entry in os.scandir(store.root / "worktrees") if JOB_ID_RE.fullmatch(entry.name)]
    except OSError:
        return 0
    saved = 0
    for job_id in job_ids:
        try:
            observed = observe(store.read(job_id), store.root)
        except (Refused, DamagedRecord):
            continue
        record = observed.record
        worktree = worktree_of(store, record)
        if not worktree or "work" in worktree or observed.running or running_process(record.hermes) is not None:
            continue
        try:
            restored = check_repository(store, record, refs_too=True)
            if restored:
                audit(cfg, event="repository", job_id=job_id, changed=restored)
            save_worktree_work(store, record)
            if is_own_folder(worktree):
                git(worktree["repo"], "worktree", "unlock", worktree["path"], check=False)
        except (GitFailed, OSError) as exc:
            audit(cfg, event="worktree", job_id=job_id, problem=f"its work could not be saved: {exc}")
            continue

        def keep(stored: JobRecord, found: JobRecord = record) -> None:
            stored.worktree, stored.diff, stored.changes = found.worktree, found.diff, found.changes
            stored.repository = found.repository
        store.update(job_id, keep, final_too=True)
        audit(cfg, event="worktree", job_id=job_id, saved=record.diff)
        saved += 1
    return saved


def prune_jobs(store: JobStore, cfg: Config) -> int:
    """Remove finished jobs past retention_days or beyond retention_max_jobs; never a running one. An
    orphaned job (its supervisor and its Hermes gone) counts as finished.

    Runs under the launch lock, where every unfinished job has its active marker, so only their records are
    read."""
    active = set(store.active_ids())
    dead = {job_id for job_id, observed, _ in store.observed_jobs(sorted(active, key=job_sort_key))
            if observed is not None and observed.state is JobState.ORPHANED
            and running_process(observed.record.hermes) is None}
    finished = [job_id for job_id in store.list_ids() if job_id not in active or job_id in dead]

    def stamp(seconds_ago: float) -> str:
        return time.strftime("%Y%m%d-%H%M%S", time.localtime(time.time() - seconds_ago))
    cutoff, recent = stamp(cfg.retention_days * 86400), stamp(60)
    excess = max(0, len(finished) - cfg.retention_max_jobs)
    # A job of the last minute is kept whatever the count: its id could otherwise be claimed again.
    doomed = [job_id for i, job_id in enumerate(finished) if (i < excess or job_id < cutoff) and job_id < recent]
    removed = 0
    for job_id in doomed:
        try:
            drop_worktree(store, job_id)
            store.clear_active(job_id)
            store.remove(job_id)
            removed += 1
        except OSError:  # left for a later launch; pruning must never block one
            continue
    return removed
