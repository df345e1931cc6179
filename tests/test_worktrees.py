"""Issue 30: a job in a git worktree of its own, its work as a diff and a patch, and hermes_land (merge,
discard, keep), against the fake Hermes and a real `git`. The fake's `!commit=MSG` commits what it wrote,
`!uncommitted=REL:TEXT` leaves a change after that."""
import dataclasses
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from claude_hermes_bridge.config import load_config
from claude_hermes_bridge.jobs import JobStore
from claude_hermes_bridge.launch import drop_worktree, prune_jobs, recover_worktrees
from harness import Bridge, BridgeClient, refused, wait_gone, wait_until

pytestmark = pytest.mark.posix("the fake hermes is a shell script")


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True,
                          env={**os.environ, "GIT_AUTHOR_NAME": "user", "GIT_AUTHOR_EMAIL": "user@test",
                               "GIT_COMMITTER_NAME": "user", "GIT_COMMITTER_EMAIL": "user@test"})
    return done.stdout.strip()


def make_repo(folder: Path, files: dict[str, str | bytes] | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    git(folder, "init", "-q", "-b", "main")
    for name, content in (files or {"a.txt": "one\ntwo\nthree\n"}).items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    git(folder, "add", "-A")
    git(folder, "commit", "-q", "-m", "the user's first commit")
    return folder


def final(client: BridgeClient, **arguments: Any) -> Any:
    result = client.call("hermes_run", wait_s=30, **arguments)
    return client.wait_final(result.field("JOB_ID")) if result.field("STATUS") == "running" else result


def state_of(repo: Path) -> tuple[str, ...]:
    """What the bridge must leave alone: HEAD, the user's branches, the index, the working tree, the stash."""
    branches = [line for line in git(repo, "branch", "--list").splitlines() if "hermes-bridge/" not in line]
    return (git(repo, "rev-parse", "HEAD"), "\n".join(branches), git(repo, "diff", "--cached"),
            git(repo, "status", "--porcelain", "--untracked-files=all") + git(repo, "diff"), git(repo, "stash", "list"))


@pytest.fixture
def repo(bridge: Bridge) -> Path:
    return make_repo(bridge.root / "repo")


def client_of(bridge: Bridge, driver: str) -> BridgeClient:
    bridge.configure(hermes_driver=driver)
    client = bridge.client()
    client.params.env = dict(bridge.env, FAKE_HERMES_ACP="1" if driver == "acp" else "0")
    return client


@pytest.mark.parametrize("driver", ["cli", "acp"])
def test_a_worktree_job_works_in_its_own_worktree_and_the_main_tree_is_untouched(bridge, repo, driver):
    before = state_of(repo)
    with client_of(bridge, driver) as client:
        result = final(client, task="!write=b.txt:bee !commit=add-b !uncommitted=a.txt:changed", cwd=str(repo),
                       isolation="worktree")
    assert result.field("STATUS") == "ok", result.text
    job_id = result.field("JOB_ID")
    worktree = bridge.jobs / "worktrees" / job_id
    assert bridge.runs()[0]["cwd"] == str(worktree)
    assert result.field("CWD") == str(worktree)
    assert state_of(repo) == before and not (repo / "b.txt").exists()
    assert result.field("WORKTREE").startswith(f"{worktree} (branch hermes-bridge/{job_id}, base "
                                               f"{git(repo, 'rev-parse', 'HEAD')[:12]}, HEAD at launch")
    assert result.field("DIFF").startswith("2 files changed, +2 -3 against the base"), result.field("DIFF")
    assert "CHANGED_FILES: 1 created, 1 modified, 0 deleted (in the worktree" in result.text
    assert "\n+ b.txt\n~ a.txt\n" in result.text
    assert f'hermes_land(job_id="{job_id}", action="merge")' in result.field("LAND")
    assert git(repo, "worktree", "list", "--porcelain").count(f"locked claude-hermes-bridge job {job_id}") == 1


def test_the_patch_holds_the_whole_change_binary_files_too_and_reads_page_by_page(bridge):
    repo = make_repo(bridge.root / "repo", {"a.txt": "one\n", "logo.bin": bytes(range(256)) * 8})
    with bridge.client() as client:
        result = final(client, task="!delete=logo.bin !write=b.txt:bee !commit=work", cwd=str(repo),
                       isolation="worktree")
        patch = Path(result.field("PATCH").split(" (")[0])
        page = client.call("hermes_read", path=str(patch), max_bytes=200)
    assert patch == bridge.jobs / f"{result.field('JOB_ID')}.patch"
    assert "GIT binary patch" in patch.read_text()
    assert "diff --git a/b.txt b/b.txt" in page.text
    copy = bridge.tmp / "copy"
    subprocess.run(["git", "clone", "-q", str(repo), str(copy)], check=True)
    git(copy, "apply", "--index", str(patch))
    assert (copy / "b.txt").read_text() == "bee" and not (copy / "logo.bin").exists()


def test_merge_into_a_clean_main_tree_on_its_branch_is_a_merge_and_is_idempotent(bridge, repo):
    with bridge.client() as client:
        job_id = final(client, task="!write=b.txt:bee !commit=add-b !uncommitted=c.txt:sea", cwd=str(repo),
                       isolation="worktree").field("JOB_ID")
        merged = client.call("hermes_land", job_id=job_id, action="merge")
        again = client.call("hermes_land", job_id=job_id, action="merge")
        discard = client.call("hermes_land", job_id=job_id, action="discard")
    assert merged.field("STATUS") == "ok", merged.text
    assert merged.field("LANDED").startswith("merge at ") and "merged into main" in merged.field("LANDED")
    assert (repo / "b.txt").read_text() == "bee" and (repo / "c.txt").read_text() == "sea"
    assert git(repo, "status", "--porcelain") == ""
    assert not (bridge.jobs / "worktrees" / job_id).exists()
    assert git(repo, "branch", "--list", f"hermes-bridge/{job_id}")  # stays until retention
    assert "already done" in again.field("NOTE")
    assert refused(discard) and "already merged" in discard.text
    assert "NOTE: merge:" not in merged.text  # issue 49: LANDED says it; the block does not repeat itself
    assert merged.field("CWD").endswith(f"(removed at the merge: the work is in {repo})"), merged.text
    assert f"(removed at the merge: the work is in {repo}) (branch " in merged.field("WORKTREE")


def test_merge_into_a_main_tree_with_uncommitted_work_applies_three_way_and_keeps_the_users_work(bridge, repo):
    with bridge.client() as client:
        job_id = final(client, task="!write=a.txt:one\\ntwo\\nTHREE\\n !commit=work", cwd=str(repo),
                       isolation="worktree").field("JOB_ID")
    (repo / "a.txt").write_text("ONE\ntwo\nthree\n")  # the user edits the same file, another line
    (repo / "notes.md").write_text("mine")
    head = git(repo, "rev-parse", "HEAD")
    with bridge.client() as client:
        merged = client.call("hermes_land", job_id=job_id, action="merge")
    assert merged.field("STATUS") == "ok", merged.text
    assert "applied three-way to the working tree" in merged.field("LANDED")
    assert git(repo, "rev-parse", "HEAD") == head and git(repo, "diff", "--cached") == ""
    assert (repo / "notes.md").read_text() == "mine"


def test_a_conflict_is_refused_naming_the_path_and_the_main_tree_is_left_as_it_was(bridge, repo):
    with bridge.client() as client:
        job_id = final(client, task="!write=a.txt:job's\\n !commit=work", cwd=str(repo),
                       isolation="worktree").field("JOB_ID")
        (repo / "a.txt").write_text("the user's\n")
        git(repo, "commit", "-qam", "the user's change")
        before = state_of(repo)
        clean = client.call("hermes_land", job_id=job_id, action="merge")
        (repo / "other.txt").write_text("uncommitted")
        dirty_before = state_of(repo)
        dirty = client.call("hermes_land", job_id=job_id, action="merge")
    for result in (clean, dirty):
        assert refused(result) and "conflicts with the main tree in 1 path: a.txt" in result.text, result.text
    assert state_of(repo)[:3] == dirty_before[:3] and state_of(repo) == dirty_before
    assert before[0] == dirty_before[0]
    assert (bridge.jobs / "worktrees" / job_id).is_dir()
    assert not bridge.record(job_id).landed


def test_discard_removes_the_worktree_its_branch_and_ref_and_keep_then_merge_lands_it(bridge, repo):
    with bridge.client() as client:
        dropped = final(client, task="!write=b.txt:bee", cwd=str(repo), isolation="worktree").field("JOB_ID")
        kept = final(client, task="!write=c.txt:sea", cwd=str(repo), isolation="worktree").field("JOB_ID")
        saved = git(repo, "for-each-ref", "--format=%(refname)", f"refs/hermes-bridge-work/{dropped}")
        short = subprocess.run(["git", "-C", str(repo), "rev-parse", "--symbolic-full-name",
                                f"hermes-bridge/{dropped}"], capture_output=True, text=True, check=True)
        discard = client.call("hermes_land", job_id=dropped, action="discard")
        keep = client.call("hermes_land", job_id=kept, action="keep")
        merge = client.call("hermes_land", job_id=kept, action="merge")
    assert discard.field("STATUS") == "ok" and "were removed" in discard.field("LANDED")
    assert not (bridge.jobs / "worktrees" / dropped).exists()
    assert git(repo, "branch", "--list", f"hermes-bridge/{dropped}") == ""
    assert git(repo, "for-each-ref", f"refs/hermes-bridge-work/{dropped}") == ""
    assert saved == f"refs/hermes-bridge-work/{dropped}"  # the saved work, under a name no short name reaches:
    assert short.stdout.strip() == f"refs/heads/hermes-bridge/{dropped}" and "ambiguous" not in short.stderr
    assert (bridge.jobs / f"{dropped}.patch").is_file()
    assert "left as it is" in keep.field("LANDED")
    assert merge.field("STATUS") == "ok" and (repo / "c.txt").read_text() == "sea"
    assert not (repo / "b.txt").exists()


def test_land_is_refused_while_the_job_runs_for_a_job_in_its_folder_and_for_a_bad_action(bridge, repo):
    with bridge.client() as client:
        running = client.call("hermes_run", task="!sleep=30", cwd=str(repo), isolation="worktree", wait_s=0)
        in_folder = final(client, task="plain", cwd=str(repo)).field("JOB_ID")
        while_running = client.call("hermes_land", job_id=running.field("JOB_ID"), action="merge")
        not_isolated = client.call("hermes_land", job_id=in_folder, action="merge")
        bad = client.call("hermes_land", job_id=in_folder, action="push")
        client.call("hermes_cancel", job_id=running.field("JOB_ID"))
    assert refused(while_running) and "is still running" in while_running.text
    assert refused(not_isolated) and "nothing to land" in not_isolated.text
    assert refused(bad) and 'action must be "merge", "discard" or "keep"' in bad.text


@pytest.mark.parametrize(("setup", "words"), [
    ("no-repo", "is not in one"), ("no-commit", "has none yet"), ("top-outside", "whose top is outside the allowed"),
    ("bad-isolation", 'isolation must be "none" or "worktree"'), ("base-without", "applies to isolation"),
])
def test_a_worktree_launch_is_refused_naming_why_and_starts_nothing(bridge, setup, words):
    folder = bridge.root / "work"
    folder.mkdir()
    arguments: dict[str, Any] = {"isolation": "worktree"}
    if setup == "no-commit":
        git(folder, "init", "-q")
    elif setup == "top-outside":
        make_repo(bridge.tmp / "roots", {"x.txt": "x"})  # the root sits inside a repository it does not hold
    elif setup == "bad-isolation":
        arguments["isolation"] = "container"
    elif setup == "base-without":
        arguments = {"isolation": "none", "isolation_base": "working-tree"}
    with bridge.client() as client:
        result = client.call("hermes_run", task="anything", cwd=str(folder), wait_s=0, **arguments)
    assert refused(result) and words in result.text, result.text
    assert bridge.runs() == [] and JobStore(bridge.jobs).list_ids() == []


def test_working_tree_base_carries_the_users_uncommitted_work_and_touches_nothing_of_theirs(bridge, repo):
    (repo / "a.txt").write_text("edited, not committed\n")
    (repo / "new.txt").write_text("untracked")
    before = state_of(repo)
    with bridge.client() as client:
        head_based = client.call("hermes_run", task="!sleep=0 look", cwd=str(repo), isolation="worktree", wait_s=30)
        result = final(client, task="!write=b.txt:bee", cwd=str(repo), isolation="worktree",
                       isolation_base="working-tree")
    assert "2 paths with uncommitted or untracked changes" in head_based.text
    worktree = Path(result.field("CWD"))
    assert (worktree / "a.txt").read_text() == "edited, not committed\n"
    assert (worktree / "new.txt").read_text() == "untracked"
    assert "the working tree at launch" in result.field("WORKTREE")
    assert result.field("DIFF").startswith("1 file changed, +1 -0"), result.field("DIFF")  # the job's work only
    assert state_of(repo) == before


def test_a_job_in_a_subfolder_runs_in_the_same_subfolder_of_its_worktree(bridge):
    """And may write the rest of its worktree (the sandbox holds it to the worktree, not to the subfolder)."""
    repo = make_repo(bridge.root / "repo", {"pkg/mod.py": "x = 1\n"})
    script = bridge.tmp / "top.sh"
    script.write_text("echo z > ../top.txt\n")
    with bridge.client() as client:
        result = final(client, task=f"!write=new.py:y !shell={script}", cwd=str(repo / "pkg"), isolation="worktree")
    assert bridge.runs()[0]["cwd"] == str(bridge.jobs / "worktrees" / result.field("JOB_ID") / "pkg")
    assert result.field("STATUS") == "ok", result.text
    assert "\n+ pkg/new.py\n" in result.text and "\n+ top.txt\n" in result.text


def test_two_worktree_jobs_on_one_repository_run_at_once_apart_and_an_identical_one_is_deduped(bridge, repo):
    with bridge.client() as client:
        first = client.call("hermes_run", task="!write=one.txt:1 !sleep=3", cwd=str(repo), isolation="worktree",
                            wait_s=0).field("JOB_ID")
        second = client.call("hermes_run", task="!write=two.txt:2 !sleep=3", cwd=str(repo), isolation="worktree",
                             wait_s=0).field("JOB_ID")
        again = client.call("hermes_run", task="!write=two.txt:2 !sleep=3", cwd=str(repo), isolation="worktree",
                            wait_s=0)
        wait_until(lambda: len(bridge.runs()) == 2, 20, "both Hermes to run")
        results = [client.wait_final(job_id) for job_id in (first, second)]
    assert again.field("JOB_ID") == second and "an identical job is already running" in again.text
    assert [r.field("DIFF")[:15] for r in results] == ["1 file changed,"] * 2
    assert "+ one.txt" in results[0].text and "two.txt" not in results[0].text
    assert "+ two.txt" in results[1].text and "one.txt" not in results[1].text
    assert git(repo, "status", "--porcelain") == ""


@pytest.mark.parametrize("driver", ["cli", "acp"])
def test_a_resume_runs_in_the_worktree_remade_from_its_branch_after_a_merge_removed_it(bridge, repo, driver):
    with client_of(bridge, driver) as client:
        first = final(client, task="!write=b.txt:bee !commit=one", cwd=str(repo), isolation="worktree")
        client.call("hermes_land", job_id=first.field("JOB_ID"), action="merge")
        worktree = bridge.jobs / "worktrees" / first.field("JOB_ID")
        assert not worktree.exists()
        resumed = client.call("hermes_resume", session_id=first.field("SESSION_ID"), task="!write=c.txt:sea",
                              wait_s=30)
        resumed = client.wait_final(resumed.field("JOB_ID")) if resumed.field("STATUS") == "running" else resumed
    assert resumed.field("STATUS") == "ok", resumed.text
    assert resumed.field("CWD") == str(worktree) and bridge.runs()[-1]["cwd"] == str(worktree)
    assert (worktree / "c.txt").read_text() == "sea" and not (repo / "c.txt").exists()
    assert "this job runs in its worktree" in resumed.text
    assert resumed.field("DIFF").startswith("2 files changed")  # the whole change since the base


def test_a_resume_of_a_discarded_worktree_is_refused(bridge, repo):
    with bridge.client() as client:
        first = final(client, task="!write=b.txt:bee", cwd=str(repo), isolation="worktree")
        client.call("hermes_land", job_id=first.field("JOB_ID"), action="discard")
        resumed = client.call("hermes_resume", session_id=first.field("SESSION_ID"), task="more", wait_s=0)
    assert refused(resumed) and "were discarded" in resumed.text


def test_a_failed_worktree_add_leaves_no_branch_and_the_job_says_why(bridge, repo):
    (repo / ".git" / "worktrees").write_text("not a folder")  # git makes the branch, then fails to add
    with bridge.client() as client:
        result = final(client, task="never runs", cwd=str(repo), isolation="worktree")
    assert result.field("STATUS") == "error"
    assert "the job's worktree could not be made" in result.field("REASON")
    assert git(repo, "branch", "--list", "hermes-bridge/*") == "" and bridge.runs() == []


def test_submodules_are_initialised_in_the_worktree(bridge):
    library = make_repo(bridge.tmp / "library", {"lib.txt": "library"})
    repo = make_repo(bridge.root / "repo")
    # git refuses submodules by file path unless allowed (CVE-2022-39253); HOME is the bridge's, as for its jobs
    (bridge.tmp / "home" / ".gitconfig").write_text('[protocol "file"]\n\tallow = always\n')
    subprocess.run(["git", "-C", str(repo), "submodule", "add", "-q", str(library), "lib"], check=True,
                   capture_output=True, env={**os.environ, "HOME": str(bridge.tmp / "home")})
    git(repo, "commit", "-qm", "a submodule")
    with bridge.client() as client:
        result = final(client, task="look", cwd=str(repo), isolation="worktree")
    assert "submodules initialised" in result.field("WORKTREE")
    assert (Path(result.field("CWD")) / "lib" / "lib.txt").read_text() == "library"


def test_a_worktree_whose_supervisor_died_has_its_work_saved_at_the_next_start(bridge, repo):
    with bridge.client() as client:
        job_id = client.call("hermes_run", task="!write=b.txt:bee !commit=one !uncommitted=c.txt:sea !sleep=60",
                             cwd=str(repo), isolation="worktree", wait_s=0).field("JOB_ID")
        wait_until(lambda: (bridge.jobs / "worktrees" / job_id / "c.txt").exists(), 20, "the job's work")
        record = bridge.record(job_id)
        for process_id in (record.supervisor, record.hermes):
            os.kill(process_id.pid, signal.SIGKILL)
        wait_gone([record.supervisor.pid, record.hermes.pid])
        orphan = client.call("hermes_status", job_id=job_id, wait_s=0)
    assert orphan.field("STATUS") == "orphaned"
    assert recover_worktrees(load_config(bridge.config)) == 1
    saved = bridge.record(job_id)
    assert saved.diff and saved.diff["files"] == 2
    assert "c.txt" in (bridge.jobs / f"{job_id}.patch").read_text()
    block = next(b for b in git(repo, "worktree", "list", "--porcelain").split("\n\n") if b.endswith(job_id)
                 or f"{job_id}\n" in b)
    assert "locked" not in block  # unlocked: hermes_land or retention removes it
    with bridge.client() as client:
        merged = client.call("hermes_land", job_id=job_id, action="merge")
    assert merged.field("LANDED").startswith("merge"), merged.text
    assert (repo / "c.txt").read_text() == "sea"


def test_an_orphaned_worktree_job_whose_hermes_still_runs_is_neither_saved_nor_landed(bridge, repo):
    """Its supervisor died, its Hermes did not: the work is still being written, so a server start leaves the
    worktree locked and unsaved, and hermes_land refuses until Hermes is gone."""
    with bridge.client() as client:
        job_id = client.call("hermes_run", task="!write=b.txt:bee !sleep=60", cwd=str(repo), isolation="worktree",
                             wait_s=0).field("JOB_ID")
        wait_until(lambda: (bridge.jobs / "worktrees" / job_id / "b.txt").exists(), 20, "the job's work")
        record = bridge.record(job_id)
        os.kill(record.supervisor.pid, signal.SIGKILL)
        wait_gone([record.supervisor.pid])
        assert client.call("hermes_status", job_id=job_id, wait_s=0).field("STATUS") == "orphaned"
        assert recover_worktrees(load_config(bridge.config)) == 0
        landed = client.call("hermes_land", job_id=job_id, action="merge")
        os.kill(record.hermes.pid, signal.SIGKILL)
        wait_gone([record.hermes.pid])
    assert refused(landed) and "is still running" in landed.text, landed.text
    assert not (bridge.jobs / f"{job_id}.patch").exists() and not bridge.record(job_id).diff
    assert f"locked claude-hermes-bridge job {job_id}" in git(repo, "worktree", "list", "--porcelain")
    assert recover_worktrees(load_config(bridge.config)) == 1  # now that Hermes is gone


def test_a_repository_that_left_the_roots_is_neither_landed_nor_resumed(bridge, repo):
    with bridge.client() as client:
        job = final(client, task="!write=b.txt:bee", cwd=str(repo), isolation="worktree")
    elsewhere = bridge.tmp / "other-root"
    elsewhere.mkdir()
    bridge.configure(allowed_roots=[str(elsewhere)])
    with bridge.client() as client:
        landed = client.call("hermes_land", job_id=job.field("JOB_ID"), action="merge")
        resumed = client.call("hermes_resume", session_id=job.field("SESSION_ID"), task="more", wait_s=0)
    assert refused(landed) and "outside the allowed roots" in landed.text, landed.text
    assert refused(resumed) and "outside today's allowed roots" in resumed.text, resumed.text
    assert not (repo / "b.txt").exists() and len(bridge.runs()) == 1


def test_retention_removes_a_pruned_jobs_worktree_and_branch_and_health_counts_them(bridge, repo, monkeypatch):
    with bridge.client() as client:
        job_id = final(client, task="!write=b.txt:bee", cwd=str(repo), isolation="worktree").field("JOB_ID")
        health = client.call("hermes_health")
    assert health.field("WORKTREES").startswith("1 kept in")
    now = time.time()
    monkeypatch.setattr(time, "time", lambda: now + 2 * 86400)  # two days on: past a one-day retention
    cfg = dataclasses.replace(load_config(bridge.config), retention_days=1)
    assert prune_jobs(JobStore(bridge.jobs), cfg) == 1
    assert not (bridge.jobs / "worktrees" / job_id).exists() and not (bridge.jobs / f"{job_id}.json").exists()
    assert git(repo, "branch", "--list", "hermes-bridge/*") == ""
    assert git(repo, "worktree", "list", "--porcelain").count("worktree ") == 1


def test_a_record_rewritten_to_name_another_branch_or_repository_is_never_landed_or_pruned(bridge, repo):
    """A job can write its own record: a worktree that is not the one the bridge made for it is not touched."""
    other = make_repo(bridge.root / "other")
    with bridge.client() as client:
        job_id = final(client, task="!write=b.txt:bee", cwd=str(repo), isolation="worktree").field("JOB_ID")
        record = bridge.jobs / f"{job_id}.json"
        record.write_text(record.read_text().replace(f'"branch": "hermes-bridge/{job_id}"', '"branch": "main"')
                          .replace(f'"repo": "{repo}"', f'"repo": "{other}"'))
        discard = client.call("hermes_land", job_id=job_id, action="discard")
    assert refused(discard) and "did not make for it" in discard.text
    drop_worktree(JobStore(bridge.jobs), job_id)
    assert git(other, "branch", "--list", "main") and git(repo, "branch", "--list", "main")
