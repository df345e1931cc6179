"""[supervisor] Hermes' own settings kept as the user had them through a sandboxed job. Landlock grants rights
beneath a folder and cannot take one file out of a folder it grants, and Hermes writes its home's top folder at
every run (state.db's journal, auth.lock, spawn-ledger.json), so the sandbox must leave that folder writable:
config.yaml, .env, SOUL.md and the skills, hooks, cron and plugins folders are recorded before Hermes starts and
put back at the job's end. The job's version of what it changed is kept beside the record, so an edit the user
made meanwhile is not lost, only moved aside and named."""
import os
from typing import Any

from .jobs import JobStore
from .repo_guard import (
    change_verb,
    changed_entries,
    keep_job_version,
    load_snapshot,
    put_back,
    read_entry,
    save_snapshot,
)
from .safe_io import shown

GUARDED_NAMES = ("config.yaml", ".env", "SOUL.md", "skills", "hooks", "cron", "plugins")
FIRST_RUN_NAMES = ("SOUL.md", "skills", "hooks", "cron")  # what Hermes makes in a home it has never run in
GUARDED_ENTRIES = 5000  # paths kept, all told: a skills folder holds a few hundred
CHANGES_NAMED = 12


def guarded_paths(home: str) -> list[str]:
    """Every path of Hermes' home that a job may not change: the guarded names and what their folders hold
    (a symlinked folder is one entry, its target, never walked)."""
    paths = []
    for name in GUARDED_NAMES:
        top = os.path.join(home, name)
        paths.append(top)
        if os.path.isdir(top) and not os.path.islink(top):
            for folder, subfolders, files in os.walk(top):
                paths += [os.path.join(folder, entry) for entry in sorted(files + subfolders)]
        if len(paths) >= GUARDED_ENTRIES:
            break
    return paths[:GUARDED_ENTRIES]


def guard_home(store: JobStore, job_id: str, home: str) -> None:
    """Before Hermes starts: the guarded part of its home as it is, kept beside the record."""
    files = {path: read_entry(path) for path in guarded_paths(home)}
    save_snapshot(store.home_snapshot_path(job_id), {"common": home, "files": files, "configs": {}, "refs": {}})


def restore_home(store: JobStore, job_id: str) -> list[str]:
    """Every guarded path the job changed put back, the job's version of each file kept in the job's
    home-changes folder; the changes in words (empty when nothing changed)."""
    snapshot = load_snapshot(store.home_snapshot_path(job_id))
    if snapshot is None:
        return []
    home: str = snapshot["common"]
    kept_at = store.home_changes_path(job_id)
    files: dict[str, Any] = snapshot["files"]
    first_run = [name for name in FIRST_RUN_NAMES if files.get(os.path.join(home, name), 0) is None
                 and os.path.lexists(os.path.join(home, name))]
    made_by_hermes = tuple(os.path.join(home, name) for name in first_run)
    changes = [(path, before, after) for path, before, after in changed_entries(files, guarded_paths(home))
               if not (path in made_by_hermes or path.startswith(tuple(top + os.sep for top in made_by_hermes)))]
    job_versions = {path: keep_job_version(path, kept_at / os.path.relpath(path, home))
                    for path, _, after in changes if after is not None and after.get("kind") == "file"}
    said = [f"{', '.join(first_run)} made (Hermes' first run in this home); kept"] if first_run else []
    for path, before, after in changes:
        name = shown(os.path.relpath(path, home), 200)
        try:
            restored = put_back(path, before)
        except OSError as exc:
            said.append(f"the job {change_verb(before, after)} {name}, and it could not be put back "
                        f"({exc.strerror or exc})")
            continue
        kept = f" (the job's version: {shown(str(job_versions[path]), 300)})" if job_versions.get(path) else ""
        said.append(f"the job {change_verb(before, after)} {name}; "
                    + (f"put back{kept}" if restored else "NOT put back (too large to have been kept)"))
    return said[:CHANGES_NAMED] + ([f"and {len(said) - CHANGES_NAMED} more"] if len(said) > CHANGES_NAMED else [])

