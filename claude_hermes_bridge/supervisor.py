"""[supervisor] Supervisor: one detached process per job, from Hermes' start to the outcome in its record."""
import contextlib
import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, cast

import psutil

from .config import Config, audit, load_config
from .drivers import (
    HermesRun,
    LaunchPlan,
    ProcessStarter,
    WarmStart,
    driver_of,
    hermes_launch,
    plan_launch,
    private_tmp_of,
    sandbox_extra,
    sandbox_writable,
    tool_cache,
    usable_hermes,
)
from .folder_changes import FolderWatch
from .git_calls import GitFailed
from .hermes_cli import (
    FOLDER_MOVE_RE,
    MOVE_ANNOUNCEMENT_BYTES,
    model_trouble,
    read_tail,
    session_id_from_log,
)
from .hermes_store import (
    StoreUnavailable,
    read_store,
    refusal_texts,
    session_spend,
    session_store_path,
    sessions_spend,
    sessions_started_in,
    store_fingerprint,
)
from .home_guard import guard_home, restore_home
from .job_network import JobNetwork
from .job_queue import start_queued
from .jobs import (
    GUARD_NOTES_KEPT,
    HEARTBEAT_S,
    LATE_ANSWERS_KEPT,
    MAX_TASK_BYTES,
    REFUSED_PATHS_KEPT,
    TREE_KEPT,
    JobRecord,
    JobState,
    JobStore,
    Outcome,
    validate_job_id,
)
from .processes import (
    Ownership,
    StopReport,
    WindowsJob,
    become_subreaper,
    held_in_job_object,
    reap_orphans,
    stop_tree,
)
from .repo_guard import check_repository, guard_repository, repository_around
from .safe_io import (
    IS_WINDOWS,
    DamagedRecord,
    ProcessId,
    Refused,
    clean_text,
    disk_error,
    is_alive,
    is_number,
    machine_clock,
    open_regular,
    plural,
    proc_status,
    read_capped,
    shown,
    within_any,
)
from .sandbox import mechanism as sandbox_mechanism
from .sandbox import refused_paths, unreadable_paths
from .worktrees import add_worktree, job_roots, object_environment, own_objects, save_worktree_work

# `server.py --supervise <id>`: one detached process per job that owns it from start to outcome.
POLL_S = 0.2


class BoundedLog:
    """The job's log (this process' stderr, fd 2) kept under max_log_bytes: past it the log keeps its first
    quarter and its newest half, with a line saying how much was left out between. Everyone writes it in
    append mode, so after the cut the writes go on at the new end; the job's known processes are paused for the
    cut (milliseconds), so none of their output is lost or lands out of order."""

    def __init__(self, path: Path, cap: int) -> None:
        self.path, self.cap = path, cap
        self.left_out = 0

    def keep_bounded(self, writers: list[psutil.Process]) -> None:
        try:
            if os.fstat(2).st_size <= self.cap:
                return
        except OSError:
            return
        paused = [proc for proc in writers if is_alive(proc)]
        for proc in paused:
            with contextlib.suppress(psutil.Error):
                proc.suspend()
        stopping_by = time.monotonic() + 2  # a stop lands once a write in progress (10 MB at once?) has ended
        while any(is_alive(proc) and proc_status(proc) != psutil.STATUS_STOPPED for proc in paused) and (
                time.monotonic() < stopping_by):
            time.sleep(0.005)
        try:
            head, tail = self.cap // 4, self.cap // 2
            size = os.fstat(2).st_size
            with open_regular(self.path) as log:
                log.seek(max(head, size - tail))
                newest = log.read()
            os.ftruncate(2, head)
            self.left_out += size - head - len(newest)
            os.write(2, (f"\n[bridge] {self.left_out:,} bytes of output were left out here (max_log_bytes "
                         f"{self.cap:,}): the log keeps its head and its newest output\n").encode() + newest)
        except OSError:
            return
        finally:
            for proc in paused:
                with contextlib.suppress(psutil.Error):
                    proc.resume()


SPEND_COUNTERS = ("api_calls", "tokens_in", "tokens_out", "cost_usd")


def never_lower(found: dict[str, Any], before: dict[str, Any] | None) -> dict[str, Any]:
    """The spend as read, except that no counter goes below an earlier reading: a job can write Hermes' store,
    and a budget must not reopen because its counters went down (said in the record, as `lowered`)."""
    if not before:
        return found
    lowered = [key for key in SPEND_COUNTERS if is_number(before.get(key)) and found[key] < before[key]]
    for key in lowered:
        found[key] = before[key]
    if lowered or before.get("lowered"):
        found["lowered"] = 1
    return found


class SpendWatch:
    """A job's spend, read from Hermes' store, against its budgets (tokens, cost, and max_turns where the
    driver's Hermes does not stop at it by itself). While the job runs it is read every SPEND_EVERY_S at most,
    and only when the store changed: a poll costs a stat."""

    def __init__(self, cfg: Config, store: JobStore, record: JobRecord) -> None:
        self.cfg, self.store, self.record = cfg, store, record
        self.next_read = 0.0
        self.session: str | None = None
        self.fingerprint: tuple[tuple[int, int] | None, ...] = ()

    @property
    def watching(self) -> bool:
        """Whether this job has a budget the bridge enforces."""
        record = self.record
        return bool(record.max_tokens or record.max_cost_usd
                    or (record.max_turns and not driver_of(record).enforces_max_turns))

    def passed_while_running(self) -> tuple[JobState, str] | None:
        """The budget passed, when a read is due; None otherwise."""
        if time.monotonic() < self.next_read or not self.watching:
            return None
        self.next_read = time.monotonic() + SPEND_EVERY_S
        return self.passed(stop_at_turns=not driver_of(self.record).enforces_max_turns, fresh=False)

    def spend(self, fresh: bool) -> dict[str, Any] | None:
        """This job's spend so far (a resumed session's earlier counters taken off), kept in the record. Not
        `fresh`, a store that has not changed since the last read is not read again. A write the change times
        cannot tell apart (same size, same tick) is read at the next."""
        record = self.record
        fingerprint = store_fingerprint(session_store_path(self.cfg))
        if not fresh and self.session and record.spend and fingerprint == self.fingerprint:
            return record.spend
        session = (record.session_id or record.session_requested or self.session
                   or session_id_from_log(self.store.log_path(record.id)))
        started = record.started_at
        try:
            sessions = [session] if session else []
            if not sessions and record.cwd and started is not None:  # looked for at every read, never latched:
                # a session started meanwhile by another job in the folder would otherwise be taken for this one
                sessions = read_store(self.cfg, lambda db: sessions_started_in(db, cast(str, record.cwd), started))
            if not sessions:
                return None
            found = read_store(self.cfg, lambda db: sessions_spend(db, sessions))
            self.session = session  # a session id Hermes named is not looked for again
            self.fingerprint = fingerprint
        except StoreUnavailable:
            return None
        if found is None:
            return None
        base = record.spend_base or {}
        for key in SPEND_COUNTERS:
            found[key] = max(0, found[key] - base.get(key, 0))
        record.spend = never_lower(found, record.spend)
        return record.spend

    def passed(self, stop_at_turns: bool, fresh: bool) -> tuple[JobState, str] | None:
        """The budget this job has passed, read from Hermes' store, or None."""
        record = self.record
        spend = self.spend(fresh)
        if spend is None:
            return None
        tokens = spend["tokens_in"] + spend["tokens_out"]
        if record.max_tokens and tokens > record.max_tokens:
            return JobState.OVER_BUDGET, f"passed max_tokens: {tokens:,} tokens of {record.max_tokens:,}"
        if record.max_cost_usd and spend["priced"] and spend["cost_usd"] > record.max_cost_usd:
            return JobState.OVER_BUDGET, (f"passed max_cost_usd: ${spend['cost_usd']:.4f} of "
                                          f"${record.max_cost_usd:g} (Hermes' estimate)")
        if stop_at_turns and record.max_turns and spend["api_calls"] >= record.max_turns:
            return JobState.OVER_BUDGET, f"reached max_turns ({record.max_turns}): {spend['api_calls']} API calls"
        return None


class Supervisor:
    """Owns one job from a detached process: starts Hermes with the record's driver, enforces the timeout,
    obeys cancel, records. Its collaborators come in (config, store, the process starter), so tests can drive
    the loop with a fake; the driver (DRIVERS) holds everything that differs between the ways to run Hermes.

    The outcome is never lost: a record write the disk refuses mid-run is kept and tried again on the next
    poll, and the outcome is retried with back-off for OUTCOME_RETRY_S, writing nothing else meanwhile."""

    def __init__(self, job_id: str, cfg: Config, store: JobStore, start_process: ProcessStarter | None = None,
                 subreaper: bool = False, warm: WarmStart | None = None):
        self.cfg = cfg
        self.warm = warm  # a standby's Hermes, started before the job (standby.py)
        self.store = store
        self.start_process = start_process
        self.run_: HermesRun | None = None
        self.subreaper = subreaper  # orphans of the job's tools re-parent to this process (Linux)
        self.job_id = job_id
        self.record = self.store.read(job_id)
        self.owner = Ownership(self.record.marker, frozenset({os.getpid()}))
        self.known_tree = set(self.record.tree)
        self.stop_signal = False
        self.log_offset = 0
        self.log = BoundedLog(store.log_path(job_id), cfg.max_log_bytes)
        self.windows_job: WindowsJob | None = None
        self.hermes: psutil.Process | None = None
        self.watch: FolderWatch | None = None
        self.unsaved = False
        self.writable: list[str] = []  # what the sandbox lets the job write; empty: not sandboxed
        self.private_tmp: Path | None = None
        self.next_heartbeat = 0.0
        self.spend = SpendWatch(cfg, store, self.record)
        self.network = JobNetwork(cfg, store, self.record)

    def note(self, text: str) -> None:
        self.write_log(f"[bridge] {text}\n")

    def write_log(self, text: str) -> None:
        """The job's log is this process's stderr (Hermes writes there too). A log the disk refuses loses the
        line, never the job."""
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.write(text)
            sys.stderr.flush()

    def save(self) -> None:
        """Write the record; a disk that refuses it (full, read-only, a lock held) leaves it to the next poll."""
        try:
            self.store.write(self.record)
            self.unsaved = False
        except (OSError, DamagedRecord):
            self.unsaved = True

    def run(self) -> int:
        record = self.record
        record.supervisor = ProcessId.of(psutil.Process())
        record.change_state(JobState.RUNNING)
        record.heartbeat = machine_clock()
        try:
            written = self.store.write(record)
        except (OSError, DamagedRecord) as exc:
            self._finish(Outcome(JobState.ERROR, None, f"the jobs folder refused the job's first write ("
                                 f"{disk_error(exc)}); Hermes was not started"))
            return 0
        if not written:
            self.note("the job already has an outcome (cancelled as an orphan before this supervisor started); "
                      "Hermes was not started")
            return 0
        try:
            outcome = self._run_hermes()
        except Exception as exc:  # the outcome must be written whatever went wrong, after the tree is stopped
            with contextlib.suppress(OSError, ValueError):
                traceback.print_exc()
            report = self._stop_everything()
            outcome = Outcome(JobState.ERROR, None, f"the supervisor failed ({type(exc).__name__}: "
                              f"{shown(str(exc), 300)}); {report.describe()}")
        self._finish(outcome)
        return 0

    def _stop_everything(self) -> StopReport:
        """After a failure of the supervisor itself: Hermes and every process proven the job's, stopped."""
        try:
            return stop_tree(self.owner, self.hermes, self.record.tree, self.cfg.kill_grace_s, self.windows_job,
                             self.subreaper)
        except Exception:  # noqa: BLE001  (the outcome is written whatever the stop met)
            return StopReport(frozenset(), [self.hermes.pid] if self.hermes else [], [], False)

    def on_sigterm(self, _signum: int, _frame: Any) -> None:
        self.stop_signal = True

    def _cancel_requested(self) -> bool:
        return self.stop_signal or self.store.cancel_path(self.job_id).exists()

    def _confined_folder(self) -> str | None:
        """Check, then use the very thing checked: the folder is re-resolved and re-confined right before
        Hermes starts, so a folder swapped for a symlink out after the launch check is not followed."""
        folder = self.record.cwd
        if not folder:
            return None
        real = os.path.realpath(folder)
        if real != folder or not within_any(real, self.roots) or not os.path.isdir(real):
            return None
        return real

    @property
    def roots(self) -> list[str]:
        return job_roots(self.cfg, self.record)

    def _run_hermes(self) -> Outcome:
        plan = self._plan()
        if isinstance(plan, Outcome):
            return plan
        self.run_ = driver_of(self.record)(self.cfg, self.store, self.record, plan.argv[0], self.write_log,
                                           self.start_process, self.save)
        proc = self._start(plan, self.run_)
        return self._watch(proc, self.run_)

    def _plan(self) -> "LaunchPlan | Outcome":
        """Everything checked before Hermes starts: the executable, its command line, the folder."""
        record, cfg = self.record, self.cfg
        if self._cancel_requested():
            return Outcome(JobState.CANCELLED, None, "cancelled before Hermes started")
        try:
            exe = usable_hermes(cfg)
            if record.worktree and not os.path.isdir(record.worktree["path"]):
                self._make_worktree(record.worktree)
            if record.worktree:
                own_objects(self.store, record)
                guard_repository(self.store, record)
            folder = self._confined_folder()
            if folder is None:
                return Outcome(JobState.ERROR, None, f"the job's folder {shown(record.cwd)} no longer resolves to "
                               "itself inside the allowed roots (moved, removed or replaced by a symlink); Hermes "
                               "was not started")
            if not record.worktree and (top := repository_around(folder)):
                record.guarded_repo = top
                guard_repository(self.store, record)
            task_path = self.store.task_path(self.job_id)
            task = read_capped(task_path, MAX_TASK_BYTES).decode("utf-8")
            if refusal := self._plan_sandbox(folder):
                return refusal
            if refused := self.network.start(sandboxed=bool(self.writable)):
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

    def _plan_sandbox(self, folder: str) -> Outcome | None:
        """Where the operating system will let the job write (self.writable), and what its blocks say about it
        (record.sandbox); an Outcome when the setting requires a sandbox this machine cannot give."""
        cfg, record = self.cfg, self.record
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
            self.store, self.job_id)
        self.writable = sandbox_writable(cfg, own[0], self.private_tmp, record.worktree)
        home = cfg.hermes_home_path
        extra = sandbox_extra(cfg)
        try:
            guard_home(self.store, self.job_id, str(home))
        except OSError as exc:
            return Outcome(JobState.ERROR, None, f"Hermes' settings in {shown(str(home))} could not be recorded before "
                           f"the job ({exc.strerror or exc}), so what it changed there could not be put back; Hermes "
                           "was not started")
        scoped = "; no signal to a process outside the job" if found.signals_scoped else ""
        record.sandbox = (f"writes limited to {shown(own[0])}, {shown(str(self.private_tmp))} (TMPDIR), Hermes' home "
                          f"{shown(str(home))} (its settings, skills, hooks and cron put back at the end), the tool "
                          f"cache {shown(str(tool_cache(self.private_tmp)))} (npm, uv, pip, go, cargo, ...)"
                          + (", the job's own git objects and branch" if record.worktree else "")
                          + (f", {shown(', '.join(extra), 600)}" if extra else "") + f" ({found.name}{scoped}); "
                          + reading_words(cfg, self.writable))
        return None

    def _note_refusals(self, session_id: str | None) -> None:
        """The writes the sandbox refused, as the job's tools reported them (their results in Hermes' store, and
        the job's log), outside what the job may write: SANDBOX_DENIED."""
        texts = [clean_text(read_tail(self.store.log_path(self.job_id), REFUSAL_LOG_BYTES)[0])]
        since = self.record.started_at
        if session_id and since is not None:
            with contextlib.suppress(StoreUnavailable):
                texts += read_store(self.cfg, lambda db: refusal_texts(db, session_id, since))
        self.record.sandbox_refused = refused_paths(texts, self.writable, REFUSED_PATHS_KEPT)

    def _restore_home(self) -> None:
        """What the sandboxed job changed of Hermes' settings put back, reported and audited."""
        notes = restore_home(self.store, self.job_id)
        for note in notes:
            self.note(f"Hermes' home: {note}")
        if notes:
            self.record.hermes_home = notes[-GUARD_NOTES_KEPT:]
            audit(self.cfg, event="hermes_home", job_id=self.job_id, changed=notes)

    def _make_worktree(self, worktree: dict[str, Any]) -> None:
        """The job's worktree, made before Hermes starts (a fresh one on its branch, or a resumed job's again
        from its branch), recorded with where git keeps it."""
        for note in add_worktree(self.store, self.job_id, worktree):
            self.note(note)
        self.note(f"worktree {worktree['path']} on branch {worktree['branch']} at {worktree['base'][:12]}")
        self.save()

    def _check_repository(self) -> None:
        """The job's repository put back as it was before Hermes started, what the job changed reported and
        audited: before the bridge's own git saves the work."""
        notes = check_repository(self.store, self.record, refs_too=True)
        for note in notes:
            self.note(f"repository: {note}")
        if notes:
            audit(self.cfg, event="repository", job_id=self.job_id, changed=notes)

    def _start(self, plan: "LaunchPlan", run: HermesRun) -> subprocess.Popen[bytes]:
        """Start Hermes as planned, after the folder listing has begun, and record who it is."""
        record, cfg = self.record, self.cfg
        self.watch = FolderWatch(plan.folder, cfg.changed_files_skip, cfg.changed_files_max_entries,
                                 cfg.changed_files_max_s)
        record.argv = plan.shown_argv
        if record.session_requested:  # a resumed session's earlier spend is not this job's, budgeted or not
            with contextlib.suppress(StoreUnavailable):
                base = read_store(cfg, lambda db: session_spend(db, cast(str, record.session_requested)))
                record.spend_base = {key: value for key, value in (base or {}).items() if is_number(value)}
        if self.warm:
            proc = run.adopt(plan, self.warm)
        else:
            argv, env = hermes_launch(cfg, plan.argv, record.marker, self.writable, self.private_tmp,
                                      self._git_environment(), self.network.port, self.network.enforced)
            proc = run.start(dataclasses.replace(plan, argv=argv), env)
        if IS_WINDOWS:
            self.windows_job = self._job_object_for(proc)
        self.hermes = psutil.Process(proc.pid)
        record.hermes = ProcessId.of(self.hermes)
        record.started_at, record.started_clock = time.time(), machine_clock()
        self.save()
        audit(cfg, event="job", job_id=self.job_id, state=JobState.RUNNING.value, hermes_pid=proc.pid,
              cwd=record.cwd, cli_flags=plan.cli_flags)
        return proc

    def _git_environment(self) -> dict[str, str]:
        """A worktree job's git writes objects to the job's own folder and reads the repository's (own_objects)."""
        worktree = self.record.worktree
        if not worktree or "objects" not in worktree:
            return {}
        return object_environment(worktree["objects"], worktree["repo"])

    def _watch(self, proc: subprocess.Popen[bytes], run: HermesRun) -> Outcome:
        """Until Hermes exits: remember its tree, pump its driver, and stop it on cancel, timeout or a move
        outside the roots; then sweep what it left running, and the outcome."""
        started = time.monotonic()
        exit_code, stopping, report = self._wait(proc, run, started)
        self.record.duration_s = round(time.monotonic() - started, 3)
        run.drain()
        sweep = stop_tree(self.owner, None, self.record.tree, 0, complete=self.subreaper)
        self._keep_log_bounded()
        if stopping:
            asked = "" if report else f"Hermes stopped when asked ({run.stop_request}); "
            report = report.merged(sweep) if report else sweep
            return Outcome(stopping[0], exit_code, f"{stopping[1]}; {asked}{report.describe()}")
        if sweep.stopped or sweep.survivors:
            self.record.swept = f"after Hermes exited, tool processes it left running: {sweep.describe()}"
        # a cap that ended the turn, whatever Hermes printed (0.19/0.20 exit 0 at --max-turns, 0.22 exits 1); every
        # job's spend is read here once, so its final block and hermes_jobs say what it cost
        if passed := self.spend.passed(stop_at_turns=True, fresh=True):
            return Outcome(passed[0], exit_code, passed[1])
        outcome = run.outcome(exit_code)
        if outcome.state is JobState.ERROR and (trouble := model_trouble(read_tail(
                self.store.log_path(self.job_id), 16384)[0])):
            return Outcome(outcome.state, exit_code, f"{trouble}; {outcome.reason}")
        return outcome

    def _wait(self, proc: subprocess.Popen[bytes], run: HermesRun, started: float
              ) -> tuple[int, tuple[JobState, str] | None, StopReport | None]:
        """Poll until Hermes exits. A stop first asks Hermes (the driver's ask_to_stop), then, after the
        driver's grace, stops the tree; a turn that is over while the process runs is closed, then stopped.
        The deadline is on this process' monotonic clock: a step of the wall clock neither ends a job early nor
        lets it run long."""
        record = self.record
        hermes = cast(psutil.Process, self.hermes)
        deadline = started + record.timeout_s
        stopping: tuple[JobState, str] | None = None
        report: StopReport | None = None
        stop_at = close_by = None
        while True:
            try:
                return proc.wait(timeout=POLL_S), stopping, report
            except subprocess.TimeoutExpired:
                pass
            self._remember_tree(hermes)
            reap_orphans(proc.pid)
            self._keep_log_bounded()
            now = time.monotonic()
            run.pump()
            if self.network.pump():
                self.save()
            self._stamp(now)
            if run.finished and close_by is None:
                run.close()
                close_by = now + run.exit_grace_s
            if stopping is None and (stopping := self._reason_to_stop(deadline)):
                self.note(f"{stopping[0].value}: stopping Hermes (pid {proc.pid}) and its tree")
                run.ask_to_stop()
                stop_at = now + run.stop_grace_s
            due = (stop_at is not None and (now >= stop_at or run.finished)) or (
                close_by is not None and now >= close_by)
            if due and report is None:
                report = stop_tree(self.owner, hermes, record.tree, self.cfg.kill_grace_s, self.windows_job,
                                   self.subreaper)
                if report.survivors:
                    self.note(f"could not stop pids {report.survivors}")

    def _stamp(self, now: float) -> None:
        """The heartbeat readers tell a working supervisor by, and any write the disk refused before."""
        if now >= self.next_heartbeat or self.unsaved:
            self.next_heartbeat = now + HEARTBEAT_S
            self.record.heartbeat = machine_clock()
            if self.watch and (so_far := self.watch.changes_so_far()):
                self.record.changes = so_far  # what the job view lists while the job runs
            self.save()

    def _keep_log_bounded(self) -> None:
        self.log.keep_bounded([proc for proc in [self.hermes, *(seen.process() for seen in self.record.tree)]
                               if proc is not None])

    def _reason_to_stop(self, deadline: float) -> tuple[JobState, str] | None:
        record = self.record
        if self._cancel_requested():
            return JobState.CANCELLED, "cancelled on request"
        if time.monotonic() > deadline:
            return JobState.TIMEOUT, (f"hit timeout_s={record.timeout_s:g}. Work may be part-done: inspect before "
                                      "re-running")
        if moved := self._moved_outside_roots():
            return JobState.ERROR, (f"Hermes moved to {shown(moved)}, outside the allowed roots (a resumed session "
                                    "runs in its recorded folder); the job was stopped at once")
        return self.spend.passed_while_running()

    def _usage(self, session_id: str | None) -> None:
        """The session's counters, kept in the record for hermes_jobs and for when the store is gone."""
        if not session_id or self.run_ is None:
            return
        with contextlib.suppress(StoreUnavailable):
            usage = self.run_.usage(session_id)
            if usage:
                self.record.usage = dataclasses.asdict(usage)

    def _job_object_for(self, proc: subprocess.Popen[bytes]) -> "WindowsJob | None":
        """Hermes in a job object of its own (a warm Hermes was put in one when it started); without one (nested
        jobs refused) the tree walk still applies."""
        if self.warm:
            if self.warm.windows_job is None:
                self.note("no job object holds this warm Hermes; its tree is found through parent links only")
            return self.warm.windows_job
        try:
            return held_in_job_object(proc)
        except OSError as exc:
            self.note(f"no job object for Hermes ({exc}); its tree is found through parent links only")
            return None

    def _moved_outside_roots(self) -> str | None:
        """The backstop for a resume: a folder Hermes announced moving to that lies outside the roots, read
        from the new part of its log. Hermes announces the move as it starts, so only the start of the log
        is read: later text is tool output, which may print anything, and a plain run never moves."""
        if not self.record.session_requested or self.log_offset >= MOVE_ANNOUNCEMENT_BYTES:
            return None
        try:
            with open_regular(self.store.log_path(self.job_id)) as log:
                log.seek(self.log_offset)
                data = log.read(MOVE_ANNOUNCEMENT_BYTES - self.log_offset)
        except OSError:
            return None
        cut = data.rfind(b"\n") + 1  # a line still being written is read on the next poll
        self.log_offset += cut
        for folder in FOLDER_MOVE_RE.findall(clean_text(data[:cut])):
            if not within_any(os.path.realpath(folder), self.roots):
                return str(folder)
        return None

    def _remember_tree(self, hermes: "psutil.Process") -> None:
        """Record every process of the job seen: Hermes' descendants and, as a subreaper, the orphans that
        were re-parented to this supervisor (they are no longer below Hermes). The record keeps TREE_KEPT;
        the marker and the subreaper find the rest."""
        try:
            children = hermes.children(recursive=True)
            if self.subreaper:
                children += [proc for proc in psutil.Process().children(recursive=True) if proc.pid != hermes.pid]
        except psutil.Error:
            return
        changed = False
        for child in children:
            process_id = ProcessId.of_safe(child)
            if process_id and process_id not in self.known_tree and len(self.record.tree) < TREE_KEPT:
                self.known_tree.add(process_id)
                self.record.tree.append(process_id)
                changed = True
        if changed:
            self.save()

    def _finish(self, outcome: Outcome) -> None:
        record = self.record
        exit_code = outcome.exit_code
        session_id: str | None = None
        self.network.close()
        if self.run_ is not None:
            try:
                self.run_.cleanup()
                session_id, source = self.run_.session(exit_code)
                record.session_source = source or record.session_source
                self.run_.report(session_id)
            except Exception as exc:  # the outcome is written whatever the driver did
                self.note(f"could not tell the job's session: {exc}")
        record.change_state(outcome.state, outcome.reason, exit_code)
        record.session_id = session_id
        record.late_answers = [*record.late_answers, *self.store.answers_file(self.job_id)[1]][-LATE_ANSWERS_KEPT:]
        try:
            if self.writable:
                self._note_refusals(session_id)
                self._restore_home()
            if record.worktree or record.guarded_repo:
                self._check_repository()
            if record.worktree:  # a worktree job's changes are git's to tell
                save_worktree_work(self.store, record)
            elif self.watch:
                record.changes = self.watch.changes()
            self._usage(session_id)
        except Exception as exc:  # a report of the job, never a reason to lose its outcome
            self.note(f"could not list the changes, save the worktree's work or read the usage: {exc}")
        requested = record.session_requested
        if requested and session_id and session_id != requested:
            record.session_note = (f"asked to resume session {requested}, but Hermes reported session {session_id}: "
                                   "it started a fresh session or continued a compressed one under a new id")
        if not self._write_outcome():
            return  # the record still says running with a dead supervisor: readers report it orphaned
        for path in (self.store.cancel_path(self.job_id), self.store.answers_path(self.job_id),
                     self.store.steers_path(self.job_id), self.store.active / self.job_id):
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)
        if self.private_tmp is not None:
            shutil.rmtree(self.private_tmp, ignore_errors=True)
        audit(self.cfg, event="job", job_id=self.job_id, state=outcome.state.value, exit_code=exit_code,
              reason=outcome.reason)
        start_queued(self.cfg, self.store)  # this job's slot is free: the oldest queued job starts, server or not

    def _write_outcome(self) -> bool:
        """The outcome, written once the disk takes it: a full or read-only jobs folder is waited out with
        back-off for OUTCOME_RETRY_S, writing nothing else to it meanwhile, and the record then says what
        delayed it. False when it never could (or another writer's outcome stands)."""
        first_failure: tuple[float, str] | None = None
        wait_s = OUTCOME_RETRY_FIRST_S
        give_up = time.monotonic() + OUTCOME_RETRY_S
        while True:
            if first_failure:
                self.record.outcome_note = (f"written {time.monotonic() - first_failure[0]:.0f} s after the job ended: "
                                            f"the jobs folder refused writes until then ({first_failure[1]})")
            try:
                self.store.write(self.record)
                return True
            except (OSError, DamagedRecord) as exc:
                first_failure = first_failure or (time.monotonic(), disk_error(exc))
            if time.monotonic() >= give_up:
                return False
            time.sleep(wait_s)
            wait_s = min(wait_s * 2, OUTCOME_RETRY_MAX_WAIT_S)


def reading_words(cfg: Config, writable: list[str]) -> str:
    """What a sandboxed job cannot read, and which of it the job's own folders hold (and so it can)."""
    unreadable = unreadable_paths(os.path.expanduser("~"), cfg.sandbox_unreadable)
    present = [path for path in unreadable if os.path.lexists(path)]
    exposed = [path for path in present if any(path == folder or path.startswith(folder.rstrip("/") + "/")
                                                for folder in map(os.path.realpath, writable))]
    words = (f"reading: your credentials unreadable ({plural(len(present), 'path')} here, as "
             f"{shown(', '.join(present[:6]), 400)}{', ...' if len(present) > 6 else ''})" if present else
             "reading: your credentials unreadable (none of ~/.ssh, ~/.aws, ... is here now; made later, still "
             "unreadable)")
    return words + (f"; EXCEPT {shown(', '.join(exposed), 400)}, inside what the job may write" if exposed else "")


REFUSAL_LOG_BYTES = 262144  # the end of the job's log read for refused writes
SPEND_EVERY_S = 0.5  # how often a supervisor with a budget looks at Hermes' store: a model call takes longer
OUTCOME_RETRY_S = 1800.0
OUTCOME_RETRY_FIRST_S = 0.25
OUTCOME_RETRY_MAX_WAIT_S = 5.0


def main(job_id: str) -> int:
    """The supervisor's program, `--supervise ID`: no argparse, no MCP."""
    cfg = load_config()
    supervisor = Supervisor(validate_job_id(job_id), cfg, JobStore.of(cfg), subreaper=become_subreaper())
    signal.signal(signal.SIGTERM, supervisor.on_sigterm)
    return supervisor.run()
