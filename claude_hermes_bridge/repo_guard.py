"""[both] A job's repository kept as the user had it (a worktree job's shared one, or the one a job without a
worktree works in): its config, hooks and refs recorded before Hermes starts, then any change put back (config,
hooks; the job's version kept aside) or named (refs), and reported."""
import base64
import json
import os
import shutil
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

from .git_calls import GitFailed, git, git_text
from .jobs import GUARD_NOTES_KEPT, JOB_ID_RE, JobRecord, JobStore
from .safe_io import read_capped, shown, write_atomic
from .worktrees import (
    LEGACY_REF_PREFIX,
    STANDBY_NAME_RE,
    WORKTREE_BRANCH_PREFIX,
    WORKTREE_REF_PREFIX,
    common_git_folder,
)

# A worktree shares its repository's common folder with the main tree: what a job writes there reaches the
# user's next git command (a hook, core.hooksPath, core.fsmonitor, filter and merge drivers, an include). Where the
# job's mount namespace holds the git folder read-only (drivers.git_folder_mounts) nothing there can change; this
# guard is what holds where none can be made, and says what changed either way. It keeps the repository's shape,
# not a list of files: every file through which git decides where config, hooks, refs and objects come from, in
# the common folder, in each linked worktree's admin folder and in each submodule's git folder.
SHAPE_FILES = ("config", "config.worktree", "info/attributes", "commondir", "objects/info/alternates")
ADMIN_FILES = ("commondir", "gitdir", "config.worktree")  # in each worktrees/<name>/
GUARDED_FOLDER = "hooks"
# git's own hook names (githooks(5)), walked first so that no number of other files pushes one out of the walk
NAMED_HOOKS = ("applypatch-msg", "pre-applypatch", "post-applypatch", "pre-commit", "pre-merge-commit",
               "prepare-commit-msg", "commit-msg", "post-commit", "pre-rebase", "post-checkout", "post-merge",
               "pre-push", "pre-receive", "update", "proc-receive", "post-receive", "post-update",
               "reference-transaction", "push-to-checkout", "pre-auto-gc", "post-rewrite", "sendemail-validate",
               "fsmonitor-watchman", "p4-changelist", "p4-prepare-changelist", "p4-post-changelist", "p4-pre-submit",
               "post-index-change")
INCLUDE_KEYS = ("include.path",)  # and includeif.<condition>.path
GUARDED_FILE_BYTES = 1 << 20  # a larger file is compared by its size and time, and not put back
HOOK_ENTRIES = 500  # entries kept of one hooks folder; past it the folder is put back whole (put_back_folder)
GIT_FOLDERS = 200  # linked worktrees' admin folders, and submodules' git folders, each kept
REFS_KEPT = 20000
CHANGES_NAMED = 12


def read_entry(path: str) -> dict[str, Any] | None:
    """One guarded path as it is now: a regular file (its content, or only its size and time when too large),
    a symlink (its target), another kind (named), or None when absent. Read without following a symlink."""
    try:
        status = os.lstat(path)
    except OSError:
        return None
    if stat.S_ISLNK(status.st_mode):
        return {"kind": "link", "target": os.readlink(path)}
    if not stat.S_ISREG(status.st_mode):
        return {"kind": "folder" if stat.S_ISDIR(status.st_mode) else "other"}
    mode = stat.S_IMODE(status.st_mode)
    if status.st_size > GUARDED_FILE_BYTES:
        return {"kind": "file", "mode": mode, "size": status.st_size, "mtime": status.st_mtime_ns}
    try:
        data = read_capped(path, GUARDED_FILE_BYTES)
    except (OSError, ValueError):
        return {"kind": "other"}
    return {"kind": "file", "mode": mode, "data": base64.b64encode(data).decode()}


def config_entries(path: str) -> list[str]:
    """A config file's settings as name=value lines (git reads it; reading config runs nothing)."""
    if not os.path.isfile(path):
        return []
    done = git(os.path.dirname(path), "config", "--file", path, "--no-includes", "--list", "-z", check=False)
    return sorted(entry.replace("\n", "=", 1) for entry in done.stdout.decode("utf-8", "replace").split("\0") if entry)


def includes_of(path: str, entries: list[str]) -> list[str]:
    """The files a config file includes, resolved as git resolves them (~ expanded, relative to the file)."""
    found = []
    for entry in entries:
        name, _, value = entry.partition("=")
        if (name in INCLUDE_KEYS or (name.startswith("includeif.") and name.endswith(".path"))) and value:
            target = os.path.expanduser(value)
            found.append(os.path.normpath(os.path.join(os.path.dirname(path), target)))
    return found


def hooks_of(folder: str) -> tuple[list[str], bool]:
    """A hooks folder's entries, git's named hooks first, at most HOOK_ENTRIES; and whether the walk was cut."""
    named = (os.path.join(folder, name) for name in NAMED_HOOKS)
    paths = [folder, *(path for path in named if os.path.lexists(path))]
    if not os.path.isdir(folder) or os.path.islink(folder):
        return paths, False
    for parent, subfolders, files in os.walk(folder):
        for name in sorted(files + subfolders):
            path = os.path.join(parent, name)
            if path not in paths:
                if len(paths) > HOOK_ENTRIES:
                    return paths, True
                paths.append(path)
    return paths, False


def git_folders(common: str) -> list[str]:
    """Every git folder git may run something from besides the common folder: each linked worktree's admin
    folder (but the bridge's own worktrees', named for a job or a standby: made and removed while a job runs) and
    each submodule's git folder (modules/**, nested ones too), at most GIT_FOLDERS."""
    found = []
    worktrees = os.path.join(common, "worktrees")
    if os.path.isdir(worktrees) and not os.path.islink(worktrees):
        found += [os.path.join(worktrees, name) for name in sorted(os.listdir(worktrees))
                  if not (JOB_ID_RE.fullmatch(name) or STANDBY_NAME_RE.fullmatch(name))]
    modules = os.path.join(common, "modules")
    if os.path.isdir(modules) and not os.path.islink(modules):
        for parent, subfolders, files in os.walk(modules):
            if "HEAD" in files or "config" in files:
                found.append(parent)
            subfolders[:] = [name for name in sorted(subfolders) if name not in ("objects", "refs", "logs", "hooks")]
            if len(found) >= GIT_FOLDERS:
                break
    return found[:GIT_FOLDERS]


def guarded_paths(common: str, configs: dict[str, list[str]]) -> list[str]:
    """Every path kept: the shape files of the common folder, its hooks, each worktree's admin files, each
    submodule's config and hooks, and the includes the configs name (configs: none when looking for what a job
    added, as an include it added may name any file of the user's)."""
    paths = [os.path.join(common, name) for name in SHAPE_FILES]
    paths += hooks_of(os.path.join(common, GUARDED_FOLDER))[0]
    for folder in git_folders(common):
        if os.path.basename(os.path.dirname(folder)) == "worktrees":
            paths += [os.path.join(folder, name) for name in ADMIN_FILES]
        else:
            paths += [os.path.join(folder, "config"), *hooks_of(os.path.join(folder, GUARDED_FOLDER))[0]]
    for config, entries in configs.items():
        paths += includes_of(config, entries)
    return list(dict.fromkeys(paths))


def dot_git_identity(top: str) -> dict[str, Any] | None:
    """The repository's .git as it is: a folder's identity, or a gitdir file's content; None when absent."""
    dot_git = os.path.join(top, ".git")
    if os.path.isdir(dot_git) and not os.path.islink(dot_git):
        status = os.stat(dot_git)
        return {"kind": "folder", "identity": [status.st_dev, status.st_ino]}
    return read_entry(dot_git)


def put_back_dot_git(top: str, kept: dict[str, Any] | None) -> str | None:
    """The repository's .git folder back where a job moved it from (a gitdir file put in its place naming it), in
    words; None when .git is as it was."""
    now = dot_git_identity(top)
    if kept is None or now == kept:
        return None
    dot_git = os.path.join(top, ".git")
    if kept.get("kind") != "folder" or now is None or now.get("kind") != "file":
        return ".git is not what it was when the job started, and cannot be put back: look at it before running git"
    named = base64.b64decode(now.get("data", "")).decode("utf-8", "replace").removeprefix("gitdir:").strip()
    moved = os.path.join(top, named)
    try:
        status = os.stat(moved)
        if [status.st_dev, status.st_ino] != kept["identity"] or not os.path.isdir(moved):
            raise OSError("not the folder .git was")
        os.unlink(dot_git)
        os.rename(moved, dot_git)
    except OSError as exc:
        return (f"the job replaced .git by a gitdir file naming {shown(named, 200)}; NOT restored ({exc}): look at it "
                "before running git")
    return f"the job moved .git to {shown(named, 200)} and put a gitdir file in its place; moved back"


def list_refs(top: str) -> dict[str, str]:
    listing = git(top, "for-each-ref", "--format=%(objectname) %(refname)").stdout.decode("utf-8", "replace")
    pairs = (line.split(" ", 1) for line in listing.splitlines()[:REFS_KEPT])
    return {name: target for target, name in pairs}


def take_snapshot(top: str) -> dict[str, Any]:
    """The repository's guarded files and refs as they are now, as JSON-ready data."""
    common = common_git_folder(top)
    configs = {path: config_entries(path) for path in (os.path.join(common, "config"),
                                                        os.path.join(common, "config.worktree"))}
    return {"common": common, "files": {path: read_entry(path) for path in guarded_paths(common, configs)},
            "configs": configs, "refs": list_refs(top), "dot_git": dot_git_identity(top)}


def save_snapshot(path: Path, snapshot: dict[str, Any]) -> None:
    write_atomic(path, json.dumps(snapshot).encode())


def load_snapshot(path: Path) -> dict[str, Any] | None:
    """A snapshot this bridge saved, or None when there is none (a job can write the jobs folder: a snapshot
    of the wrong shape is none)."""
    try:
        found = json.loads(read_capped(path, 64 << 20))
    except (OSError, ValueError):
        return None
    valid = (isinstance(found, dict) and isinstance(found.get("common"), str) and isinstance(found.get("files"), dict)
             and isinstance(found.get("configs"), dict) and isinstance(found.get("refs"), dict))
    return found if valid else None


def put_back(path: str, entry: dict[str, Any] | None) -> bool:
    """The path as the snapshot had it; False when it cannot be (a large file: only its size was kept)."""
    current = read_entry(path)
    if entry is not None and entry.get("kind") == "file" and "data" not in entry:
        return False
    if current is not None:
        if current.get("kind") == "folder":
            shutil.rmtree(path)
        else:
            os.unlink(path)
    if entry is None:
        return True
    if entry.get("kind") == "folder":
        os.makedirs(path, exist_ok=True)
    elif entry.get("kind") == "link":
        os.symlink(str(entry["target"]), path)
    elif entry.get("kind") == "file":
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_atomic(Path(path), base64.b64decode(entry["data"]))
        os.chmod(path, int(entry.get("mode", 0o644)))
    return True


def changed_entries(kept: dict[str, Any], also: list[str]) -> Iterator[tuple[str, Any, Any]]:
    """(path, as kept, as it is now) for every kept path, and every path of `also`, that differs now; a folder
    before what it holds, each read only when its turn comes (a folder put back changes what it holds)."""
    paths = list(dict.fromkeys([*kept, *also]))
    for path in sorted(paths, key=lambda name: (name.count(os.sep), name)):
        before, after = kept.get(path), read_entry(path)
        if before != after:
            yield path, before, after


def change_verb(before: dict[str, Any] | None, after: dict[str, Any] | None) -> str:
    return "created" if before is None else "removed" if after is None else "changed"


def changed_settings(before: list[str], after: list[str]) -> list[str]:
    """The settings that differ, by name (a driver's or a section's as name.*): core.hooksPath, filter.pwn.*."""
    names = set()
    for entry in set(before) ^ set(after):
        name = entry.partition("=")[0]
        section, _, rest = name.partition(".")
        names.add(f"{section}.{rest.rpartition('.')[0]}.*" if "." in rest else name)
    return sorted(names)


def keep_job_version(path: str, copy: Path) -> Path | None:
    """A copy of the job's version of a file it changed, or None when it could not be made."""
    try:
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, copy, follow_symlinks=False)
    except OSError:
        return None
    return copy


def restore_repository(top: str, snapshot: dict[str, Any], kept_at: Path) -> list[str]:
    """Every guarded path the job changed put back as the snapshot had it, the job's version of each file kept
    under kept_at; the changes in words, one per path (empty when nothing changed)."""
    common = snapshot["common"]
    files: dict[str, Any] = snapshot["files"]
    said = [moved] if (moved := put_back_dot_git(top, snapshot.get("dot_git"))) else []
    now_configs = {path: config_entries(path) for path in snapshot["configs"]}
    said += [put_back_folder(os.path.join(folder, GUARDED_FOLDER), files, top, kept_at)
             for folder in [common, *git_folders(common)] if hooks_of(os.path.join(folder, GUARDED_FOLDER))[1]]
    for path, before, after in changed_entries(files, guarded_paths(common, {})):
        if not admin_folder_kept(path, common, files):
            continue
        if after is not None and after.get("kind") == "file" and os.path.isabs(path) and path.startswith(common):
            keep_job_version(path, kept_at / os.path.relpath(path, common))
        try:
            restored = put_back(path, before)
        except OSError as exc:
            said.append(f"{where(path, top)} could not be put back ({exc.strerror or exc})")
            continue
        settings = changed_settings(snapshot["configs"].get(path, []), now_configs.get(path, []))
        what = f" ({', '.join(settings[:CHANGES_NAMED])}{', ...' if len(settings) > CHANGES_NAMED else ''})" \
            if settings else ""
        said.append(f"the job {change_verb(before, after)} {where(path, top)}{what}; "
                    + ("restored" if restored else "NOT restored (too large to have been kept)"))
    return said


def admin_folder_kept(path: str, common: str, files: dict[str, Any]) -> bool:
    """Whether a guarded path is to be kept as it was: any path but a linked worktree's admin file whose folder
    was made, or removed whole, since the snapshot (a worktree added or removed: `git worktree` does that, and a
    job's change to one that stays is what git would follow)."""
    worktrees = os.path.join(common, "worktrees") + os.sep
    if not path.startswith(worktrees):
        return True
    admin = os.path.join(worktrees, path[len(worktrees):].split(os.sep)[0])
    return os.path.isdir(admin) and any(kept.startswith(admin + os.sep) and files[kept] is not None
                                        for kept in files)


def put_back_folder(folder: str, files: dict[str, Any], top: str, kept_at: Path) -> str:
    """A hooks folder holding more than a walk keeps: moved aside whole (kept under kept_at) and made again from
    what the snapshot recorded of it, in words."""
    aside = kept_at / "whole" / os.path.relpath(folder, os.path.dirname(os.path.dirname(folder)))
    try:
        aside.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(folder, aside)
        inside = (path for path in files if path == folder or path.startswith(folder + os.sep))
        for path in sorted(inside, key=lambda path: path.count(os.sep)):
            put_back(path, files[path])
    except OSError as exc:
        return f"{where(folder, top)} held more than {HOOK_ENTRIES} entries and could not be put back ({exc})"
    return (f"{where(folder, top)} held more than {HOOK_ENTRIES} entries after the job: replaced whole by its copy "
            "from before the job (the job's version kept aside)")


def where(path: str, top: str) -> str:
    """A path as the user knows it: relative to the main tree when inside it (.git/config), else whole."""
    relative = os.path.relpath(path, top) if os.path.splitdrive(path)[0] == os.path.splitdrive(top)[0] else path
    return shown(relative if not relative.startswith("..") else path, 200)


def changed_refs(top: str, snapshot: dict[str, Any], expected: Callable[[str], bool], worktree: bool) -> str | None:
    """Refs created, moved or deleted since the snapshot, except those expected (the job's own branch and saved
    work, other jobs' of this bridge), in words; None when none. They are named, not put back: the user may
    have made them meanwhile."""
    try:
        now = list_refs(top)
    except GitFailed as exc:
        return f"the refs could not be compared ({exc})"
    before: dict[str, str] = snapshot["refs"]
    kinds = {"created": [name for name in now if name not in before],
             "moved": [name for name in now if name in before and now[name] != before[name]],
             "deleted": [name for name in before if name not in now]}
    parts = []
    for kind, names in kinds.items():
        unexpected = sorted(name for name in names if not expected(name))
        if unexpected:
            parts.append(f"{kind} {', '.join(shown(name, 200) for name in unexpected[:CHANGES_NAMED])}"
                         + (f" and {len(unexpected) - CHANGES_NAMED} more" if len(unexpected) > CHANGES_NAMED else ""))
    if not parts:
        return None
    whose = "refs outside the job's own branch" if worktree else "refs"
    return f"{whose} changed while it ran (by the job, or by someone else meanwhile; not undone): {'; '.join(parts)}"


def bridge_ref_owner(refname: str) -> str | None:
    """The job id a ref of the bridge's own names (its branch, its saved work), or None for any other ref."""
    for prefix in (f"refs/heads/{WORKTREE_BRANCH_PREFIX}", WORKTREE_REF_PREFIX, LEGACY_REF_PREFIX):
        if refname.startswith(prefix):
            name = refname[len(prefix):]
            job_id = name.rpartition("-")[0] if "-" in name and not JOB_ID_RE.fullmatch(name) else name
            return job_id if JOB_ID_RE.fullmatch(job_id) else None
    return None


def guarded_top(record: JobRecord) -> str | None:
    """The repository a job's guard keeps: a worktree job's, or the one a job without a worktree works in."""
    return record.worktree["repo"] if record.worktree else record.guarded_repo


def repository_around(folder: str) -> str | None:
    """The top of the git repository folder is in, or None when it is in none."""
    try:
        return os.path.realpath(git_text(folder, "rev-parse", "--show-toplevel")) or None
    except GitFailed:
        return None


def guard_repository(store: JobStore, record: JobRecord) -> None:
    """Before Hermes starts: the job's repository as it is, kept beside the record."""
    save_snapshot(store.repository_snapshot_path(record.id), take_snapshot(cast(str, guarded_top(record))))


def check_repository(store: JobStore, record: JobRecord, refs_too: bool) -> list[str]:
    """What the job changed in its repository since guard_repository, put back where it can be, added to the
    record's REPOSITORY notes and returned (new notes only). refs_too: when the job has just ended; the
    repository as it is then becomes what a landing compares with (at a landing, refs are not compared: the
    user's own work since then moves them)."""
    snapshot = load_snapshot(store.repository_snapshot_path(record.id))
    top = guarded_top(record)
    if snapshot is None or top is None:
        return []
    notes = restore_repository(top, snapshot, store.repository_changes_path(record.id))
    if refs_too:
        owners = (record.id, (record.worktree or {}).get("job"))

        def expected(refname: str) -> bool:  # the bridge's own for another job, or a standby's readied worktree
            owner = bridge_ref_owner(refname)
            return (owner is not None and (owner in owners or store.record_path(owner).is_file())) or (
                STANDBY_NAME_RE.fullmatch(refname.removeprefix(f"refs/heads/{WORKTREE_BRANCH_PREFIX}")) is not None)
        refs = changed_refs(top, snapshot, expected, worktree=bool(record.worktree))
        notes += [refs] if refs else []
        save_snapshot(store.repository_snapshot_path(record.id), take_snapshot(top))  # what a landing compares with
    record.repository = [*record.repository, *notes][-GUARD_NOTES_KEPT:]
    return notes
