"""Issue 51, worktree jobs start warm, with the fake Hermes over ACP: after a worktree job, the standby readies a
worktree of the same repository at HEAD with Hermes started in it under the job's sandbox rules; the next
worktree job on that repository takes it (moved to the job's own place, on the job's own branch), commits and
lands as a cold one does; another commit (HEAD moved) starts cold, says why, and leaves no readied worktree or
branch behind."""
import json
import re
from pathlib import Path
from typing import Any

import pytest
from test_standby import acp_client, ready
from test_worktrees import final, git, make_repo

from conftest import require_sandbox
from harness import Bridge, wait_until

pytestmark = pytest.mark.posix("a readied worktree is renamed for its job, which Windows refuses")

COMMIT = ("echo mine > mine.txt && git add mine.txt && git -c user.name=j -c user.email=j@t commit -qm mine "
          "&& pwd > where.txt")


def bridge_branches(repo: Path) -> list[str]:
    """The bridge's branches in the repository (a job's, a standby's)."""
    return git(repo, "for-each-ref", "--format=%(refname:short)", "refs/heads/hermes-bridge/").split()


def test_the_next_worktree_job_takes_the_readied_worktree_commits_and_lands(bridge: Bridge) -> None:
    require_sandbox()
    repo = make_repo(bridge.root / "repo")
    script = bridge.tmp / "commit.sh"
    script.write_text(COMMIT + "\n")
    bridge.configure(hermes_driver="acp", warm_start=True)
    with acp_client(bridge) as client:
        first = final(client, task="first !write=one.txt:1", cwd=str(repo), isolation="worktree")
        assert first.field("STATUS") == "ok" and first.field("START").startswith("cold"), first.text
        standby = ready(bridge)
        readied = Path(standby["worktree"]["path"])
        assert readied.parent == bridge.jobs / "worktrees" and (readied / "a.txt").exists()
        assert f"hermes-bridge/{readied.name}" in bridge_branches(repo)
        job = final(client, task=f"warm !shell={script}", cwd=str(repo), isolation="worktree")
        job_id = job.field("JOB_ID")
        assert job.field("STATUS") == "ok", job.text
        assert job.field("START").startswith("warm (the task reached Hermes "), job.text
        own = bridge.jobs / "worktrees" / job_id
        assert (own / "where.txt").read_text().strip() == str(own)  # Hermes' tools ran in the job's own place
        assert not readied.exists() and "writes limited to " + str(own) in job.field("SANDBOX"), job.text
        assert git(repo, "log", "-1", "--format=%s", f"hermes-bridge/{job_id}") == "mine"
        landed = client.call("hermes_land", job_id=job_id, action="merge")
        assert not landed.is_error, landed.text
    assert (repo / "mine.txt").read_text() == "mine\n"
    assert git(repo, "fsck", "--strict") == ""
    assert not (bridge.jobs / "worktree-objects" / readied.name).exists()  # the link Hermes' git named, gone
    assert f"hermes-bridge/{readied.name}" not in bridge_branches(repo)


def test_a_worktree_job_after_head_moved_starts_cold_and_the_readied_worktree_goes(bridge: Bridge) -> None:
    require_sandbox()
    repo = make_repo(bridge.root / "repo")
    bridge.configure(hermes_driver="acp", warm_start=True)
    with acp_client(bridge) as client:
        final(client, task="first !write=one.txt:1", cwd=str(repo), isolation="worktree")
        readied = Path(ready(bridge)["worktree"]["path"])
        (repo / "b.txt").write_text("the user's\n")
        git(repo, "add", "b.txt")
        git(repo, "commit", "-qm", "the user's next commit")
        job = final(client, task="after !write=two.txt:2", cwd=str(repo), isolation="worktree")
        assert job.field("STATUS") == "ok", job.text
        assert "readied a worktree of another repository or commit (HEAD moved since)" in job.field("START")
        assert (bridge.jobs / "worktrees" / job.field("JOB_ID") / "b.txt").exists()  # made at the new HEAD
        # the folder goes first, then its branch (remove_worktree): both are waited for
        wait_until(lambda: (not readied.exists() and f"hermes-bridge/{readied.name}" not in bridge_branches(repo))
                   or None, 30, "the readied worktree and its branch to go with its standby")
        assert not (bridge.jobs / "worktree-objects" / readied.name).exists()
        fresh = ready(bridge)  # readied for the new HEAD
        assert fresh["worktree"]["base"] == git(repo, "rev-parse", "HEAD")


def test_a_standby_killed_with_a_readied_worktree_has_it_removed_by_the_next(bridge: Bridge) -> None:
    """A standby killed while it waits cannot remove its worktree: the next standby sweeps it (worktree, admin
    folder, branch, object folder), found from the folder itself; the job after the kill starts cold."""
    import psutil
    from test_standby import gone

    repo = make_repo(bridge.root / "repo")
    bridge.configure(hermes_driver="acp", warm_start=True)
    with acp_client(bridge) as client:
        final(client, task="first !write=one.txt:1", cwd=str(repo), isolation="worktree")
        standby = ready(bridge)
        readied = Path(standby["worktree"]["path"])
        psutil.Process(standby["pid"]).kill()
        wait_until(lambda: gone(standby["pid"]) or None, 10, "the killed standby to be gone")
        job = final(client, task="after the kill !write=two.txt:2", cwd=str(repo), isolation="worktree")
        assert job.field("STATUS") == "ok" and job.field("START").endswith("the warm Hermes waiting had exited)"), \
            job.text
        assert ready(bridge)["pid"] != standby["pid"]
    assert not readied.exists() and f"hermes-bridge/{readied.name}" not in bridge_branches(repo)
    assert not (bridge.jobs / "worktree-objects" / readied.name).exists()
    assert readied.name not in git(repo, "worktree", "list")


def test_a_worktree_job_running_while_the_standby_readies_its_next_names_no_change_of_the_standbys(
        bridge: Bridge) -> None:
    """The standby readies a worktree (a branch, an admin folder) while the job that asked for it still runs:
    that job's guard does not report the standby's branch as a change of its repository's refs."""
    repo = make_repo(bridge.root / "repo")
    bridge.configure(hermes_driver="acp", warm_start=True)
    script = bridge.tmp / "long.sh"
    script.write_text("sleep 8\n")
    with acp_client(bridge) as client:
        started = client.call("hermes_run", task=f"long !shell={script}", cwd=str(repo), isolation="worktree",
                              wait_s=0)
        standby = ready(bridge)
        job = client.wait_final(started.field("JOB_ID"))
    readied = Path(standby["worktree"]["path"])
    assert job.field("STATUS") == "ok", job.text
    assert f"hermes-bridge/{readied.name}" in bridge_branches(repo)  # readied while the job ran
    assert (bridge.record(job.field("JOB_ID")).ended_at or 0) > standby["ready_at"], job.text
    assert "standby" not in job.text, job.text


def rules(result: Any) -> str:
    """A job's SANDBOX line but the name of its private temporary folder."""
    return re.sub(r"[^ ,]+ \(TMPDIR\)", "<its own> (TMPDIR)", result.field("SANDBOX"))


def resumed(client: Any, session: str, task: str) -> Any:
    result = client.call("hermes_resume", session_id=session, task=task, wait_s=30)
    return client.wait_final(result.field("JOB_ID")) if result.field("STATUS") == "running" else result


def test_the_next_resume_in_a_worktree_takes_a_standby_readied_there_and_its_work_lands(bridge: Bridge) -> None:
    """Issue 65: a resumed worktree job readies a standby in that very worktree, confined as a resumed job's Hermes
    is; the next resume there takes it, writes its own worktree (and nothing else) and its work lands."""
    require_sandbox()
    repo = make_repo(bridge.root / "repo")
    (bridge.tmp / "outside.sh").write_text(f"(echo escaped > '{bridge.tmp / 'OUTSIDE'}') 2>/dev/null || true\n")
    bridge.configure(hermes_driver="acp", warm_start=True)
    with acp_client(bridge) as client:
        first = final(client, task="first !write=one.txt:1 !commit=one", cwd=str(repo), isolation="worktree")
        worktree = bridge.jobs / "worktrees" / first.field("JOB_ID")
        session = first.field("SESSION_ID")
        second = resumed(client, session, "second !write=two.txt:2")
        assert second.field("STATUS") == "ok" and second.field("START").startswith("cold"), second.text
        place = f"{worktree} (the worktree of job {first.field('JOB_ID')}, folder "
        wait_until(lambda: any(json.loads(path.read_text()).get("folder", "").startswith(place)
                               for path in bridge.jobs.glob("standby*/ready.json")), 40, "a standby in the worktree")
        third = resumed(client, session, f"third !write=three.txt:3 !shell={bridge.tmp / 'outside.sh'}")
        assert third.field("STATUS") == "ok", third.text
        assert third.field("START").startswith("warm (the task reached Hermes "), third.text
        assert third.field("CWD") == str(worktree)
        assert rules(third) == rules(second), third.text  # the same rules but its own TMPDIR (the standby's)
        assert (worktree / "three.txt").read_text() == "3" and not (repo / "three.txt").exists()
        assert not (bridge.tmp / "OUTSIDE").exists()  # its tools were held by the worktree's sandbox
        landed = client.call("hermes_land", job_id=third.field("JOB_ID"), action="merge")
        assert not landed.is_error, landed.text
    assert [(repo / name).read_text() for name in ("one.txt", "two.txt", "three.txt")] == ["1", "2", "3"]


def test_a_standby_waiting_in_a_worktree_that_is_landed_retires(bridge: Bridge) -> None:
    """A standby readied in a resumed job's worktree can serve nothing once that worktree is landed (removed): it
    retires at its next look, not after standby_idle_s."""
    require_sandbox()
    repo = make_repo(bridge.root / "repo")
    bridge.configure(hermes_driver="acp", warm_start=True, standby_idle_s=600)
    with acp_client(bridge) as client:
        first = final(client, task="first !write=one.txt:1 !commit=one", cwd=str(repo), isolation="worktree")
        worktree = bridge.jobs / "worktrees" / first.field("JOB_ID")
        second = resumed(client, first.field("SESSION_ID"), "second !write=two.txt:2 !commit=two")
        place = f"{worktree} (the worktree of job {first.field('JOB_ID')}, folder "

        def waiting_there() -> bool:
            return any(json.loads(path.read_text()).get("folder", "").startswith(place)
                       for path in bridge.jobs.glob("standby*/ready.json"))
        wait_until(lambda: waiting_there() or None, 40, "a standby in the worktree")
        landed = client.call("hermes_land", job_id=second.field("JOB_ID"), action="merge")
        assert not landed.is_error, landed.text
        assert not worktree.exists()
        wait_until(lambda: not waiting_there() or None, 20, "the standby in the landed worktree to retire")
    assert (repo / "two.txt").read_text() == "2"
