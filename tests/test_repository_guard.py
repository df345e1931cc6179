"""Issue 37 part 2 and 3: a worktree job shares its repository's config, hooks and refs with the user. What
it changes there is put back and reported; the bridge's own git runs no program the repository's config or
attributes name; a landing never overwrites what git does not track, never follows core.worktree, and removes
only its own worktree. Against the fake Hermes (its `!shell=SCRIPT` is the job's shell) and a real git."""
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from test_worktrees import final, git, make_repo, state_of

from claude_hermes_bridge.config import load_config
from claude_hermes_bridge.git_calls import git_text
from claude_hermes_bridge.jobs import JobStore
from claude_hermes_bridge.landing import merge_work
from claude_hermes_bridge.repo_guard import bridge_ref_owner, restore_repository, take_snapshot
from claude_hermes_bridge.worktrees import add_worktree, is_branch_of
from conftest import require_sandbox
from harness import Bridge, BridgeClient, refused

pytestmark = pytest.mark.posix("the fake hermes and the planted programs are shell scripts")

USER_FILES: dict[str, str | bytes] = {"a.txt": "one\ntwo\nthree\nfour\nfive\nsix\n", ".gitignore": ".env\nbuild/\n"}


def mark_script(folder: Path, name: str, mark: Path, passes_input: bool = True) -> Path:
    """An executable that leaves `mark` when it runs (and, as a filter or textconv would, passes its input),
    unless the job's own shell or the test's stand-in for the user runs it: only the bridge's git leaves it."""
    script = folder / name
    script.write_text(f"#!/bin/sh\n[ -n \"$FAKE_JOB_SHELL$AS_THE_USER\" ] || touch '{mark}'\n"
                      f"{'cat' if passes_input else ':'}\nexit 0\n")
    script.chmod(0o755)
    return script


def hooks_folder(folder: Path, mark: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for hook in ("pre-commit", "post-commit", "post-checkout", "post-merge", "pre-merge-commit",
                 "reference-transaction", "post-rewrite", "pre-auto-gc"):
        mark_script(folder, hook, mark, passes_input=False)
    return folder


def set_attributes(repo: Path, line: str) -> None:
    """Attributes through .git/info/attributes: not in the tree, so no commit of the user's changes."""
    info = Path(git(repo, "rev-parse", "--git-common-dir"))
    info = (repo / info if not info.is_absolute() else info) / "info"
    info.mkdir(exist_ok=True)
    (info / "attributes").write_text(line + "\n")


# Each way a repository's configuration makes git run a program, planted by the user before the job (so the
# job's snapshot holds it and nothing is put back: only the bridge's own git calls are under test), with a
# plain git command that shows the plant does run.
def plant_hooks(repo: Path, _tools: Path, mark: Path) -> list[str]:
    hooks_folder(repo / ".git" / "hooks", mark)
    return ["commit", "--allow-empty", "-qm", "probe"]


def plant_hooks_path(repo: Path, tools: Path, mark: Path) -> list[str]:
    git(repo, "config", "core.hooksPath", str(hooks_folder(tools / "hooks", mark)))
    return ["commit", "--allow-empty", "-qm", "probe"]


def plant_fsmonitor(repo: Path, tools: Path, mark: Path) -> list[str]:
    git(repo, "config", "core.fsmonitor", str(mark_script(tools, "fsmonitor", mark)))
    return ["status"]


def plant_filter(repo: Path, tools: Path, mark: Path) -> list[str]:
    script = mark_script(tools, "filter", mark)
    git(repo, "config", "filter.pwn.clean", str(script))
    git(repo, "config", "filter.pwn.smudge", str(script))
    set_attributes(repo, "*.txt filter=pwn")
    return ["add", "--renormalize", "."]


def plant_filter_process(repo: Path, tools: Path, mark: Path) -> list[str]:
    git(repo, "config", "filter.pwn.process", str(mark_script(tools, "process", mark)))
    set_attributes(repo, "*.txt filter=pwn")
    return ["add", "--renormalize", "."]


def plant_included_filter(repo: Path, tools: Path, mark: Path) -> list[str]:
    script = mark_script(tools, "filter", mark)
    (tools / "included.cfg").write_text(f'[filter "hidden"]\n\tclean = {script}\n\tsmudge = {script}\n')
    git(repo, "config", "include.path", str(tools / "included.cfg"))
    set_attributes(repo, "*.txt filter=hidden")
    return ["add", "--renormalize", "."]


def plant_textconv(repo: Path, tools: Path, mark: Path) -> list[str]:
    git(repo, "config", "diff.pwn.textconv", str(mark_script(tools, "textconv", mark)))
    set_attributes(repo, "*.txt diff=pwn")
    return ["diff", "HEAD~1", "HEAD"]


def plant_external_diff(repo: Path, tools: Path, mark: Path) -> list[str]:
    git(repo, "config", "diff.external", str(mark_script(tools, "external", mark)))
    git(repo, "config", "diff.pwn.command", str(mark_script(tools, "command", mark)))
    set_attributes(repo, "*.txt diff=pwn")
    return ["diff", "HEAD~1", "HEAD"]


def plant_merge_driver(repo: Path, tools: Path, mark: Path) -> list[str]:
    git(repo, "config", "merge.pwn.driver", str(mark_script(tools, "merge", mark)) + " %O %A %B")
    set_attributes(repo, "*.txt merge=pwn")
    return ["merge-tree", "--write-tree", "HEAD", "side"]


def plant_gpg(repo: Path, tools: Path, mark: Path) -> list[str]:
    git(repo, "config", "commit.gpgSign", "true")
    git(repo, "config", "gpg.program", str(mark_script(tools, "gpg", mark)))
    return ["commit", "--allow-empty", "-qm", "probe"]


def plant_editor(repo: Path, tools: Path, mark: Path) -> list[str]:
    git(repo, "config", "core.editor", str(mark_script(tools, "editor", mark)))
    return ["commit", "--allow-empty", "-q"]


VECTORS = {"hooks": plant_hooks, "core.hooksPath": plant_hooks_path, "core.fsmonitor": plant_fsmonitor,
           "filter clean/smudge": plant_filter, "filter process": plant_filter_process,
           "filter behind include.path": plant_included_filter, "diff textconv": plant_textconv,
           "external diff": plant_external_diff, "merge driver": plant_merge_driver, "gpg signing": plant_gpg,
           "editor": plant_editor}


def as_the_user(repo: Path, *args: str) -> None:
    """The user's own git: the repository's programs rightly run, and leave no mark."""
    subprocess.run(["git", "-C", str(repo), "-c", "commit.gpgSign=false", *args], check=True, capture_output=True,
                   env={**os.environ, "AS_THE_USER": "1", "GIT_AUTHOR_NAME": "user", "GIT_AUTHOR_EMAIL": "user@test",
                        "GIT_COMMITTER_NAME": "user", "GIT_COMMITTER_EMAIL": "user@test"})


def history(repo: Path) -> None:
    """A branch `side` that changes a.txt's third line, and main its first and last (the probes diff and merge
    them)."""
    git(repo, "branch", "side")
    for text, message in (("ONE\ntwo\nthree\nfour\nfive\nsix\n", "first"),
                          ("ONE\ntwo\nthree\nfour\nfive\nSIX\n", "last")):
        (repo / "a.txt").write_text(text)
        git(repo, "commit", "-qam", message)
    git(repo, "checkout", "-q", "side")
    (repo / "a.txt").write_text("one\ntwo\nTHREE\nfour\nfive\nsix\n")
    git(repo, "commit", "-qam", "third")
    git(repo, "checkout", "-q", "main")


@pytest.mark.parametrize("vector", VECTORS)
def test_the_bridges_own_git_runs_no_program_the_repositorys_config_names(bridge: Bridge, vector: str) -> None:
    repo = make_repo(bridge.root / "repo", USER_FILES)
    history(repo)
    tools, mark = bridge.tmp / "tools", bridge.tmp / "MARK"
    tools.mkdir()
    probe = VECTORS[vector](repo, tools, mark)
    copy = bridge.tmp / "probe"
    shutil.copytree(repo, copy)
    subprocess.run(["git", "-C", str(copy), *probe], capture_output=True, check=False,
                   env={**os.environ, "GIT_AUTHOR_NAME": "u", "GIT_AUTHOR_EMAIL": "u@t", "GIT_COMMITTER_NAME": "u",
                        "GIT_COMMITTER_EMAIL": "u@t"})
    assert mark.exists(), f"the planted {vector} does not run under plain git: the test would prove nothing"
    mark.unlink()

    with bridge.client() as client:
        # The job runs no git of its own (its git would rightly run the user's configuration): it leaves its
        # changes uncommitted, and every git command from here on is the bridge's.
        job = final(client, task="!write=a.txt:ONE\\ntwo\\nTHREE\\nfour\\nfive\\nSIX\\n !uncommitted=b.txt:bee",
                    cwd=str(repo), isolation="worktree")
        assert job.field("STATUS") == "ok", job.text
        (repo / "a.txt").write_text("ONE\ntwo\nthree\nfour\nfive\nsix, the user's\n")  # a content merge
        as_the_user(repo, "commit", "-qam", "the user's change")
        landed = client.call("hermes_land", job_id=job.field("JOB_ID"), action="merge")
        if vector == "merge driver":  # the driver is not run, so the path is a conflict to merge by hand
            assert refused(landed) and "a.txt" in landed.text, landed.text
            landed = client.call("hermes_land", job_id=job.field("JOB_ID"), action="discard")
        assert landed.field("STATUS") == "ok", landed.text
    assert "REPOSITORY" not in job.text and "REPOSITORY" not in landed.text  # the user's own config stays
    assert not mark.exists(), f"the bridge's git ran the repository's {vector}"


def poison_script(bridge: Bridge) -> tuple[Path, Path]:
    """What a job's shell can do to the repository it shares with the user, with plain git and plain writes."""
    mark = bridge.tmp / "POISONED"
    tools = bridge.tmp / "job-tools"
    tools.mkdir()
    program = mark_script(tools, "program", mark, passes_input=False)
    filter_program = mark_script(tools, "filter", mark)
    hooks = hooks_folder(tools / "hooks", mark)
    script = bridge.tmp / "poison.sh"
    script.write_text(f"""set -e
git config core.hooksPath '{hooks}'
git config core.fsmonitor '{program}'
git config filter.pwn.smudge '{filter_program}'
git config filter.pwn.clean '{filter_program}'
git config merge.pwn.driver '{program} %A'
common=$(git rev-parse --git-common-dir)
printf '[diff "pwn"]\\n\\ttextconv = {filter_program}\\n' > '{tools}/hidden.cfg'
git config include.path '{tools}/hidden.cfg'
printf '*.txt filter=pwn merge=pwn diff=pwn\\n' > "$common/info/attributes"
cp '{program}' "$common/hooks/pre-commit"
git branch planted-branch
git tag planted-tag
git update-ref refs/heads/hermes-bridge/20990101-000000-1 HEAD
git update-ref refs/hermes-bridge-work/20990101-000000-2 HEAD
""")
    return script, mark


def common_files(repo: Path) -> dict[str, bytes]:
    found = {}
    for path in [repo / ".git" / "config", *sorted((repo / ".git" / "hooks").iterdir())]:
        found[path.name] = path.read_bytes()
    info = repo / ".git" / "info" / "attributes"
    found["info/attributes"] = info.read_bytes() if info.exists() else b""
    return found


@pytest.mark.parametrize("driver", ["cli", "acp"])
def test_a_job_that_poisons_the_shared_config_and_hooks_has_them_put_back_and_reported(bridge: Bridge,
                                                                                       driver: str) -> None:
    repo = make_repo(bridge.root / "repo", USER_FILES)
    before = common_files(repo)
    script, mark = poison_script(bridge)
    bridge.configure(hermes_driver=driver, sandbox="off")  # the sandbox would refuse the writes (next test)
    client = bridge.client()
    client.params.env = dict(bridge.env, FAKE_HERMES_ACP="1" if driver == "acp" else "0")
    with client:
        job = final(client, task=f"!shell={script} !write=b.txt:bee !commit=work", cwd=str(repo),
                    isolation="worktree")
        assert job.field("STATUS") == "ok", job.text
        after_job = common_files(repo)
        landed = client.call("hermes_land", job_id=job.field("JOB_ID"), action="merge")
        status = client.call("hermes_status", job_id=job.field("JOB_ID"))
    assert after_job == before, "the job's changes to the repository's config, hooks or attributes stayed"
    reported = job.field("REPOSITORY")
    for words in ("the job changed .git/config (core.fsmonitor, core.hookspath, filter.pwn.*, include.path, "
                  "merge.pwn.*); restored", "the job created .git/hooks/pre-commit; restored",
                  "the job created .git/info/attributes; restored",
                  "created refs/heads/hermes-bridge/20990101-000000-1, refs/heads/planted-branch, "
                  "refs/hermes-bridge-work/20990101-000000-2, refs/tags/planted-tag"):
        assert words in reported, reported
    assert landed.field("STATUS") == "ok" and "merged into main" in landed.field("LANDED"), landed.text
    assert status.field("REPOSITORY") == reported  # every later block says it
    git(repo, "commit", "--allow-empty", "-qm", "the user's next commit")
    git(repo, "status")
    assert not mark.exists(), "a program the job planted ran"
    audit = [json.loads(line) for line in (bridge.tmp / "logs" / "audit.log").read_text().splitlines()]
    assert [e["changed"] for e in audit if e.get("event") == "repository"] == [reported.split(" | ")]


def test_under_the_sandbox_the_jobs_writes_to_the_shared_config_and_hooks_fail_and_its_commit_works(
        bridge: Bridge) -> None:
    """Issue 38: with the sandbox, the same poisoning fails at its first write (git config gets a permission
    error), while a commit on the job's own branch still works."""
    require_sandbox()
    repo = make_repo(bridge.root / "repo", USER_FILES)
    before = common_files(repo)
    script = bridge.tmp / "try.sh"
    script.write_text("git config core.hooksPath /tmp/x 2>> tried.txt || echo config-refused >> tried.txt\n"
                      "cp tried.txt \"$(git rev-parse --git-common-dir)/hooks/pre-commit\" 2>/dev/null "
                      "|| echo hook-refused >> tried.txt\n"
                      "git tag planted 2>/dev/null || echo tag-refused >> tried.txt\n")
    with bridge.client() as client:
        job = final(client, task=f"!shell={script} !write=b.txt:bee !commit=work", cwd=str(repo),
                    isolation="worktree")
    assert job.field("STATUS") == "ok", job.text
    assert job.field("SANDBOX").startswith("writes limited to "), job.text
    worktree = bridge.jobs / "worktrees" / job.field("JOB_ID")
    tried = (worktree / "tried.txt").read_text()
    assert "config-refused" in tried and "hook-refused" in tried and "tag-refused" in tried, tried
    assert common_files(repo) == before and "REPOSITORY" not in job.text
    assert git(repo, "log", "-1", "--format=%s", f"hermes-bridge/{job.field('JOB_ID')}") == "work"


def test_what_changes_after_the_job_ended_is_put_back_before_the_landing_and_core_worktree_is_not_followed(
        bridge: Bridge) -> None:
    repo = make_repo(bridge.root / "repo", USER_FILES)
    elsewhere = bridge.tmp / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "a.txt").write_text("someone else's\n")
    with bridge.client() as client:
        job = final(client, task="!write=b.txt:bee !commit=work", cwd=str(repo), isolation="worktree")
        git(repo, "config", "core.worktree", str(elsewhere))  # a leftover of the job, after its end
        landed = client.call("hermes_land", job_id=job.field("JOB_ID"), action="merge")
    assert landed.field("STATUS") == "ok", landed.text
    assert "the job changed .git/config (core.worktree); restored" in landed.field("REPOSITORY")
    assert (repo / "b.txt").read_text() == "bee" and sorted(p.name for p in elsewhere.iterdir()) == ["a.txt"]
    assert subprocess.run(["git", "-C", str(repo), "config", "--get", "core.worktree"]).returncode == 1


def test_a_landing_pins_the_main_tree_whatever_core_worktree_says(bridge: Bridge) -> None:
    repo = make_repo(bridge.root / "repo", USER_FILES)
    elsewhere = bridge.tmp / "elsewhere"
    elsewhere.mkdir()
    with bridge.client() as client:
        job = final(client, task="!write=b.txt:bee !commit=work", cwd=str(repo), isolation="worktree")
    job_id = job.field("JOB_ID")
    cfg = load_config(bridge.config)
    store = JobStore.of(cfg)
    record = store.read(job_id)
    git(repo, "config", "core.worktree", str(elsewhere))
    assert "merged into main" in merge_work(store, record)
    assert (repo / "b.txt").read_text() == "bee" and list(elsewhere.iterdir()) == []


def test_a_landing_never_overwrites_files_git_does_not_track(bridge: Bridge) -> None:
    files: dict[str, str | bytes] = {**USER_FILES, ".gitignore": ".env\nbuild/\nnotes\nlink\n"}
    repo = make_repo(bridge.root / "repo", files)
    (repo / ".env").write_text("SECRET=the user's\n")
    (repo / "build").mkdir()
    (repo / "build" / "cache.bin").write_bytes(b"\x00cache")
    (repo / "notes").write_text("an ignored file where the job puts a folder\n")
    (repo / "link").symlink_to(bridge.tmp / "nowhere")  # an ignored link that leads nowhere (issue 50)
    before = state_of(repo)
    script = bridge.tmp / "force.sh"
    script.write_text("echo 'SECRET=the job' > .env && mkdir -p build notes && echo job > build/cache.bin && "
                      "echo job > notes/x.txt && echo job > link && git add -f .env build/cache.bin notes/x.txt link\n")
    with bridge.client() as client:
        job = final(client, task=f"!shell={script} !write=c.txt:sea !commit=work", cwd=str(repo),
                    isolation="worktree")
        assert job.field("STATUS") == "ok" and "+ .env" in job.text, job.text
        landed = client.call("hermes_land", job_id=job.field("JOB_ID"), action="merge")
    assert refused(landed), landed.text
    assert "would overwrite 4 files" in landed.text and ".env, build/cache.bin, link, notes." in landed.text, \
        landed.text
    assert (repo / "link").is_symlink() and os.readlink(repo / "link") == str(bridge.tmp / "nowhere")
    assert (repo / ".env").read_text() == "SECRET=the user's\n"
    assert (repo / "build" / "cache.bin").read_bytes() == b"\x00cache" and (repo / "notes").is_file()
    assert state_of(repo) == before and not (repo / "c.txt").exists()


def worktree_job_beside_users_worktree(bridge: Bridge, client: BridgeClient) -> tuple[Path, Path, str, Path, Path]:
    """A repository with a worktree of the user's and a finished worktree job: the repository, the user's
    worktree, the job's id, its worktree's path and its administrative folder."""
    repo = make_repo(bridge.root / "repo", USER_FILES)
    users_worktree = bridge.tmp / "users-worktree"
    git(repo, "worktree", "add", "-q", str(users_worktree), "-b", "users-branch")
    job = final(client, task="!write=b.txt:bee !commit=work", cwd=str(repo), isolation="worktree")
    job_id = job.field("JOB_ID")
    path = bridge.jobs / "worktrees" / job_id
    return repo, users_worktree, job_id, path, Path(git_text(str(path), "rev-parse", "--absolute-git-dir"))


def test_a_symlink_put_at_the_worktree_path_is_removed_never_followed(bridge: Bridge) -> None:
    with bridge.client() as client:
        repo, users_worktree, job_id, path, admin = worktree_job_beside_users_worktree(bridge, client)
        (users_worktree / "draft.txt").write_text("the user's uncommitted work\n")
        shutil.rmtree(path)
        path.symlink_to(users_worktree)
        (admin / "gitdir").write_text(f"{users_worktree}/.git\n")
        discarded = client.call("hermes_land", job_id=job_id, action="discard")
    assert discarded.field("STATUS") == "ok", discarded.text
    assert (users_worktree / "draft.txt").read_text() == "the user's uncommitted work\n"
    assert (users_worktree / "a.txt").exists() and not path.is_symlink() and not path.exists()
    assert f"{users_worktree}\n" in git(repo, "worktree", "list", "--porcelain") + "\n"


def test_a_discard_removes_only_the_folders_the_bridge_made(bridge: Bridge) -> None:
    """Issue 50: at discard, the worktree's path and its administrative folder may hold something else by now (the
    user's folder moved there, another worktree's administrative folder renamed into its place): neither is the
    bridge's, so neither is removed, and the user's worktree keeps its git link."""
    users_folder = bridge.tmp / "users-folder"
    users_folder.mkdir()
    (users_folder / "keep.txt").write_text("a folder that is not the bridge's worktree\n")
    with bridge.client() as client:
        _, users_worktree, job_id, path, admin = worktree_job_beside_users_worktree(bridge, client)
        users_admin = Path(git_text(str(users_worktree), "rev-parse", "--absolute-git-dir"))
        shutil.rmtree(path)
        users_folder.rename(path)
        shutil.rmtree(admin)
        users_admin.rename(admin)
        discarded = client.call("hermes_land", job_id=job_id, action="discard")
    assert discarded.field("STATUS") == "ok", discarded.text
    assert (path / "keep.txt").read_text() == "a folder that is not the bridge's worktree\n"
    assert (admin / "gitdir").read_text().strip() == f"{users_worktree}/.git"  # kept, where it was put
    admin.rename(users_admin)
    assert git_text(str(users_worktree), "status", "--porcelain") == ""  # its link works again


def test_a_branch_name_another_job_planted_is_no_reason_to_fail(bridge: Bridge) -> None:
    repo = make_repo(bridge.root / "repo", USER_FILES)
    store = JobStore.of(load_config(bridge.config))
    store.ensure()
    job_id = "20990101-000000-7"
    git(repo, "branch", f"hermes-bridge/{job_id}")
    git(repo, "branch", f"hermes-bridge/{job_id}-2")
    worktree: dict[str, Any] = {"repo": str(repo), "path": str(store.worktree_path(job_id)),
                                "branch": f"hermes-bridge/{job_id}", "base": git(repo, "rev-parse", "HEAD")}
    notes = add_worktree(store, job_id, worktree)
    assert worktree["branch"] == f"hermes-bridge/{job_id}-3"
    assert notes == [f"the branch hermes-bridge/{job_id} already existed (not made by this job), so the job's "
                     f"branch is hermes-bridge/{job_id}-3"]
    assert git(store.worktree_path(job_id), "rev-parse", "--abbrev-ref", "HEAD") == f"hermes-bridge/{job_id}-3"
    assert is_branch_of(worktree["branch"], job_id) and not is_branch_of(f"hermes-bridge/{job_id}-x", job_id)
    assert bridge_ref_owner(f"refs/heads/hermes-bridge/{job_id}-3") == job_id
    assert bridge_ref_owner("refs/heads/main") is None


def test_a_worktree_jobs_edit_of_the_main_tree_is_denied_as_outside_its_worktree(bridge: Bridge) -> None:
    """The main tree lies inside the allowed roots, and still a worktree job's edit of it is denied, in words
    that say which boundary it crossed."""
    repo = make_repo(bridge.root / "repo", USER_FILES)
    bridge.configure(hermes_driver="acp")
    client = bridge.client()
    client.params.env = dict(bridge.env, FAKE_HERMES_ACP="1")
    with client:
        job = final(client, task=f"!edit=inside.txt:fine !edit={repo / 'a.txt'}:bad", cwd=str(repo),
                    isolation="worktree")
    assert job.field("STATUS") == "ok", job.text
    assert (repo / "a.txt").read_text() == USER_FILES["a.txt"]
    worktree = bridge.jobs / "worktrees" / job.field("JOB_ID")
    assert (worktree / "inside.txt").read_text() == "fine"
    decisions = {d["what"]: (d["decision"], d["by"]) for d in bridge.record(job.field("JOB_ID")).decisions}
    assert decisions[f"edit {repo / 'a.txt'}"] == (
        "deny", f"the bridge: {repo / 'a.txt'} resolves to {repo / 'a.txt'}, outside the job's worktree (the main "
                "tree changes only through hermes_land)")


@pytest.mark.parametrize("key", ["include.path", "includeIf.gitdir:/.path", "includeIf.onbranch:main.path"])
def test_a_file_the_users_config_includes_is_put_back_whatever_includes_it(tmp_path: Path, key: str) -> None:
    """Issue 50 (repo_guard.py:61): git reads a file named by include.path or by includeIf.<condition>.path as
    part of the repository's config: a job that writes a program into it has it put back, and said."""
    repo = make_repo(tmp_path / "repo", USER_FILES)
    included = tmp_path / "settings" / "included.cfg"
    included.parent.mkdir()
    included.write_text("[user]\n\tname = the user\n")
    git(repo, "config", key, str(included))
    snapshot = take_snapshot(str(repo))
    included.write_text("[core]\n\tfsmonitor = touch planted\n")
    said = restore_repository(str(repo), snapshot, tmp_path / "kept")
    assert included.read_text() == "[user]\n\tname = the user\n"
    assert said == [f"the job changed {included}; restored"], said


def guarded_change(tmp_path: Path, change: Any) -> tuple[Path, list[str]]:
    """A repository with a submodule's git folder and another linked worktree, snapshotted, changed by
    `change(repo)` as a job without a mount namespace could, then restored: the repository and what was said."""
    repo = make_repo(tmp_path / "repo", USER_FILES)
    (repo / ".git" / "modules" / "sub" / "hooks").mkdir(parents=True)
    (repo / ".git" / "modules" / "sub" / "config").write_text("[core]\n\tbare = false\n")
    (repo / ".git" / "modules" / "sub" / "HEAD").write_text("ref: refs/heads/main\n")
    git(repo, "worktree", "add", "-q", str(tmp_path / "other"), "-b", "other")
    snapshot = take_snapshot(str(repo))
    change(repo)
    return repo, restore_repository(str(repo), snapshot, tmp_path / "kept")


def test_no_number_of_files_in_hooks_pushes_a_planted_hook_past_the_guard(tmp_path: Path) -> None:
    """Issue 63: 600 empty files in .git/hooks pushed a planted pre-commit past the guard's cut of 500."""
    def fill(repo: Path) -> None:
        for number in range(600):
            (repo / ".git" / "hooks" / f"aaa-{number:03}").write_text("")
        (repo / ".git" / "hooks" / "pre-commit").write_text("#!/bin/sh\ntouch planted\n")
    repo, said = guarded_change(tmp_path, fill)
    assert not (repo / ".git" / "hooks" / "pre-commit").exists()
    assert not list((repo / ".git" / "hooks").glob("aaa-*"))
    assert said[0] == (".git/hooks held more than 500 entries after the job: replaced whole by its copy from before "
                       "the job (the job's version kept aside)"), said
    assert (tmp_path / "kept" / "whole" / ".git" / "hooks" / "pre-commit").exists()


@pytest.mark.parametrize("where", ["modules/sub/config", "worktrees/other/commondir", "commondir",
                                   "objects/info/alternates", "modules/sub/hooks/pre-commit"])
def test_the_guard_keeps_every_file_through_which_git_finds_config_hooks_and_objects(tmp_path: Path,
                                                                                       where: str) -> None:
    """Issue 63: a submodule's git folder, another worktree's admin folder, commondir and alternates."""
    def plant(repo: Path) -> None:
        path = repo / ".git" / where
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("[core]\n\tfsmonitor = touch planted\n")
    repo, said = guarded_change(tmp_path, plant)
    original = {"modules/sub/config": "[core]\n\tbare = false\n", "worktrees/other/commondir": "../..\n"}
    path = repo / ".git" / where
    assert (path.read_text() == original[where]) if where in original else not path.exists(), where
    assert any(f".git/{where}" in line and line.endswith("restored") for line in said), said


def test_a_git_folder_moved_aside_behind_a_gitdir_file_is_moved_back(tmp_path: Path) -> None:
    def move(repo: Path) -> None:
        (repo / ".git").rename(repo / ".hidden-git")
        (repo / ".git").write_text("gitdir: .hidden-git\n")
    repo, said = guarded_change(tmp_path, move)
    assert (repo / ".git").is_dir() and not (repo / ".hidden-git").exists()
    assert said[0] == "the job moved .git to .hidden-git and put a gitdir file in its place; moved back", said
    git(repo, "status")
