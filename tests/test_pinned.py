"""Behaviours a deliberate-bug pass found unpinned (issue 22): each test fails when its behaviour breaks."""
import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from typing import Any

import psutil
import pytest

import server


def config_for(tmp_path, **values):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"jobs_dir": str(tmp_path / "jobs"), **values}))
    return server.load_config(path)


def test_a_same_size_edit_is_listed_as_modified():
    before = server.FolderSnapshot({"a.txt": (5, 1_000), "b.txt": (3, 1_000)}, taken_ns=2_000)
    after = server.FolderSnapshot({"a.txt": (5, 3_000), "b.txt": (3, 1_000)}, taken_ns=4_000)
    changes = server.compare_snapshots(before, after)
    assert (changes["created"], changes["modified"], changes["deleted"]) == (0, 1, 0)
    assert changes["lines"] == ["~ a.txt (5 B)"]


def test_more_than_fifty_changes_are_cut_with_the_count():
    before = server.FolderSnapshot({}, taken_ns=1)
    after = server.FolderSnapshot({f"f{i:02d}": (1, 5) for i in range(57)}, taken_ns=10)
    changes = server.compare_snapshots(before, after)
    assert len(changes["lines"]) == server.CHANGED_LINES == 50 and changes["more"] == 7
    record = server.JobRecord(id="20261130-000000-1", state=server.JobState.OK, changes=changes)
    assert server.changes_lines(record)[-1] == "... and 7 more"


@pytest.mark.parametrize("separator", ["\u2028", "\u2029"])
def test_unicode_line_separators_are_escaped_in_quoted_values(separator):
    quoted = server.shown(f"folder{separator}STATUS: ok")
    assert separator not in quoted and "STATUS: ok" in quoted
    assert quoted.startswith("folder\\u202")


def test_an_answer_longer_than_max_output_chars_is_cut_and_says_how_much():
    lines = server.quoted_answer("a" * 120 + "\n" + "b" * 30, 100)
    assert lines == [server.ANSWER_PREFIX + "a" * 100, "[cut: 51 more characters]"]
    assert server.quoted_answer("short", 100) == [server.ANSWER_PREFIX + "short"]


def test_forged_changes_without_their_more_count_make_the_record_damaged():
    data = server.JobRecord(id="20261130-000000-1", state=server.JobState.OK).to_json()
    data["changes"] = {"created": 1, "modified": 0, "deleted": 0, "lines": ["+ x (1 B)"]}
    with pytest.raises(server.DamagedRecord):
        server.JobRecord.from_json(data, "20261130-000000-1")


def test_an_orphaned_job_is_rendered_with_the_part_done_advice(tmp_path):
    cfg = config_for(tmp_path)
    record = server.JobRecord(id="20261130-000000-1", state=server.JobState.ORPHANED, created_at=time.time() - 60,
                              ended_at=time.time(), reason="the supervisor died")
    text = server.render_status(server.JobView(record, server.JobState.ORPHANED), cfg)
    assert "STATUS: orphaned" in text and "Work may be part-done" in text


def test_hermes_upgraded_in_place_at_the_same_path_is_probed_again(tmp_path):
    exe = tmp_path / "hermes"
    exe.write_text("#!/bin/sh\necho 0.19\n")
    first = server.exe_fingerprint(str(exe))
    exe.write_text("#!/bin/sh\necho 0.22 upgraded\n")
    os.utime(exe, ns=(time.time_ns() + 10**9, time.time_ns() + 10**9))
    assert server.exe_fingerprint(str(exe)) != first


def test_a_multibyte_task_near_the_posix_argument_limit_is_refused_by_its_bytes():
    fits = "é" * ((server.POSIX_ARGUMENT_LIMIT - len(server.QUERY_OPTION)) // 2)
    assert server.argv_problem(["hermes", server.QUERY_OPTION + fits], windows=False) is None
    too_long = fits + "é"  # fewer characters than the limit, more bytes
    assert len(server.QUERY_OPTION + too_long) < server.POSIX_ARGUMENT_LIMIT
    problem = server.argv_problem(["hermes", server.QUERY_OPTION + too_long], windows=False)
    assert problem and "bytes" in problem


def test_hermes_home_from_the_config_wins_and_otherwise_the_environment_is_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("HERMES_HOME", "/from/the/environment")
    assert server.hermes_env(config_for(tmp_path))["HERMES_HOME"] == "/from/the/environment"
    home = tmp_path / "hermes-home"
    home.mkdir()
    assert server.hermes_env(config_for(tmp_path, hermes_home=str(home)))["HERMES_HOME"] == str(home)


def test_a_config_beside_server_py_is_used_only_without_hermes_bridge_config(tmp_path, monkeypatch):
    chosen = tmp_path / "chosen.json"
    monkeypatch.setenv("HERMES_BRIDGE_CONFIG", str(chosen))
    assert server.config_path() == chosen
    monkeypatch.delenv("HERMES_BRIDGE_CONFIG")
    monkeypatch.setattr(server, "SERVER_DIR", tmp_path)
    (tmp_path / "config.json").write_text("{}")
    assert server.config_path() == tmp_path / "config.json"


def skill_md(folder, name="s"):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "SKILL.md").write_text(f"---\nname: {name}\ndescription: d\n---\nbody\n")


@pytest.mark.posix("symlinks need privileges on Windows")
def test_a_symlinked_folder_under_skills_is_not_followed(tmp_path):
    skills = tmp_path / "skills"
    skill_md(skills / "cat" / "inside")
    skill_md(tmp_path / "elsewhere" / "outside")
    (skills / "cat" / "linked").symlink_to(tmp_path / "elsewhere")
    files, note = server.SkillIndex().files(str(skills))
    assert files == [str(skills / "cat" / "inside" / "SKILL.md")] and note is None


def test_the_skill_depth_limit_holds_at_exactly_its_boundary(tmp_path):
    skills = tmp_path / "skills"
    at_limit = skills.joinpath(*[f"d{i}" for i in range(server.SKILL_TREE_DEPTH)])
    skill_md(at_limit)
    files, note = server.SkillIndex().files(str(skills))
    assert files == [str(at_limit / "SKILL.md")] and note is None
    skill_md(at_limit / "one-deeper")
    files, note = server.SkillIndex().files(str(skills))
    assert files == [str(at_limit / "SKILL.md")]
    assert note == f"folders deeper than {server.SKILL_TREE_DEPTH} levels are not searched"


def test_the_skill_folder_cap_stops_the_walk_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(server, "SKILL_TREE_FOLDERS", 5)
    skills = tmp_path / "skills"
    for i in range(8):
        skill_md(skills / f"c{i}")
    files, note = server.SkillIndex().files(str(skills))
    assert note == "stopped after 5 folders" and len(files) == 4


def test_front_matter_with_more_plain_yaml_events_than_the_limit_is_skipped(tmp_path):
    items = ", ".join("x" for _ in range(server.SKILL_YAML_EVENTS))
    path = tmp_path / "SKILL.md"
    path.write_text(f"---\nname: many\ntags: [{items}]\n---\n")
    with pytest.raises(server.SkippedSkill, match=f"more than {server.SKILL_YAML_EVENTS} YAML nodes"):
        server.front_matter(str(path))
    path.write_text("---\nname: few\ntags: [" + ", ".join("x" for _ in range(100)) + "]\n---\n")
    assert server.front_matter(str(path))["name"] == "few"


def test_two_registrations_within_one_second_keep_both_backups(tmp_path, monkeypatch):
    import register_with_claude as reg

    monkeypatch.setattr(reg.time, "strftime", lambda _format: "20261201-120000")  # both in the same second
    config = tmp_path / "claude_desktop_config.json"
    config.write_text('{"first": 1}')
    first = reg.write_safely(config, '{"second": 2}')
    second = reg.write_safely(config, '{"third": 3}')
    assert first and second and first != second
    assert first.read_text() == '{"first": 1}' and second.read_text() == '{"second": 2}'
    assert config.read_text() == '{"third": 3}'


def session_db(sessions, messages=()):
    import sqlite3

    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE sessions (id TEXT, cwd TEXT, started_at REAL)")
    db.execute("CREATE TABLE messages (id INTEGER PRIMARY KEY, session_id TEXT, role TEXT, content TEXT, "
               "timestamp REAL)")
    db.executemany("INSERT INTO sessions VALUES (?, ?, ?)", sessions)
    db.executemany("INSERT INTO messages (session_id, role, content, timestamp) VALUES (?, ?, ?, ?)", messages)
    return db


def test_two_sessions_started_in_the_jobs_folder_during_one_job_capture_none(tmp_path):
    folder = str(tmp_path)
    one = session_db([("20261201_100000_aaaaaa", folder, 100.0)])
    assert server.matched_session(one, folder, 100.0) == ("20261201_100000_aaaaaa", "found in the session store")
    two = session_db([("20261201_100000_aaaaaa", folder, 100.0), ("20261201_100001_bbbbbb", folder, 101.0)])
    session, why = server.matched_session(two, folder, 100.0)
    assert session is None and why == f"2 sessions in the store started in {folder} during the job"


def test_an_older_reply_of_a_resumed_session_is_never_its_answer():
    session = "20261201_100000_aaaaaa"
    db = session_db([(session, "/w", 10.0)], [(session, "assistant", "the earlier job's reply", 50.0)])
    assert server.final_answer(db, session, since=100.0) is None
    db.execute("INSERT INTO messages (session_id, role, content, timestamp) VALUES (?, 'assistant', 'this job', 120)",
               (session,))
    assert server.final_answer(db, session, since=100.0) == "this job"


@pytest.mark.parametrize(("yolo", "approvals", "mode"), [
    (False, None, "deny"), (True, None, "yolo"), (True, "deny", "yolo"), (True, "ask", "ask"),
    (False, "yolo", "yolo"), (False, "ask", "ask")])
def test_the_bundles_auto_approve_box_wins_over_its_default_deny_but_not_over_ask(yolo, approvals, mode):
    cfg = server.Config(path=server.SERVER_DIR / "config.json", yolo=yolo, approvals=approvals)
    assert cfg.approval_mode == mode


def test_capabilities_checks_its_arguments_before_walking_the_skills_tree(tmp_path, monkeypatch):
    def walked(_self, _skills_dir):
        raise AssertionError("the skills tree was walked for arguments that are refused anyway")
    monkeypatch.setattr(server.SkillIndex, "skills", walked)
    not_text: Any = 5  # what a host may send for query
    with pytest.raises(server.Refused, match="query and category must be text"):
        server.capabilities(config_for(tmp_path), server.SkillIndex(), not_text, None, None)


def test_parallel_tool_calls_are_running_until_every_one_has_its_result():
    import sqlite3

    session = "20261201_100000_aaaaaa"
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE messages (id INTEGER PRIMARY KEY, session_id TEXT, role TEXT, content TEXT, "
               "tool_calls TEXT, tool_call_id TEXT, timestamp REAL)")
    calls = [{"id": f"call_{n}", "type": "function",
              "function": {"name": "terminal", "arguments": json.dumps({"command": f"make part{n}"})}} for n in (1, 2)]
    db.execute("INSERT INTO messages (session_id, role, tool_calls, timestamp) VALUES (?, 'assistant', ?, 100)",
               (session, json.dumps(calls)))
    db.execute("INSERT INTO messages (session_id, role, tool_call_id, timestamp) VALUES (?, 'tool', 'call_1', 101)",
               (session,))
    assert server.current_tool(db, session, since=50, now=110) == "terminal: make part2 (running 10 s)"
    db.execute("INSERT INTO messages (session_id, role, tool_call_id, timestamp) VALUES (?, 'tool', 'call_2', 102)",
               (session,))
    assert server.current_tool(db, session, since=50, now=110) == "terminal: make part2 (finished)"


# A stand-in for a supervisor: it starts the command it is given and waits for it. Stops in these tests are
# anchored on it, never on the test's own process, whose other children belong to other tests.
WAITS = "import subprocess, sys; sys.exit(subprocess.run(sys.argv[1:]).returncode)"

FORKS_ON_SIGTERM = """
import os, signal, subprocess, sys, time
def forks(*_):
    if sys.argv[1] == "detached":  # re-parented away from this process at once
        shell = ["sh", "-c", "sleep 60 >/dev/null 2>&1 & echo $!"]
        late = subprocess.run(shell, capture_output=True, text=True).stdout.strip()
    else:
        late = str(subprocess.Popen(["sleep", "60"]).pid)
    open(sys.argv[2], "w").write(late)
signal.signal(signal.SIGTERM, forks)
print("ready", os.getpid(), flush=True)
while True:
    time.sleep(1)
"""


@pytest.mark.posix("POSIX signals, sh and env")
@pytest.mark.parametrize(("fork", "require_descent"), [("child", True), ("detached", False)],
                         ids=["a-child-found-by-descent", "a-detached-process-found-by-its-marker"])
def test_a_process_forked_during_a_stop_is_caught_by_a_later_sweep(tmp_path, fork, require_descent):
    """Hermes (the root, below a supervisor) answers the polite stop by starting one more process, after the
    first snapshot was taken."""
    marker = "20261130-000000-1:" + secrets.token_hex(16)  # unique: the sweep looks at every process
    late_pid = tmp_path / "late.pid"
    hermes = ["env", f"HERMES_BRIDGE_JOB={marker}", sys.executable, "-c", FORKS_ON_SIGTERM, fork, str(late_pid)]
    supervisor = subprocess.Popen([sys.executable, "-c", WAITS, *hermes], stdout=subprocess.PIPE, text=True)
    started: list[int] = []
    try:
        assert supervisor.stdout is not None
        ready, root = supervisor.stdout.readline().split()
        started.append(int(root))
        assert ready == "ready"
        owner = server.Ownership(marker, frozenset({supervisor.pid}), require_descent=require_descent)
        report = server.stop_tree(owner, psutil.Process(int(root)), [], grace_s=2)
        started.append(late := int(late_pid.read_text()))
        assert report.survivors == [] and report.stopped == 2, report
        with contextlib.suppress(psutil.NoSuchProcess):
            assert server.still_running([psutil.Process(late)], 5) == []
    finally:
        supervisor.kill()
        supervisor.wait()
        for pid in started:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


STOPS_ITS_OWN_MARKER = """
import json, os, subprocess, sys, psutil
sys.path.insert(0, sys.argv[1])
import server
victim = subprocess.Popen(["sleep", "60"])
ancestor = psutil.Process().parent()
owner = server.Ownership(os.environ["HERMES_BRIDGE_JOB"], frozenset({ancestor.pid}), require_descent=sys.argv[2] == "1")
report = server.stop_tree(owner, ancestor, [], grace_s=1)
print(json.dumps({"stopped": report.stopped, "victim": victim.wait(timeout=10)}), flush=True)
"""


@pytest.mark.posix("POSIX signals")
@pytest.mark.parametrize("require_descent", [True, False], ids=["by-descent", "by-marker"])
def test_a_protected_process_carrying_the_marker_is_never_signalled_by_a_stop(require_descent):
    """The stopping process and its ancestor both carry the job's marker, and a record names the ancestor
    as the job's root: only the marked child below is stopped; the stopper and the ancestor live on."""
    marker = "20261130-000000-1:" + secrets.token_hex(16)
    stopper = [sys.executable, "-c", STOPS_ITS_OWN_MARKER, str(server.SERVER_DIR), "1" if require_descent else "0"]
    ancestor = subprocess.run([sys.executable, "-c", WAITS, *stopper], capture_output=True, text=True, timeout=60,
                              env=dict(os.environ, HERMES_BRIDGE_JOB=marker))
    assert ancestor.returncode == 0, ancestor.stderr
    assert json.loads(ancestor.stdout) == {"stopped": 1, "victim": -signal.SIGKILL}
