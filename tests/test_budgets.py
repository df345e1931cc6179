"""Bounded delegation (issue 29, sections 1 and 2): a job's token and cost budgets and its turn cap, enforced by
the supervisor from Hermes' session store for both drivers, against the fake Hermes (1,000 tokens in and 100
out per API call, `!calls=N` calls 0.3 s apart; FAKE_HERMES_PRICE dollars per call, unset: not priced)."""
import time
from pathlib import Path
from typing import Any

import pytest

from claude_hermes_bridge.config import Config
from claude_hermes_bridge.hermes_cli import hermes_env, retry_advice
from claude_hermes_bridge.hermes_store import session_spend
from claude_hermes_bridge.job_watching import SpendWatch, never_lower
from claude_hermes_bridge.jobs import FINAL_STATES, PART_DONE_STATES, JobRecord, JobState, JobStore
from claude_hermes_bridge.mcp_edge import TASK_FAILED_STATES
from claude_hermes_bridge.processes import JOB_MARKER
from claude_hermes_bridge.render import spend_line
from harness import Bridge, BridgeClient, refused, wait_until

pytestmark = pytest.mark.posix("the fake hermes is a shell script")

PER_CALL = 1100  # tokens the fake records per API call


def client_of(bridge: Bridge, driver: str, **env: str) -> BridgeClient:
    bridge.configure(hermes_driver=driver)
    client = bridge.client()
    client.params.env = dict(bridge.env, FAKE_HERMES_ACP="1" if driver == "acp" else "0", **env)
    return client


def final(client: BridgeClient, **arguments: Any) -> Any:
    result = client.call("hermes_run", wait_s=40, **arguments)
    return client.wait_final(result.field("JOB_ID")) if result.field("STATUS") == "running" else result


@pytest.mark.parametrize("driver", ["cli", "acp"])
def test_a_token_budget_stops_the_job_as_over_budget(bridge, driver):
    with client_of(bridge, driver) as client:
        result = final(client, task="work !calls=40", max_tokens=3000)
    assert result.field("STATUS") == "over_budget", result.text
    reason = result.field("REASON")
    assert reason.startswith("passed max_tokens: ") and " of 3,000" in reason, reason
    spent = bridge.record(result.field("JOB_ID")).spend or {}
    assert 3000 < spent["tokens_in"] + spent["tokens_out"] <= 3000 + 3 * PER_CALL, spent
    assert "SPEND: " in result.text and "of 3,000" in result.field("SPEND")
    assert "Work may be part-done" in result.text
    if driver == "cli":  # stopped as at a terminal first: Ctrl-C, and Hermes ends its turn by itself
        log = bridge.jobs / f"{result.field('JOB_ID')}.log"
        assert "fake hermes: stopped by SIGINT" in log.read_text(), log.read_text()[-2000:]
        assert result.field("EXIT_CODE") == "130"
        assert "Hermes stopped when asked (Ctrl-C: SIGINT to its process group)" in reason, reason


@pytest.mark.parametrize("driver", ["cli", "acp"])
def test_a_cost_budget_stops_a_priced_job_and_says_what_it_spent(bridge, driver):
    with client_of(bridge, driver, FAKE_HERMES_PRICE="0.01") as client:
        result = final(client, task="work !calls=40", max_cost_usd=0.025)
    assert result.field("STATUS") == "over_budget", result.text
    assert result.field("REASON").startswith("passed max_cost_usd: $0.0") and "of $0.025 (Hermes' estimate)" in (
        result.field("REASON"))
    assert "(Hermes' estimate)" in result.field("SPEND")


@pytest.mark.parametrize("driver", ["cli", "acp"])
def test_a_job_without_budgets_says_what_it_spent_and_hermes_jobs_lists_its_cost(bridge, driver):
    with client_of(bridge, driver, FAKE_HERMES_PRICE="0.01") as client:
        result = final(client, task="work !calls=2")
        listing = client.call("hermes_jobs").text
    assert result.field("STATUS") == "ok", result.text
    assert result.field("SPEND") == (  # 2 calls, the answer
        "3 API calls; tokens 3,300 (in 3,000 / out 300); cost $0.0300 (Hermes' estimate)")
    row = next(line for line in listing.splitlines() if line.startswith(result.field("JOB_ID")))
    assert "  cost $0.0" in row, listing


@pytest.mark.parametrize("driver", ["cli", "acp"])
def test_an_unbudgeted_resumed_jobs_spend_is_its_own_not_the_whole_sessions(bridge, driver):
    with client_of(bridge, driver, FAKE_HERMES_PRICE="0.01") as client:
        first = final(client, task="work !calls=2")
        started = client.call("hermes_resume", session_id=first.field("SESSION_ID"), task="more !calls=1", wait_s=0)
        resumed = client.wait_final(started.field("JOB_ID"))
        listing = client.call("hermes_jobs").text
    assert resumed.field("STATUS") == "ok", resumed.text
    assert resumed.field("SPEND") == (  # 1 call, the answer
        "2 API calls; tokens 2,200 (in 2,000 / out 200); cost $0.0200 (Hermes' estimate)")
    row = next(line for line in listing.splitlines() if line.startswith(resumed.field("JOB_ID")))
    assert "$0.0200" in row, row


def test_a_cost_budget_on_a_model_hermes_cannot_price_is_said_not_enforced_and_the_token_cap_holds(bridge):
    with client_of(bridge, "acp") as client:
        result = final(client, task="work !calls=4", max_cost_usd=0.001, max_tokens=100_000)
    assert result.field("STATUS") == "ok", result.text
    spend = result.field("SPEND")
    assert "cost not priced by Hermes (fake)" in spend and "max_cost_usd cannot be enforced" in spend, spend
    assert ("tokens 4,400 (in 4,000 / out 400) of 100,000" in spend  # the answer is a call
            or "tokens 5,500 (in 5,000 / out 500) of 100,000" in spend), spend


@pytest.mark.parametrize("driver", ["cli", "acp"])
def test_max_turns_holds_for_both_drivers_and_the_reason_says_so(bridge, driver):
    """ACP ignores agent.max_turns (the bridge stops it); the CLI stops at --max-turns by itself and exits 0:
    either way the count says why the job ended."""
    with client_of(bridge, driver) as client:
        result = final(client, task="work !calls=40", max_turns=3)
    assert result.field("STATUS") == "over_budget", result.text
    assert result.field("REASON").startswith("reached max_turns (3)"), result.field("REASON")
    calls = (bridge.record(result.field("JOB_ID")).spend or {})["api_calls"]
    assert 3 <= calls <= 3 + 3, calls


def test_budgets_are_checked_defaulted_and_clamped_to_the_configs_ceilings(bridge):
    bridge.configure(default_max_tokens=50_000, max_tokens_limit=80_000, max_cost_usd_limit=1.5)
    with client_of(bridge, "cli") as client:
        refused(client.call("hermes_run", task="x", max_tokens=0, wait_s=0), "max_tokens must be a positive whole")
        refused(client.call("hermes_run", task="x", max_cost_usd=-1, wait_s=0), "max_cost_usd must be a positive")
        clamped = client.call("hermes_run", task="clamped", max_tokens=10**9, max_cost_usd=9, wait_s=20)
        defaulted = client.call("hermes_run", task="defaulted", wait_s=20)
    assert "max_tokens=1e+09 was clamped to 80000" in clamped.text
    assert "max_cost_usd=9 was clamped to 1.5" in clamped.text
    assert bridge.record(clamped.field("JOB_ID")).max_tokens == 80_000
    assert bridge.record(defaulted.field("JOB_ID")).max_tokens == 50_000


def test_over_budget_is_a_final_part_done_state_that_a_task_reports_as_an_error():
    assert JobState.OVER_BUDGET in FINAL_STATES and JobState.OVER_BUDGET in (
        PART_DONE_STATES)
    assert JobState.OVER_BUDGET in TASK_FAILED_STATES


# ------------------------------------------------------------------ section 3: why a job ended, and whether to retry
@pytest.mark.parametrize(("task", "status", "reason", "retry"), [
    ("fine", "ok", "Hermes finished its turn (exit 0)", None),
    ("limited !rate-limited !exit=1", "error", "the model endpoint rate-limited Hermes", "yes, after a pause"),
    ("down !model-down !exit=1", "error", "Hermes could not reach its model endpoint", "no: fix Hermes' model"),
    ("stopped !exit=130", "error", "Hermes exited 130: interrupted", "yes, once the files are checked"),
    ("odd !exit=2", "error", "Hermes exited with code 2", "maybe: read the log"),
], ids=["ok", "rate-limited", "model-down", "interrupted", "exit-2-without-usage"])
def test_every_final_block_says_why_the_job_ended_and_whether_a_retry_can_help(bridge, task, status, reason, retry):
    with client_of(bridge, "cli") as client:
        result = final(client, task=task)
    assert result.field("STATUS") == status, result.text
    assert reason in result.field("REASON"), result.field("REASON")
    if retry is None:
        assert "RETRY:" not in result.text
    else:
        assert result.field("RETRY").startswith(retry), result.field("RETRY")


def test_over_budget_and_timeout_say_a_retry_as_is_cannot_help():
    assert (retry_advice(JobState.OVER_BUDGET, "") or "").startswith("no: raise the cap")
    assert (retry_advice(JobState.TIMEOUT, "") or "").startswith("no: raise timeout_s")


def test_hermes_kanban_task_is_kept_out_of_hermes_environment(tmp_path, monkeypatch):
    """With HERMES_KANBAN_TASK set, Hermes exits 75 or 78 with meanings of its own."""
    monkeypatch.setenv("HERMES_KANBAN_TASK", "card-1")
    env = hermes_env(Config(path=tmp_path / "c.json"), "marker")
    assert "HERMES_KANBAN_TASK" not in env and env[JOB_MARKER] == "marker"


# ------------------------------------------------------------------ section 5: waiting on several jobs
def test_status_of_several_jobs_waits_for_any_or_all_and_gives_each_ended_jobs_block(bridge):
    with client_of(bridge, "cli") as client:
        quick = client.call("hermes_run", task="quick !sleep=1", wait_s=0).field("JOB_ID")
        slow = client.call("hermes_run", task="slow !sleep=8", wait_s=0).field("JOB_ID")
        anyone = client.call("hermes_status", job_ids=[quick, slow], wait_s=30)
        everyone = client.call("hermes_status", job_ids=[quick, slow], until="all", wait_s=30)
        bad = client.call("hermes_status", job_ids=[quick], until="most")
        single = client.call("hermes_status", job_id=quick, wait_s=0)
    assert anyone.text.startswith("JOBS: 1 of 2 ended"), anyone.text
    assert f"=== {quick} ===\nSTATUS: ok" in anyone.text and f"- {slow}: running" in anyone.text
    assert everyone.text.startswith("JOBS: 2 of 2 ended (waited for all)"), everyone.text
    assert f"=== {slow} ===\nSTATUS: ok" in everyone.text
    refused(bad, 'until must be "any" or "all"')
    assert single.field("STATUS") == "ok" and single.field("JOB_ID") == quick


def test_the_spend_counts_side_calls_that_only_session_model_usage_holds_and_child_sessions(tmp_path):
    """Hermes 0.22 keeps title generation and compression calls in session_model_usage alone (no cost_status
    there): they count, and do not make a priced session unpriced; a child session counts too. A store without
    the table (0.19, 0.20) is read from its sessions rows."""
    import sqlite3

    db = sqlite3.connect(tmp_path / "state.db")
    db.execute("CREATE TABLE sessions (id TEXT PRIMARY KEY, parent_session_id TEXT, model TEXT, api_call_count "
               "INTEGER, input_tokens INTEGER, output_tokens INTEGER, estimated_cost_usd REAL, cost_status TEXT)")
    db.executemany("INSERT INTO sessions VALUES (?, ?, 'm', ?, ?, ?, ?, 'estimated')",
                   [("main", None, 3, 300, 30, 0.03), ("child", "main", 1, 100, 10, 0.01)])
    assert session_spend(db, "main") == {"api_calls": 4, "tokens_in": 400, "tokens_out": 40, "cost_usd": 0.04,
                                                "priced": 1, "model": "m"}
    db.execute("CREATE TABLE session_model_usage (session_id TEXT, model TEXT, task TEXT, api_call_count INTEGER, "
               "input_tokens INTEGER, output_tokens INTEGER, estimated_cost_usd REAL, cost_status TEXT)")
    db.executemany("INSERT INTO session_model_usage VALUES (?, 'm', ?, ?, ?, ?, ?, ?)",
                   [("main", "", 3, 300, 30, 0.03, "estimated"), ("main", "title_generation", 1, 50, 5, 0.005, None)])
    spend = session_spend(db, "main")
    assert spend is not None and round(spend.pop("cost_usd"), 6) == 0.045
    assert spend == {"api_calls": 5, "tokens_in": 450, "tokens_out": 45, "priced": 1, "model": "m"}


def test_two_budgeted_jobs_in_one_folder_are_both_held_to_their_caps(bridge):
    """Issue 37: a CLI Hermes names its session only at its end; two jobs started in one folder 0.6 s apart
    cannot tell their sessions apart while they run. Neither may run unbudgeted: each is charged for both."""
    folder = bridge.root / "shared"
    folder.mkdir()
    with client_of(bridge, "cli") as client:
        first = client.call("hermes_run", task="one !calls=40", cwd=str(folder), max_tokens=3000, wait_s=0)
        time.sleep(0.6)
        second = client.call("hermes_run", task="two !calls=40", cwd=str(folder), max_tokens=3000, wait_s=0)
        ends = [client.wait_final(job.field("JOB_ID")) for job in (first, second)]
    for end in ends:
        assert end.field("STATUS") == "over_budget", end.text
        spent = bridge.record(end.field("JOB_ID")).spend or {}
        assert spent["tokens_in"] + spent["tokens_out"] <= 3000 + 6 * PER_CALL, spent


def test_a_decoy_session_in_the_store_does_not_lift_the_budget(bridge):
    """A job can write Hermes' store: one more session row in its folder must not make it unbudgeted."""
    import sqlite3

    folder = bridge.root / "decoy"
    folder.mkdir()
    with client_of(bridge, "cli") as client:
        job = client.call("hermes_run", task="work !calls=40", cwd=str(folder), max_tokens=3000, wait_s=0)
        store = bridge.tmp / "hermes-home" / "state.db"

        def plant_decoy() -> bool | None:
            """The decoy row, once the fake has made its store and its tables (a file alone is not enough)."""
            if not store.exists():
                return None  # connecting would make it
            try:
                with sqlite3.connect(store, timeout=10) as db:
                    db.execute("INSERT INTO sessions (id, source, started_at, cwd) VALUES (?, 'cli', ?, ?)",
                               ("20261203_000000_decoy0", time.time(), str(folder)))
                return True
            except sqlite3.OperationalError:
                return None
        wait_until(plant_decoy, 20, "Hermes' store with its sessions table")
        end = client.wait_final(job.field("JOB_ID"))
    assert end.field("STATUS") == "over_budget", end.text
    assert "counted over 2 sessions started in the job's folder" in end.field("SPEND")


def test_the_spend_a_budget_reads_never_goes_down():
    """A store whose counters fell (a job rewrote Hermes' records) keeps the highest reading, and says so."""
    first = never_lower({"api_calls": 5, "tokens_in": 5000, "tokens_out": 500, "cost_usd": 0.5, "priced": 1}, None)
    lowered = never_lower({"api_calls": 1, "tokens_in": 100, "tokens_out": 600, "cost_usd": 0.1, "priced": 1},
                          dict(first))
    assert lowered == {"api_calls": 5, "tokens_in": 5000, "tokens_out": 600, "cost_usd": 0.5, "priced": 1,
                       "lowered": 1}
    later = never_lower({"api_calls": 9, "tokens_in": 9000, "tokens_out": 900, "cost_usd": 0.9, "priced": 1},
                        dict(lowered))
    assert later["lowered"] == 1 and later["tokens_in"] == 9000  # said from then on
    record = JobRecord(id="20261203-000000-1", state=JobState.OK, spend=lowered, max_tokens=3000)
    assert "the highest reading is kept" in spend_line(record)[0]


def store_with(home: Path, rows: list[tuple[str, int, int, int]]) -> None:
    """A Hermes store whose sessions rows are (id, api calls, tokens in, tokens out), in a folder of its own."""
    import sqlite3

    home.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(home / "state.db") as db:
        db.execute("CREATE TABLE IF NOT EXISTS sessions (id TEXT PRIMARY KEY, api_call_count INTEGER, "
                   "input_tokens INTEGER, output_tokens INTEGER, model TEXT)")
        db.executemany("INSERT OR REPLACE INTO sessions VALUES (?, ?, ?, ?, 'm')", rows)


def watch_of(tmp_path: Path, driver: str = "cli", **fields: Any) -> SpendWatch:
    cfg = Config(path=tmp_path / "config.json", hermes_home=str(tmp_path / "home"), jobs_dir=str(tmp_path / "jobs"))
    record = JobRecord(id="20261203-000000-1", state=JobState.RUNNING, driver=driver, session_id="s1", **fields)
    return SpendWatch(cfg, JobStore.of(cfg), record)


def test_max_tokens_counts_tokens_in_and_out(tmp_path):
    store_with(tmp_path / "home", [("s1", 2, 2000, 1500)])
    passed = watch_of(tmp_path, max_tokens=3000).passed(stop_at_turns=True, fresh=True)
    assert passed is not None and passed[1] == "passed max_tokens: 3,500 tokens of 3,000"


def test_under_the_cli_driver_the_running_check_leaves_max_turns_to_hermes(tmp_path):
    """Hermes' CLI stops at --max-turns by itself; the bridge stopping it at as many API calls would cut
    the last turn short. Over ACP (which ignores max_turns) the bridge stops it."""
    store_with(tmp_path / "home", [("s1", 5, 10, 10)])
    assert watch_of(tmp_path, "cli", max_turns=5, max_tokens=10**6).passed_while_running() is None
    passed = watch_of(tmp_path, "acp", max_turns=5).passed_while_running()
    assert passed is not None and passed[1] == "reached max_turns (5): 5 API calls"


def test_a_job_that_rewrites_hermes_store_does_not_rewind_its_spend_or_reopen_its_cap(tmp_path):
    store_with(tmp_path / "home", [("s1", 5, 5000, 500)])
    watch = watch_of(tmp_path, max_tokens=5000)
    assert watch.passed(stop_at_turns=True, fresh=True) is not None
    store_with(tmp_path / "home", [("s1", 1, 100, 10)])  # the job's shell can write Hermes' store
    spend = watch.spend(fresh=True) or {}
    assert (spend["tokens_in"], spend["tokens_out"], spend["lowered"]) == (5000, 500, 1)
    assert watch.passed(stop_at_turns=True, fresh=True) is not None


def test_a_resumed_sessions_earlier_spend_is_not_the_new_jobs(tmp_path):
    store_with(tmp_path / "home", [("s1", 7, 7000, 700)])
    watch = watch_of(tmp_path, spend_base={"api_calls": 5, "tokens_in": 5000, "tokens_out": 500, "cost_usd": 0})
    assert watch.spend(fresh=True) == {"api_calls": 2, "tokens_in": 2000, "tokens_out": 200, "cost_usd": 0.0,
                                       "priced": 0, "model": "m"}


def test_a_write_that_only_reaches_the_write_ahead_log_is_seen(tmp_path):
    """Hermes' store is in WAL mode: a write changes state.db-wal alone until a checkpoint."""
    import sqlite3

    store_with(tmp_path / "home", [("s1", 1, 100, 10)])
    writer = sqlite3.connect(tmp_path / "home" / "state.db")
    writer.execute("PRAGMA journal_mode=WAL")
    writer.execute("PRAGMA wal_autocheckpoint=0")
    watch = watch_of(tmp_path)
    assert (watch.spend(fresh=False) or {})["api_calls"] == 1
    database = (tmp_path / "home" / "state.db").stat()
    writer.execute("UPDATE sessions SET api_call_count = 2 WHERE id = 's1'")
    writer.commit()
    assert (tmp_path / "home" / "state.db").stat().st_mtime_ns == database.st_mtime_ns  # the WAL alone changed
    assert (watch.spend(fresh=False) or {})["api_calls"] == 2
    writer.close()
