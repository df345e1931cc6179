"""[supervisor] The job as its supervisor holds it, shared by every phase of its life (planning, watching,
finishing): its record, written when the disk takes it, notes in its log, and whether a stop was asked."""
import contextlib
import sys
import threading

from .config import Config
from .jobs import JobStore
from .safe_io import DamagedRecord
from .worktrees import job_roots


class SupervisedJob:
    """One job's record and the ways its supervisor writes: a record write the disk refuses (full, read-only, a
    lock held) is kept and tried again at the next poll (unsaved), and a log line the disk refuses loses the line,
    never the job."""

    def __init__(self, job_id: str, cfg: Config, store: JobStore) -> None:
        self.job_id, self.cfg, self.store = job_id, cfg, store
        self.record = store.read(job_id)
        self.unsaved = False
        self.stop_signal = False  # SIGTERM arrived
        self.install_kept: tuple[str, str] | None = None  # Hermes' install and its fingerprint, where it was writable
        self.fetching: tuple[threading.Event, threading.Thread] | None = None  # an ssh job's fetching of its progress

    def note(self, text: str) -> None:
        self.write_log(f"[bridge] {text}\n")

    def write_log(self, text: str) -> None:
        """The job's log is this process's stderr (Hermes writes there too)."""
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.write(text)
            sys.stderr.flush()

    def save(self) -> None:
        try:
            self.store.write(self.record)
            self.unsaved = False
        except (OSError, DamagedRecord):
            self.unsaved = True

    def cancel_requested(self) -> bool:
        return self.stop_signal or self.store.cancel_path(self.job_id).exists()

    @property
    def roots(self) -> list[str]:
        return job_roots(self.cfg, self.record)
