"""[server] hermes_steer: guidance for a running ACP job, relayed to its supervisor through the jobs folder (the
job's steer file, written under the record's lock), which sends it to Hermes on the job's own connection."""
import json
import os
import secrets
import stat
import time
from typing import Any

from .config import Config, audit
from .jobs import (
    ANSWERERS,
    GUIDANCE_MAX_CHARS,
    STEER_TOO_LATE,
    STEER_WHEN,
    STEERS_KEPT,
    JobRecord,
    JobStore,
    ObservedJob,
)
from .render import steer_words
from .safe_io import DamagedRecord, LockTimeout, Refused, count_hiding, disk_error, shown, write_atomic
from .tools import observed_job

STEER_BY = {"planner": "the planner (hermes_steer)", "view": ANSWERERS["view"]}


def check_guidance(guidance: Any, when: Any) -> tuple[str, str]:
    """The guidance as data: text, not empty, bounded; newlines and tabs kept, other control characters not."""
    if when is None:
        when = "now"
    if when not in STEER_WHEN:
        raise Refused(f'when must be "now" or "next_turn", got {shown(when, 40)}')
    if not isinstance(guidance, str) or not guidance.strip():
        raise Refused("guidance is empty: say what Hermes should do differently, in words")
    if len(guidance) > GUIDANCE_MAX_CHARS:
        raise Refused(f"guidance is {len(guidance):,} characters; at most {GUIDANCE_MAX_CHARS:,} are sent to a "
                      "running job (put the details in a file and point Hermes at it)")
    if "\ufffd" in guidance or count_hiding(guidance, "\n\t"):
        raise Refused("guidance holds control or invisible characters; send plain text")
    return guidance.strip(), when


def request_steer(cfg: Config, job_id: Any, guidance: Any, when: Any, by: str) -> tuple[ObservedJob, dict[str, Any]]:
    """The steer claimed under the record's lock and written where the job's supervisor reads it: refused for a
    job that cannot take one now (ended, run by the CLI, waiting on a question). Returns the job and the steer."""
    text, when = check_guidance(guidance, when)
    observed = observed_job(cfg, job_id)
    record, store = observed.record, JobStore.of(cfg)
    steer_id = f"s{len(record.steers) + 1}-{secrets.token_hex(3)}"
    try:
        with store.record_lock(record.id):
            observed = observed_job(cfg, record.id)
            check_steerable(observed)
            steer = {"id": steer_id, "text": text, "when": when, "by": STEER_BY[by], "at": time.time()}
            add_steer(store, observed.record, steer)
    except LockTimeout:
        raise Refused(f"job {record.id}'s record is held by another process; steer again in a moment") from None
    except OSError as exc:
        raise Refused(f"the guidance could not be written: the jobs folder refuses writes ({disk_error(exc)})"
                      ) from None
    audit(cfg, event="steer", job_id=record.id, steer_id=steer_id, when=when, by=STEER_BY[by], guidance=text)
    return observed, steer


def check_steerable(observed: ObservedJob) -> None:
    record = observed.record
    if not observed.running:
        raise Refused(f"job {record.id} has ended ({observed.shown_state}): there is no turn to steer. Continue its "
                      f"session with hermes_resume(session_id=\"{record.session_id or 'latest'}\", task=<the "
                      "guidance>)")
    if record.driver != "acp":
        raise Refused(f"job {record.id} runs with the CLI driver, which has no channel to Hermes while it runs. "
                      "Cancel it (hermes_cancel) and continue its session with hermes_resume(session_id, task=<the "
                      "guidance>), or set hermes_driver to acp for later jobs")
    if observed.pending_questions:
        raise Refused(f"job {record.id} waits on Hermes' question (APPROVAL_ID {observed.pending_questions[0]['id']}): "
                      "answer it first (hermes_approve), then steer")
    if len(record.steers) >= STEERS_KEPT:
        raise Refused(f"job {record.id} was steered {STEERS_KEPT} times already; cancel it and start afresh")


def add_steer(store: JobStore, record: JobRecord, steer: dict[str, Any]) -> None:
    """Appended to the steer file (a planted non-file at its name is moved aside, as for answers)."""
    path = store.steers_path(record.id)
    if os.path.lexists(path) and not stat.S_ISREG(os.lstat(path).st_mode):
        os.replace(path, path.with_name(f".{path.name}.not-a-steer-{os.urandom(4).hex()}"))
    waiting = store.steers_file(record.id)
    if len(waiting) >= STEERS_KEPT:
        raise Refused(f"job {record.id} has {STEERS_KEPT} steers waiting already")
    write_atomic(path, json.dumps([*waiting, steer]).encode())


def steer_outcome(observed: ObservedJob, steer_id: str) -> tuple[bool, str]:
    """Whether the supervisor has settled the steer (sent and answered, or not delivered), and it in words."""
    steer = next((s for s in observed.record.steers if s["id"] == steer_id), None)
    if steer is None:
        if observed.running:
            return False, f"steer {steer_id}: relayed; the job's supervisor has not taken it yet"
        return True, f"steer {steer_id}: NOT delivered: the job ended as it was relayed"
    return steer["state"] != "sent", steer_words(steer)


def note_undelivered(store: JobStore, job_id: str, steer: dict[str, Any]) -> None:
    """A steer relayed as the job ended, after its supervisor's last look: kept in the record as not
    delivered, so no later block leaves it unsaid."""
    with store.record_lock(job_id):
        stored = store.read(job_id)
        if any(s["id"] == steer["id"] for s in stored.steers):
            return
        stored.steers = [*stored.steers, {**steer, "state": "not delivered", "hermes": STEER_TOO_LATE}][-STEERS_KEPT:]
        try:
            write_atomic(store.record_path(job_id), stored.encoded())
        except (OSError, DamagedRecord):
            return
