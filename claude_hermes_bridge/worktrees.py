"""[both] A worktree job's repository, its worktree made and removed, its work saved as a commit and a patch."""
import dataclasses
import os
import subprocess
from pathlib import Path
from typing import Any, cast

from .config import Config
from .jobs import CHANGED_LINES, JOB_ID_RE, JobRecord, JobStore
from .safe_io import Refused, locked, shown

# A job with isolation "worktree" runs in a git worktree of its own, made and owned by the bridge (Hermes'
# own --worktree is unfit: DESIGN.md section 13), in the jobs folder: outside the repository, so the main
# tree's `git status`, `git clean` and `grep -r` never see it, and readable by hermes_read like a job's log.
# The job's work (its commits and what it left uncommitted) is kept as one commit under
# refs/hermes-bridge/<id> and as a binary patch beside the record; hermes_land merges or discards it.
WORKTREE_BRANCH_PREFIX = "hermes-bridge/"
WORKTREE_REF_PREFIX = "refs/hermes-bridge/"
ISOLATION_BASES = ("head", "working-tree")
GIT_TIMEOUT_S = 60.0  # one git command; a worktree's checkout and its submodules get GIT_CHECKOUT_TIMEOUT_S
GIT_CHECKOUT_TIMEOUT_S = 600.0
REPO_LOCK_S = 30.0
BRIDGE_IDENTITY = {"GIT_AUTHOR_NAME": "claude-hermes-bridge", "GIT_AUTHOR_EMAIL": "hermes-bridge@localhost",
                   "GIT_COMMITTER_NAME": "claude-hermes-bridge", "GIT_COMMITTER_EMAIL": "hermes-bridge@localhost"}


class GitFailed(Exception):
    """A git command that failed, in words: the command and the last line git printed."""


def git(folder: str, *args: str, env: dict[str, str] | None = None, timeout_s: float = GIT_TIMEOUT_S,
        stdout: Any = None, check: bool = True, given: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    """git in folder, with nothing of the caller's git environment, no hooks and no fsmonitor (a repository's
    config could name a program for either, and the bridge's own git calls run no program of the job's),
    no prompt, and messages in English. stdout: a file to stream into (a patch can be large); given: its
    input."""
    import shutil

    exe = shutil.which("git")
    if exe is None:
        raise GitFailed("git is not installed or not on PATH")
    environment = {key: value for key, value in os.environ.items() if not key.startswith("GIT_")}
    environment.update(GIT_TERMINAL_PROMPT="0", LC_ALL="C", LANGUAGE="C", **(env or {}))
    argv = [exe, "-c", f"core.hooksPath={os.devnull}", "-c", "core.fsmonitor=false", "-C", folder, *args]
    try:
        done = subprocess.run(argv, input=given, stdin=None if given is not None else subprocess.DEVNULL,
                              stdout=stdout or subprocess.PIPE, stderr=subprocess.PIPE, env=environment,
                              timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise GitFailed(f"git {args[0]} took more than {timeout_s:g} s") from None
    except OSError as exc:
        raise GitFailed(f"git could not run: {exc.strerror or exc}") from None
    if check and done.returncode != 0:
        said = [line for line in done.stderr.decode("utf-8", "replace").splitlines() if line.strip()]
        last = said[-1] if said else f"exit {done.returncode}"
        raise GitFailed(f"git {' '.join(args[:2])} failed: {shown(last, 300)}")
    return done


def git_text(folder: str, *args: str, env: dict[str, str] | None = None) -> str:
    return git(folder, *args, env=env).stdout.decode("utf-8", "replace").strip()


@dataclasses.dataclass(frozen=True)
class Repository:
    """The repository a worktree job's cwd is in, as the launch found it."""

    top: str
    head: str
    branch: str | None  # the branch HEAD is on; None when detached
    subdir: str  # cwd below top, with / ('' for the top itself)
    uncommitted: int  # paths with uncommitted or untracked changes
    submodules: bool


def repository_of(cwd: str) -> Repository:
    """The repository around cwd, or Refused naming why a worktree cannot be made from it."""
    try:
        top = os.path.realpath(git_text(cwd, "rev-parse", "--show-toplevel"))
    except GitFailed as exc:
        raise Refused(f"isolation \"worktree\" needs cwd inside a git repository, and {shown(cwd)} is not in one "
                      f"({exc}). Run `git init` and commit, or use isolation \"none\"") from None
    try:
        head = git_text(top, "rev-parse", "--verify", "--quiet", "HEAD^{commit}")
    except GitFailed:
        raise Refused(f"isolation \"worktree\" needs a repository with at least one commit, and {shown(top)} has "
                      "none yet: commit first, or use isolation \"none\"") from None
    branch = git(top, "symbolic-ref", "--quiet", "--short", "HEAD", check=False).stdout.decode().strip() or None
    status = git(top, "status", "--porcelain", "-z", "--untracked-files=all", "--no-renames").stdout
    subdir = Path(os.path.relpath(cwd, top)).as_posix()
    return Repository(top, head, branch, "" if subdir == "." else subdir, len([e for e in status.split(b"\0") if e]),
                      os.path.isfile(os.path.join(top, ".gitmodules")))


def worktree_of(store: "JobStore", record: "JobRecord") -> dict[str, Any] | None:
    """A record's worktree, only as the bridge made it: in this jobs folder, on the branch named for the job
    that made it (a resumed job's is its first job's). A job can write its record: a worktree pointing
    anywhere else is never touched (None)."""
    worktree = record.worktree
    if not worktree:
        return None
    owner = worktree.get("job", record.id)
    if not isinstance(owner, str) or not JOB_ID_RE.fullmatch(owner):
        return None
    if worktree["path"] != str(store.worktree_path(owner)) or worktree["branch"] != WORKTREE_BRANCH_PREFIX + owner:
        return None
    return worktree


def job_roots(cfg: Config, record: "JobRecord") -> list[str]:
    """Where a job may work and edit: the allowed roots, or, for a worktree job, only its own worktree."""
    return [os.path.realpath(record.worktree["path"])] if record.worktree else cfg.roots


def repo_lock(store: "JobStore", top: str) -> Any:
    """One lock per repository (by its folder) around the bridge's changes to it: worktrees made and removed,
    merges, so two jobs or a job and a landing never interleave them."""
    import hashlib

    return locked(store.locks / f"repo-{hashlib.sha256(top.encode()).hexdigest()[:24]}.lock", REPO_LOCK_S)


def tree_commit(folder: str, parent: str, index: Path, message: str, git_dir: list[str] | None = None) -> str:
    """A commit of everything in folder's working tree (untracked files too, ignored ones not) on parent,
    made through a throwaway index: the folder's own index, stash and branches are untouched. parent itself
    when nothing differs from it."""
    env = {"GIT_INDEX_FILE": str(index), **BRIDGE_IDENTITY}
    where = git_dir or []
    index.unlink(missing_ok=True)
    try:
        git(folder, *where, "read-tree", parent, env=env)
        git(folder, *where, "add", "-A", "--", ".", env=env, timeout_s=GIT_CHECKOUT_TIMEOUT_S)
        tree = git_text(folder, *where, "write-tree", env=env)
    finally:
        index.unlink(missing_ok=True)
    if tree == git_text(folder, *where, "rev-parse", f"{parent}^{{tree}}"):
        return parent
    return git_text(folder, *where, "commit-tree", tree, "-p", parent, "-m", message, env=env)


def worktree_git(worktree: dict[str, Any]) -> list[str]:
    """The options that pin a git command to the job's own worktree: its administrative folder as recorded
    when it was made, so a `.git` file the job rewrote cannot point the bridge at another repository."""
    return [f"--git-dir={worktree['admin']}", f"--work-tree={worktree['path']}"]


def add_worktree(store: "JobStore", job_id: str, worktree: dict[str, Any]) -> list[str]:
    """Make the job's worktree (recorded in worktree: repo, path, branch, base; admin is set here): on a new
    branch at base, or from its branch when a resume finds it removed; locked with the job's id as the reason.
    A failed add leaves no branch behind. Returns notes for the log (submodules)."""
    top, path, branch = worktree["repo"], worktree["path"], worktree["branch"]
    reason = f"claude-hermes-bridge job {job_id}"
    fresh = "admin" not in worktree  # else a resumed job's worktree, made again from its branch
    notes = []
    with repo_lock(store, top):
        def branch_exists() -> bool:
            return git(top, "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}", check=False).returncode == 0
        existed = branch_exists()
        if fresh and existed:
            raise GitFailed(f"the repository already has a branch {branch} (another bridge's job of the same id?)")
        if fresh and worktree.get("from") == "working-tree":
            worktree["base"] = tree_commit(top, worktree["head"], store.locks / f"{job_id}.index",
                                           f"claude-hermes-bridge: the working tree as job {job_id} started")
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        try:
            where = ["-b", branch, path, worktree["base"]] if fresh else [path, branch]
            git(top, "worktree", "add", "--lock", "--reason", reason, *where, timeout_s=GIT_CHECKOUT_TIMEOUT_S)
        except GitFailed:
            if not existed and branch_exists():  # git makes the branch first, and leaves it when the add fails
                git(top, "branch", "-D", branch, check=False)
            raise
        worktree["admin"] = os.path.realpath(os.path.join(path, git_text(path, "rev-parse", "--git-dir")))
    if worktree.get("submodules") == "present":
        try:
            git(path, "submodule", "update", "--init", "--recursive", timeout_s=GIT_CHECKOUT_TIMEOUT_S)
            worktree["submodules"] = "initialised"
        except GitFailed as exc:
            worktree["submodules"] = f"not initialised ({exc}): empty in the worktree"
        notes.append(f"submodules {worktree['submodules']}")
    return notes


def save_worktree_work(store: "JobStore", record: "JobRecord") -> None:
    """The job's work as one commit (its own commits, plus what it left uncommitted), kept reachable under
    refs/hermes-bridge/<id>, with the patch against the base beside the record and its stat and file list in
    the record. Called when the job ends, and for a job whose supervisor died, at the next server start."""
    worktree = cast(dict[str, Any], record.worktree)
    path, top = worktree["path"], worktree["repo"]
    if not os.path.isdir(path) or "admin" not in worktree:
        return
    pinned = worktree_git(worktree)
    head = git_text(path, *pinned, "rev-parse", "--verify", "HEAD^{commit}")
    work = tree_commit(path, head, store.locks / f"{record.id}.index",
                       f"claude-hermes-bridge: the work of job {record.id} (committed and not)", pinned)
    git(top, "update-ref", f"{WORKTREE_REF_PREFIX}{record.id}", work)
    base = worktree["base"]
    patch = store.patch_path(record.id)
    partial = patch.with_name(patch.name + ".partial")
    partial.unlink(missing_ok=True)
    with open(partial, "xb") as handle:
        git(top, "diff", "--binary", "--no-color", "--no-ext-diff", base, work, stdout=handle)
    os.replace(partial, patch)
    files = insertions = deletions = 0
    for line in git(top, "diff", "--numstat", "-z", "--no-renames", base, work).stdout.split(b"\0"):
        fields = line.split(b"\t", 2)
        if len(fields) == 3:
            files += 1
            insertions += int(fields[0]) if fields[0].isdigit() else 0
            deletions += int(fields[1]) if fields[1].isdigit() else 0
    worktree["work"] = work
    record.diff = {"files": files, "insertions": insertions, "deletions": deletions, "patch": str(patch),
                   "patch_bytes": patch.stat().st_size}
    record.changes = worktree_changes(top, base, work)


def worktree_changes(top: str, base: str, work: str) -> dict[str, Any]:
    """CHANGED_FILES of a worktree job: what its work changed against the base, as git sees it."""
    names = git(top, "diff", "--name-status", "-z", "--no-renames", base, work).stdout.decode("utf-8", "replace")
    fields = names.split("\0")
    pairs = list(zip(fields[0::2], fields[1::2], strict=False))  # the list ends with an empty field
    kinds = {"A": "+", "M": "~", "T": "~", "D": "-"}
    marked = [(kinds.get(status[:1], "~"), name) for status, name in pairs if status]
    lines = [f"{mark} {name}" for order in "+~-" for mark, name in marked if mark == order]  # as compare_snapshots
    count = {mark: sum(1 for found, _ in marked if found == mark) for mark in "+~-"}
    return {"created": count["+"], "modified": count["~"], "deleted": count["-"], "lines": lines[:CHANGED_LINES],
            "more": max(0, len(lines) - CHANGED_LINES)}


def remove_worktree(store: "JobStore", worktree: dict[str, Any], branch_too: bool, job_id: str) -> None:
    """The worktree gone (locked or not, with what it held: its work is kept under the job's ref and in the
    patch); with branch_too, its branch and the job's ref as well."""
    top = worktree["repo"]
    with repo_lock(store, top):
        if os.path.isdir(worktree["path"]):
            git(top, "worktree", "remove", "--force", "--force", worktree["path"], timeout_s=GIT_CHECKOUT_TIMEOUT_S)
        git(top, "worktree", "prune", check=False)
        if branch_too:
            git(top, "branch", "-D", worktree["branch"], check=False)
            git(top, "update-ref", "-d", f"{WORKTREE_REF_PREFIX}{job_id}", check=False)
