"""Plain-function tests: confinement, liveness, the store and rendering, without MCP."""
import json
import os
import time
from typing import Any

import psutil
import pytest

import server


def config_for(tmp_path, **values):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(values))
    return server.load_config(path)


@pytest.mark.posix("symlinks need privileges on Windows")
@pytest.mark.parametrize("bad", ["work2", "work/../work2", "work/loop", "relative:work/inner", "work/x\x00y",
                                 "long:" + "a" * 5000])
def test_roots_compare_whole_components_and_resolved_paths(tmp_path, bad):
    (tmp_path / "work").mkdir()
    (tmp_path / "work2").mkdir()
    (tmp_path / "work" / "inner").mkdir()
    (tmp_path / "work" / "loop").symlink_to(tmp_path / "work" / "loop")
    cfg = config_for(tmp_path, allowed_roots=[str(tmp_path / "work")])
    assert server.confine_cwd(cfg, str(tmp_path / "work" / "inner")) == str((tmp_path / "work" / "inner").resolve())
    kind, _, rest = bad.rpartition(":")
    path = {"relative": rest, "long": "/" + rest}.get(kind, os.path.join(tmp_path, bad))
    with pytest.raises(server.Refused):
        server.confine_cwd(cfg, path)


def test_no_roots_refuses_every_folder_with_the_fix(tmp_path):
    (tmp_path / "work").mkdir()
    with pytest.raises(server.Refused, match="no allowed_roots"):
        server.confine_cwd(config_for(tmp_path, allowed_roots=[]), str(tmp_path / "work"))


def test_liveness_needs_pid_and_start_time():
    me = psutil.Process()
    assert server.ProcessId.of(me).process() is not None
    assert server.ProcessId(me.pid, me.create_time() - 100).process() is None  # a reused pid
    assert server.ProcessId(2**22 + 7, 1.0).process() is None
    assert server.running_process(None) is None


def running_record(**fields: Any) -> server.JobRecord:
    return server.JobRecord(id="20261130-000000-1", state=server.JobState.RUNNING, **fields)


def test_observe_reports_orphaned_jobs_and_supervisors_that_never_started():
    dead = server.ProcessId(2**22 + 9, 1.0)
    record = running_record(supervisor=dead, hermes=dead, created_at=time.time() - 100)
    view = server.observe(record)
    assert view.state == "orphaned" and "Hermes is not running" in str(view.reason)
    record.hermes = server.ProcessId.of(psutil.Process())
    assert "still running" in str(server.observe(record).reason)
    never_started = server.JobRecord(id="x", state=server.JobState.STARTING, created_at=time.time())
    assert server.observe(never_started).state == "starting" and server.observe(never_started).running
    never_started.created_at -= server.START_GRACE_S + 1
    assert server.observe(never_started).state == "orphaned"  # not "starting" for ever


def test_a_record_reads_back_as_the_json_a_launch_writes(tmp_path):
    """The typed record changes nothing on disk: the keys a launch writes, in that order, and the optional
    ones only once they are known."""
    store = server.JobStore(tmp_path)
    store.ensure()
    request = server.JobRequest(kind="run", task="do  it\n", cwd="/w", max_turns=3, timeout_s=60.0, skills=["a"],
                                toolsets=[])
    record = request.record("20261130-000000-1", "/jobs/20261130-000000-1.log")
    store.write(record)
    on_disk = json.loads(store.record_path(record.id).read_text())
    assert list(on_disk) == list(server.RECORD_ALWAYS_WRITTEN)
    assert on_disk["state"] == "starting" and on_disk["task_preview"] == "do it" and on_disk["supervisor"] is None
    record.hermes = server.ProcessId(42, 1.5)
    record.tree = [server.ProcessId(43, 2.5)]
    record.started_at = 10.0
    store.write(record)
    on_disk = json.loads(store.record_path(record.id).read_text())
    assert on_disk["hermes"] == {"pid": 42, "create_time": 1.5} and on_disk["tree"] == [[43, 2.5]]
    assert "ended_at" not in on_disk and "usage" not in on_disk
    assert store.read(record.id) == record


@pytest.mark.parametrize(("field", "value"), [
    ("state", "paused"), ("state", 1), ("created_at", "yesterday"), ("timeout_s", True), ("exit_code", 1.5),
    ("skills", "a,b"), ("skills", [1]), ("cwd", ["/w"]), ("supervisor", [1, 2]), ("hermes", {"pid": "1"}),
    ("hermes", {"pid": True, "create_time": 1.0}), ("tree", {"1": 2.0}), ("tree", [[1, 2.0, 3]]),
    ("tree", [["1", 2.0]]), ("usage", {"tokens_in": "many"}), ("changes", "lots"), ("id", "20261130-000000-2"),
    ("changes", {"created": 1, "modified": 0, "deleted": 0, "more": 0, "lines": 5}), ("changes", {"note": 5}),
    ("created_at", float("nan")), ("max_turns", float("inf")), ("hermes", {"pid": 1, "create_time": float("inf")}),
])
def test_a_record_field_of_the_wrong_shape_is_damaged_never_trusted(tmp_path, field, value):
    store = server.JobStore(tmp_path)
    store.ensure()
    data = running_record(cwd="/w").to_json() | {field: value}
    store.record_path("20261130-000000-1").write_text(json.dumps(data))
    with pytest.raises(server.DamagedRecord):
        store.read("20261130-000000-1")


def test_a_record_of_an_older_bridge_with_fewer_fields_is_read(tmp_path):
    store = server.JobStore(tmp_path)
    store.ensure()
    store.record_path("20261130-000000-1").write_text('{"id": "20261130-000000-1", "state": "ok", "extra": 1}')
    record = store.read("20261130-000000-1")
    assert record.state is server.JobState.OK and record.tree == [] and record.cwd is None


def test_job_ids_are_claimed_atomically(tmp_path):
    store = server.JobStore(tmp_path / "jobs")
    ids = {store.claim_id(b"task") for _ in range(50)}
    assert len(ids) == 50 and all(server.JOB_ID_RE.fullmatch(i) for i in ids)


@pytest.mark.parametrize("bad", ["../x", "", "20261130-000000-1/../../etc", None, 5, "a" * 10_000],
                         ids=["dotdot", "empty", "traversal", "none", "number", "huge"])
def test_job_ids_are_validated(bad):
    with pytest.raises(server.Refused):
        server.validate_job_id(bad)


def test_damaged_records_are_reported_not_raised(tmp_path):
    cfg = config_for(tmp_path, jobs_dir=str(tmp_path / "jobs"), allowed_roots=[str(tmp_path)])
    store = server.JobStore(cfg.jobs_path)
    store.ensure()
    for n, content in enumerate([b"", b"{trunc", b"[1, 2]", b'{"id": "other", "state": "ok"}'], start=1):
        store.record_path(f"20261130-000000-{n}").write_bytes(content)
    listing = server.list_jobs(cfg, None, None)
    assert listing.count("damaged") == 4
    with pytest.raises(server.Refused, match="damaged"):
        server.job_view(cfg, "20261130-000000-1")


def test_log_excerpt_is_bounded_and_says_how_much_was_cut(tmp_path):
    log = tmp_path / "job.log"
    log.write_bytes(b"\x1b[31m" + b"a" * 50_000 + b"\xff\xfe\n" + b"tail line\n")
    text = server.log_excerpt(log, 1000)
    assert "[cut: the first" in text and "hermes_read" in text
    body = text.split("\n...", 1)[1]
    assert len(body) <= 1000 and body.endswith("tail line\n") and "\x1b" not in text


def test_config_problems_name_the_spot_and_keep_defaults(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"allowed_roots": [1], "max_running_jobs": true, "kill_grace_s": -1}')
    cfg = server.load_config(path)
    joined = "\n".join(cfg.problems)
    assert "allowed_roots must be a list of folder paths" in joined
    assert "max_running_jobs must be a whole number" in joined
    assert cfg.kill_grace_s == 5 and cfg.max_running_jobs == 4
    assert "no config file" in server.load_config(tmp_path / "missing.json").problems[0]


@pytest.mark.parametrize(("key", "value", "problem", "used"), [
    ("approvals", "maybe", "approvals maybe is not deny, ask or yolo (deny used)", "deny"),
    ("hermes_driver", "ssh", "hermes_driver ssh is not auto, acp or cli (auto used)", "auto"),
    ("hermes_cli_form", "x\ny", "hermes_cli_form x\\ny is not auto, query-file or query-arg (auto used)", "auto"),
    ("max_wait_s", 0.5, "max_wait_s 0.5 is outside 1..50", 1),
    ("approval_timeout_s", 1, "approval_timeout_s 1 must be at least 5 (default 300 used)", 300),
    ("default_max_turns", 0, "default_max_turns 0 must be at least 1 (Hermes' own default used)", None),
], ids=["approvals", "driver", "cli-form-escaped", "wait-clamped", "number-below-its-minimum", "turns"])
def test_a_setting_out_of_its_choices_or_range_is_named_and_replaced(tmp_path, key, value, problem, used):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"allowed_roots": [str(tmp_path)], key: value}))
    cfg = server.load_config(path)
    assert len(cfg.problems) == 1 and cfg.problems[0].startswith(problem), cfg.problems
    assert getattr(cfg, key) == used


@pytest.mark.parametrize(("form", "expected"), [
    ("query-arg", ["hermes", "chat", "--query=-do it", "-Q", "--max-turns=5", "--resume=S", "--skills=a,b",
                   "--toolsets=t", "--yolo", "--source", "tool"]),
    ("query-file", ["hermes", "chat", "--query-file", "-", "-Q", "--oneshot", "--in=/w", "--max-turns=5",
                    "--resume=S", "--skills=a,b", "--toolsets=t", "--yolo", "--source", "tool"]),
], ids=["0.19-form", "0.21-form"])
def test_command_lines_join_every_value_to_its_option(form, expected):
    """A task or id starting with '-' can never be read as an option: each value is joined with '='."""
    cfg = server.Config(path=server.SERVER_DIR / "config.json", yolo=True, extra_args=["--source", "tool"])
    record = running_record(cwd="/w", max_turns=5, session_requested="S", skills=["a", "b"], toolsets=["t"])
    cli = server.HermesCli(server.FORM_FLAGS[form], "test")
    assert server.hermes_command(cli, "hermes", record, "-do it", cfg) == expected


def test_the_flags_a_0_20_hermes_declares_give_in_but_not_query_file():
    cli = server.HermesCli(frozenset({"--query", "--quiet", "--in", "--resume"}), "test")
    cfg = server.Config(path=server.SERVER_DIR / "config.json")
    argv = server.hermes_command(cli, "hermes", running_record(cwd="/w"), "task", cfg)
    assert argv == ["hermes", "chat", "--query=task", "-Q", "--in=/w"]


def test_describe_exit_names_signals_and_tells_a_crash_from_a_kill():
    assert server.describe_exit(-9) == "Hermes was killed by SIGKILL (9) from outside the bridge"
    assert "hermes_health" in server.describe_exit(2)
    assert server.describe_exit(-6).startswith("Hermes crashed (SIGABRT, 6) before its turn was known to have ended")
    assert server.describe_exit(0xC0000005, turn_saved=True).startswith(
        "Hermes crashed (Windows status 0xC0000005) on its way out")
    assert server.describe_exit(-9, turn_saved=True).startswith("Hermes was killed by SIGKILL")
    assert server.describe_exit(1, turn_saved=True) == "Hermes exited with code 1"


@pytest.mark.parametrize(("log", "ends"), [
    ("answer\n\nsession_id: 20261202_013955_eebde4\n", True),
    ("answer\nsession_id: 20261202_013955_eebde4\n\n  \n", True),
    ("session_id: 20261202_013955_eebde4\nFatal Python error: Segmentation fault\n", False),
    ("a tool printed session_id: x\n", False),
    ("", False),
])
def test_a_turn_counts_as_saved_only_when_the_session_line_is_the_logs_last(tmp_path, log, ends):
    path = tmp_path / "job.log"
    path.write_text(log)
    assert server.ends_with_session_line(path) is ends


def test_skill_index_cache_sees_added_edited_and_removed_skills(tmp_path):
    skills = tmp_path / "skills"

    def write(rel, name, description):
        path = skills / rel / "SKILL.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"---\nname: {name}\ndescription: {description}\n---\n")
        return path
    first = write("cat/one", "one", "first")
    index = server.SkillIndex()
    assert [s["name"] for s in index.skills(skills)[0]] == ["one"]
    write("cat/two", "two", "second")
    write("other/deep/three", "three", "third")
    assert sorted(s["name"] for s in index.skills(skills)[0]) == ["one", "three", "two"]
    write("cat/one", "one", "edited description, longer")
    assert {s["name"]: s["description"] for s in index.skills(skills)[0]}["one"].startswith("edited")
    first.unlink()
    first.parent.rmdir()
    skills_now, malformed = index.skills(skills)
    assert sorted(s["name"] for s in skills_now) == ["three", "two"] and malformed == []
    assert {s["name"]: s["category"] for s in skills_now} == {"two": "cat", "three": "other"}


def test_the_captured_session_id_is_the_last_session_line(tmp_path):
    """A compressed session continues under a new id: the last line names the session to resume."""
    log = tmp_path / "job.log"
    log.write_text("session_id: 20261130_000000_aaaaaa\nworking\nsession_id: 20261130_000001_bbbbbb\n")
    assert server.session_id_from_log(log) == "20261130_000001_bbbbbb"
    log.write_text("session_id: --yolo\n")
    assert server.session_id_from_log(log) is None


def test_records_are_written_whole_while_a_reader_races_and_no_temp_file_is_left(tmp_path):
    import threading

    store = server.JobStore(tmp_path)
    store.ensure()
    record = running_record(tree=[server.ProcessId(n, 1.0) for n in range(2000)])  # ~100 KB: a plain write fails
    store.write(record)
    damaged = []
    stop = threading.Event()

    def read_forever():
        while not stop.is_set():
            try:
                store.read("20261130-000000-1")
            except server.DamagedRecord as exc:
                damaged.append(exc)
    reader = threading.Thread(target=read_forever)
    reader.start()
    try:
        for n in range(50):
            record.tree.append(server.ProcessId(100000 + n, 2.0))
            store.write(record)
    finally:
        stop.set()
        reader.join()
    assert damaged == []
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_register_writes_atomically_a_failed_replace_leaves_the_original(tmp_path, monkeypatch):
    import register_with_claude as reg

    config = tmp_path / "claude_desktop_config.json"
    config.write_text('{"keep": true}')
    def failing_replace(_src, _dst):
        raise OSError("disk full")
    monkeypatch.setattr(reg.os, "replace", failing_replace)
    with pytest.raises(OSError, match="disk full"):
        reg.write_safely(config, '{"new": 1}')
    assert config.read_text() == '{"keep": true}'
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]


def test_tool_bodies_run_without_mcp_and_every_outcome_is_a_result_with_one_audit_line(tmp_path, monkeypatch):
    """The shared step every tool goes through: a refusal, a bug and a listing each come back as a result,
    never raised, and each leaves one audit line taken from the result's fields."""
    import anyio

    logs = tmp_path / "logs"
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"allowed_roots": [str(tmp_path)], "jobs_dir": str(tmp_path / "jobs"),
                                  "logs_dir": str(logs)}))
    monkeypatch.setenv("HERMES_BRIDGE_CONFIG", str(config))
    monkeypatch.delenv(server.SETTINGS_ENV, raising=False)

    async def broken(_cfg: server.Config) -> server.ToolResult:
        raise RuntimeError("boom")
    refused = anyio.run(server.run_tool_body, "hermes_status", lambda cfg: server.status_tool(cfg, "../x", 0))
    error = anyio.run(server.run_tool_body, "hermes_jobs", broken)
    listing = anyio.run(server.run_tool_body, "hermes_jobs",
                        lambda cfg: server.listing_tool(server.list_jobs, cfg, None, None))
    assert refused.status == "refused" and refused.is_error and "is not a job id" in refused.text
    assert error.status == "error" and "internal error in hermes_jobs: RuntimeError: boom" in error.text
    assert listing.status == "ok" and not listing.is_error and "No jobs yet" in listing.text
    lines = [json.loads(line) for line in (logs / "audit.log").read_text().splitlines()]
    assert [(line["tool"], line["outcome"]) for line in lines] == [
        ("hermes_status", "refused"), ("hermes_jobs", "error"), ("hermes_jobs", "ok")]
