"""[server] The status block the model reads: job_details, render_status, ToolResult."""
import contextlib
import dataclasses
import re
import time
from pathlib import Path
from typing import Any, cast

from .config import Config, Executor
from .executors import container_network
from .folder_changes import human_size, who_runs
from .hermes_cli import read_tail, retry_advice
from .hermes_store import (
    StoreUnavailable,
    Usage,
    current_tool,
    final_text,
    matched_session,
    read_store,
    session_usage,
)
from .job_queue import queue_words
from .jobs import (
    CHANGED_LINES,
    FINAL_STATES,
    PART_DONE_STATES,
    JobRecord,
    JobState,
    JobStore,
    ObservedJob,
    is_network_question,
)
from .safe_io import clean_str, clean_text, clock_words, is_number, machine_clock, plural, shown

RUNNING_TAIL_CHARS = 2000


# Hermes' own log lines (`2026-12-03 23:17:19 [INFO] agent.tool_executor: ...`): the log keeps them, the block does not
HERMES_LOG_LINE_RE = re.compile(rb"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)? \[(?:INFO|DEBUG)\] ")


def log_excerpt(path: Path, max_chars: int) -> str:
    """The end of a log for a person, bounded by max_chars: what Hermes said, its tools, warnings and errors, and
    the bridge's notes, without Hermes' own INFO and DEBUG log lines (FULL_LOG keeps them); saying how much was
    cut and how to read the rest."""
    raw_tail, size = read_tail(path, max_chars * 8)
    lines = raw_tail.split(b"\n")
    kept_lines = [line for line in lines if not HERMES_LOG_LINE_RE.match(line)]
    left_out = len(lines) - len(kept_lines)
    tail = b"\n".join(kept_lines)
    raw = tail.decode("utf-8", "replace")
    start = 0
    if len(clean_text(tail)) > max_chars:  # keep the longest end of the raw text whose clean form fits
        low, high = 0, len(raw)
        while low < high:
            middle = (low + high) // 2
            if len(clean_str(raw[middle:])) <= max_chars:
                high = middle
            else:
                low = middle + 1
        start = low
    text = clean_str(raw[start:])
    note = (f"[{plural(left_out, 'line')} of Hermes' own INFO log left out here; FULL_LOG has every line]\n"
            if left_out else "")
    kept_bytes = len(tail) if start == 0 else len(raw[start:].encode("utf-8", "replace"))
    hidden = size - len(raw_tail) + len(tail) - kept_bytes
    if hidden <= 0:
        return note + text if text or note else "(no output)"
    return (f"[cut: the first {hidden} of {size} bytes are not shown; read them with "
            f"hermes_read(path=\"{shown(str(path))}\", offset=0, max_bytes=...)]\n{note}...{text}")


def elapsed_s(record: JobRecord, running: bool) -> int:
    """How long Hermes has run (or ran): the supervisor's own monotonic measure once it ended, the shared
    machine clock while it runs; wall-clock differences only for records of older bridges."""
    if not running and record.duration_s is not None:
        return max(0, int(record.duration_s))
    if running and record.started_clock is not None:
        return max(0, int(machine_clock() - record.started_clock))
    if running and record.started_at is None and record.created_clock is not None:
        return max(0, int(machine_clock() - record.created_clock))
    start = record.started_at or record.created_at or time.time()
    end = record.ended_at or time.time()
    return max(0, int(end - start))


@dataclasses.dataclass
class JobDetails:
    """What Hermes' session store (and the record) say about a job beyond its state, for one status block."""

    activity: str | None = None
    current_tool: str | None = None
    usage: str | None = None
    final_text: str | None = None  # Hermes' last message to the user: the block's HERMES ANSWER

    def progress_line(self, job_id: str) -> str:
        tool = f"; {self.current_tool}" if self.current_tool and self.current_tool != "none yet" else ""
        return f"job {job_id} is running: {self.activity}{tool}"


def job_details(cfg: Config, observed: ObservedJob) -> JobDetails:
    """One short read of the session store: live counters and the current tool while the job runs; the
    usage and Hermes' final text when it has ended. Never raises: an unreadable store is 'unavailable'."""
    record = observed.record
    started = record.started_at
    if started is None:
        reason = ("unavailable: the job waits in the queue" if observed.state is JobState.QUEUED else
                  "unavailable: Hermes has not started yet" if observed.running else
                  "unavailable: Hermes never started")
        return JobDetails(activity=reason, usage=reason, final_text=reason)
    if record.acp is not None:
        return acp_details(record, observed.running)
    kept_usage = None
    if not observed.running and record.usage:
        with contextlib.suppress(TypeError):
            kept_usage = Usage(**record.usage).line()
    try:
        return read_store(cfg, lambda db: store_details(db, observed, started, kept_usage))
    except StoreUnavailable as exc:
        unavailable = f"unavailable: {exc}"
        return JobDetails(activity=unavailable, usage=kept_usage or unavailable, final_text=unavailable)


def store_details(db: Any, observed: ObservedJob, started: float, kept_usage: str | None) -> JobDetails:
    """The session store's part of job_details: live counters and the current tool of a running job, or the
    usage (the record's own copy first) and Hermes' final text of an ended one."""
    record = observed.record
    session = record.session_id or record.session_requested
    if not session and observed.running and record.cwd:
        session, why = matched_session(db, record.cwd, started)
        if not session:
            raise StoreUnavailable(why)
    if not session:
        raise StoreUnavailable(record.session_source or "no session was captured")
    usage = session_usage(db, session)
    if observed.running:
        return JobDetails(activity=usage.line() if usage else f"unavailable: no session {session} in the store yet",
                          current_tool=current_tool(db, session, started, time.time()) or "none yet")
    return JobDetails(usage=kept_usage or (usage.line() if usage else f"unavailable: no session {session}"),
                      final_text=final_text(db, session, started) or "unavailable: Hermes wrote no reply")


def acp_details(record: JobRecord, running: bool) -> JobDetails:
    """The activity of a job driven over ACP, from Hermes' own events as the supervisor kept them."""
    acp = cast(dict[str, Any], record.acp)
    context = (f", context {int(acp['context_used']):,} / {int(acp['context_size']):,} tokens"
               if is_number(acp.get("context_used")) and is_number(acp.get("context_size")) else "")
    activity = f"{plural(int(acp.get('tool_calls', 0)), 'tool call')}{context}"
    tool = None
    if isinstance(acp.get("tool"), str):
        started = acp.get("tool_started")
        seconds = int(time.time() - cast(float, started)) if is_number(started) else 0
        status = acp.get("tool_status")
        tool = f"{acp['tool']} ({status if status in ('completed', 'failed') else f'running {seconds} s'})"
    if is_number(acp.get("tokens_in")) and is_number(acp.get("tokens_out")):
        usage = f"{activity}, tokens in {int(acp['tokens_in']):,} / out {int(acp['tokens_out']):,}"
    else:
        usage = f"{activity}, tokens unavailable: Hermes reported none"
    text = acp.get("answer") if isinstance(acp.get("answer"), str) else None  # the record's key (a format)
    if running:
        return JobDetails(activity=activity, current_tool=tool or "none yet")
    return JobDetails(usage=usage, final_text=text or "unavailable: Hermes wrote no reply")


def changes_lines(record: JobRecord) -> list[str]:
    changes = record.changes
    if changes is None:
        return []
    if "note" in changes:
        return [f"CHANGED_FILES: {shown(changes['note'])}"]
    lines = [f"CHANGED_FILES: {changes['created']} created, {changes['modified']} modified, "
             f"{changes['deleted']} deleted " + ("(in the worktree, against its base, paths from the repository's top)"
                                                 if record.worktree else "(under CWD, since the job started)")]
    lines += [shown(line, 400) for line in changes["lines"][:CHANGED_LINES]]
    if changes["more"] > 0:
        lines.append(f"... and {changes['more']} more")
    if runs_later := changes.get("runs_later"):
        lines.append(f"RUNS_LATER: the job changed {plural(len(runs_later), 'file')} that other programs run or load "
                     "later, outside any sandbox: " + ", ".join(f"{shown(path, 200)} ({who_runs(path)})"
                                                                for path in runs_later[:CHANGED_LINES])
                     + (" ..." if len(runs_later) > CHANGED_LINES else "")
                     + ". Read them before you open the folder in an editor or agent, or run anything there")
    return lines


QUESTIONS_SHOWN = 10


def seconds_left(question: dict[str, Any]) -> int:
    return max(0, int(question["expires_clock"] - machine_clock()))


def deadline_words(question: dict[str, Any]) -> str:
    """When the question is denied by itself (by Hermes, or for a host by the job's proxy), as a person reads
    it: the clock time and how long from now."""
    who = "the job's proxy refuses the host" if is_network_question(question) else "Hermes denies this"
    return f"{who} by itself{clock_words(question['expires_at'])} (in {seconds_left(question)} s) if nobody answers"


def approval_lines(observed: ObservedJob) -> list[str]:
    """The questions Hermes waits on, oldest first, each with its id, how long Hermes still waits, and how to
    answer it (at most QUESTIONS_SHOWN; the rest are counted and come next)."""
    pending = observed.pending_questions
    job_id = observed.record.id
    lines = [f"QUESTIONS_WAITING: {len(pending)} (answer each by its APPROVAL_ID)"] if len(pending) > 1 else []
    for question in pending[:QUESTIONS_SHOWN]:
        approval_id = shown(question["id"], 40)
        who = "The job" if is_network_question(question) else "Hermes"
        lines += [f"APPROVAL_ID: {approval_id}",
                  f"APPROVAL: {who} asks to {shown(question['what'], 2400)}",
                  f"APPROVAL_WAITS_S: {seconds_left(question)} ({deadline_words(question)})"]
    if len(pending) > QUESTIONS_SHOWN:
        lines.append(f"... and {len(pending) - QUESTIONS_SHOWN} more questions, shown once these are answered")
    if pending:
        which = (f'"{shown(pending[0]["id"], 40)}"' if len(pending) == 1 else "<an APPROVAL_ID above>")
        for_job = ("a host's answer holds for the rest of the job" if all(map(is_network_question, pending)) else
                   "\"allow_for_job\" also allows this exact command when the job asks again")
        lines.append(f"Ask the user, then answer with hermes_approve(job_id=\"{job_id}\", approval_id={which}, "
                     f"decision=\"allow\" or \"deny\"; {for_job}).")
    return lines


def decision_lines(record: JobRecord) -> list[str]:
    """The questions Hermes asked in this job, and who answered what: counts of all, the newest listed."""
    decisions = record.decisions
    counts = record.decided or {}
    total = sum(counts.values()) or len(decisions)
    if not total:
        return []
    by_kind = ", ".join(f"{count} {decision}" for decision, count in sorted(counts.items()))
    lines = [f"APPROVALS: {plural(total, 'question')} answered" + (f" ({by_kind})" if by_kind else "")
             + (f"; the newest {min(20, len(decisions))} listed" if total > 20 else "")]
    lines += [f"- {shown(d['id'], 40)}: {shown(d['what'], 2400)} -> {shown(d['decision'], 20)} by {shown(d['by'], 400)}"
              for d in decisions[-20:]]
    return lines


def start_line(record: JobRecord) -> list[str]:
    """How Hermes came to the job (warm: a standby's, started before it), and how long the task took to reach
    it from the call that started the job."""
    if not record.start:
        return []
    mode, _, why = record.start.partition(": ")
    timing = (f"the task reached Hermes {max(0.0, record.prompt_sent_at - record.created_at):.1f} s after the job "
              "was started" if record.prompt_sent_at and record.created_at else "")
    return [f"START: {shown(mode, 20)} ({'; '.join(part for part in (timing, shown(why, 300)) if part)})"
            if timing or why else f"START: {shown(mode, 20)}"]


# The SANDBOX words as the supervisor composes them, each part already bounded (four paths, sandbox_writable, the
# credentials here and those inside the job's folders): never cut at their end, where EXCEPT warns of keys the
# job can read.
SANDBOX_CHARS = 3000


def listed_paths(paths: list[str]) -> str:
    return ", ".join(shown(path, 200) for path in paths[:8]) + (" ..." if len(paths) > 8 else "")


def executor_words(record: JobRecord) -> str:
    """Where the job's commands ran, and what that changes about its boundary (docs/executors.md)."""
    if not record.executor:
        return "local (this machine)"
    executor = Executor.of_record(record.executor)
    if executor.kind == "docker":
        network = ("the docker daemon's default network" if container_network(executor, record.network_mode or "open")
                   else "none")
        words = (f"{executor.described()}: the job's commands and file edits ran in a container made for this job "
                 f"alone, its folder mounted at the same path, no Docker daemon reachable from inside, container "
                 f"network {network} (Hermes and its model calls stay on this machine)")
    else:
        remote = (record.worktree or {}).get("remote")
        words = (f"{executor.described()}: the job's commands and file edits ran on {executor.host} as "
                 f"{executor.user}" + (f", in the worktree {remote}" if remote else "")
                 + "; the bridge carries the work there and back with git (Hermes and its model calls stay here)")
    return words + (f"; {record.executor_report}" if record.executor_report else "")


def sandbox_lines(record: JobRecord) -> list[str]:
    """Where the job ran, what the operating system confined it to, and what it changed of Hermes' settings and
    of its repository's git folder (put back)."""
    lines = [f"EXECUTOR: {shown(executor_words(record), 1000)}"]
    if record.sandbox:
        lines.append(f"SANDBOX: {shown(record.sandbox, SANDBOX_CHARS)}")
    if record.read_only:
        lines.append(f"READ_ONLY: {shown(record.read_only, 1000)}")
    denied = []
    if refused := record.sandbox_refused:
        denied.append(f"the sandbox refused writes to {plural(len(refused), 'path')} outside the job's folders, as its "
                      f"tools reported them: {listed_paths(refused)}. If the work needed them, that is why it failed: "
                      "add the folder to sandbox_writable, or run it with sandbox: off")
    if unread := record.sandbox_unread:
        denied.append(f"the sandbox refused reading {plural(len(unread), 'path')} it keeps from every job (keys, "
                      "credentials and other processes' /proc; sandbox_unreadable adds more), as its tools reported "
                      f"them: {listed_paths(unread)}")
    if denied:
        lines.append("SANDBOX_DENIED: " + " | ".join(denied))
    if record.network:
        lines.append(f"NETWORK: {shown(record.network, 1500)}")
    if record.hermes_home:
        lines.append("HERMES_SETTINGS: " + " | ".join(shown(note, 600) for note in record.hermes_home))
    if record.repository:
        lines.append("REPOSITORY: " + " | ".join(shown(note, 1000) for note in record.repository))
    return lines


def budget_facts(record: JobRecord) -> list[dict[str, Any]]:
    """Each budget the job has and what it has spent of it so far, for the job view's bars (a cost Hermes does
    not price is left out: it cannot be shown against its budget)."""
    spend = record.spend or {}
    tokens = int(spend.get("tokens_in", 0)) + int(spend.get("tokens_out", 0))
    budgets: list[tuple[str, float, float | None]] = [
        ("tokens", tokens, record.max_tokens), ("turns", int(spend.get("api_calls", 0)), record.max_turns)]
    if spend.get("priced") or not spend:
        budgets.insert(1, ("dollars", float(spend.get("cost_usd", 0)), record.max_cost_usd))
    return [{"what": what, "spent": spent, "limit": limit} for what, spent, limit in budgets if limit]


STEER_OUTCOMES = {"sent": "sent; Hermes has not answered yet", "acknowledged": "taken by Hermes",
                  "refused": "REFUSED by Hermes", "not delivered": "NOT delivered"}


def steer_words(steer: dict[str, Any]) -> str:
    """One steer as the blocks list it: which, who, when, what, and what became of it."""
    state = STEER_OUTCOMES[steer["state"]]
    said = f": {shown(steer['hermes'], 300)}" if steer.get("hermes") else ""
    return (f"steer {shown(steer['id'], 20)} ({steer['when']}) by {shown(steer['by'], 60)}{clock_words(steer['at'])}: "
            f"\"{shown(steer['text'], 300)}\" -> {state}{said}")


def steer_lines(record: JobRecord) -> list[str]:
    """Every steer of the job, oldest first, in every later block."""
    return [f"STEERED: {steer_words(steer)}" for steer in record.steers]


USAGE_TOKENS = re.compile(r", tokens (?:in [\d,]+ / out [\d,]+|unavailable: Hermes reported none)$")


def spend_line(record: JobRecord) -> list[str]:
    """The job's spend against its budgets, as Hermes' store counted it (a price Hermes does not know is said,
    never shown as zero)."""
    spend = record.spend
    if not spend:
        return []
    tokens_in, tokens_out = int(spend.get("tokens_in", 0)), int(spend.get("tokens_out", 0))
    parts = [f"{plural(int(spend.get('api_calls', 0)), 'API call')}"
             + (f" (max_turns {record.max_turns})" if record.max_turns else ""),
             f"tokens {tokens_in + tokens_out:,} (in {tokens_in:,} / out {tokens_out:,})"
             + (f" of {record.max_tokens:,}" if record.max_tokens else "")]
    if spend.get("priced"):
        parts.append(f"cost ${float(spend.get('cost_usd', 0)):.4f}" + (f" of ${record.max_cost_usd:g}"
                                                                       if record.max_cost_usd else "")
                     + " (Hermes' estimate)")
    else:
        parts.append(f"cost not priced by Hermes ({shown(spend.get('model') or 'its model', 100)})"
                     + ("; max_cost_usd cannot be enforced, the token and turn caps still hold"
                        if record.max_cost_usd else ""))
    if spend.get("sessions"):
        parts.append(f"counted over {int(spend['sessions'])} sessions started in the job's folder during it (its own "
                     "could not be told apart, so the budget holds for them all)")
    if spend.get("lowered"):
        parts.append("Hermes' store counted less at a later reading (its records were changed): the highest "
                     "reading is kept")
    return ["SPEND: " + "; ".join(parts)]


def late_answer_lines(record: JobRecord) -> list[str]:
    """Answers that came after their question was decided (a dialog left open past Hermes' deadline): refused
    when they came, listed so nobody takes them for decisions."""
    late = record.late_answers
    if not late:
        return []
    decided = {d["id"]: d for d in record.decisions}
    lines = [f"LATE_ANSWERS: {plural(len(late), 'answer')} came after the question was decided (or the job ended), "
             "and were not relayed"]
    for answer in late:
        earlier = decided.get(answer["id"])
        before = (f" (it was decided: {shown(earlier['decision'], 20)} by {shown(earlier['by'], 200)}"
                  f"{clock_words(earlier.get('at'))})" if earlier else "")
        lines.append(f"- {shown(answer['id'], 40)}: {shown(answer['decision'], 20)} by {shown(answer['by'], 100)}"
                     f"{clock_words(answer['at'])}{before}")
    return lines


ANSWER_PREFIX = "| "


def quoted_final_text(answer: str, max_chars: int) -> list[str]:
    """Hermes' reply as lines of its section: escapes and control characters removed as in the log tail,
    every line (U+2028 and U+2029 break lines too) behind ANSWER_PREFIX, so no text of Hermes can pass for a
    field line such as STATUS: or JOB_ID:. Cut at max_chars, saying how much."""
    text = clean_str(answer).strip("\n")  # ACP's answer can open with blank lines: a reply starts at its text
    cut = len(text) - max_chars
    lines = [ANSWER_PREFIX + line for line in text[:max_chars].splitlines()] or [ANSWER_PREFIX]
    if cut > 0:
        lines.append(f"[cut: {cut} more characters]")
    return lines


def removed_worktree(record: "JobRecord") -> str:
    """After a merge or a discard the worktree is gone: said wherever a block names its path."""
    landed = record.landed or {}
    if not record.worktree or landed.get("action") not in ("merge", "discard"):
        return ""
    where = f"the work is in {shown(record.worktree['repo'])}" if landed["action"] == "merge" else "the work dropped"
    return f" (removed at the {'merge' if landed['action'] == 'merge' else 'discard'}: {where})"


def worktree_lines(record: "JobRecord") -> list[str]:
    """WORKTREE, DIFF, PATCH, REPOSITORY and LANDED lines of a worktree job."""
    worktree = record.worktree
    if not worktree:
        return []
    origin = "the working tree at launch" if worktree.get("from") == "working-tree" else "HEAD at launch"
    submodules = worktree.get("submodules")
    lines = [f"WORKTREE: {shown(worktree['path'])}{removed_worktree(record)} (branch {shown(worktree['branch'])}, base "
             f"{shown(worktree['base'])[:12]}, {origin}, in repository {shown(worktree['repo'])}"
             + (f"; submodules {shown(str(submodules), 300)}" if submodules not in (None, "none", "present") else "")
             + ")"]
    diff = record.diff
    if diff:
        lines.append(f"DIFF: {plural(int(diff['files']), 'file')} changed, +{int(diff['insertions'])} "
                     f"-{int(diff['deletions'])} against the base (the job's commits and its uncommitted changes)")
        lines.append(f"PATCH: {shown(str(diff['patch']))} ({human_size(int(diff['patch_bytes']))}; read it with "
                     "hermes_read, page by page)")
    landed = record.landed
    if landed:
        lines.append(f"LANDED: {shown(str(landed['action']))}{clock_words(landed.get('at'))}: "
                     f"{shown(str(landed['how']), 600)}")
    elif record.state in FINAL_STATES and diff:
        lines.append(f'LAND: not yet. hermes_land(job_id="{record.id}", action="merge") applies it to '
                     f"{shown(worktree['repo'])}; \"discard\" drops it; \"keep\" leaves it for retention")
    return lines


def worktree_facts(record: "JobRecord") -> list[list[str]]:
    """A worktree job's rows as a person reads them in the job view (the view shows the change itself and the
    buttons that land it, so no PATCH path nor advice on hermes_land)."""
    worktree = record.worktree
    if not worktree:
        return []
    origin = "your uncommitted files" if worktree.get("from") == "working-tree" else "the last commit"
    rows = [["worktree", f"{shown(worktree['path'])} (branch {shown(worktree['branch'])}, started from {origin} "
                         f"{shown(worktree['base'])[:12]} of {shown(worktree['repo'])})"]]
    if record.repository:
        rows.append(["repository", " | ".join(shown(note, 1000) for note in record.repository)])
    return rows


def containment_facts(record: "JobRecord") -> list[list[str]]:
    """What confined the job, what the sandbox refused, what it may reach over the network (and what its proxy
    refused), what it put back of a repository it worked in, and the files it changed that run later, as the job
    view's rows (the block's SANDBOX, SANDBOX_DENIED, NETWORK, REPOSITORY and RUNS_LATER lines; a worktree job's
    repository row is its worktree's)."""
    rows = [["executor", shown(executor_words(record), 1000)]] if record.executor else []
    if record.sandbox:
        rows.append(["sandbox", shown(record.sandbox, SANDBOX_CHARS)])
    if record.sandbox_refused:
        rows.append(["refused by the sandbox", ", ".join(shown(path, 200) for path in record.sandbox_refused)])
    if record.sandbox_unread:
        rows.append(["kept from reading", ", ".join(shown(path, 200) for path in record.sandbox_unread)])
    if record.read_only:
        rows.append(["read-only", shown(record.read_only, 1000)])
    if record.network:
        rows.append(["network", shown(record.network, 1500)])
    if record.repository and not record.worktree:
        rows.append(["repository", " | ".join(shown(note, 1000) for note in record.repository)])
    if runs_later := (record.changes or {}).get("runs_later"):
        rows.append(["runs later", "read before you open the folder or run anything there: "
                     + ", ".join(f"{shown(path, 200)} ({who_runs(path)})" for path in runs_later)])
    return rows


def render_status(observed: ObservedJob, cfg: Config, notes: list[str] | None = None,
                  details: JobDetails | None = None) -> str:
    """The status block. The log shown is always the job's own <id>.log in the store, never a path taken
    from the record, and every value that came from disk is shown escaped."""
    record = observed.record
    notes = list(notes or [])
    if record.cwd_note:
        notes.insert(0, record.cwd_note)
    log = JobStore.of(cfg).log_path(record.id)
    head = [f"STATUS: {observed.shown_state}", f"JOB_ID: {record.id}"]
    body = (queued_lines(observed, cfg, log) if observed.state is JobState.QUEUED
            else running_lines(observed, log, details) if observed.running
            else final_lines(observed, cfg, log, details))
    note_lines = [f"NOTE: {shown(note, 1000)}" for note in notes]
    return "\n".join(head + body[0] + note_lines + body[1])


# What Hermes prints while it retries its model endpoint (0.19/0.20: "⏳ Retrying in 5.0s (attempt 2/3)...", 0.22:
# "⏳ Provider temporarily unavailable — retrying automatically in 68s (cycle 3/5)", a stream's "reconnecting,
# retry 2/3"), read among the last lines of a running job's log: then a silent job is not a slow one.
MODEL_RETRY_RE = re.compile(r"retrying in \d|retrying automatically|reconnecting, retry|API call failed",
                            re.IGNORECASE)
MODEL_RETRY_LINES = 4


def model_condition(log: Path) -> str | None:
    """Hermes retrying its model endpoint right now, in words with its own line; None when the end of the log
    says nothing of it."""
    tail = clean_text(read_tail(log, 4096)[0])
    lines = [line.strip() for line in tail.splitlines() if line.strip()][-MODEL_RETRY_LINES:]
    said = next((line for line in reversed(lines) if MODEL_RETRY_RE.search(line)), None)
    return (f"Hermes cannot reach its model endpoint right now and is retrying; it said: {shown(said, 300)}. Check "
            "that the model (a local server, the provider, its key) is up" if said else None)


def queued_lines(observed: ObservedJob, cfg: Config, log: Path) -> tuple[list[str], list[str]]:
    """A queued job's lines: its place in the queue, what it will run with, and that it is not a failure."""
    record = observed.record
    lines = [f"QUEUE: {queue_words(JobStore.of(cfg), record, cfg)}", f"CWD: {shown(record.cwd, 1000)}",
             f"TIMEOUT_S: {record.timeout_s:g} (hard cap we enforce, counted from its start)",
             f"FULL_LOG: {shown(str(log))}"]
    return lines, ["Waiting for a free slot. This is NOT a failure: it starts by itself, in the order accepted.",
                   f'Collect the result with hermes_status(job_id="{record.id}"); hermes_cancel ends it before it '
                   "starts.", "Do not re-run the task -- it is already accepted."]


def running_lines(observed: ObservedJob, log: Path, details: JobDetails | None) -> tuple[list[str], list[str]]:
    """A running job's lines before the notes, and after them."""
    record = observed.record
    lines = [f"CWD: {shown(record.cwd, 1000)}", f"ELAPSED_S: {elapsed_s(record, observed.running)}",
             f"TIMEOUT_S: {record.timeout_s:g} (hard cap we enforce)", f"FULL_LOG: {shown(str(log))}"]
    if observed.condition:
        lines.append(f"CONDITION: {shown(observed.condition, 600)}")
    if trouble := model_condition(log):
        lines.append(f"CONDITION: {trouble}")
    lines += start_line(record) + sandbox_lines(record) + spend_line(record) + worktree_lines(record)
    if details:
        lines.append(f"ACTIVITY: {shown(details.activity, 400)}")
        if details.current_tool:
            lines.append(f"CURRENT_TOOL: {shown(details.current_tool, 400)}")
    lines += approval_lines(observed) + decision_lines(record) + steer_lines(record)
    over = record.hermes is not None and (observed.condition or "").startswith("Hermes has exited")
    first = ("Hermes has ended; the job's outcome is not written yet. This is NOT a failure." if over
             else "Still running. This is NOT a failure and NOT a timeout.")
    return lines, [first, f'Collect the result with hermes_status(job_id="{record.id}").',
                   "Do not re-run the task -- " + ("it has run; its outcome follows in a moment." if over
                                                   else "it is already executing."),
                   "--- OUTPUT SO FAR (tail) ---", log_excerpt(log, RUNNING_TAIL_CHARS)]


def final_lines(observed: ObservedJob, cfg: Config, log: Path, details: JobDetails | None
                ) -> tuple[list[str], list[str]]:
    """An ended job's lines before the notes, and after them: advice, usage, changes, final text, output."""
    record = observed.record
    exit_code, session = record.exit_code, record.session_id
    denied = (record.decided or {}).get("deny", 0)
    asked = "request" if any(d["id"].startswith("net-") for d in record.decisions) else "command"
    lines = [f"DENIED: {plural(denied, asked)} Hermes asked {'for' if asked == 'request' else 'to run'} "
             f"{'was' if denied == 1 else 'were'} denied (see APPROVALS): the work may be incomplete; check it with "
             "hermes_read"] if denied else []
    lines += [f"EXIT_CODE: {'none' if exit_code is None else exit_code}",
             f"SESSION_ID: {shown(session) if session else 'none captured'}",
             f"CWD: {shown(record.cwd, 1000)}{removed_worktree(record)}",
             f"ELAPSED_S: {elapsed_s(record, observed.running)}",
             f"FULL_LOG: {shown(str(log))}"]
    if observed.reason and observed.state is not JobState.OK:
        lines.append(f"REASON: {shown(observed.reason, 2000)}")
    elif observed.state is JobState.OK:
        lines.append(f"REASON: {shown(observed.reason or 'Hermes finished its turn', 2000)}"
                     + (f" (exit {exit_code})" if exit_code is not None else ""))
    if advice := retry_advice(observed.state, observed.reason or ""):
        lines.append(f"RETRY: {advice}")
    if not session and record.session_source:
        lines.append(f"SESSION_NOTE: none captured: {shown(record.session_source, 1000)}")
    if record.session_note:
        lines.append(f"SESSION_NOTE: {shown(record.session_note, 1000)}")
    if record.swept:
        lines.append(f"STOPPED: {shown(record.swept, 1000)}")
    if record.outcome_note:
        lines.append(f"OUTCOME_NOTE: {shown(record.outcome_note, 600)}")
    lines += decision_lines(record) + late_answer_lines(record) + steer_lines(record)
    after: list[str] = []
    if observed.state is JobState.ORPHANED:
        after.append(f'Stop what is left with hermes_cancel(job_id="{record.id}").')
    if observed.state in PART_DONE_STATES:
        after.append("Work may be part-done: inspect the files with hermes_read before re-running.")
    spend = spend_line(record)
    if details:  # one token count on a block: SPEND's (the budgets'), when the job has one
        usage = details.usage or ""
        after.append(f"USAGE: {shown(USAGE_TOKENS.sub('', usage) if spend else usage, 400)}")
    after += spend
    after += start_line(record) + sandbox_lines(record) + changes_lines(record) + worktree_lines(record)
    if details:
        after += ["--- HERMES ANSWER ---", *quoted_final_text(details.final_text or "", cfg.max_output_chars)]
    return lines, after + ["--- HERMES OUTPUT ---", log_excerpt(log, cfg.max_output_chars)]


@dataclasses.dataclass
class ToolResult:
    """What a tool answers, and what its audit line records: taken from these fields, never parsed back out
    of the text (which quotes files and Hermes' output)."""

    text: str
    status: str = "ok"
    job_id: str | None = None
    cwd: str | None = None
    reason: str | None = None
    facts: dict[str, Any] | None = None  # the same facts as fields (in _meta), for the job view
    patch: dict[str, Any] | None = None  # a page of a worktree job's patch (in _meta), for the job view

    @property
    def is_error(self) -> bool:
        return self.status in ("refused", "error")


def status_result(observed: ObservedJob, cfg: Config, notes: list[str] | None = None) -> ToolResult:
    """The status block with what the session store adds; reads the disk, so it runs off the event loop."""
    record = observed.record
    details = job_details(cfg, observed)
    text = render_status(observed, cfg, notes, details)
    return ToolResult(text, observed.shown_state, record.id, record.cwd, None if observed.running else observed.reason,
                      job_facts(cfg, observed, details, notes or []))


def job_facts(cfg: Config, observed: ObservedJob, details: JobDetails, notes: list[str]) -> dict[str, Any]:
    """What the status block says, as fields (what a job view renders, from the result's _meta); every text that came
    from disk or from Hermes escaped as in the block."""
    record = observed.record
    questions = [{"id": shown(q["id"], 40), "what": shown(q["what"], 2400), "expires_at": q["expires_at"],
                  "seconds_left": seconds_left(q), "network": is_network_question(q)}
                 for q in observed.pending_questions[:QUESTIONS_SHOWN]]
    changes = record.changes or {}
    return {"job_id": record.id, "status": observed.shown_state, "running": observed.running,
            "cwd": shown(record.cwd, 1000), "elapsed_s": elapsed_s(record, observed.running),
            "timeout_s": record.timeout_s,
            "deadline_at": (record.started_at or record.created_at) + record.timeout_s if observed.running else None,
            "reason": shown(observed.reason, 2000) if observed.reason and not observed.running else None,
            "condition": (model_condition(JobStore.of(cfg).log_path(record.id)) or observed.condition)
            if observed.running else None,
            "activity": shown(details.activity, 400) if details.activity else None,
            "current_tool": shown(details.current_tool, 400) if details.current_tool else None,
            "spend": (spend_line(record) or [""])[0].removeprefix("SPEND: ") or None,
            "changes": {"created": changes.get("created", 0), "modified": changes.get("modified", 0),
                        "deleted": changes.get("deleted", 0),
                        "lines": [shown(line, 400) for line in changes.get("lines", [])[:CHANGED_LINES]],
                        "note": shown(changes["note"]) if "note" in changes else None},
            "final_text": clean_str(details.final_text[:20000]) if details.final_text and not observed.running
            else None,
            "questions": questions, "worktree": worktree_facts(record), "containment": containment_facts(record),
            "diff": {key: record.diff[key] for key in ("files", "insertions", "deletions", "patch_bytes")}
            if record.diff else None,
            "landed": {"action": shown(str(record.landed["action"]), 20), "how": shown(str(record.landed["how"]), 600),
                       "at": record.landed.get("at")} if record.landed else None,
            "budgets": budget_facts(record),
            "steerable": observed.running and record.driver == "acp",
            "steers": [{"at": steer["at"], "by": shown(steer["by"], 60), "when": steer["when"],
                        "text": shown(steer["text"], 300), "outcome": STEER_OUTCOMES[steer["state"]],
                        "hermes": shown(steer.get("hermes", ""), 300)} for steer in record.steers],
            "landable": bool(record.worktree and record.diff and not record.landed and not observed.running),
            "landing_target": {"repo": shown(record.worktree["repo"], 1000), "branch": shown(record.worktree["branch"])}
            if record.worktree else None,
            "decisions": [{"what": shown(d["what"], 600), "decision": d["decision"], "by": shown(d["by"], 200),
                           "at": d.get("at")} for d in record.decisions[-5:]],
            "notes": [shown(note, 1000) for note in notes]}


def refused_result(reason: str) -> ToolResult:
    return ToolResult(f"STATUS: refused\nREASON: {reason}\nNothing was started.", "refused", reason=reason)
