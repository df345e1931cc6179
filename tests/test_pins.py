"""Issue 50: behaviours the suite let pass when written wrong (a mutation pass on 741da6c), each pinned by a test
that fails with the one-line bug and passes without it; and the red team's leftovers (characters that hide or
reorder text, told by their Unicode category)."""
import json
import math
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from claude_hermes_bridge.git_calls import GitFailed, git, git_text
from claude_hermes_bridge.jobs import STEERS_KEPT, JobRecord, JobState, JobStore, ObservedJob
from claude_hermes_bridge.render import render_status, start_line
from claude_hermes_bridge.review import visible
from claude_hermes_bridge.safe_io import Refused, clean_str, shown
from claude_hermes_bridge.steer import add_steer, check_guidance, check_steerable
from claude_hermes_bridge.tools import budget
from harness import config_for, running_record

# One of each: Arabic letter mark, word joiner, soft hyphen, Mongolian vowel separator, an 8-bit CSI (C1), a
# C1 control, a line separator, a right-to-left override.
HIDING = ["\u061c", "\u2060", "\u00ad", "\u180e", "\u009b", "\u0085", "\u2028", "\u202e"]


@pytest.mark.parametrize("char", HIDING, ids=[f"U+{ord(c):04X}" for c in HIDING])
def test_a_character_that_hides_or_controls_text_is_escaped_and_refused_by_its_category(char: str) -> None:
    text = f"safe{char}text"
    escape = char.encode("unicode_escape").decode("ascii")
    assert shown(text) == f"safe{escape}text"
    assert clean_str(text) == f"safe{escape}text"  # Hermes' output as the model reads it
    assert visible(text.encode()) == f"safe{escape}text"  # a line of the patch view
    with pytest.raises(Refused, match="control or invisible characters"):
        check_guidance(text, "now")


def test_ordinary_text_in_any_script_is_kept_as_it_is() -> None:
    for text in ("naïve café", "日本語のテキスト", "مرحبا", "emoji 🎉", "tab\tand\nline"):
        assert clean_str(text) == text
    assert check_guidance("línea uno\nline two", "now") == ("línea uno\nline two", "now")


def test_guidance_with_replacement_characters_is_refused() -> None:
    with pytest.raises(Refused):
        check_guidance(b"bad \xff bytes".decode("utf-8", "replace"), "now")


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan, 0, -1, True, "1"])
def test_a_cost_budget_that_could_never_fire_is_refused(value: object) -> None:
    with pytest.raises(Refused, match="max_cost_usd must be a positive number"):
        budget("max_cost_usd", value, None, None, whole=False)
    assert budget("max_cost_usd", 0.5, None, 2.0, whole=False).value == 0.5


def test_the_steer_past_the_last_kept_is_refused_never_dropped(tmp_path: Path) -> None:
    store = JobStore(tmp_path)
    store.ensure()
    record = JobRecord(id="20261130-000000-1", state=JobState.RUNNING)
    for number in range(STEERS_KEPT):
        add_steer(store, record, {"id": f"s{number}", "text": "x", "when": "now", "by": "planner", "at": 1.0})
    with pytest.raises(Refused, match=f"has {STEERS_KEPT} steers waiting"):
        add_steer(store, record, {"id": "late", "text": "x", "when": "now", "by": "planner", "at": 1.0})
    assert len(json.loads(store.steers_path(record.id).read_text())) == STEERS_KEPT


def test_a_job_steered_as_often_as_its_record_keeps_takes_no_more() -> None:
    """Its supervisor sends no steer past the last its record keeps: one more would be taken and never sent."""
    sent = [{"id": f"s{number}", "text": "x", "when": "now", "by": "planner", "at": 1.0, "state": "acknowledged",
             "hermes": ""} for number in range(STEERS_KEPT)]
    record = JobRecord(id="20261130-000000-1", state=JobState.RUNNING, driver="acp", steers=sent[:-1])
    check_steerable(ObservedJob(record, JobState.RUNNING))
    record.steers = sent
    with pytest.raises(Refused, match=f"was steered {STEERS_KEPT} times already"):
        check_steerable(ObservedJob(record, JobState.RUNNING))


def test_a_running_jobs_block_says_its_sandbox(tmp_path: Path) -> None:
    cfg = config_for(tmp_path)
    record = JobRecord(id="20261130-000000-1", state=JobState.RUNNING, created_at=time.time(),
                       sandbox="writes limited to /x (Landlock ABI 7)", sandbox_refused=["/home/u/.npm"])
    text = render_status(ObservedJob(record, JobState.RUNNING), cfg)
    assert "SANDBOX: writes limited to /x (Landlock ABI 7)" in text
    assert "SANDBOX_DENIED: the sandbox refused writes to 1 path outside the job's folders" in text


def test_the_sandbox_line_keeps_its_except_however_long_the_paths(tmp_path: Path) -> None:
    """Deep folders make the SANDBOX words long; the warning at their end (keys the job can read, inside its own
    folder) is never cut off (a CI run whose temporary folder was one digit longer lost it)."""
    long = "/" + "/".join(["a-rather-long-folder-name"] * 8)
    words = (f"writes limited to {long}, {long}/tmp (TMPDIR), Hermes' home {long}/home, the tool cache {long}/cache "
             f"(Landlock ABI 7); reading: your credentials unreadable (5 paths here, as {', '.join([long] * 2)}); "
             f"EXCEPT {long}/.ssh, inside what the job may write")
    record = JobRecord(id="20261130-000000-1", state=JobState.RUNNING, created_at=time.time(), sandbox=words)
    text = render_status(ObservedJob(record, JobState.RUNNING), config_for(tmp_path))
    assert len(words) > 1200 and f"EXCEPT {long}/.ssh, inside what the job may write" in text


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    folder = tmp_path / "repo"
    folder.mkdir()
    env = {**os.environ, "GIT_AUTHOR_NAME": "u", "GIT_AUTHOR_EMAIL": "u@t", "GIT_COMMITTER_NAME": "u",
           "GIT_COMMITTER_EMAIL": "u@t"}
    for command in (["init", "-q", "-b", "main"], ["commit", "-q", "--allow-empty", "-m", "first"]):
        subprocess.run(["git", "-C", str(folder), *command], check=True, env=env)
    (folder / "a.txt").write_text("one\n")
    return folder


@pytest.mark.posix("the planted program is a shell script")
def test_the_servers_git_environment_does_not_steer_the_bridges_git(repo: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """GIT_EXTERNAL_DIFF, GIT_WORK_TREE, GIT_DIR and GIT_INDEX_FILE in the server's environment (the host's) are
    not the bridge's: its git works on the repository it names, and runs no program they name."""
    mark = tmp_path / "ran"
    program = tmp_path / "external-diff"
    program.write_text(f"#!/bin/sh\ntouch {mark}\n")
    program.chmod(0o755)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.setenv("GIT_EXTERNAL_DIFF", str(program))
    monkeypatch.setenv("GIT_WORK_TREE", str(elsewhere))
    monkeypatch.setenv("GIT_DIR", str(elsewhere / ".git"))
    monkeypatch.setenv("GIT_INDEX_FILE", str(tmp_path / "other-index"))
    assert git_text(str(repo), "rev-parse", "--show-toplevel") == str(repo)
    git(str(repo), "add", "a.txt")
    git(str(repo), "diff", "--cached")
    assert not mark.exists() and not (tmp_path / "other-index").exists()


@pytest.mark.posix("the planted program is a shell command")
def test_an_ext_remote_runs_no_command_through_the_bridges_git(repo: Path, tmp_path: Path) -> None:
    """git refuses ext:: by default; a job can write the repository's config to allow it: the bridge's git not."""
    subprocess.run(["git", "-C", str(repo), "config", "protocol.ext.allow", "always"], check=True)
    mark = tmp_path / "ran"
    with pytest.raises(GitFailed):
        git(str(repo), "ls-remote", f"ext::sh -c touch% {mark}")
    assert not mark.exists()


@pytest.mark.posix("the planted filter is a shell command")
def test_the_drivers_overridden_are_read_from_the_pinned_repository_not_the_folders_git_file(
        repo: Path, tmp_path: Path) -> None:
    """A worktree job can rewrite its `.git` file to name a repository of its own, with no filter defined: the
    bridge's git, pinned to the worktree's administrative folder, still overrides the filter the real config
    defines (read from there), so staging the job's work runs nothing."""
    mark = tmp_path / "ran"
    worktree = tmp_path / "job-worktree"
    subprocess.run(["git", "-C", str(repo), "worktree", "add", "-q", "-b", "job", str(worktree)], check=True)
    admin = git_text(str(worktree), "rev-parse", "--absolute-git-dir")
    subprocess.run(["git", "-C", str(repo), "config", "filter.planted.clean", f"touch {mark}; cat"], check=True)
    (worktree / ".gitattributes").write_text("*.txt filter=planted\n")
    (worktree / "work.txt").write_text("the job's work\n")
    decoy = tmp_path / "decoy"
    subprocess.run(["git", "init", "-q", str(decoy)], check=True)
    (worktree / ".git").write_text(f"gitdir: {decoy / '.git'}\n")
    git(str(worktree), f"--git-dir={admin}", f"--work-tree={worktree}", "add", "-A")
    assert "work.txt" in git_text(str(worktree), f"--git-dir={admin}", f"--work-tree={worktree}", "diff",
                                  "--cached", "--name-only")
    assert not mark.exists()


def test_start_counts_from_the_call_that_started_the_job_not_from_hermes_start() -> None:
    """A cold start's seconds to start Hermes are part of what START says (the call at 100, Hermes at 103)."""
    record = JobRecord(id="20261130-000000-1", state=JobState.OK, start="cold", created_at=100.0, started_at=103.0,
                       prompt_sent_at=104.5)
    assert start_line(record) == ["START: cold (the task reached Hermes 4.5 s after the job was started)"]


def test_the_approve_hint_names_the_one_waiting_question_and_a_host_question_is_worded_as_one() -> None:
    """Issue 67: with exactly one question the hint shows its id, not a placeholder; a network question is the
    job's (its proxy's), holds for the job, and never speaks of "the same exact command"."""
    from claude_hermes_bridge.render import approval_lines
    from claude_hermes_bridge.safe_io import machine_clock

    def waiting(question_id: str, what: str) -> dict[str, Any]:
        return {"id": question_id, "what": what, "asked_at": time.time(), "expires_at": time.time() + 60,
                "expires_clock": machine_clock() + 60}
    record = running_record(questions=[waiting("net-1-abc", "connect to pypi.example:443, a host not on ...")])
    lines = approval_lines(ObservedJob(record, JobState.RUNNING))
    assert "APPROVAL: The job asks to connect to pypi.example:443" in lines[1], lines
    assert "the job's proxy refuses the host by itself" in lines[2], lines
    assert lines[-1].startswith(f'Ask the user, then answer with hermes_approve(job_id="{record.id}", '
                                'approval_id="net-1-abc", decision="allow" or "deny"; a host\'s answer holds'), lines
    record.questions.append(waiting("tool-2", "run `rm -rf build`"))
    lines = approval_lines(ObservedJob(record, JobState.RUNNING))
    assert "approval_id=<an APPROVAL_ID above>" in lines[-1] and "same exact command" not in lines[-1]
    assert "APPROVAL: Hermes asks to run `rm -rf build`" in lines
