"""[supervisor] Supervisor: one detached process per job, from Hermes' start to the outcome in its record. It
holds the job through its three phases, each a module of its own: planning (job_planning), watching
(job_watching) and finishing (job_finishing)."""
import contextlib
import dataclasses
import os
import signal
import subprocess
import time
import traceback
from typing import Any

import psutil

from .config import Config, audit, load_config
from .drivers import HermesRun, LaunchPlan, ProcessStarter, WarmStart, driver_of, hermes_launch
from .folder_changes import FolderWatch
from .hermes_store import StoreUnavailable, read_store, session_spend
from .job_finishing import JobFinish
from .job_network import JobNetwork
from .job_planning import JobPlanner
from .job_watching import JobWatch
from .jobs import JobRecord, JobState, JobStore, Outcome, validate_job_id
from .processes import (
    Ownership,
    StopReport,
    WindowsJob,
    become_subreaper,
    held_in_job_object,
    started_process,
    stop_tree,
)
from .safe_io import IS_WINDOWS, DamagedRecord, ProcessId, disk_error, is_number, machine_clock, shown
from .supervised_job import SupervisedJob
from .worktrees import hooks_path_folder, object_environment

# `server.py --supervise <id>`: one detached process per job that owns it from start to outcome.


class Supervisor:
    """Owns one job from a detached process: plans it, starts Hermes with the record's driver, watches it
    (timeout, cancel, budgets), finishes it. Its collaborators come in (config, store, the process starter), so
    tests can drive the loop with a fake; the driver (DRIVERS) holds everything that differs between the ways to
    run Hermes.

    The outcome is never lost: a record write the disk refuses mid-run is kept and tried again on the next
    poll, and the outcome is retried with back-off (JobFinish.write_outcome), writing nothing else meanwhile."""

    def __init__(self, job_id: str, cfg: Config, store: JobStore, start_process: ProcessStarter | None = None,
                 subreaper: bool = False, warm: WarmStart | None = None):
        self.job = SupervisedJob(job_id, cfg, store)
        self.cfg, self.store, self.job_id = cfg, store, job_id
        self.warm = warm  # a standby's Hermes, started before the job (standby.py)
        self.start_process = start_process
        self.subreaper = subreaper  # orphans of the job's tools re-parent to this process (Linux)
        self.owner = Ownership(self.record.marker, frozenset({os.getpid()}))
        self.network = JobNetwork(cfg, store, self.record)
        self.planner = JobPlanner(self.job, self.network, warm)
        self.run_: HermesRun | None = None
        self.hermes: psutil.Process | None = None
        self.windows_job: WindowsJob | None = None
        self.watching: JobWatch | None = None

    @property
    def record(self) -> JobRecord:
        return self.job.record

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
            self.job.note("the job already has an outcome (cancelled as an orphan before this supervisor started); "
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

    def on_sigterm(self, _signum: int, _frame: Any) -> None:
        self.job.stop_signal = True

    def _run_hermes(self) -> Outcome:
        plan = self.planner.plan()
        if isinstance(plan, Outcome):
            return plan
        self.run_ = driver_of(self.record)(self.cfg, self.store, self.record, plan.argv[0], self.job.write_log,
                                           self.start_process, self.job.save)
        self.run_.terminal = self.planner.terminal
        proc, self.watching = self._start(plan, self.run_)
        return self.watching.watch(proc, self.run_)

    def _start(self, plan: LaunchPlan, run: HermesRun) -> tuple[subprocess.Popen[bytes], JobWatch]:
        """Start Hermes as planned, after the folder listing has begun, record who it is, and watch it."""
        record, cfg, planner = self.record, self.cfg, self.planner
        hooks = hooks_path_folder(record.guarded_repo, plan.folder) if record.guarded_repo else None
        folder = FolderWatch(plan.folder, cfg.changed_files_skip, cfg.changed_files_max_entries,
                             cfg.changed_files_max_s, hooks)
        record.argv = plan.shown_argv
        if record.session_requested:  # a resumed session's earlier spend is not this job's, budgeted or not
            with contextlib.suppress(StoreUnavailable):
                base = read_store(cfg, lambda db: session_spend(db, str(record.session_requested)))
                record.spend_base = {key: value for key, value in (base or {}).items() if is_number(value)}
        if self.warm:
            proc = run.adopt(plan, self.warm)
        else:
            argv, env = hermes_launch(cfg, plan.argv, record.marker, planner.writable, planner.private_tmp,
                                      self._git_environment(), self.network.proxy, self.network.enforced,
                                      planner.mounts, planner.cache, planner.also_ports)
            proc = run.start(dataclasses.replace(plan, argv=argv), env)
        if IS_WINDOWS:
            self.windows_job = self._job_object_for(proc)
        self.hermes = started_process(proc.pid)
        record.hermes = ProcessId.of_safe(self.hermes) if self.hermes else None
        if record.hermes is None:
            self.job.note(f"Hermes (pid {proc.pid}) had exited before its supervisor first looked at it")
        record.started_at, record.started_clock = time.time(), machine_clock()
        self.job.save()
        audit(cfg, event="job", job_id=self.job_id, state=JobState.RUNNING.value, hermes_pid=proc.pid,
              cwd=record.cwd, cli_flags=plan.cli_flags)
        return proc, JobWatch(self.job, self.hermes, self.owner, self.subreaper, self.windows_job, folder,
                              self.network)

    def _git_environment(self) -> dict[str, str]:
        """A worktree job's git writes objects to the job's own folder and reads the repository's (own_objects);
        a docker job's Hermes talks to its executor's daemon."""
        worktree = self.record.worktree
        if not worktree or "objects" not in worktree:
            return dict(self.planner.executor_env)
        return {**object_environment(worktree["objects"], worktree["repo"]), **self.planner.executor_env}

    def _job_object_for(self, proc: subprocess.Popen[bytes]) -> WindowsJob | None:
        """Hermes in a job object of its own (a warm Hermes was put in one when it started); without one (nested
        jobs refused) the tree walk still applies."""
        if self.warm:
            if self.warm.windows_job is None:
                self.job.note("no job object holds this warm Hermes; its tree is found through parent links only")
            return self.warm.windows_job
        try:
            return held_in_job_object(proc)
        except OSError as exc:
            self.job.note(f"no job object for Hermes ({exc}); its tree is found through parent links only")
            return None

    def _stop_everything(self) -> StopReport:
        """After a failure of the supervisor itself: Hermes and every process proven the job's, stopped."""
        try:
            return stop_tree(self.owner, self.hermes, self.record.tree, self.cfg.kill_grace_s, self.windows_job,
                             self.subreaper)
        except Exception:  # noqa: BLE001  (the outcome is written whatever the stop met)
            return StopReport(frozenset(), [self.hermes.pid] if self.hermes else [], [], False)

    def _finish(self, outcome: Outcome) -> None:
        JobFinish(self.job, self.network, self.run_, self.planner.writable,
                  self.watching.folder if self.watching else None, self.planner.private_tmp).finish(outcome)


def main(job_id: str) -> int:
    """The supervisor's program, `--supervise ID`: no argparse, no MCP."""
    cfg = load_config()
    supervisor = Supervisor(validate_job_id(job_id), cfg, JobStore.of(cfg), subreaper=become_subreaper())
    signal.signal(signal.SIGTERM, supervisor.on_sigterm)
    return supervisor.run()
