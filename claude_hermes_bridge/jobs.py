"""[both] JobRecord (every field checked, every list bounded), JobStore (the jobs folder), ObservedJob (observe)."""
import dataclasses
import enum
import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import psutil

from .config import APPROVAL_MODES, DRIVER_NAMES, START_GRACE_S, Config
from .network import NETWORK_MODES
from .safe_io import (
    DamagedRecord,
    ProcessId,
    Refused,
    create_exclusive,
    is_number,
    is_whole_number,
    locked,
    machine_clock,
    proc_status,
    read_json,
    read_replaceable,
    running_process,
    shown,
    write_atomic,
)

JOB_ID_RE = re.compile(r"\d{8}-\d{6}-\d{1,6}")
RECORD_MAX_BYTES = 4 << 20  # a record holds the pids Hermes started; far below this
MAX_TASK_BYTES = 4 << 20


SESSION_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")  # a Hermes session id, as records hold it


class JobState(str, enum.Enum):
    """A job's state. A record holds the value; orphaned is never written, only observed."""

    QUEUED = "queued"  # accepted past max_running_jobs: no supervisor yet (job_queue starts it when a slot frees)
    STARTING = "starting"
    RUNNING = "running"
    OK = "ok"
    ERROR = "error"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"
    OVER_BUDGET = "over_budget"
    ORPHANED = "orphaned"


FINAL_STATES = frozenset({JobState.OK, JobState.ERROR, JobState.TIMEOUT, JobState.CANCELLED, JobState.OVER_BUDGET})
LIVE_STATES = frozenset({JobState.QUEUED, JobState.STARTING, JobState.RUNNING})
PART_DONE_STATES = frozenset({JobState.TIMEOUT, JobState.CANCELLED, JobState.OVER_BUDGET, JobState.ORPHANED})


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How a job ended, as the supervisor (or a cancel of an orphan) writes it."""

    state: JobState
    exit_code: int | None
    reason: str | None


# What a record keeps of its lists, so a live job's record never grows past what the store reads back
# (RECORD_MAX_BYTES): the questions waiting now, the newest decisions (with counts of all), the processes seen.
QUESTIONS_KEPT = 1000
QUESTIONS_MAX_BYTES = 1 << 20
DECISIONS_KEPT = 100
LATE_ANSWERS_KEPT = 20
REFUSED_PATHS_KEPT = 20  # paths the sandbox refused a write to, as the job's tools reported them
GUARD_NOTES_KEPT = 40  # what a job changed in its shared repository or in Hermes' settings, one note per path
ANSWERS_MAX_BYTES = 1 << 20
STEERS_KEPT = 20  # steers of one job: in its steer file and in its record
GUIDANCE_MAX_CHARS = 4000
STEER_WHEN = ("now", "next_turn")
# what became of a steer the supervisor took: sent to Hermes, taken or refused by Hermes, or not delivered
STEER_STATES = ("sent", "acknowledged", "refused", "not delivered")
STEER_TOO_LATE = "the job's turn had ended when it arrived"  # a steer relayed after the supervisor's last look
LATE_KEY = "late"  # the answers file's list of late answers, which the supervisor copies into the record
# allow_for_job: this question, and the same command (the exact text) asked again in this job, are allowed
ANSWER_DECISIONS = ("allow", "deny", "allow_for_job")
SESSION_OPTION = "allow_session"  # Hermes' "allow for this session" option, by its id
NETWORK_QUESTION_PREFIX = "net-"  # a question the job's proxy asks (a host to connect to), not one of Hermes'


def is_network_question(question: dict[str, Any]) -> bool:
    return str(question.get("id", "")).startswith(NETWORK_QUESTION_PREFIX)


ANSWERERS = {"user": "the user (elicitation)", "planner": "the planner (hermes_approve)",  # who answered, in words
             "view": "the user (job view)", "terminal": "the user (at the terminal, --try)",
             "host": "the host, declined without asking anyone (it answered at once)"}
TREE_KEPT = 20_000
CHANGED_LINES = 50
TEXT_FIELD_MAX_BYTES = 256 << 10  # Hermes' answer as the record keeps it, JSON-encoded


def is_text_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def is_text_fields(value: Any, names: tuple[str, ...]) -> bool:
    """A dict whose named fields are all text."""
    return isinstance(value, dict) and all(isinstance(value.get(name), str) for name in names)


def is_flat_dict(value: Any) -> bool:
    """A dict of text keys whose values are text or finite numbers (activity and spend as records keep them)."""
    return isinstance(value, dict) and all(isinstance(k, str) and (isinstance(x, str) or is_number(x))
                                           for k, x in value.items())


def is_late_answer(value: Any) -> bool:
    """An answer that came after its question was decided: its question's id, the decision, who, when."""
    return is_text_fields(value, ("id", "decision", "by")) and is_number(value.get("at"))


def is_network_mode(value: Any) -> bool:
    return value is None or value in NETWORK_MODES


def is_question(value: Any) -> bool:
    """A question Hermes waits on, as the supervisor keeps it: its id, what it asks, when it was asked and
    until when Hermes waits (wall clock for people, machine_clock for deciding)."""
    return (is_text_fields(value, ("id", "what")) and all(is_number(value.get(name)) for name in (
        "asked_at", "expires_at", "expires_clock")))


def fit_json(text: str, max_bytes: int) -> str:
    """The longest head of text whose JSON encoding (as records are written) takes at most max_bytes: a
    character can take six bytes there (\\u001b), so a count of characters bounds nothing."""
    if len(json.dumps(text, ensure_ascii=False).encode()) <= max_bytes:
        return text
    low, high = 0, len(text)
    while low < high:
        middle = (low + high + 1) // 2
        if len(json.dumps(text[:middle], ensure_ascii=False).encode()) <= max_bytes:
            low = middle
        else:
            high = middle - 1
    return text[:low]


def is_changes(value: Any) -> bool:
    """The changed files as compare_snapshots writes them, or a note saying why they were not tracked."""
    if not isinstance(value, dict):
        return False
    if "note" in value:
        return isinstance(value["note"], str)
    return (all(is_whole_number(value.get(count)) for count in ("created", "modified", "deleted", "more"))
            and is_text_list(value.get("lines")) and is_text_list(value.get("runs_later", [])))


def is_text(value: Any) -> bool:
    return isinstance(value, str)


def is_nonce(value: Any) -> bool:
    return isinstance(value, str) and re.fullmatch(r"[0-9a-f]{16,64}", value) is not None


def is_standby_marker(value: Any) -> bool:
    return isinstance(value, str) and re.fullmatch(r"standby:[0-9a-f]{32}", value) is not None


def is_steer_request(value: Any) -> bool:
    """A steer as the server writes it for the supervisor: its id, the guidance, when, who, at what time."""
    return (is_text_fields(value, ("id", "text", "when", "by")) and value["when"] in STEER_WHEN
            and len(value["text"]) <= GUIDANCE_MAX_CHARS and is_number(value.get("at")))


def is_steers(value: Any) -> bool:
    """The record's steers: each request with its state and, once Hermes answered, what it said."""
    return isinstance(value, list) and len(value) <= STEERS_KEPT and all(
        is_steer_request(steer) and steer.get("state") in STEER_STATES
        and isinstance(steer.get("hermes", ""), str) for steer in value)


def is_questions(value: Any) -> bool:
    return isinstance(value, list) and len(value) <= QUESTIONS_KEPT and all(is_question(q) for q in value)


def is_decisions(value: Any) -> bool:
    return isinstance(value, list) and len(value) <= DECISIONS_KEPT and all(
        is_text_fields(d, ("id", "what", "decision", "by")) for d in value)


def is_late_answers(value: Any) -> bool:
    return isinstance(value, list) and len(value) <= LATE_ANSWERS_KEPT and all(is_late_answer(a) for a in value)


def is_counts(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and is_whole_number(n) for k, n in value.items())


def is_numbers(value: Any) -> bool:
    return isinstance(value, dict) and all(is_number(x) for x in value.values())


def is_worktree(value: Any) -> bool:
    return is_flat_dict(value) and is_text_fields(value, ("repo", "path", "branch", "base"))


def is_refused_paths(value: Any) -> bool:
    return is_text_list(value) and len(value) <= REFUSED_PATHS_KEPT


def is_guard_notes(value: Any) -> bool:
    return is_text_list(value) and len(value) <= GUARD_NOTES_KEPT


def is_diff(value: Any) -> bool:
    return (is_flat_dict(value) and isinstance(value.get("patch"), str)
            and all(is_whole_number(value.get(n)) for n in ("files", "insertions", "deletions", "patch_bytes")))


def is_landed(value: Any) -> bool:
    return is_flat_dict(value) and is_text_fields(value, ("action", "how"))


def is_executor(value: Any) -> bool:
    return is_flat_dict(value) and is_text_fields(value, ("name", "kind"))


def is_driver(value: Any) -> bool:
    return value in DRIVER_NAMES


def is_approval_mode(value: Any) -> bool:
    return value in APPROVAL_MODES


def checked(check: Callable[[Any], bool], default: Any = None, factory: Callable[[], Any] | None = None) -> Any:
    """A record field declared with what it may hold on disk (bool is never a number here): from_json checks
    every field by it, and a field declared without one cannot be read (RECORD_FIELD_CHECKS fails at import)."""
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata={"check": check})
    return dataclasses.field(default=default, metadata={"check": check})


# Written by every launch, even when empty; the other fields appear once they are known.
RECORD_ALWAYS_WRITTEN = ("id", "state", "created_at", "task_preview", "cwd",
                         "session_requested", "skills", "toolsets", "max_turns", "timeout_s", "dedupe_key",
                         "supervisor", "hermes", "exit_code", "session_id", "reason", "log", "driver", "approval_mode",
                         "created_clock", "network_mode")


@dataclasses.dataclass
class JobRecord:
    """A job's record, <id>.json: what was asked, who runs it, how it ended. The fields are the JSON keys.

    Hermes' shell can write the jobs folder, so from_json checks every field and raises DamagedRecord;
    nothing read from a record is trusted further than its type (pids are proven before any signal)."""

    id: str
    state: JobState = JobState.STARTING
    created_at: float = checked(is_number, 0.0)
    task_preview: str = checked(is_text, "")
    cwd: str | None = checked(is_text)
    session_requested: str | None = checked(is_text)
    skills: list[str] = checked(is_text_list, factory=list)
    toolsets: list[str] = checked(is_text_list, factory=list)
    max_turns: int | None = checked(is_whole_number)
    timeout_s: float = checked(is_number, 0.0)
    dedupe_key: str | None = checked(is_text)
    supervisor: ProcessId | None = None
    hermes: ProcessId | None = None
    exit_code: int | None = checked(is_whole_number)
    session_id: str | None = checked(is_text)
    reason: str | None = checked(is_text)
    log: str | None = checked(is_text)
    cwd_note: str | None = checked(is_text)
    started_at: float | None = checked(is_number)
    ended_at: float | None = checked(is_number)
    argv: list[str] | None = checked(is_text_list)
    tree: list[ProcessId] = dataclasses.field(default_factory=list)  # every descendant of Hermes seen
    changes: dict[str, Any] | None = checked(is_changes)
    usage: dict[str, Any] | None = checked(is_numbers)
    session_source: str | None = checked(is_text)
    session_note: str | None = checked(is_text)
    nonce: str | None = checked(is_nonce)  # makes the process marker unique machine-wide (see marker)
    driver: str | None = checked(is_driver)  # cli or acp (older records: cli)
    approval_mode: str | None = checked(is_approval_mode)  # deny, ask or yolo, as the job was started with
    acp: dict[str, Any] | None = checked(is_flat_dict)  # the job's activity from Hermes' ACP events
    questions: list[dict[str, Any]] = checked(is_questions, factory=list)  # Hermes' questions waiting now
    decisions: list[dict[str, Any]] = checked(is_decisions, factory=list)  # the newest DECISIONS_KEPT decided
    decided: dict[str, int] | None = checked(is_counts)  # how many questions were decided each way, all told
    created_clock: float | None = checked(is_number)  # machine_clock() at the launch, at Hermes' start, at
    # the last heartbeat
    started_clock: float | None = checked(is_number)
    heartbeat: float | None = checked(is_number)
    duration_s: float | None = checked(is_number)  # Hermes' run as the supervisor timed it (monotonic)
    outcome_note: str | None = checked(is_text)  # what delayed writing the outcome (a full or read-only disk)
    swept: str | None = checked(is_text)  # what the supervisor stopped after Hermes had exited
    late_answers: list[dict[str, Any]] = checked(is_late_answers, factory=list)  # refused: the question was decided
    max_tokens: int | None = checked(is_whole_number)  # the job's budgets, enforced by its supervisor for both drivers
    max_cost_usd: float | None = checked(is_number)
    spend: dict[str, Any] | None = checked(is_flat_dict)  # what this job spent, from Hermes' store (session_spend)
    spend_base: dict[str, Any] | None = checked(is_numbers)  # a resumed session's counters when the job started
    worktree: dict[str, Any] | None = checked(is_worktree)  # a worktree job's: repo, path, branch, base
    diff: dict[str, Any] | None = checked(is_diff)  # a worktree job's work against its base: counts and the patch file
    landed: dict[str, Any] | None = checked(is_landed)  # what hermes_land did with the work: action, how, at
    repository: list[str] = checked(is_guard_notes, factory=list)  # what the job changed in its shared repository
    sandbox: str | None = checked(is_text)  # what the operating system confined the job to, or why nothing
    sandbox_refused: list[str] = checked(is_refused_paths, factory=list)  # SANDBOX_DENIED: writes
    sandbox_unread: list[str] = checked(is_refused_paths, factory=list)  # SANDBOX_DENIED: keys and credentials
    network_mode: str | None = checked(is_network_mode)  # as the job was started with (None: an older bridge's)
    network: str | None = checked(is_text)  # what the job may reach over the network, and what was refused
    dequeued_at: float | None = checked(is_number)  # a queued job's start: when a slot freed (wall clock)
    dequeued_clock: float | None = checked(is_number)  # and on machine_clock, from which its start grace counts
    guarded_repo: str | None = checked(is_text)  # the repository a job without a worktree works in, kept as it was
    read_only: str | None = checked(is_text)  # what the job's mount namespace held read-only, in words
    hermes_home: list[str] = checked(is_guard_notes, factory=list)  # what a sandboxed job changed of Hermes' settings
    standby_marker: str | None = checked(is_standby_marker)  # a warm job's: the marker its standby gave Hermes
    start: str | None = checked(is_text)  # warm, or cold and why: how Hermes came to the job
    prompt_sent_at: float | None = checked(is_number)  # when the task reached Hermes (ACP: session/prompt sent)
    steers: list[dict[str, Any]] = checked(is_steers, factory=list)  # guidance sent while it ran (hermes_steer)
    executor: dict[str, Any] | None = checked(is_executor)  # where its commands ran (config.Executor); None: here
    executor_report: str | None = checked(is_text)  # what became of its container, or what came back from the host

    def add_decision(self, decision: dict[str, Any]) -> None:
        """A question decided: counted, and kept among the newest DECISIONS_KEPT."""
        self.decisions = [*self.decisions, decision][-DECISIONS_KEPT:]
        counts = dict(self.decided or {})
        counts[decision["decision"]] = counts.get(decision["decision"], 0) + 1
        self.decided = counts

    @property
    def marker(self) -> str:
        """The value of JOB_MARKER in this job's processes: the id alone would be shared by a job of the same
        id in another jobs folder (another install, another test run), and a stop would kill both."""
        if self.standby_marker:  # given before the job existed: random, so as unique as id and nonce
            return self.standby_marker
        return f"{self.id}:{self.nonce}" if self.nonce else self.id

    @classmethod
    def from_json(cls, data: Any, job_id: str) -> "JobRecord":
        if not isinstance(data, dict) or data.get("id") != job_id or not isinstance(data.get("state"), str):
            raise DamagedRecord("not a job record (wrong shape)")
        try:
            state = JobState(data["state"])
        except ValueError:
            raise DamagedRecord(f"state {shown(data['state'], 40)} is not a job state") from None
        fields: dict[str, Any] = {}
        for name, check in RECORD_FIELD_CHECKS.items():
            value = data.get(name)
            if value is not None and not check(value):
                raise DamagedRecord(f"field {name} has the wrong type")
            if value is not None:
                fields[name] = value
        for name in ("supervisor", "hermes"):
            if data.get(name) is not None:
                fields[name] = ProcessId.from_json(data[name])
        tree = data.get("tree") or []
        if not isinstance(tree, list):
            raise DamagedRecord("field tree has the wrong type")
        return cls(id=job_id, state=state, tree=[ProcessId.from_pair(entry) for entry in tree], **fields)

    def change_state(self, state: JobState, reason: str | None = None, exit_code: int | None = None) -> None:
        """Every change of a record's state goes through here (as supervisord's change_state): an ending
        stamps its time, with the reason and the exit code it ended with."""
        self.state = state
        if state in FINAL_STATES:
            self.ended_at, self.reason, self.exit_code = time.time(), reason, exit_code

    def encoded(self) -> bytes:
        """The record as written to disk: refused (DamagedRecord) when the store could not read it back."""
        data = self.to_json()
        encoded = json.dumps(data, indent=1, ensure_ascii=False).encode()
        if len(encoded) > RECORD_MAX_BYTES:
            raise DamagedRecord(f"the record would be {len(encoded):,} bytes, more than the {RECORD_MAX_BYTES:,} the "
                                "store reads")
        JobRecord.from_json(json.loads(encoded), self.id)
        return encoded

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name not in RECORD_ALWAYS_WRITTEN and value in (None, []):
                continue
            if isinstance(value, ProcessId):
                value = value.to_json()
            elif field.name == "tree":
                value = [process_id.to_pair() for process_id in value]
            elif isinstance(value, JobState):
                value = value.value
            data[field.name] = value
        return data


# Parsed by from_json itself: the id and state it is read under, and the process identities.
RECORD_PARSED = ("id", "state", "supervisor", "hermes", "tree")
RECORD_FIELD_CHECKS: dict[str, Callable[[Any], bool]] = {
    field.name: field.metadata["check"] for field in dataclasses.fields(JobRecord) if field.name not in RECORD_PARSED}


def write_record(store: "JobStore", record: JobRecord) -> None:
    """A record written, for a caller that needs no answer (a driver saving its job's activity)."""
    store.write(record)


def validate_job_id(job_id: Any) -> str:
    if not isinstance(job_id, str) or not JOB_ID_RE.fullmatch(job_id):
        raise Refused(f"job_id {shown(job_id, 60)} is not a job id: ids look like 20261106-101500-1 (see hermes_jobs)")
    return job_id


def job_sort_key(job_id: str) -> tuple[str, int]:
    stamp, _, counter = job_id.rpartition("-")
    return stamp, int(counter)


RECORD_LOCK_S = 15.0  # a deadline for a stuck holder; ten writers queued on a loaded machine stay well within it


class JobStore:
    """The jobs folder: <id>.json record, <id>.log output, <id>.task text, active/<id> while unfinished."""

    def __init__(self, root: Path):
        self.root = root
        self.active = root / "active"
        self.locks = root / "locks"

    @classmethod
    def of(cls, cfg: Config) -> "JobStore":
        """The jobs folder a config names (a JobStore is only its paths: cheap to make)."""
        return cls(cfg.jobs_path)

    def observed_jobs(self, job_ids: Iterable[str]) -> Iterator[tuple[str, "ObservedJob | None", str]]:
        """Each job as observed now, in the order given; a record that cannot be trusted comes as None with
        the reason (a job can write the jobs folder: a listing shows it as damaged, never fails on it)."""
        for job_id in job_ids:
            try:
                yield job_id, observe(self.read(job_id), self.root), ""
            except (Refused, DamagedRecord) as exc:
                yield job_id, None, str(exc)

    def ensure(self) -> None:
        self.active.mkdir(parents=True, exist_ok=True)
        self.locks.mkdir(exist_ok=True)

    def record_path(self, job_id: str) -> Path:
        return self.root / f"{job_id}.json"

    def log_path(self, job_id: str) -> Path:
        return self.root / f"{job_id}.log"

    def task_path(self, job_id: str) -> Path:
        return self.root / f"{job_id}.task"

    def cancel_path(self, job_id: str) -> Path:
        return self.root / f"{job_id}.cancel"

    def patch_path(self, job_id: str) -> Path:
        """A worktree job's whole change against its base, as a binary patch."""
        return self.root / f"{job_id}.patch"

    def repository_snapshot_path(self, job_id: str) -> Path:
        """A worktree job's shared repository as it was before Hermes started: config, hooks, refs."""
        return self.root / f"{job_id}.repository"

    def policy_path(self, owner: str) -> Path:
        """The managed policy Hermes is started with for a job (owner: its id) or a standby (its pid and a random
        part), outside what a sandboxed job may write."""
        return self.root / "policies" / owner

    def repository_changes_path(self, job_id: str) -> Path:
        """The job's versions of what it changed in its repository's git folder (put back since)."""
        return self.root / f"{job_id}.repository-changes"

    def home_snapshot_path(self, job_id: str) -> Path:
        """A sandboxed job's guarded part of Hermes' home as it was before Hermes started."""
        return self.root / f"{job_id}.hermes-home"

    def home_changes_path(self, job_id: str) -> Path:
        """The job's versions of what it changed in the guarded part of Hermes' home (put back since)."""
        return self.root / f"{job_id}.hermes-home-changes"

    def worktree_path(self, job_id: str) -> Path:
        """Where a worktree job's worktree is made: in the jobs folder, outside every repository."""
        return self.root / "worktrees" / job_id

    def worktree_objects_path(self, job_id: str) -> Path:
        """A worktree job's own object folder: its commits are written here, the repository's objects are read
        as an alternate, and the bridge brings its work into the repository through git, which hashes it."""
        return self.root / "worktree-objects" / job_id

    def answers_path(self, job_id: str) -> Path:
        """The answers to the questions a job waits on, {approval id: {decision, by, at}}: each claimed once,
        under the record's lock (claim_answer), and read by the job's supervisor."""
        return self.root / f"{job_id}.answers"

    def steers_path(self, job_id: str) -> Path:
        """The guidance for a running job, [{id, text, when, by, at}], written by the server under the record's
        lock (request_steer) and read by the job's supervisor, which sends each to Hermes once."""
        return self.root / f"{job_id}.steer"

    def steers_file(self, job_id: str) -> list[dict[str, Any]]:
        """The steer file's requests of the right shape (a job can write the file)."""
        found = read_json(self.steers_path(job_id), ANSWERS_MAX_BYTES)
        return [steer for steer in found if is_steer_request(steer)][:STEERS_KEPT] if isinstance(found, list) else []

    def answers_file(self, job_id: str) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
        """The answers file in one read: the answers claimed for a job's questions, and the answers that came
        after their question was decided; entries of the right shape only (a job can write the file)."""
        found = read_json(self.answers_path(job_id), ANSWERS_MAX_BYTES)
        if not isinstance(found, dict):
            return {}, []
        late = found.get(LATE_KEY)
        return ({key: value for key, value in found.items() if isinstance(value, dict)
                 and value.get("decision") in ANSWER_DECISIONS and isinstance(value.get("by"), str)},
                [a for a in late if is_late_answer(a)][-LATE_ANSWERS_KEPT:] if isinstance(late, list) else [])

    @property
    def detach_path(self) -> Path:
        """Whether jobs outlive the host, as the last launch found it (Windows job objects may forbid it)."""
        return self.root / "detach.json"

    def claim_id(self, task: bytes) -> str:
        """A new id, claimed by creating its task file and its log exclusively, so two processes never share
        one. Ids are predictable, so a job may have planted a FIFO, a symlink or a file at a future id's
        names: such an id is skipped for the next, and nothing planted is ever opened or followed. An id never
        sorts before one already on disk, though the clock stepped back; a claim the disk refused leaves
        nothing behind."""
        self.ensure()
        now = time.strftime("%Y%m%d-%H%M%S", time.localtime(time.time()))
        ahead = time.strftime("%Y%m%d-%H%M%S", time.localtime(time.time() + 86400))
        newest = [job_id.rpartition("-")[0] for job_id in self.list_ids()[-1:]]
        stamp = max(now, newest[0]) if newest and newest[0] <= ahead else now  # a far-future name is planted
        for counter in range(1, 1_000_000):
            job_id = f"{stamp}-{counter}"
            if any(os.path.lexists(path) for path in (self.record_path(job_id), self.cancel_path(job_id),
                                                      self.answers_path(job_id), self.steers_path(job_id))):
                continue
            try:
                task_fd = create_exclusive(self.task_path(job_id))
            except FileExistsError:
                continue
            try:
                os.close(create_exclusive(self.log_path(job_id)))
            except FileExistsError:
                os.close(task_fd)
                self.task_path(job_id).unlink(missing_ok=True)
                continue
            except OSError:
                os.close(task_fd)
                self.task_path(job_id).unlink(missing_ok=True)
                raise
            try:
                with open(task_fd, "wb") as handle:
                    handle.write(task)
            except OSError:
                self.task_path(job_id).unlink(missing_ok=True)
                self.log_path(job_id).unlink(missing_ok=True)
                raise
            return job_id
        raise Refused("no free job id this second; try again")

    def record_lock(self, job_id: str) -> Any:
        return locked(self.locks / f"{job_id}.lock", RECORD_LOCK_S)

    def write(self, record: JobRecord) -> bool:
        """Write the record whole, unless the disk already holds an outcome: an outcome is final, so a
        cancel that took a job for an orphan never replaces what its supervisor has just written (checked
        under the record's lock). False when the record was left as it was."""
        with self.record_lock(record.id):
            try:
                if self.read(record.id).state in FINAL_STATES:
                    return False
            except (Refused, DamagedRecord):
                pass
            write_atomic(self.record_path(record.id), record.encoded())
            return True

    def update(self, job_id: str, change: Callable[[JobRecord], None], final_too: bool = False) -> JobRecord | None:
        """Read, change and write a record under its lock, so a write from another process in between is
        never lost (a launcher noting its supervisor while that supervisor writes). None when the record holds
        an outcome already (unless final_too: what became of a finished job's worktree), or is damaged: it is
        then left as it is."""
        with self.record_lock(job_id):
            try:
                record = self.read(job_id)
            except DamagedRecord:
                return None
            if record.state in FINAL_STATES and not final_too:
                return None
            change(record)
            write_atomic(self.record_path(job_id), record.encoded())
            return record

    def read(self, job_id: str) -> JobRecord:
        try:
            data = read_replaceable(self.record_path(job_id), RECORD_MAX_BYTES)
        except FileNotFoundError:
            raise Refused(f"no job {job_id} in {self.root} (it may have been pruned; see hermes_jobs)") from None
        except OSError as exc:
            raise DamagedRecord(f"unreadable: {exc.strerror or exc}") from None
        try:
            return JobRecord.from_json(json.loads(data), job_id)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise DamagedRecord(f"not JSON ({len(data)} bytes)") from None

    def list_ids(self) -> list[str]:
        """Every job id on disk, oldest first, without opening a record."""
        try:
            with os.scandir(self.root) as entries:
                ids = [e.name[:-5] for e in entries if e.name.endswith(".json") and JOB_ID_RE.fullmatch(e.name[:-5])]
        except OSError:  # no folder yet, or not a folder: hermes_health names the problem
            return []
        return sorted(ids, key=job_sort_key)

    def active_ids(self) -> list[str]:
        try:
            with os.scandir(self.active) as entries:
                return sorted((e.name for e in entries if JOB_ID_RE.fullmatch(e.name)), key=job_sort_key)
        except OSError:
            return []

    def mark_active(self, job_id: str) -> None:
        write_atomic(self.active / job_id, b"")

    def clear_active(self, job_id: str) -> None:
        (self.active / job_id).unlink(missing_ok=True)

    def remove(self, job_id: str) -> None:
        """The record goes last: a log still held open (Windows) leaves the job listed, to be pruned later,
        instead of a log without a record left behind for ever. Folders a killed supervisor could not remove
        (the job's private temporary folder, its managed policy) go too."""
        for folder in (self.home_changes_path(job_id), self.repository_changes_path(job_id),
                       self.root / "tmp" / job_id, self.policy_path(job_id)):
            shutil.rmtree(folder, ignore_errors=True)
        for path in (self.log_path(job_id), self.task_path(job_id), self.cancel_path(job_id),
                     self.answers_path(job_id), self.steers_path(job_id), self.patch_path(job_id),
                     self.repository_snapshot_path(job_id),
                     self.home_snapshot_path(job_id), self.locks / f"{job_id}.lock",
                     self.record_path(job_id)):
            path.unlink(missing_ok=True)

    def captured_sessions(self, scan_limit: int = 5000) -> Iterator[str]:
        """Session ids captured by jobs of this bridge, newest first, each once; bounded by scan_limit."""
        for _, session_id in self._captures(scan_limit):
            yield session_id

    def captured_by(self, session_id: str, scan_limit: int = 5000) -> Iterator[JobRecord]:
        """The bridge's jobs that captured this session, newest first; bounded by scan_limit."""
        return (record for record, sid in self._captures(scan_limit) if sid == session_id)

    def _captures(self, scan_limit: int) -> Iterator[tuple[JobRecord, str]]:
        seen: set[str] = set()
        for job_id in reversed(self.list_ids()[-scan_limit:]):
            try:
                record = self.read(job_id)
            except (Refused, DamagedRecord):
                continue
            session_id = record.session_id
            if session_id and SESSION_NAME_RE.fullmatch(session_id) and session_id not in seen and record.cwd:
                seen.add(session_id)
                yield record, session_id


HEARTBEAT_S = 5.0  # how often a supervisor stamps its record while it watches a job
HEARTBEAT_STALE_S = 30.0  # a live supervisor silent for longer is not watching its job
DISK_FULL_BYTES = 1 << 20


def disk_problem(folder: Path) -> str | None:
    """Why this folder's disk refuses writes, read without writing: full (free space, as a zero-byte write
    would still succeed), or read-only. None when it takes writes, or cannot be asked."""
    import shutil

    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return None
    if free < DISK_FULL_BYTES:
        return f"the disk of {folder} is full ({free:,} bytes free)"
    if hasattr(os, "statvfs") and os.statvfs(folder).f_flag & getattr(os, "ST_RDONLY", 1):
        return f"{folder} is on a read-only file system"
    if not os.access(folder, os.W_OK):
        return f"{folder} is not writable"
    return None


@dataclasses.dataclass
class ObservedJob:
    """A record plus what the disk and the process table say about it now. condition says what a live
    supervisor's job is doing beyond running: frozen, silent, or over with its outcome not written yet."""

    record: JobRecord
    state: JobState
    reason: str | None = None
    condition: str | None = None
    frozen: bool = False

    @property
    def running(self) -> bool:
        return self.state in LIVE_STATES

    @property
    def pending_questions(self) -> list[dict[str, Any]]:
        """The questions Hermes waits on, oldest first, while it still waits."""
        if not self.running:
            return []
        now = machine_clock()
        return [question for question in self.record.questions if now < question["expires_clock"]]

    @property
    def shown_state(self) -> str:
        """What a status block and a listing say: starting is shown as running, a question as needs_approval."""
        if self.pending_questions:
            return "needs_approval"
        if self.state is JobState.QUEUED:
            return JobState.QUEUED.value
        return JobState.RUNNING.value if self.running else self.state.value


def observe(record: JobRecord, jobs_folder: Path | None = None) -> ObservedJob:
    """The job's state as a reader should report it: a dead supervisor without an outcome is orphaned; a live
    one may be frozen, silent, or done with Hermes and waiting to write the outcome (jobs_folder: whose disk
    to ask why)."""
    if record.state in FINAL_STATES:
        return ObservedJob(record, record.state, record.reason)
    if record.state is JobState.QUEUED:  # no supervisor until a slot frees: waiting, not orphaned
        return ObservedJob(record, JobState.QUEUED)
    live = JobState.RUNNING if record.state is JobState.RUNNING else JobState.STARTING
    if supervisor := running_process(record.supervisor):
        condition, frozen = supervisor_condition(record, supervisor, jobs_folder)
        return ObservedJob(record, live, condition=condition, frozen=frozen)
    launched = record.dequeued_clock or record.created_clock
    age = machine_clock() - launched if launched is not None else time.time() - record.created_at
    if record.supervisor is None and age < START_GRACE_S:
        return ObservedJob(record, JobState.STARTING)
    hermes = running_process(record.hermes)
    hermes_note = (f"Hermes (pid {hermes.pid}) is still running; hermes_cancel stops it" if hermes
                   else "Hermes is not running")
    return ObservedJob(record, JobState.ORPHANED, f"the job's supervisor is gone and wrote no outcome; {hermes_note}. "
                   "Inspect the log and the files before re-running.")


def supervisor_condition(record: JobRecord, supervisor: "psutil.Process",
                         jobs_folder: Path | None) -> tuple[str | None, bool]:
    """What a live supervisor's job is doing beyond running, and whether the supervisor is frozen."""
    if proc_status(supervisor) == psutil.STATUS_STOPPED:
        return (f"the job's supervisor (pid {supervisor.pid}) is frozen (stopped by a signal): nothing watches the "
                "job, enforces its timeout or writes its outcome. hermes_cancel ends it", True)
    disk = disk_problem(jobs_folder) if jobs_folder is not None else None
    hermes_over = record.hermes is not None and running_process(record.hermes) is None
    if hermes_over:
        return ("Hermes has exited: the job is over. " + (f"Its outcome waits for the disk ({disk}); the supervisor "
                "writes it as soon as the disk takes it" if disk else "The supervisor is writing its outcome"), False)
    if disk:
        return f"the jobs folder refuses writes ({disk}); the supervisor waits for the disk", False
    silent = machine_clock() - record.heartbeat if record.heartbeat is not None else 0.0
    if silent > HEARTBEAT_STALE_S:
        return (f"the job's supervisor (pid {supervisor.pid}) has not stamped its record for {int(silent)} s: it may "
                "be stuck. hermes_cancel ends it", False)
    return None, False
