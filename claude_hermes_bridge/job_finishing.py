"""[supervisor] A job's last phase: once Hermes is gone, the outcome and everything around it. The driver's
session and its cleanup, the refused writes said, Hermes' settings and the repository put back, the changes
listed or the worktree's work saved, the usage read; then the outcome written whatever the disk does meanwhile,
the job's files removed, and the next queued job started."""
import contextlib
import dataclasses
import json
import shutil
import time
from pathlib import Path
from typing import Any, cast

from .config import Executor, audit
from .drivers import HermesRun, install_changed_path, install_fingerprint, job_unreadable
from .executors import (
    CHECK_TIMEOUT_S,
    carry_back,
    fetched_so_far,
    keep_what_came,
    remove_job_containers,
    remove_remote_worktree,
    unlink_short_tmp,
)
from .folder_changes import FolderWatch
from .git_calls import GIT_TIMEOUT_S, GitFailed
from .hermes_cli import read_tail
from .hermes_store import StoreUnavailable, read_store, refusal_texts
from .home_guard import restore_home
from .job_network import JobNetwork
from .job_queue import start_queued
from .jobs import GUARD_NOTES_KEPT, LATE_ANSWERS_KEPT, REFUSED_PATHS_KEPT, JobState, Outcome
from .repo_guard import check_repository
from .safe_io import DamagedRecord, clean_text, disk_error, shown, within_any, write_atomic
from .sandbox import refused_paths
from .supervised_job import SupervisedJob
from .worktrees import object_environment, save_worktree_work, worktree_git

REFUSAL_LOG_BYTES = 262144  # the end of the job's log read for refused writes
OUTCOME_RETRY_S = 1800.0
OUTCOME_RETRY_FIRST_S = 0.25
OUTCOME_RETRY_MAX_WAIT_S = 5.0


class JobFinish:
    """Finishes one job: what the earlier phases made comes in (the driver, if Hermes was planned; the sandbox's
    writable folders; the folder's watch, if Hermes started; the private temporary folder). Nothing here may lose
    the outcome: every report is tried, and its failure is a line in the log."""

    def __init__(self, job: SupervisedJob, network: JobNetwork, run: HermesRun | None, writable: list[str],
                 folder: FolderWatch | None, private_tmp: Path | None) -> None:
        self.job, self.network, self.run = job, network, run
        self.writable, self.folder, self.private_tmp = writable, folder, private_tmp

    def finish(self, outcome: Outcome) -> None:
        job = self.job
        record, store = job.record, job.store
        exit_code = outcome.exit_code
        session_id: str | None = None
        self.network.close()
        if self.run is not None:
            try:
                self.run.cleanup()
                session_id, source = self.run.session(exit_code)
                record.session_source = source or record.session_source
                self.run.report(session_id)
            except Exception as exc:  # the outcome is written whatever the driver did
                job.note(f"could not tell the job's session: {exc}")
        if record.executor:
            outcome = self.finish_executor(outcome)
        record.change_state(outcome.state, outcome.reason, exit_code)
        record.session_id = session_id
        record.late_answers = [*record.late_answers, *store.answers_file(job.job_id)[1]][-LATE_ANSWERS_KEPT:]
        try:
            if self.writable:
                self.note_refusals(session_id)
                self.put_back_home()
                self.check_install()
            if record.worktree or record.guarded_repo:
                self.put_back_repository()
            if record.worktree:  # a worktree job's changes are git's to tell
                save_worktree_work(store, record)
            elif self.folder:
                record.changes = self.folder.changes()
            self.keep_usage(session_id)
        except Exception as exc:  # a report of the job, never a reason to lose its outcome
            job.note(f"could not list the changes, save the worktree's work or read the usage: {exc}")
        requested = record.session_requested
        if requested and session_id and session_id != requested:
            record.session_note = (f"asked to resume session {requested}, but Hermes reported session {session_id}: "
                                   "it started a fresh session or continued a compressed one under a new id")
        if not self.write_outcome():
            return  # the record still says running with a dead supervisor: readers report it orphaned
        for path in (store.cancel_path(job.job_id), store.answers_path(job.job_id),
                     store.steers_path(job.job_id), store.active / job.job_id):
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)
        if self.private_tmp is not None:
            shutil.rmtree(self.private_tmp, ignore_errors=True)
        audit(job.cfg, event="job", job_id=job.job_id, state=outcome.state.value, exit_code=exit_code,
              reason=outcome.reason)
        start_queued(job.cfg, store)  # the slot is free: the oldest queued job starts, server or not

    def finish_executor(self, outcome: Outcome) -> Outcome:
        """A docker job's containers removed, however it ended; an ssh job's work brought back from the host into
        its local worktree (the host lost: the job is an error naming it, and the worktree keeps its start)."""
        job = self.job
        record = job.record
        executor = Executor.of_record(cast(dict[str, Any], record.executor))
        if executor.kind == "docker":
            record.executor_report = remove_job_containers(executor, job.store.root, job.job_id)
            return outcome
        if self.private_tmp is not None:
            unlink_short_tmp(self.private_tmp, job.job_id, job.store.root)
        worktree = record.worktree
        if not worktree or "remote" not in worktree:
            return outcome
        if job.fetching is not None:  # stopped before the last fetch: two fetches would race for the ref
            stop, fetcher = job.fetching
            stop.set()
            fetcher.join(GIT_TIMEOUT_S + CHECK_TIMEOUT_S)
        objects = object_environment(str(job.store.worktree_objects_path(worktree.get("job", job.job_id))),
                                     worktree["repo"])
        local_git = worktree_git(worktree)
        try:
            commit = carry_back(executor, worktree, local_git, objects, job.job_id)
        except GitFailed as exc:
            kept = "the branch keeps the job's start"
            with contextlib.suppress(GitFailed):
                if so_far := fetched_so_far(worktree, local_git, objects, job.job_id):
                    keep_what_came(worktree, local_git, objects, job.job_id, so_far)
                    kept = f"the branch keeps what came back while it ran ({so_far[:12]})"
            record.executor_report = f"the work did not all come back from {executor.host}: {exc}; {kept}"
            if outcome.state != JobState.OK:
                return outcome
            return Outcome(JobState.ERROR, outcome.exit_code, f"the host {executor.host} was lost before the job's "
                           f"work came back ({exc}); {kept}")
        remove_remote_worktree(executor, worktree)
        record.executor_report = (f"the job's branch came back from {executor.host} at {commit[:12]} (its remote "
                                  "worktree removed)")
        return outcome

    def write_outcome(self) -> bool:
        """The outcome, written once the disk takes it: a full or read-only jobs folder is waited out with
        back-off for OUTCOME_RETRY_S, writing nothing else to it meanwhile, and the record then says what
        delayed it. False when it never could (or another writer's outcome stands)."""
        first_failure: tuple[float, str] | None = None
        wait_s = OUTCOME_RETRY_FIRST_S
        give_up = time.monotonic() + OUTCOME_RETRY_S
        record = self.job.record
        while True:
            if first_failure:
                record.outcome_note = (f"written {time.monotonic() - first_failure[0]:.0f} s after the job ended: "
                                       f"the jobs folder refused writes until then ({first_failure[1]})")
            try:
                self.job.store.write(record)
                return True
            except (OSError, DamagedRecord) as exc:
                first_failure = first_failure or (time.monotonic(), disk_error(exc))
            if time.monotonic() >= give_up:
                return False
            time.sleep(wait_s)
            wait_s = min(wait_s * 2, OUTCOME_RETRY_MAX_WAIT_S)

    def note_refusals(self, session_id: str | None) -> None:
        """What the sandbox refused, as the job's tools reported them (their results in Hermes' store, and the
        job's log), outside what the job may write: SANDBOX_DENIED, reads of the keys it keeps apart."""
        texts = [clean_text(read_tail(self.job.store.log_path(self.job.job_id), REFUSAL_LOG_BYTES)[0])]
        since = self.job.record.started_at
        if session_id and since is not None:
            with contextlib.suppress(StoreUnavailable):
                texts += read_store(self.job.cfg, lambda db: refusal_texts(db, session_id, since))
        refused = refused_paths(texts, self.writable, REFUSED_PATHS_KEPT)
        unreadable = job_unreadable(self.job.cfg, self.writable, self.run.exe if self.run else "")
        self.job.record.sandbox_unread = [path for path in refused
                                          if within_any(path, unreadable) or path.startswith("/proc/")]
        self.job.record.sandbox_refused = [path for path in refused if path not in self.job.record.sandbox_unread]

    def put_back_home(self) -> None:
        """What the sandboxed job changed of Hermes' settings put back, reported and audited."""
        notes = restore_home(self.job.store, self.job.job_id)
        for note in notes:
            self.job.note(f"Hermes' home: {note}")
        if notes:
            self.job.record.hermes_home = notes[-GUARD_NOTES_KEPT:]
            audit(self.job.cfg, event="hermes_home", job_id=self.job.job_id, changed=notes)

    def check_install(self) -> None:
        """Hermes' install, where the job could write it: changed, it is said, and no job starts from it until it
        is reinstalled (drivers.install_change_refusal); it cannot be put back."""
        if self.job.install_kept is None:
            return
        install, before = self.job.install_kept
        after = install_fingerprint(install)
        if after == before:
            return
        note = (f"Hermes' install {shown(install)} was CHANGED by this job (no mount namespace held it read-only "
                "here): no job starts from it until Hermes is reinstalled")
        self.job.note(note)
        self.job.record.hermes_home = [*(self.job.record.hermes_home or []), note][-GUARD_NOTES_KEPT:]
        with contextlib.suppress(OSError):
            write_atomic(install_changed_path(self.job.store), json.dumps(
                {"job_id": self.job.job_id, "install": install, "fingerprint": after}).encode())
        audit(self.job.cfg, event="hermes_install", job_id=self.job.job_id, changed=install)

    def put_back_repository(self) -> None:
        """The job's repository put back as it was before Hermes started, what the job changed reported and
        audited: before the bridge's own git saves the work."""
        notes = check_repository(self.job.store, self.job.record, refs_too=True)
        for note in notes:
            self.job.note(f"repository: {note}")
        if notes:
            audit(self.job.cfg, event="repository", job_id=self.job.job_id, changed=notes)

    def keep_usage(self, session_id: str | None) -> None:
        """The session's counters, kept in the record for hermes_jobs and for when the store is gone."""
        if not session_id or self.run is None:
            return
        with contextlib.suppress(StoreUnavailable):
            usage = self.run.usage(session_id)
            if usage:
                self.job.record.usage = dataclasses.asdict(usage)
