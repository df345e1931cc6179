"""Issue 50: the warm standby's hand-over, pinned where a one-line bug passed the suite: the renames a server
and a standby race through (taking.take_standby, standby.wait_for_a_job) and the standby's end (standby.serve),
called as plain functions with the standby's folder in a temporary folder and a process that stands for Hermes."""
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

import claude_hermes_bridge.standby as standby
import claude_hermes_bridge.taking as taking
from claude_hermes_bridge.hermes_acp import WarmHermes
from claude_hermes_bridge.jobs import JobRecord, JobState, JobStore
from harness import config_for

pytestmark = pytest.mark.posix("the standby runs on Windows in tests/test_windows.py; these race its files on Linux")

MARKER = "standby:" + "a" * 32


def store_at(tmp_path: Path) -> JobStore:
    (tmp_path / "standby").mkdir(exist_ok=True)
    return cast(JobStore, SimpleNamespace(root=tmp_path))


def publish(store: JobStore, marker: str = MARKER) -> None:
    (store.root / "standby" / "ready.json").write_text(json.dumps({"marker": marker}))


def job(marker: str = MARKER) -> JobRecord:
    return cast(JobRecord, SimpleNamespace(id="20261205-120000-abcdef", standby_marker=marker))


def names(store: JobStore) -> list[str]:
    return sorted(path.name for path in (store.root / "standby").iterdir())


def test_a_standby_replaced_since_the_server_read_it_is_not_taken_and_stays_published(tmp_path: Path) -> None:
    """taking.take_standby: the ready file now names another standby (another folder's, other settings'): the job
    starts cold, and that standby is left for the job it was readied for."""
    store = store_at(tmp_path)
    publish(store, "standby:" + "b" * 32)
    assert taking.take_standby(store.root / "standby", job()) == "the warm Hermes was replaced meanwhile"
    assert names(store) == ["ready.json"]
    assert json.loads((tmp_path / "standby" / "ready.json").read_text())["marker"] == "standby:" + "b" * 32


def test_a_standby_that_answers_within_the_wait_serves_the_job(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    publish(store)
    folder = tmp_path / "standby"
    record = job()

    def answer() -> None:
        taken = folder / f"taken-{record.id}.json"
        while not taken.exists():
            time.sleep(0.005)
        taken.rename(folder / f"serving-{record.id}.json")
    threading.Thread(target=answer, daemon=True).start()
    assert taking.take_standby(store.root / "standby", record) is None


def test_a_standby_that_answered_as_the_wait_ended_serves_the_job_alone(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """taking.take_standby: the standby took the job between the server's last look and its taking the job back: the
    take-back rename fails, so the job is the standby's, and the server must not start it cold as well."""
    store = store_at(tmp_path)
    publish(store)
    folder = tmp_path / "standby"
    record = job()
    monkeypatch.setattr(taking, "TAKE_ANSWER_S", 0.0)  # the wait is over before the server looks
    real_rename = taking.os.rename

    def standby_answers_first(source: Any, target: Any) -> None:
        if Path(target).name.startswith("abandoned-") and (folder / f"taken-{record.id}.json").exists():
            real_rename(folder / f"taken-{record.id}.json", folder / f"serving-{record.id}.json")
        real_rename(source, target)
    monkeypatch.setattr(taking.os, "rename", standby_answers_first)
    assert taking.take_standby(store.root / "standby", record) is None
    assert names(store) == [f"serving-{record.id}.json"]


def test_a_standby_that_never_answers_is_taken_back_and_finds_nothing_to_serve(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    store = store_at(tmp_path)
    publish(store)
    monkeypatch.setattr(taking, "TAKE_ANSWER_S", 0.05)
    assert taking.take_standby(store.root / "standby", job()) == "the standby did not answer in time"
    assert names(store) == []  # no taken- file left for a standby woken later to serve


ANSWERING = ("import json, sys\n"
             "for line in sys.stdin:\n"
             "    print(json.dumps({'jsonrpc': '2.0', 'id': json.loads(line)['id'], 'error': {'code': -32601}}), "
             "flush=True)\n")


class Waiting:
    """A standby's wait_for_a_job in a thread, with a process standing for its Hermes: one that answers every
    request with an error, as Hermes' JSON-RPC layer answers a method it does not know, or one that never reads."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fits: bool = True, answers: bool = True):
        self.cfg = config_for(tmp_path, standby_idle_s=600)
        self.store = JobStore.of(self.cfg)
        self.folder = standby.standby_folder(self.store)
        self.folder.mkdir(parents=True)
        self.hermes = subprocess.Popen([sys.executable, "-c", ANSWERING if answers else "import time; time.sleep(60)"],
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        warm = SimpleNamespace(hermes=WarmHermes(self.hermes))
        shape = {"network": "open", "worktree": None}
        self.standby = standby.Standby("key-1", str(tmp_path), shape, MARKER, cast(Any, warm), 0.1)
        monkeypatch.setattr(standby, "still_fits", lambda _cfg, _held: fits)
        monkeypatch.setattr(standby, "STALE_CHECK_S", 0.0)
        monkeypatch.setattr(standby, "LOOK_S", 0.0)
        self.outcome: list[str | None] = []
        self.thread = threading.Thread(target=lambda: self.outcome.append(
            standby.wait_for_a_job(self.cfg, self.store, self.folder, self.standby)), daemon=True)

    def __enter__(self) -> "Waiting":
        self.thread.start()
        deadline = time.monotonic() + 10
        while not (self.folder / "ready.json").exists() and self.thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.hermes.kill()
        self.hermes.wait()

    def ended(self, timeout: float = 10) -> list[str | None]:
        self.thread.join(timeout)
        return self.outcome


def test_a_standby_whose_settings_went_stale_retires_on_its_own(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """standby.py:218: Hermes' home or the settings changed since it was readied: it retires (its ready file
    gone, so no server reads it as waiting), not only when a job tries to take it or it has been idle long."""
    with Waiting(tmp_path, monkeypatch, fits=False) as waiting:
        assert waiting.ended() == [None]
        assert not (waiting.folder / "ready.json").exists()


def test_a_standby_steps_aside_when_a_job_elsewhere_wants_one(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """standby.py:221: a job in another folder (another key) asked for a standby: this one retires, or that
    folder would never get warm."""
    with Waiting(tmp_path, monkeypatch) as waiting:
        time.sleep(0.3)
        assert waiting.thread.is_alive()  # it fits and nobody else wants one: it waits
        (waiting.folder / "wanted.json").write_text(json.dumps({"key": "key-2"}))
        assert waiting.ended() == [None]
        assert not (waiting.folder / "ready.json").exists()


def test_a_standby_wanted_for_its_own_key_keeps_waiting_and_serves(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    with Waiting(tmp_path, monkeypatch) as waiting:
        (waiting.folder / "wanted.json").write_text(json.dumps({"key": "key-1"}))
        time.sleep(0.3)
        assert waiting.thread.is_alive()
        (waiting.folder / "ready.json").rename(waiting.folder / "taken-20261205-120000-abcdef.json")
        assert waiting.ended() == ["20261205-120000-abcdef"]
        assert (waiting.folder / "serving-20261205-120000-abcdef.json").exists()


def test_a_standby_whose_hermes_does_not_answer_refuses_the_job_and_says_why(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 65's fault: a standby whose Hermes is frozen or stuck would take the job and leave it waiting for
    ever. Handed a job, it asks its Hermes first; with no answer, the job is the server's to start cold, and its
    START says why."""
    with Waiting(tmp_path, monkeypatch, answers=False) as waiting:
        publish(waiting.store, MARKER)
        assert taking.take_standby(waiting.folder, job()) == (
            "the warm Hermes could not take it: its Hermes is not answering (Hermes did not answer bridge/ping "
            "within 1.5 s)")
        assert waiting.ended() == [None]
        assert names(waiting.store) == ["prepared.json"]  # nothing left for it or another server to serve
    standby.let_go(waiting.folder, "20261205-120000-abcdef", "too late: the server took the job back already")
    assert names(waiting.store) == ["prepared.json"]  # and no reason left behind that nobody reads


def test_a_warm_job_refused_before_hermes_got_its_task_leaves_no_hermes_running(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """standby.py:246: the supervisor ended the job before the task was sent (a budget, a refused folder):
    the standby's Hermes is stopped with it, not left waiting forever."""
    with Waiting(tmp_path, monkeypatch) as waiting:
        dismissed: list[str] = []

        def dismiss(_cfg: Any, warm: Any, marker: str) -> None:
            dismissed.append(marker)
            warm.hermes.proc.kill()
        monkeypatch.setattr(standby, "dismiss", dismiss)
        monkeypatch.setattr(standby, "Supervisor", lambda *_args, **_kwargs: SimpleNamespace(
            on_sigterm=lambda *_args: None, run=lambda: 1))
        monkeypatch.setattr(standby.signal, "signal", lambda *_args: None)
        monkeypatch.setattr(standby.os, "dup2", lambda *_args: None)  # keep this test's own output
        waiting.standby.warm.policy_dir = tmp_path / "policy"
        waiting.store.log_path("20261205-120000-abcdef").touch()
        (waiting.folder / "ready.json").unlink()
        assert standby.serve(waiting.cfg, waiting.store, waiting.folder, "20261205-120000-abcdef", waiting.standby,
                             False) == 1
        assert dismissed == [MARKER]
        assert waiting.hermes.wait(10) is not None


def test_a_killed_standbys_folders_are_swept_and_a_live_ones_kept(tmp_path: Path) -> None:
    """Its private temporary folder and its policy (named by its pid) outlive a standby killed before its
    cleanup; the next standby removes those whose process is gone, never a live one's, nor a job's."""
    store = JobStore.of(config_for(tmp_path))
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead, alive = f"standby-{gone.pid}-{'a' * 12}", f"standby-{os.getpid()}-{'b' * 12}"
    for parent in (store.root / "tmp", store.root / "policies"):
        for name in (dead, alive, "20261205-120000-1"):
            (parent / name).mkdir(parents=True)
    standby.sweep_leftovers(store)
    for parent in (store.root / "tmp", store.root / "policies"):
        assert sorted(path.name for path in parent.iterdir()) == ["20261205-120000-1", alive]


def test_a_standby_is_readied_only_once_every_acp_job_started_lately_has_its_task(tmp_path: Path,
                                                                                    monkeypatch: Any) -> None:
    """Three jobs started together: the standby the first asked for, prepared beside the other two's cold starts,
    slowed each of them (bench: jobs_together_rows); it waits for all of them now, and for nothing else."""
    store = JobStore(tmp_path / "jobs")
    store.active.mkdir(parents=True)
    now = time.time()
    kinds = {"asked": ("acp", JobState.STARTING, now), "sibling": ("acp", JobState.STARTING, now),
             "cli": ("cli", JobState.RUNNING, now), "queued": ("acp", JobState.QUEUED, now),
             "long ago": ("acp", JobState.STARTING, now - standby.PAST_START_S - 1)}
    ids = {}
    for number, (kind, (driver, state, created)) in enumerate(kinds.items(), 1):
        ids[kind] = f"20261207-120000-{number}"
        store.write(JobRecord(id=ids[kind], driver=driver, state=state, created_at=created))
        store.mark_active(ids[kind])
    starting = {kind: standby.is_starting(store, job_id, asked=kind == "asked") for kind, job_id in ids.items()}
    assert starting == {"asked": True, "sibling": True, "cli": False, "queued": False, "long ago": False}
    monkeypatch.setattr(standby, "PAST_START_S", 3.0)

    def tasks_given() -> None:
        for kind in ("asked", "sibling"):
            time.sleep(0.6)
            record = store.read(ids[kind])
            record.prompt_sent_at = time.time()
            store.write(record)
    giver = threading.Thread(target=tasks_given)
    giver.start()
    started = time.monotonic()
    standby.wait_past_starts(store, ids["asked"])
    waited = time.monotonic() - started
    giver.join()
    assert 1.1 <= waited < 2.5, waited  # past both tasks (the sibling's last), not the deadline
