"""[both] A worktree job's repository, its worktree made and removed, its work saved as a commit and a patch."""
import contextlib
import dataclasses
import os
import re
import shutil
from pathlib import Path
from typing import Any, cast

from .config import Config
from .folder_changes import runs_later
from .git_calls import GIT_CHECKOUT_TIMEOUT_S, GitFailed, git, git_text
from .jobs import CHANGED_LINES, JOB_ID_RE, JobRecord, JobStore
from .safe_io import IS_WINDOWS, Refused, folder_identity, locked, shown

# A job with isolation "worktree" runs in a git worktree of its own, made and owned by the bridge (Hermes'
# own --worktree is unfit: DESIGN.md section 13), in the jobs folder: outside the repository, so the main
# tree's `git status`, `git clean` and `grep -r` never see it, and readable by hermes_read like a job's log.
# The job's work (its commits and what it left uncommitted) is kept as one commit under
# refs/hermes-bridge-work/<id> (a namespace no short name of the branch hermes-bridge/<id> resolves to) and as
# a binary patch beside the record; hermes_land merges or discards it.
WORKTREE_BRANCH_PREFIX = "hermes-bridge/"
WORKTREE_REF_PREFIX = "refs/hermes-bridge-work/"
LEGACY_REF_PREFIX = "refs/hermes-bridge/"  # where older jobs kept it; removed with them
# What a standby names its folders, and a worktree it readies with its branch (by the pid that sweeps them)
STANDBY_NAME_RE = re.compile(r"standby-(\d+)-[0-9a-f]{12}")
BRANCH_SUFFIXES = 20  # a job's branch name taken (planted by another job): hermes-bridge/<id>-2, -3, ...
ISOLATION_BASES = ("head", "working-tree")
REPO_LOCK_S = 30.0
BRIDGE_IDENTITY = {"GIT_AUTHOR_NAME": "claude-hermes-bridge", "GIT_AUTHOR_EMAIL": "hermes-bridge@localhost",
                   "GIT_COMMITTER_NAME": "claude-hermes-bridge", "GIT_COMMITTER_EMAIL": "hermes-bridge@localhost"}


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
    if refusal := common_folder_refusal(top):
        raise Refused(refusal)
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
    if worktree["path"] != str(store.worktree_path(owner)) or not is_branch_of(worktree["branch"], owner):
        return None
    return worktree


def is_branch_of(branch: str, job_id: str) -> bool:
    """Whether branch is a name the bridge gives job_id's worktree: hermes-bridge/<id>, or with a suffix when
    that name was taken."""
    return re.fullmatch(re.escape(WORKTREE_BRANCH_PREFIX + job_id) + r"(-[0-9]{1,2})?", branch) is not None


def job_roots(cfg: Config, record: "JobRecord") -> list[str]:
    """Where a job may work and edit: the allowed roots, or, for a worktree job, only its own worktree."""
    return [os.path.realpath(record.worktree["path"])] if record.worktree else cfg.roots


def repo_lock(store: "JobStore", top: str) -> Any:
    """One lock per repository (by its folder) around the bridge's changes to it: worktrees made and removed,
    merges, so two jobs or a job and a landing never interleave them."""
    import hashlib

    return locked(store.locks / f"repo-{hashlib.sha256(top.encode()).hexdigest()[:24]}.lock", REPO_LOCK_S)


def worktree_git_paths(worktree: dict[str, Any] | None) -> list[str]:
    """What git needs to write for a commit on the job's own branch, made ready for a sandbox's rules: the job's
    own object folder, the branch's folder of refs and of reflogs, and the worktree's administrative folder.
    Not the repository's objects (git never re-hashes an object it reads: whoever writes them can change what a
    commit is), config, hooks, other branches' folders or tags."""
    if not worktree or "admin" not in worktree or "objects" not in worktree:
        return []
    common = os.path.dirname(os.path.dirname(worktree["admin"]))
    folders = [os.path.join(common, "refs", "heads", WORKTREE_BRANCH_PREFIX.rstrip("/")),
               os.path.join(common, "logs", "refs", "heads", WORKTREE_BRANCH_PREFIX.rstrip("/"))]
    for folder in folders:
        os.makedirs(folder, exist_ok=True)
    return [worktree["admin"], worktree["objects"], *folders]


def own_objects(store: "JobStore", record: "JobRecord") -> str:
    """The worktree job's own object folder (made now, and named in the record's worktree): derived from the jobs
    folder and the worktree's first job, never taken from the record a job can write."""
    worktree = cast(dict[str, Any], record.worktree)
    folder = store.worktree_objects_path(worktree.get("job", record.id))
    for part in ("pack", "info"):
        (folder / part).mkdir(parents=True, exist_ok=True)
    worktree["objects"] = str(folder)
    return str(folder)


def object_environment(objects: str, top: str) -> dict[str, str]:
    """What makes git, in the job's worktree, write objects to the job's own folder and read the repository's
    as an alternate (quoted: a path may hold the list's separator)."""
    common = common_git_folder(top)
    quoted = '"' + os.path.join(common, "objects").replace("\\", "\\\\").replace('"', '\\"') + '"'
    return {"GIT_OBJECT_DIRECTORY": objects, "GIT_ALTERNATE_OBJECT_DIRECTORIES": quoted}


def common_git_folder(top: str) -> str:
    return os.path.realpath(os.path.join(top, git_text(top, "rev-parse", "--git-common-dir")))


def import_work(store: "JobStore", worktree: dict[str, Any], work: str, job_id: str) -> None:
    """The objects of the job's work that the repository lacks, brought in by git: packed from the job's own
    folder (the repository's as an alternate) and indexed into the repository by index-pack, which hashes every
    object, so a forged object can add only a new name, never change an existing one. GitFailed when the work
    is then not whole in the repository (the job removed what it needs)."""
    top, base = worktree["repo"], worktree["base"]
    objects = str(store.worktree_objects_path(worktree.get("job", job_id)))
    pack = store.locks / f"{job_id}.pack"
    pack.unlink(missing_ok=True)
    try:
        with open(pack, "xb") as out:
            git(worktree["path"], *worktree_git(worktree), "pack-objects", "--revs", "--stdout", "-q",
                env=object_environment(objects, top), stdout=out, given=f"{work}\n^{base}\n".encode())
        with open(pack, "rb") as packed:
            git(top, "index-pack", "--stdin", "--fix-thin", given=packed, timeout_s=GIT_CHECKOUT_TIMEOUT_S)
    finally:
        pack.unlink(missing_ok=True)
    git(top, "rev-list", "--objects", "--quiet", work, f"^{base}")


def tree_commit(folder: str, parent: str, index: Path, message: str, git_dir: list[str] | None = None,
                objects: dict[str, str] | None = None) -> str:
    """A commit of everything in folder's working tree (untracked files too, ignored ones not) on parent,
    made through a throwaway index: the folder's own index, stash and branches are untouched. parent itself
    when nothing differs from it. objects: where git writes and reads objects (object_environment)."""
    env = {"GIT_INDEX_FILE": str(index), **BRIDGE_IDENTITY, **(objects or {})}
    where = git_dir or []
    index.unlink(missing_ok=True)
    try:
        git(folder, *where, "read-tree", parent, env=env)
        git(folder, *where, "add", "-A", "--", ".", env=env, timeout_s=GIT_CHECKOUT_TIMEOUT_S)
        tree = git_text(folder, *where, "write-tree", env=env)
    finally:
        index.unlink(missing_ok=True)
    if tree == git_text(folder, *where, "rev-parse", f"{parent}^{{tree}}", env=objects):
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
    top, path = worktree["repo"], worktree["path"]
    reason = f"claude-hermes-bridge job {job_id}"
    fresh = "admin" not in worktree  # else a resumed job's worktree, made again from its branch
    notes = []
    with repo_lock(store, top):
        def branch_exists(name: str) -> bool:
            return git(top, "rev-parse", "--verify", "--quiet", f"refs/heads/{name}", check=False).returncode == 0
        if fresh and branch_exists(worktree["branch"]):
            taken = worktree["branch"]
            free = [f"{taken}-{n}" for n in range(2, BRANCH_SUFFIXES + 1) if not branch_exists(f"{taken}-{n}")]
            if not free:
                raise GitFailed(f"the repository already has branches {taken} and {taken}-2 to -{BRANCH_SUFFIXES}")
            worktree["branch"] = free[0]
            notes.append(f"the branch {taken} already existed (not made by this job), so the job's branch is "
                         f"{free[0]}")
        branch = worktree["branch"]
        existed = branch_exists(branch)
        if fresh and worktree.get("from") == "working-tree":
            worktree["base"] = tree_commit(top, worktree["head"], store.locks / f"{job_id}.index",
                                           f"claude-hermes-bridge: the working tree as job {job_id} started")
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        try:
            where = ["-b", branch, path, worktree["base"]] if fresh else [path, branch]
            git(top, "worktree", "add", "--lock", "--reason", reason, *where, timeout_s=GIT_CHECKOUT_TIMEOUT_S)
        except GitFailed:
            if not existed and branch_exists(branch):  # git makes the branch first, and leaves it when the add fails
                git(top, "branch", "-D", branch, check=False)
            raise
        worktree["admin"] = os.path.realpath(os.path.join(path, git_text(path, "rev-parse", "--git-dir")))
        worktree["identity"] = identity_words(path)
    if worktree.get("submodules") == "present":
        try:
            git(path, "submodule", "update", "--init", "--recursive", timeout_s=GIT_CHECKOUT_TIMEOUT_S, transport=True)
            worktree["submodules"] = "initialised"
        except GitFailed as exc:
            worktree["submodules"] = f"not initialised ({exc}): empty in the worktree"
        notes.append(f"submodules {worktree['submodules']}")
    return notes


PLANNED_KEYS = ("repo", "base", "head", "base_branch", "subdir", "from", "submodules")  # as the launch plans one


def warm_worktree_refusal(planned: dict[str, Any]) -> str | None:
    """Why a worktree job planned so cannot take a worktree a standby readied ahead of it (None: it can). A
    resumed job's worktree is not readied: its first job made it."""
    if planned.get("job"):
        return None
    if IS_WINDOWS:
        return "a readied worktree is renamed for its job, which Windows refuses while Hermes works in it"
    if planned.get("from") != "head":
        return "a worktree of your uncommitted files is made from them when its job starts"
    if planned.get("submodules") != "none":
        return "a worktree's submodules are initialised for its job"
    return None


def standby_place(worktree: dict[str, Any] | None, folder: str) -> str:
    """What a standby readied for a job like this one stands for (in its key): a new worktree job's repository and
    commit (worktree_place); a resumed worktree job's folder in that very worktree, by its identity (one removed
    and made again from its branch is another folder to the sandbox's rules); else the job's folder."""
    if not worktree:
        return folder
    if worktree.get("job"):
        return f"{folder} (the worktree of job {worktree['job']}, folder {identity_words(worktree['path'])})"
    return worktree_place(worktree)


def folder_below(top: str, subdir: str) -> str:
    """A folder of a worktree or repository by its path below the top, as the record keeps it (with /)."""
    return os.path.join(top, *subdir.split("/")) if subdir else top


def worktree_place(planned: dict[str, Any]) -> str:
    """What a standby readied for worktree jobs stands for (in its key): the repository, the commit, the folder."""
    return (f"a worktree of {planned['repo']} at commit {planned['base']}"
            + (f" (in {planned['subdir']})" if planned["subdir"] else ""))


def ready_worktree(store: "JobStore", name: str, planned: dict[str, Any]) -> dict[str, Any]:
    """A worktree for the next worktree job on a repository, made by a standby (`name`: its own, as it names
    its folders) at the base that job would get, with an object folder of its own."""
    worktree = {key: planned[key] for key in PLANNED_KEYS if key in planned}
    worktree.update(path=str(store.worktree_path(name)), branch=WORKTREE_BRANCH_PREFIX + name)
    add_worktree(store, name, worktree)
    objects = store.worktree_objects_path(name)
    for part in ("pack", "info"):
        (objects / part).mkdir(parents=True, exist_ok=True)
    worktree["objects"] = str(objects)
    return worktree


def hand_over_worktree(store: "JobStore", worktree: dict[str, Any], job_id: str) -> None:
    """A standby's worktree made the job's, as if the job had made it: moved to the job's place and locked for
    it, its branch renamed, its object folder too (its old name left as a link: the warm Hermes' git names it).
    Hermes' folder, the sandbox's rules and the folder's identity follow a rename. Only an untouched worktree
    at its base is handed over; GitFailed or OSError otherwise, with what was done undone."""
    top, old_path, old_branch = worktree["repo"], worktree["path"], worktree["branch"]
    old_objects = worktree["objects"]
    path, branch = str(store.worktree_path(job_id)), WORKTREE_BRANCH_PREFIX + job_id
    objects = str(store.worktree_objects_path(job_id))
    pinned = worktree_git(worktree)
    if (git_text(old_path, *pinned, "status", "--porcelain", "--untracked-files=all")
            or git_text(old_path, *pinned, "rev-parse", "HEAD") != worktree["base"]):
        raise GitFailed("the readied worktree is no longer as it was made")
    undo: list[Any] = []
    with repo_lock(store, top):
        try:
            git(top, "worktree", "unlock", old_path)
            undo.append(lambda: git(top, "worktree", "lock", old_path, check=False))
            git(top, "worktree", "move", old_path, path)
            undo.append(lambda: git(top, "worktree", "move", path, old_path, check=False))
            git(top, "branch", "-m", old_branch, branch)
            undo.append(lambda: git(top, "branch", "-m", branch, old_branch, check=False))
            os.rename(old_objects, objects)
            undo.append(lambda: os.rename(objects, old_objects))
            os.symlink(os.path.basename(objects), old_objects)
            undo.append(lambda: os.unlink(old_objects))
            git(top, "worktree", "lock", "--reason", f"claude-hermes-bridge job {job_id}", path)
        except (GitFailed, OSError):
            for step in reversed(undo):
                with contextlib.suppress(GitFailed, OSError):
                    step()
            raise
    worktree.update(path=path, branch=branch, objects=objects)


def remove_readied_worktree(store: "JobStore", name: str) -> None:
    """A worktree a standby readied (worktrees/<name>), its branch and object folder gone, found from the folder
    itself (its repository from its git files): for a standby killed before it removed its own."""
    path = str(store.worktree_path(name))
    if os.path.isdir(path) and not os.path.islink(path):
        try:
            common = git_text(path, "rev-parse", "--path-format=absolute", "--git-common-dir")
            admin = os.path.realpath(os.path.join(path, git_text(path, "rev-parse", "--git-dir")))
        except GitFailed:
            common = admin = ""
        if os.path.basename(common) == ".git":
            remove_worktree(store, {"repo": os.path.dirname(common), "path": path, "admin": admin,
                                    "branch": WORKTREE_BRANCH_PREFIX + name}, branch_too=True, job_id=name)
            git(os.path.dirname(common), "worktree", "prune", check=False)
    shutil.rmtree(path, ignore_errors=True)
    objects = store.worktree_objects_path(name)
    if os.path.islink(objects):
        os.unlink(objects)
    else:
        shutil.rmtree(objects, ignore_errors=True)


def save_worktree_work(store: "JobStore", record: "JobRecord") -> None:
    """The job's work as one commit (its own commits, plus what it left uncommitted), kept reachable under
    refs/hermes-bridge/<id>, with the patch against the base beside the record and its stat and file list in
    the record. Called when the job ends, and for a job whose supervisor died, at the next server start."""
    worktree = cast(dict[str, Any], record.worktree)
    path, top = worktree["path"], worktree["repo"]
    if not os.path.isdir(path) or "admin" not in worktree:
        return
    if changed := admin_folder_change(worktree):
        raise GitFailed(f"{changed}: the bridge does not run git on what the job may have redirected, so its work "
                        "was not saved (the worktree is kept as it is)")
    pinned = worktree_git(worktree)
    objects = object_environment(str(store.worktree_objects_path(worktree.get("job", record.id))), top)
    head = git_text(path, *pinned, "rev-parse", "--verify", "HEAD^{commit}", env=objects)
    work = tree_commit(path, head, store.locks / f"{record.id}.index",
                       f"claude-hermes-bridge: the work of job {record.id} (committed and not)", pinned, objects)
    import_work(store, worktree, work, record.id)
    git(top, "update-ref", f"{WORKTREE_REF_PREFIX}{record.id}", work)
    base = worktree["base"]
    patch = store.patch_path(record.id)
    partial = patch.with_name(patch.name + ".partial")
    partial.unlink(missing_ok=True)
    with open(partial, "xb") as handle:
        git(top, "diff", "--binary", "--find-renames", "--no-color", "--no-ext-diff", "--no-textconv", base, work,
            stdout=handle)
    os.replace(partial, patch)
    files = insertions = deletions = 0
    numstat = git(top, "diff", "--numstat", "-z", "--find-renames", "--no-textconv", base, work).stdout
    for line in numstat.split(b"\0"):  # counted as the patch shows them: a renamed file is one file
        fields = line.split(b"\t", 2)
        if len(fields) == 3:
            files += 1
            insertions += int(fields[0]) if fields[0].isdigit() else 0
            deletions += int(fields[1]) if fields[1].isdigit() else 0
    worktree["work"] = work
    record.diff = {"files": files, "insertions": insertions, "deletions": deletions, "patch": str(patch),
                   "patch_bytes": patch.stat().st_size}
    record.changes = worktree_changes(top, base, work)


def admin_folder_change(worktree: dict[str, Any]) -> str | None:
    """What of the worktree's administrative folder no longer says what git wrote when it was made (its commondir
    naming the repository's common folder, its gitdir naming the worktree), in words; None when all holds."""
    admin = worktree["admin"]
    expected = {"commondir": os.path.dirname(os.path.dirname(admin)), "gitdir": os.path.join(worktree["path"], ".git")}
    for name, wanted in expected.items():
        try:
            said = Path(admin, name).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError):
            return f"the worktree's {name} file could not be read"
        if os.path.realpath(os.path.join(admin, said)) != os.path.realpath(wanted):
            return f"the worktree's {name} file names {shown(said, 200)}, not {shown(wanted, 200)} as git wrote it"
    return None


def common_folder_refusal(top: str) -> str | None:
    """Why the bridge will not work on a repository whose git folder redirects git (None: it does not): a
    commondir file in its .git folder makes git take config, hooks and refs from the folder it names (a job in
    the folder may have planted it). Worded for Refused."""
    planted = os.path.join(top, ".git", "commondir")
    if os.path.isdir(os.path.join(top, ".git")) and os.path.lexists(planted):
        return (f"the repository {shown(top)} has a .git/commondir file, which makes git take its config, hooks and "
                "refs from another folder (a job may have planted it). Look at it, remove it, and try again")
    return None


def hooks_path_folder(top: str, relative_to: str) -> str | None:
    """The folder the repository's core.hooksPath names, relative to relative_to (with /), when it lies there:
    git runs every file in it as a hook (husky and many projects keep it tracked). None when unset or outside."""
    config = os.path.join(common_git_folder(top), "config")  # the file alone: the bridge's own git overrides it
    done = git(top, "config", "--file", config, "--get", "core.hooksPath", check=False)
    named = done.stdout.decode("utf-8", "replace").strip()
    if done.returncode != 0 or not named:
        return None
    folder = os.path.normpath(os.path.join(top, os.path.expanduser(named)))
    relative = os.path.relpath(folder, relative_to)
    return None if relative.startswith("..") or os.path.isabs(relative) else Path(relative).as_posix()


def worktree_changes(top: str, base: str, work: str) -> dict[str, Any]:
    """CHANGED_FILES of a worktree job: what its work changed against the base, as git sees it."""
    listing = git(top, "diff", "--name-status", "-z", "--no-renames", "--no-textconv", base, work).stdout
    names = listing.decode("utf-8", "replace")
    fields = names.split("\0")
    pairs = list(zip(fields[0::2], fields[1::2], strict=False))  # the list ends with an empty field
    kinds = {"A": "+", "M": "~", "T": "~", "D": "-"}
    marked = [(kinds.get(status[:1], "~"), name) for status, name in pairs if status]
    lines = [f"{mark} {name}" for order in "+~-" for mark, name in marked if mark == order]  # as compare_snapshots
    count = {mark: sum(1 for found, _ in marked if found == mark) for mark in "+~-"}
    later = runs_later([name for _, name in marked], hooks_path_folder(top, top))
    return {"created": count["+"], "modified": count["~"], "deleted": count["-"], "lines": lines[:CHANGED_LINES],
            "more": max(0, len(lines) - CHANGED_LINES), "runs_later": later[:CHANGED_LINES]}


def identity_words(path: str) -> str | None:
    """The folder itself as the record keeps it (device and inode, the file index on Windows): whatever name
    points at it later, this is the folder the bridge made."""
    identity = folder_identity(path)
    return f"{identity[0]}:{identity[1]}" if identity else None


def is_own_folder(worktree: dict[str, Any]) -> bool:
    """Whether the worktree's path is still the real folder the bridge made (no symlink at it, the same device
    and inode), so removing it can only remove the bridge's own worktree."""
    path = worktree["path"]
    if os.path.islink(path) or not os.path.isdir(path):
        return False
    recorded = worktree.get("identity")
    return recorded is None or recorded == identity_words(path)


def own_admin_folder(top: str, worktree: dict[str, Any]) -> str | None:
    """The worktree's administrative folder in the repository, when it is provably the one made for this path:
    directly in the repository's worktrees/ folder and naming this path as its own."""
    admin = worktree.get("admin")
    if not isinstance(admin, str):
        return None
    common = common_git_folder(top)
    if os.path.dirname(admin) != os.path.join(common, "worktrees") or os.path.islink(admin) or not os.path.isdir(admin):
        return None
    try:
        named = Path(admin, "gitdir").read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    path = worktree["path"]
    expected = {os.path.normpath(path), os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))}
    return admin if os.path.normpath(os.path.dirname(named)) in expected else None


def remove_worktree(store: "JobStore", worktree: dict[str, Any], branch_too: bool, job_id: str) -> None:
    """The worktree gone (with what it held: its work is kept under the job's ref and in the patch); with
    branch_too, its branch and the job's ref as well. Only what is provably the bridge's own is removed: a
    symlink put at the worktree's path is unlinked, never followed, and the admin folder goes only when it
    names this path (git worktree remove would act on whatever the path and the admin entries now say)."""
    top, path = worktree["repo"], worktree["path"]
    with repo_lock(store, top):
        admin = own_admin_folder(top, worktree)
        if os.path.islink(path):
            os.unlink(path)
        elif is_own_folder(worktree):
            shutil.rmtree(path)
        if admin is not None:
            shutil.rmtree(admin)
        shutil.rmtree(store.worktree_objects_path(worktree.get("job", job_id)), ignore_errors=True)
        if branch_too:
            git(top, "branch", "-D", worktree["branch"], check=False)
            for prefix in (WORKTREE_REF_PREFIX, LEGACY_REF_PREFIX):
                git(top, "update-ref", "-d", f"{prefix}{job_id}", check=False)
