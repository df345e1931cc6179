"""[server] A worktree job's work landed in its repository (hermes_land): the repository put back as the job found
it, then the work merged into the main tree (or applied three-way to a dirty one), refused on a conflict or an
untracked file it would overwrite, with the tree left as it was; or the worktree and its branch discarded."""
import os
from typing import Any, cast

from .config import Config, audit
from .git_calls import GitFailed, git, git_text
from .jobs import JobRecord, JobStore
from .repo_guard import check_repository
from .safe_io import Refused, plural, shown
from .worktrees import BRIDGE_IDENTITY, remove_worktree, repo_lock, save_worktree_work, tree_commit


def land_work(cfg: Config, store: JobStore, record: JobRecord, action: str) -> str:
    """The landing itself, after the repository is put back as the job found it (what a leftover of the job
    changed since it ended is restored and kept in the record, even when the landing is then refused)."""
    worktree = cast(dict[str, Any], record.worktree)
    restored = check_repository(store, record, refs_too="work" not in worktree)
    if restored:
        audit(cfg, event="repository", job_id=record.id, changed=restored)

        def keep(stored: JobRecord) -> None:
            stored.repository = record.repository
        store.update(record.id, keep, final_too=True)
    if "work" not in worktree:  # its supervisor died before saving it
        save_worktree_work(store, record)
    if "work" not in worktree and action == "merge":
        raise Refused(f"job {record.id}'s worktree {worktree['path']} is gone and its work was never saved: "
                      "there is nothing to merge")
    if action == "merge":
        return merge_work(store, record)
    if action == "discard":
        return discard_work(store, record)
    return (f"left as it is; retention removes the worktree and its branch {cfg.retention_days:g} days after "
            "the job (the patch file goes with the job)")


def merge_work(store: JobStore, record: JobRecord) -> str:
    """The job's work into the main tree, or Refused naming the conflicting paths with the tree untouched."""
    worktree = cast(dict[str, Any], record.worktree)
    top, work = worktree["repo"], worktree["work"]
    main_tree = f"--work-tree={top}"  # never the core.worktree a job may have set
    with repo_lock(store, top):
        clean = not git(top, main_tree, "status", "--porcelain", "-z", "--untracked-files=all",
                        "--ignore-submodules=dirty").stdout
        branch = git(top, "symbolic-ref", "--quiet", "--short", "HEAD", check=False).stdout.decode().strip()
        on_base = clean and branch and branch == worktree.get("base_branch")
        ours = "HEAD" if on_base else tree_commit(top, "HEAD", store.locks / f"{record.id}.index",
                                                  f"claude-hermes-bridge: the working tree before landing {record.id}")
        merged = git(top, "merge-tree", "--write-tree", "-z", "--name-only", "--no-messages", ours, work, check=False)
        if merged.returncode not in (0, 1):
            raise GitFailed(f"git merge-tree failed (exit {merged.returncode}; it needs git 2.38 or later): "
                            f"{shown(merged.stderr.decode('utf-8', 'replace').strip(), 300)}")
        fields = merged.stdout.decode("utf-8", "replace").split("\0")
        if merged.returncode == 1:
            conflicts = sorted({name for name in fields[1:] if name})
            raise Refused(f"the job's work conflicts with the main tree in {plural(len(conflicts), 'path')}: "
                          f"{', '.join(shown(name, 200) for name in conflicts[:50])}. Nothing was changed; resolve "
                          f"it by hand from the patch ({record.diff['patch'] if record.diff else 'none'}) or resume "
                          "the job to rework it")
        refuse_overwriting_untracked(top, ours, fields[0])
        if on_base:
            git(top, main_tree, "merge", "--no-edit", "--no-stat", "--no-verify", "-m",
                f"Merge {worktree['branch']} (claude-hermes-bridge job {record.id})", work,
                env=BRIDGE_IDENTITY if not git_identity(top) else None)
            how = f"merged into {branch} ({git_text(top, 'rev-parse', '--short', 'HEAD')})"
        else:
            patch = git(top, "diff", "--binary", "--no-color", "--no-ext-diff", "--no-textconv", ours, fields[0]).stdout
            git(top, main_tree, "apply", "--whitespace=nowarn", "-", given=patch)
            where = "had uncommitted changes" if not clean else f"was on {branch or 'a detached HEAD'}, not on " \
                f"{worktree.get('base_branch') or 'the base'}"
            how = (f"applied three-way to the working tree of {top}, not committed (the main tree {where}); "
                   "review and commit it there")
    remove_worktree(store, worktree, branch_too=False, job_id=record.id)
    return how + f"; the worktree was removed, branch {worktree['branch']} stays until retention"


def refuse_overwriting_untracked(top: str, ours: str, merged: str) -> None:
    """Refused, naming them, when the landing would replace a file in the main tree that git does not track
    (an ignored .env, a build cache): git's merge overwrites ignored files, and they are in no git object."""
    listing = git(top, "diff", "--name-status", "-z", "--no-renames", "--no-textconv", ours, merged).stdout
    fields = listing.decode("utf-8", "surrogateescape").split("\0")
    statuses = dict(zip(fields[1::2], fields[0::2], strict=False))
    removed = {name for name, status in statuses.items() if status == "D"}
    at_risk = []
    for name, status in statuses.items():
        if status != "A":
            continue
        parents = [name.rsplit("/", depth)[0] for depth in range(name.count("/"), 0, -1)]
        blocking = [parent for parent in parents if parent not in removed and (
            os.path.islink(os.path.join(top, parent)) or os.path.isfile(os.path.join(top, parent)))]
        if os.path.lexists(os.path.join(top, name)) or blocking:
            at_risk.append(blocking[0] if blocking else name)
    if at_risk:
        names = sorted(set(at_risk))
        raise Refused(f"landing would overwrite {plural(len(names), 'file')} in {shown(top)} that git does not track "
                      f"(ignored or untracked, so in no commit): {', '.join(shown(n, 200) for n in names[:50])}. "
                      "Nothing was changed; move them aside and land again, or resume the job to rework it")


def git_identity(top: str) -> bool:
    """Whether the repository (or the user) names a committer, as a merge commit needs."""
    return git(top, "config", "user.email", check=False).returncode == 0


def discard_work(store: JobStore, record: JobRecord) -> str:
    worktree = cast(dict[str, Any], record.worktree)
    remove_worktree(store, worktree, branch_too=True, job_id=record.id)
    return f"the worktree and branch {worktree['branch']} were removed (the patch file stays with the job)"
