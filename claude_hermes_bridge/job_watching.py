"""[supervisor] A job's second phase: from Hermes' start to its exit, the poll loop. Its tree remembered, its log
kept bounded, its heartbeat stamped, its driver pumped, and the reasons to stop it (cancel, timeout, a move
outside the roots, a budget) acted on: Hermes asked first, its tree stopped after the driver's grace."""
import contextlib
import os
import subprocess
import time
from pathlib import Path
from typing import Any, cast

import psutil

from .config import Config
from .drivers import HermesRun, driver_of
from .folder_changes import FolderWatch
from .hermes_cli import FOLDER_MOVE_RE, MOVE_ANNOUNCEMENT_BYTES, model_trouble, read_tail, session_id_from_log
from .hermes_store import (
    StoreUnavailable,
    read_store,
    session_store_path,
    sessions_spend,
    sessions_started_in,
    store_fingerprint,
)
from .job_network import JobNetwork
from .jobs import HEARTBEAT_S, TREE_KEPT, JobRecord, JobState, JobStore, Outcome
from .processes import Ownership, StopReport, WindowsJob, reap_orphans, stop_tree
from .safe_io import (
    ProcessId,
    clean_text,
    is_alive,
    is_number,
    machine_clock,
    open_regular,
    proc_status,
    shown,
    within_any,
)
from .supervised_job import SupervisedJob

POLL_S = 0.2
SPEND_EVERY_S = 0.5  # how often a supervisor with a budget looks at Hermes' store: a model call takes longer


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


class ResumeBackstop:
    """The backstop for a resume: a folder Hermes announced moving to that lies outside the roots, read from the
    new part of its log. Hermes announces the move as it starts, so only the start of the log is read: later text
    is tool output, which may print anything."""

    def __init__(self, log_path: Path, roots: list[str]) -> None:
        self.log_path, self.roots = log_path, roots
        self.offset = 0

    def moved_outside(self) -> str | None:
        if self.offset >= MOVE_ANNOUNCEMENT_BYTES:
            return None
        try:
            with open_regular(self.log_path) as log:
                log.seek(self.offset)
                data = log.read(MOVE_ANNOUNCEMENT_BYTES - self.offset)
        except OSError:
            return None
        cut = data.rfind(b"\n") + 1  # a line still being written is read on the next poll
        self.offset += cut
        for folder in FOLDER_MOVE_RE.findall(clean_text(data[:cut])):
            if not within_any(os.path.realpath(folder), self.roots):
                return str(folder)
        return None


class Heartbeat:
    """The record's heartbeat, which readers tell a working supervisor by, with the changes so far; a record
    write the disk refused is tried again at the next poll, not the next heartbeat."""

    def __init__(self, job: SupervisedJob, folder: FolderWatch) -> None:
        self.job, self.folder, self.due = job, folder, 0.0

    def stamp(self, now: float) -> None:
        if now >= self.due or self.job.unsaved:
            self.due = now + HEARTBEAT_S
            self.job.record.heartbeat = machine_clock()
            if so_far := self.folder.changes_so_far():
                self.job.record.changes = so_far  # what the job view lists while the job runs
            self.job.save()


class JobWatch:
    """Watches one started Hermes until it exits, and says how the job ended (an Outcome). The stop of a
    job's tree is the one act here that signals; it goes through Ownership, the proof that a process is the
    job's."""

    def __init__(self, job: SupervisedJob, hermes: psutil.Process | None, owner: Ownership, subreaper: bool,
                 windows_job: WindowsJob | None, folder: FolderWatch, network: JobNetwork) -> None:
        self.job, self.hermes, self.owner, self.subreaper = job, hermes, owner, subreaper
        self.windows_job, self.folder, self.network = windows_job, folder, network
        self.heartbeat = Heartbeat(job, folder)
        self.spend = SpendWatch(job.cfg, job.store, job.record)
        self.known_tree = set(job.record.tree)
        self.backstop = ResumeBackstop(job.store.log_path(job.job_id), job.roots) if job.record.session_requested \
            else None  # a plain run never moves
        self.log = BoundedLog(job.store.log_path(job.job_id), job.cfg.max_log_bytes)

    def watch(self, proc: subprocess.Popen[bytes], run: HermesRun) -> Outcome:
        """Until Hermes exits: remember its tree, pump its driver, and stop it on cancel, timeout or a move
        outside the roots; then sweep what it left running, and the outcome."""
        started = time.monotonic()
        exit_code, stopping, report = self.wait(proc, run, started)
        self.job.record.duration_s = round(time.monotonic() - started, 3)
        run.drain()
        sweep = stop_tree(self.owner, None, self.job.record.tree, 0, complete=self.subreaper)
        self.keep_log_bounded()
        if stopping:
            asked = "" if report else f"Hermes stopped when asked ({run.stop_request}); "
            report = report.merged(sweep) if report else sweep
            return Outcome(stopping[0], exit_code, f"{stopping[1]}; {asked}{report.describe()}")
        if sweep.stopped or sweep.survivors:
            self.job.record.swept = f"after Hermes exited, tool processes it left running: {sweep.describe()}"
        # a cap that ended the turn, whatever Hermes printed (0.19/0.20 exit 0 at --max-turns, 0.22 exits 1); every
        # job's spend is read here once, so its final block and hermes_jobs say what it cost
        if passed := self.spend.passed(stop_at_turns=True, fresh=True):
            return Outcome(passed[0], exit_code, passed[1])
        outcome = run.outcome(exit_code)
        if outcome.state is JobState.ERROR and (trouble := model_trouble(read_tail(
                self.job.store.log_path(self.job.job_id), 16384)[0])):
            return Outcome(outcome.state, exit_code, f"{trouble}; {outcome.reason}")
        if report is not None and outcome.state is JobState.OK:
            return Outcome(outcome.state, exit_code, f"Hermes finished its turn, then had not exited "
                           f"{run.exit_grace_s:g} s after its input was closed; the bridge stopped it: "
                           f"{report.describe()}")
        return outcome

    def wait(self, proc: subprocess.Popen[bytes], run: HermesRun, started: float
             ) -> tuple[int, tuple[JobState, str] | None, StopReport | None]:
        """Poll until Hermes exits. A stop first asks Hermes (the driver's ask_to_stop), then, after the
        driver's grace, stops the tree; a turn that is over while the process runs is closed, then stopped.
        The deadline is on this process' monotonic clock: a step of the wall clock neither ends a job early nor
        lets it run long."""
        record = self.job.record
        deadline = started + record.timeout_s
        stopping: tuple[JobState, str] | None = None
        report: StopReport | None = None
        stop_at = close_by = None
        while True:
            try:
                return proc.wait(timeout=POLL_S), stopping, report
            except subprocess.TimeoutExpired:
                pass
            self.remember_tree()
            reap_orphans(proc.pid)
            self.keep_log_bounded()
            now = time.monotonic()
            run.pump()
            if self.network.pump():
                self.job.save()
            self.heartbeat.stamp(now)
            if run.finished and close_by is None:
                run.close()
                close_by = now + run.exit_grace_s
            if stopping is None and (stopping := self.reason_to_stop(deadline)):
                self.job.note(f"{stopping[0].value}: stopping Hermes (pid {proc.pid}) and its tree")
                run.ask_to_stop()
                stop_at = now + run.stop_grace_s
            due = (stop_at is not None and (now >= stop_at or run.finished)) or (
                close_by is not None and now >= close_by)
            if due and report is None:
                report = stop_tree(self.owner, self.hermes, record.tree, self.job.cfg.kill_grace_s, self.windows_job,
                                   self.subreaper)
                if report.survivors:
                    self.job.note(f"could not stop pids {report.survivors}")

    def keep_log_bounded(self) -> None:
        self.log.keep_bounded([proc for proc in [self.hermes, *(seen.process() for seen in self.job.record.tree)]
                               if proc is not None])

    def reason_to_stop(self, deadline: float) -> tuple[JobState, str] | None:
        record = self.job.record
        if self.job.cancel_requested():
            return JobState.CANCELLED, "cancelled on request"
        if time.monotonic() > deadline:
            return JobState.TIMEOUT, (f"hit timeout_s={record.timeout_s:g}. Work may be part-done: inspect before "
                                      "re-running")
        if self.backstop and (moved := self.backstop.moved_outside()):
            return JobState.ERROR, (f"Hermes moved to {shown(moved)}, outside the allowed roots (a resumed session "
                                    "runs in its recorded folder); the job was stopped at once")
        return self.spend.passed_while_running()

    def remember_tree(self) -> None:
        """Record every process of the job seen: Hermes' descendants and, as a subreaper, the orphans that
        were re-parented to this supervisor (they are no longer below Hermes). The record keeps TREE_KEPT;
        the marker and the subreaper find the rest."""
        hermes = self.hermes
        try:
            children = hermes.children(recursive=True) if hermes else []
            if self.subreaper:
                children += [proc for proc in psutil.Process().children(recursive=True)
                             if not hermes or proc.pid != hermes.pid]
        except psutil.Error:
            return
        changed = False
        for child in children:
            process_id = ProcessId.of_safe(child)
            if process_id and process_id not in self.known_tree and len(self.job.record.tree) < TREE_KEPT:
                self.known_tree.add(process_id)
                self.job.record.tree.append(process_id)
                changed = True
        if changed:
            self.job.save()
