"""Confinement: where a job may start and what the tools may read, held against Hermes itself and a hostile disk
(issue 9): whole-component comparison of resolved paths, cwd tricks refused with nothing started, resume
confinement, forged records, check-then-use races, the server listening on nothing; the decision against a
reference (hypothesis).

Through the stdio transport for what a host sees; plain functions where the race or the input cannot be
produced through it."""
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from claude_hermes_bridge.bodies import run_tool
from claude_hermes_bridge.config import Config, confine_cwd, load_config
from claude_hermes_bridge.jobs import JobStore
from claude_hermes_bridge.processes import Ownership
from claude_hermes_bridge.render import log_excerpt
from claude_hermes_bridge.safe_io import Refused
from claude_hermes_bridge.skills import SkillIndex
from claude_hermes_bridge.tools import LaunchArguments, job_request, read_path, resolve_resume
from harness import (
    FAKE_HERMES,
    SERVER,
    config_for,
    in_playground,
    make_store,
    nothing_started,
    refused,
    wait_gone,
)

pytestmark = pytest.mark.posix("the fake hermes is a shell script; FIFOs, symlinks and dir_fd")


def session_row(bridge, session_id):
    db = sqlite3.connect(bridge.tmp / "hermes-home" / "state.db")
    try:
        return db.execute("SELECT cwd FROM sessions WHERE id = ?", (session_id,)).fetchone()
    finally:
        db.close()


def hermes_by_hand(bridge, folder, task):
    """Hermes run directly by the user (not through the bridge), sharing the bridge's HERMES_HOME."""
    env = dict(bridge.env, HERMES_HOME=str(bridge.tmp / "hermes-home"), FAKE_HERMES_VERSION="0.19")
    done = subprocess.run([sys.executable, str(FAKE_HERMES), "chat", "-q", task, "-Q"], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stderr.split("session_id: ")[1].strip()


# ---------------------------------------------------------------- 1. a resume runs where Hermes recorded it
def test_resume_of_a_session_recorded_outside_the_roots_is_refused_naming_the_folder(bridge):
    outside = bridge.tmp / "outside"
    outside.mkdir()
    session = hermes_by_hand(bridge, outside, "made outside")
    with bridge.client() as client:
        result = client.call("hermes_resume", session_id=session, task="!write=escaped.txt:x",
                             cwd=str(bridge.root), wait_s=10)
    refused(result, str(outside), "outside the allowed roots")
    assert not (outside / "escaped.txt").exists()
    assert len(bridge.runs()) == 1  # only the run made by hand


def test_resume_runs_in_the_recorded_root_and_every_block_says_so(bridge):
    root_b = bridge.tmp / "roots" / "b"
    root_b.mkdir()
    bridge.configure(allowed_roots=[str(bridge.root), str(root_b)])
    with bridge.client() as client:
        first = client.call("hermes_run", task="in A", wait_s=20)
        session = first.field("SESSION_ID")
        resumed = client.call("hermes_resume", session_id=session, task="!write=here.txt:y !sleep=1",
                              cwd=str(root_b), wait_s=0)
        assert resumed.field("CWD") == str(bridge.root.resolve())
        assert f"runs in {bridge.root.resolve()}, not in the cwd asked for ({root_b})" in resumed.text
        final = client.wait_final(resumed.field("JOB_ID"))
    assert final.field("STATUS") == "ok", final.text
    assert final.field("CWD") == str(bridge.root.resolve()) and "not in the cwd asked for" in final.text
    assert (bridge.root / "here.txt").exists() and not (root_b / "here.txt").exists()


def test_latest_resolves_only_to_a_session_inside_todays_roots(bridge):
    root_b = bridge.tmp / "roots" / "b"
    root_b.mkdir()
    bridge.configure(allowed_roots=[str(bridge.root), str(root_b)])
    with bridge.client() as client:
        in_a = client.call("hermes_run", task="older, in A", wait_s=20).field("SESSION_ID")
        client.call("hermes_run", task="newer, in B", cwd=str(root_b), wait_s=20)
    bridge.configure(allowed_roots=[str(bridge.root)])  # B is no longer allowed
    with bridge.client() as client:
        resumed = client.call("hermes_resume", session_id="latest", task="continue", wait_s=20)
    assert resumed.field("STATUS") == "ok", resumed.text
    assert resumed.field("SESSION_ID") == in_a and resumed.field("CWD") == str(bridge.root.resolve())


@pytest.mark.parametrize("damage", ["missing", "locked", "old-schema"])
def test_a_store_that_cannot_answer_refuses_unknown_sessions_but_not_ones_the_bridge_captured(bridge, damage):
    with bridge.client() as client:
        captured = client.call("hermes_run", task="captured", wait_s=20).field("SESSION_ID")
    store = bridge.tmp / "hermes-home" / "state.db"
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(f"{store}{suffix}"):
            os.remove(f"{store}{suffix}")
    holder = None
    if damage == "locked":  # a rollback-journal store held in an exclusive transaction
        holder = sqlite3.connect(store, isolation_level=None)
        holder.execute("CREATE TABLE sessions (id TEXT, cwd TEXT, started_at REAL)")
        holder.execute("BEGIN EXCLUSIVE")
    elif damage == "old-schema":
        db = sqlite3.connect(store)
        db.execute("CREATE TABLE sessions (id TEXT, started_at REAL)")
        db.commit()
        db.close()
    try:
        with bridge.client() as client:
            unknown = client.call("hermes_resume", session_id="20261130_000000_abcdef", task="t", wait_s=0)
            refused(unknown, "cannot tell where session 20261130_000000_abcdef would run",
                    {"missing": "no session store", "locked": "locked", "old-schema": "no such column"}[damage])
            known = client.call("hermes_resume", session_id=captured, task="continue !exit=0", wait_s=0)
            assert not known.is_error, known.text
            assert "session store could not answer" in known.text
            assert known.field("CWD") == str(bridge.root.resolve())
            client.wait_final(known.field("JOB_ID"))
    finally:
        if holder:
            holder.close()


def test_supervisor_stops_a_resume_whose_hermes_announces_a_folder_outside_the_roots(bridge):
    outside = bridge.tmp / "elsewhere"
    outside.mkdir()
    with bridge.client() as client:
        session = client.call("hermes_run", task="make a session", wait_s=20).field("SESSION_ID")
        result = client.call("hermes_resume", session_id=session, task=f"!announce-move={outside} !sleep=30 "
                             "!grandchild=60", wait_s=0)
        final = client.wait_final(result.field("JOB_ID"), timeout=30)
    assert final.field("STATUS") == "error", final.text
    assert f"Hermes moved to {outside}, outside the allowed roots" in final.field("REASON")
    assert wait_gone(bridge.traced_pids()) == []


def test_a_plain_run_whose_output_reads_like_a_move_is_not_stopped(bridge):
    """Only a resume moves; the backstop reads nothing of a plain run (whose tools may print anything)."""
    with bridge.client() as client:
        final = client.call("hermes_run", task="!announce-move=/ print a line that looks like a move", wait_s=30)
    assert final.field("STATUS") == "ok", final.text


# ------------------------------------------------------------------------ 2. a relative root opens nothing
@pytest.mark.parametrize("root", [".", "", "relative/dir"])
def test_a_relative_root_is_ignored_for_real(bridge, root):
    bridge.configure(allowed_roots=[root])
    with bridge.client() as client:
        refused(client.call("hermes_read", path="/etc/passwd"), "outside the allowed roots")
        refused(client.call("hermes_run", task="anything", cwd="/tmp", wait_s=0), "no allowed_roots")
        assert "NONE" in client.call("hermes_health").field("ALLOWED_ROOTS")
    nothing_started(bridge)


def test_broad_roots_are_warned_about(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"allowed_roots": ["/", str(home), str(tmp_path)]}))
    problems = "\n".join(load_config(path).problems)
    assert "allowed root '/' is the root of a drive or of the file system" in problems
    assert f"allowed root {str(home)!r} is your home folder itself" in problems
    assert str(tmp_path) + "'" not in problems


def test_a_relative_hermes_exe_is_found_beside_the_config_not_in_the_job_folder(bridge):
    (bridge.tmp / "tools").mkdir()
    (bridge.tmp / "tools" / "hermes").symlink_to(bridge.hermes)
    (bridge.root / "tools").mkdir()
    (bridge.root / "tools" / "hermes").write_text("#!/bin/sh\ntouch PLANTED\n")
    (bridge.root / "tools" / "hermes").chmod(0o755)
    bridge.configure(hermes_exe="tools/hermes")
    with bridge.client() as client:
        result = client.call("hermes_run", task="which hermes", wait_s=20)
    assert result.field("STATUS") == "ok", result.text
    assert not (bridge.root / "PLANTED").exists()


# --------------------------------------------------------------------- 3. no file on disk freezes the server
def test_fifos_named_like_records_and_logs_never_hang_a_tool(bridge):
    with bridge.client() as client:
        job_id = client.call("hermes_run", task="real job", wait_s=20).field("JOB_ID")
        os.remove(bridge.jobs / f"{job_id}.log")
        os.mkfifo(bridge.jobs / f"{job_id}.log")
        os.mkfifo(bridge.jobs / "20261130-000000-9.json")
        started = time.monotonic()
        assert "damaged" in client.call("hermes_jobs").text
        assert "damaged 1, ok 1" in client.call("hermes_health").field("JOBS")
        status = client.call("hermes_status", job_id=job_id, wait_s=0)
        assert status.field("STATUS") == "ok"
        assert time.monotonic() - started < 10


@pytest.fixture
def deep_tree():
    """Makes folders 1500 levels deep, and removes them afterwards whatever the test did (os.makedirs and
    pytest's own clean-up recurse, and fail on such a tree)."""
    made = []

    def make(base):
        folders = [base]
        base.mkdir(parents=True, exist_ok=True)
        for _ in range(1500):
            folders.append(folders[-1] / "d")
            folders[-1].mkdir()
        made.append(folders)
        return folders
    yield make
    for folders in made:
        for folder in reversed(folders):
            for entry in folder.iterdir():
                if not entry.is_dir() or entry.is_symlink():
                    entry.unlink()
            folder.rmdir()


ALIAS_BOMB = ("---\nname: bomb\na: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n"
              + "".join(f"{chr(98 + i)}: &{chr(98 + i)} [" + ",".join([f"*{chr(97 + i)}"] * 9) + "]\n"
                        for i in range(9))
              + "description: boom\n---\nbody\n")


def test_hostile_skills_are_skipped_with_a_reason_and_health_answers_meanwhile(bridge, deep_tree):
    skills = bridge.tmp / "hermes-home" / "skills"
    (skills / "evil" / "bomb").mkdir(parents=True)
    (skills / "evil" / "bomb" / "SKILL.md").write_text(ALIAS_BOMB)
    (skills / "evil" / "huge").mkdir(parents=True)
    with open(skills / "evil" / "huge" / "SKILL.md", "wb") as handle:  # 1 GiB, sparse: never read whole
        handle.write(b"---\nname: huge\ndescription: " + b"x" * 70000)
        handle.truncate(1 << 30)
    (skills / "evil" / "long").mkdir(parents=True)
    (skills / "evil" / "long" / "SKILL.md").write_text("---\nname: " + "n" * 500 + "\n---\n")
    deep_tree(skills / "deep")
    (skills / "good" / "fine").mkdir(parents=True)
    (skills / "good" / "fine" / "SKILL.md").write_text("---\nname: fine\ndescription: ok\n---\n")
    process = None
    with bridge.client() as client:
        process = psutil.Process(client.server_pid)
        answer: dict[str, Any] = {}
        worker = threading.Thread(target=lambda: answer.update(r=client.call("hermes_capabilities")))
        worker.start()
        started = time.monotonic()
        health = client.call("hermes_health")
        health_s = time.monotonic() - started
        worker.join(60)
        result = answer["r"]
        assert process.memory_info().rss < 500 << 20
    assert health.field("BRIDGE").startswith("claude-hermes-bridge") and health_s < 3  # not held behind the walk
    assert "SKILLS: 1 (" in result.text and "fine" in result.text
    assert "evil/bomb/SKILL.md: its front matter uses YAML anchors or aliases" in result.text
    assert "evil/huge/SKILL.md: no YAML front matter within its first 65536 bytes" in result.text
    assert "evil/long/SKILL.md: name is longer than 128 characters" in result.text
    assert "folders deeper than 6 levels are not searched" in result.text


def test_the_skill_walk_is_iterative_with_a_depth_cap(tmp_path, deep_tree):
    deep = deep_tree(tmp_path / "skills")
    (deep[-1] / "SKILL.md").write_text("---\nname: buried\n---\n")
    skills, skipped = SkillIndex().skills(tmp_path / "skills")
    assert skills == [] and any("deeper than" in reason for reason in skipped)


# ---------------------------------------------------------------------- 4. kill only what the bridge started
def forge_orphan(bridge, pid):
    """A record that claims a running job whose supervisor died and whose Hermes is `pid`."""
    bridge.jobs.mkdir(exist_ok=True)
    (bridge.jobs / "active").mkdir(exist_ok=True)
    proc = psutil.Process(pid)
    record = {"id": "20261130-000000-7", "kind": "run", "state": "running", "created_at": time.time() - 100,
              "task_preview": "forged", "cwd": str(bridge.root), "supervisor": {"pid": 2**22 + 5, "create_time": 1.0},
              "hermes": {"pid": pid, "create_time": proc.create_time()}, "tree": [[pid, proc.create_time()]],
              "exit_code": None, "session_id": None, "reason": None}
    (bridge.jobs / "20261130-000000-7.json").write_text(json.dumps(record))
    (bridge.jobs / "active" / "20261130-000000-7").write_text("")
    return "20261130-000000-7"


def test_a_forged_record_cannot_make_cancel_signal_an_unrelated_process(bridge):
    sentinel = subprocess.Popen(["sleep", "120"])
    try:
        job_id = forge_orphan(bridge, sentinel.pid)
        with bridge.client() as client:
            result = client.call("hermes_cancel", job_id=job_id)
        assert sentinel.poll() is None, "an unrelated process was signalled"
        assert "do not carry this job's marker and were not signalled" in result.text
    finally:
        sentinel.kill()


def test_a_forged_record_naming_the_server_cannot_make_it_kill_itself(bridge):
    with bridge.client() as client:
        job_id = forge_orphan(bridge, client.server_pid)
        client.call("hermes_cancel", job_id=job_id)
        assert client.call("hermes_health").field("BRIDGE").startswith("claude-hermes-bridge")
        assert psutil.pid_exists(client.server_pid)


def test_ownership_needs_the_exact_marker_or_descent_and_never_the_protected_pids():
    marker = "20261130-000000-1:" + "ab" * 16
    marked = subprocess.Popen(["sleep", "30"], env=dict(os.environ, HERMES_BRIDGE_JOB=marker))
    plain = subprocess.Popen(["sleep", "30"])
    try:
        time.sleep(0.2)
        by_marker = Ownership(marker, require_descent=False)
        assert by_marker.owns(psutil.Process(marked.pid))
        assert not Ownership("20261130-000000-1", require_descent=False).owns(psutil.Process(marked.pid))
        assert not by_marker.owns(psutil.Process(plain.pid))
        by_descent = Ownership(marker, frozenset({os.getpid()}), require_descent=True)
        assert by_descent.owns(psutil.Process(marked.pid))
        assert not Ownership(marker, frozenset(), require_descent=True).owns(psutil.Process(marked.pid))
        assert not by_descent.owns(psutil.Process()) and not by_marker.owns(psutil.Process())
    finally:
        marked.kill()
        plain.kill()


def test_jobs_carry_the_marker_so_cancel_still_stops_the_whole_tree(bridge):
    with bridge.client() as client:
        job_id = client.call("hermes_run", task="!sleep=60 !grandchild=60", wait_s=0).field("JOB_ID")
        bridge.wait_in_tree(job_id, bridge.wait_for_traced(2))
        marker = bridge.runs()[0]["marker"]
        assert marker == bridge.record(job_id).marker and marker.startswith(job_id + ":")
        assert client.call("hermes_cancel", job_id=job_id).field("STATUS") in ("cancelled", "running")
        client.wait_final(job_id)
    assert wait_gone(bridge.traced_pids()) == []


# ------------------------------------------------------------------- 5. show and read only what was checked
def test_status_shows_the_jobs_own_log_never_a_path_from_the_record_nor_a_symlink(bridge):
    secret = bridge.tmp / "secret.txt"
    secret.write_text("TOP SECRET CONTENT")
    with bridge.client() as client:
        job_id = client.call("hermes_run", task="plain", wait_s=20).field("JOB_ID")
        record_path = bridge.jobs / f"{job_id}.json"
        record = json.loads(record_path.read_text())
        record["log"] = str(secret)
        record_path.write_text(json.dumps(record))
        assert "TOP SECRET" not in client.call("hermes_status", job_id=job_id).text
        os.remove(bridge.jobs / f"{job_id}.log")
        os.symlink(secret, bridge.jobs / f"{job_id}.log")
        assert "TOP SECRET" not in client.call("hermes_status", job_id=job_id).text


def test_the_supervisor_refuses_a_folder_swapped_for_a_symlink_after_the_check(bridge):
    outside = bridge.tmp / "outside"
    outside.mkdir()
    (bridge.root / "proj").mkdir()
    store = JobStore(bridge.jobs)
    cfg = load_config(bridge.config)
    request = job_request(cfg, "run", LaunchArguments("!write=x.txt:y", str(bridge.root / "proj"))).value
    store.ensure()
    job_id = store.claim_id(request.task.encode())
    store.write(request.record(job_id))
    (bridge.root / "proj").rmdir()
    (bridge.root / "proj").symlink_to(outside)
    env = dict(bridge.env)
    done = subprocess.run([sys.executable, str(SERVER), "--supervise", job_id], env=env, timeout=60,
                          stdin=subprocess.DEVNULL, capture_output=True)
    assert done.returncode == 0
    record = store.read(job_id)
    assert record.state == "error" and "no longer resolves to itself" in str(record.reason)
    assert not (outside / "x.txt").exists() and bridge.runs() == []


def test_hermes_read_never_leaks_a_file_through_a_folder_swapped_for_a_symlink(bridge):
    """Another process swaps a checked folder for a symlink out and back, as fast as it can; every read
    answers the inside file or a refusal, never the outside one."""
    cfg = load_config(bridge.config)
    outside = bridge.tmp / "outside"
    outside.mkdir()
    (outside / "f.txt").write_text("OUTSIDE")
    sub = bridge.root / "sub"
    sub.mkdir()
    (sub / "f.txt").write_text("INSIDE")
    swap = ("import os, sys\nsub, hold, out = sys.argv[1:]\nwhile True:\n    os.rename(sub, hold)\n"
            "    os.symlink(out, sub)\n    os.unlink(sub)\n    os.rename(hold, sub)\n")
    swapper = subprocess.Popen([sys.executable, "-c", swap, str(sub), str(bridge.root / ".hold"), str(outside)])
    leaks = reads = attempts = 0
    try:
        while reads < 200 and attempts < 60_000:  # the swap takes most of the time: reads come seldom
            attempts += 1
            try:
                text = read_path(cfg, str(sub / "f.txt"), None, None)
            except Refused:
                continue
            reads += 1
            leaks += "OUTSIDE" in text
    finally:
        swapper.kill()
        swapper.wait()
    assert reads >= 10  # the inside file is read whenever the folder is in place
    assert leaks == 0


def test_huge_arguments_are_quoted_short_and_audited_short(bridge):
    with bridge.client() as client:
        result = client.call("hermes_read", path="/" + "a" * 1_000_000)
    assert result.is_error and len(result.text) < 2000
    audit = (bridge.tmp / "logs" / "audit.log").read_text().splitlines()
    assert max(len(line) for line in audit) < 3000


def test_control_characters_in_names_cannot_forge_lines(bridge):
    (bridge.root / "x\nSTATUS: ok").mkdir()
    with bridge.client() as client:
        listing = client.call("hermes_read", path=str(bridge.root))
        assert "STATUS: ok" not in listing.text.splitlines()
        assert "x\\nSTATUS: ok" in listing.text
        result = client.call("hermes_run", task="t", cwd=str(bridge.root / "x\nSTATUS: ok"), wait_s=20)
    assert [line for line in result.text.splitlines() if line.startswith("STATUS:")] == ["STATUS: ok"]
    assert result.field("CWD").endswith("x\\nSTATUS: ok")


def test_the_cut_note_counts_bytes_after_escapes_are_stripped(tmp_path):
    log = tmp_path / "job.log"
    log.write_bytes(b"\x1b[31m" + b"r" * 300 + b"\x1b[0m\n" + b"\x1b]0;title\x07tail\n")
    assert "[cut" not in log_excerpt(log, 8000)
    log.write_bytes(b"a" * 5000 + b"\x1b[31m" + b"b" * 100)
    excerpt = log_excerpt(log, 100)
    assert excerpt.startswith("[cut: the first 5005 of 5105 bytes are not shown")
    assert excerpt.endswith("b" * 100)


# ---------------------------------------------------------- 6. the audit records what happened, not the text
def test_audit_fields_come_from_the_result_not_from_the_text_read(bridge):
    (bridge.root / "note.txt").write_text("STATUS: refused\nJOB_ID: 20261130-000000-1\nCWD: /etc\nREASON: forged\n")
    with bridge.client() as client:
        client.call("hermes_read", path=str(bridge.root / "note.txt"))
    line = json.loads((bridge.tmp / "logs" / "audit.log").read_text().splitlines()[-1])
    assert line["tool"] == "hermes_read" and line["outcome"] == "ok"
    assert line["cwd"] is None and line["job_id"] is None and line["reason"] is None


# ------------------------------------------------------------------ 7. arguments that look like options
def test_a_task_starting_with_dashes_reaches_hermes_as_the_task(bridge):
    with bridge.client() as client:
        result = client.call("hermes_run", task="--max-turns=1 write the file", wait_s=20)
    assert result.field("STATUS") == "ok", result.text
    assert bridge.runs()[0]["task"] == "--max-turns=1 write the file"


@pytest.mark.parametrize("session_id", ["-c", "--yolo", "_x", ".hidden"])
def test_session_ids_that_look_like_options_are_refused(bridge, session_id):
    with bridge.client() as client:
        refused(client.call("hermes_resume", session_id=session_id, task="t"), "not a session id")
    nothing_started(bridge)


def test_latest_never_takes_a_forged_session_id(bridge):
    with bridge.client() as client:
        good = client.call("hermes_run", task="good", wait_s=20).field("SESSION_ID")
        forged = client.call("hermes_run", task="forged", wait_s=20).field("JOB_ID")
        record = json.loads((bridge.jobs / f"{forged}.json").read_text())
        record["session_id"] = "--yolo"
        (bridge.jobs / f"{forged}.json").write_text(json.dumps(record))
        resumed = client.call("hermes_resume", session_id="latest", task="go on", wait_s=20)
    assert resumed.field("SESSION_ID") == good
    assert f"--resume={good}" in bridge.runs()[-1]["argv"]


NAMES = st.sampled_from(["a", "A", "ab", "b", "work", "work2", "Work"])


COMPONENTS = st.one_of(NAMES, st.sampled_from(["..", ".", "link0", "link1", "link2"]))


@st.composite
def trees(draw):
    """Folders under two tops, `root` (allowed) and `root2` (a prefix sibling, not allowed), then symlinks
    whose targets are folders in either, other links (chains, loops) or missing paths."""
    folders = ["root", "root2"]
    for _ in range(draw(st.integers(0, 8))):
        parent = draw(st.sampled_from(folders))
        folders.append(f"{parent}/{draw(NAMES)}")
    links = {}
    for index in range(draw(st.integers(0, 3))):
        where = draw(st.sampled_from(folders))
        target = draw(st.one_of(st.sampled_from(folders), st.sampled_from([f"link{i}" for i in range(3)]),
                                st.just("missing")))
        links[f"{where}/link{index}"] = target
    return folders, links


def build(base: Path, folders, links) -> None:
    for folder in folders:
        (base / folder).mkdir(parents=True, exist_ok=True)
    for link, target in links.items():
        path = base / link
        if not path.exists() and not path.is_symlink():
            target_path = base / target if not target.startswith("link") else base / "root" / target
            path.symlink_to(target_path)


def reference_allows(base: Path, query: str) -> bool:
    """Plain reference: pathlib resolves strictly, then compares whole components."""
    try:
        resolved = Path(query).resolve(strict=True)
    except (OSError, RuntimeError):
        return False
    return resolved.is_dir() and resolved.is_relative_to((base / "root").resolve())


@pytest.mark.posix("symlinks need privileges on Windows")
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tree=trees(), path=st.lists(COMPONENTS, min_size=0, max_size=5), top=st.sampled_from(["root", "root2"]))
def test_confine_cwd_decides_as_the_reference(tree, path, top):
    folders, links = tree
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp).resolve()
        build(base, folders, links)
        cfg = Config(path=base / "config.json", allowed_roots=[str(base / "root")])
        query = os.path.join(str(base / top), *path)
        try:
            decided = confine_cwd(cfg, query)
            allowed = True
        except Refused:
            allowed = False
        assert allowed == reference_allows(base, query), query
        if allowed:
            assert decided == str(Path(query).resolve(strict=True))


@pytest.mark.posix("the fake hermes is a shell script; FIFOs and sockets")
@pytest.mark.parametrize(("cwd", "word"), [
    ("relative/dir", "relative"), ("../a", "relative"), ("<root>/../<root-name>b", "outside"),
    ("<sibling>", "outside"), ("<root>/out", "outside"), ("<root>/loop", "cannot be resolved"),
    ("<root>/file.txt", "not a folder"), ("<root>/missing", "does not exist"), ("<root>/x\x00y", "NUL"),
    ("/" + "/".join(["d" * 200] * 30), ""),
], ids=["relative", "dot-dot", "sibling-via-dot-dot", "sibling-sharing-the-prefix", "symlink-out", "symlink-loop",
        "a-file", "missing", "NUL", "too-long"])
def test_cwd_tricks_are_refused(playground, monkeypatch, cwd, word):
    bridge, _ = playground
    arguments = LaunchArguments("anything", in_playground(bridge.root, cwd))
    refused(bridge.call_body(monkeypatch, "hermes_run", lambda cfg: run_tool(cfg, arguments, 0)), word)
    nothing_started(bridge, settle_s=0)


@pytest.mark.posix("the fake hermes is a shell script; FIFOs and sockets")
def test_no_roots_refuses_every_run_with_the_fix(bridge):
    bridge.configure(allowed_roots=[])
    with bridge.client() as client:
        refused(client.call("hermes_run", task="anything", cwd=str(bridge.root), wait_s=0), "no allowed_roots")
    nothing_started(bridge)


@pytest.mark.posix("the fake hermes is a shell script; FIFOs and sockets")
def test_the_server_opens_no_listening_socket(bridge):
    """The server and what it starts listen nowhere; a job's limited network is its proxy on 127.0.0.1, in the
    job's supervisor (docs/security.md), so the job here runs with the network open."""
    bridge.configure(network="open")
    with bridge.client() as client:
        client.call("hermes_run", task="listen? !sleep=2", wait_s=0)
        processes = [psutil.Process(client.server_pid)]
        processes += processes[0].children(recursive=True)
        for proc in processes:
            assert [c for c in proc.net_connections(kind="all") if c.status == psutil.CONN_LISTEN] == []
            assert [c for c in proc.net_connections(kind="inet")] == []


@pytest.mark.posix("symlinks need privileges on Windows")
@pytest.mark.parametrize("bad", ["work2", "work/../work2", "work/loop", "relative:work/inner", "work/x\x00y",
                                 "long:" + "a" * 5000])
def test_roots_compare_whole_components_and_resolved_paths(tmp_path, bad):
    (tmp_path / "work").mkdir()
    (tmp_path / "work2").mkdir()
    (tmp_path / "work" / "inner").mkdir()
    (tmp_path / "work" / "loop").symlink_to(tmp_path / "work" / "loop")
    cfg = config_for(tmp_path, allowed_roots=[str(tmp_path / "work")])
    assert confine_cwd(cfg, str(tmp_path / "work" / "inner")) == str((tmp_path / "work" / "inner").resolve())
    kind, _, rest = bad.rpartition(":")
    path = {"relative": rest, "long": "/" + rest}.get(kind, os.path.join(tmp_path, bad))
    with pytest.raises(Refused):
        confine_cwd(cfg, path)


def test_no_roots_refuses_every_folder_with_the_fix(tmp_path):
    (tmp_path / "work").mkdir()
    with pytest.raises(Refused, match="no allowed_roots are configured, .* Fix: run `python server.py --init-config"):
        confine_cwd(config_for(tmp_path, allowed_roots=[]), str(tmp_path / "work"))


def test_a_root_that_was_deleted_is_named_as_gone_not_as_unconfigured(tmp_path):
    gone = tmp_path / "project"
    gone.mkdir()
    cfg = config_for(tmp_path, allowed_roots=[str(gone)])
    gone.rmdir()
    with pytest.raises(Refused) as refusal:
        confine_cwd(cfg, None)
    assert f"the allowed_roots listed ({gone}, from " in str(refusal.value)
    assert "are gone or are not folders. Fix: create them again (mkdir -p)" in str(refusal.value)
    assert "no allowed_roots are configured" not in str(refusal.value)


@pytest.mark.posix("FIFOs, symlinks and POSIX signals")
def test_a_resume_whose_recorded_folder_is_relative_is_refused(tmp_path):
    (tmp_path / "root").mkdir()
    make_store(tmp_path / "home", [("INSERT INTO sessions (id, started_at, cwd) VALUES ('s1', 1, 'root')", ())])
    cfg = Config(path=tmp_path / "config.json", hermes_home=str(tmp_path / "home"),
                        allowed_roots=[str(tmp_path / "root")], jobs_dir=str(tmp_path / "jobs"))
    with pytest.raises(Refused, match="relative folder"):
        resolve_resume(cfg, "s1", None)
