"""[supervisor] Hermes' own settings kept as the user had them through a sandboxed job. Landlock grants rights
beneath a folder and cannot take one file out of a folder it grants, and Hermes writes its home's top folder at
every run (state.db's journal, auth.lock, spawn-ledger.json), so the sandbox must leave that folder writable:
config.yaml, .env, SOUL.md and the skills, hooks, cron and plugins folders are recorded before Hermes starts and
put back at the job's end. The job's version of what it changed is kept beside the record, so an edit the user
made meanwhile is not lost, only moved aside and named."""
import os
import shutil
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

# Every name that runs or steers Hermes is walked before skills, with its own bound, so no number of files a job
# writes under skills/ hides a hook or a cron job it planted.
GUARDED_NAMES = ("config.yaml", ".env", "SOUL.md", "hooks", "cron", "plugins", "skills")
FIRST_RUN_NAMES = ("SOUL.md", "skills", "hooks", "cron")  # what Hermes makes in a home it has never run in
FIRST_RUN_EMPTY = ("hooks", "cron")  # Hermes makes these empty: anything in them on a first run is the job's
ENTRIES_PER_NAME = 5000  # paths kept under each name: a skills folder holds a few hundred
ENTRIES_AT_THE_END = 200000  # a walk at the job's end past this replaces the folder by what was kept
CHANGES_NAMED = 12


def walk(top: str, bound: int) -> tuple[list[str], bool]:
    """top and what it holds (a symlinked folder is one entry, its target, never walked), up to bound paths;
    and whether the walk was cut there."""
    paths = [top]
    if os.path.isdir(top) and not os.path.islink(top):
        for folder, subfolders, files in os.walk(top):
            paths += [os.path.join(folder, entry) for entry in sorted(files + subfolders)]
            if len(paths) > bound:
                return paths[:bound], True
    return paths, False


def guarded_paths(home: str, bound: int = ENTRIES_PER_NAME) -> tuple[list[str], list[str]]:
    """Every path of Hermes' home that a job may not change, and the names whose walk was cut at bound."""
    paths, cut = [], []
    for name in GUARDED_NAMES:
        found, was_cut = walk(os.path.join(home, name), bound)
        paths += found
        cut += [name] if was_cut else []
    return paths, cut


def guard_home(store: JobStore, job_id: str, home: str) -> None:
    """Before Hermes starts: the guarded part of its home as it is, kept beside the record."""
    paths, cut = guarded_paths(home)
    files = {path: read_entry(path) for path in paths}
    save_snapshot(store.home_snapshot_path(job_id), {"common": home, "files": files, "configs": {}, "refs": {},
                                                      "cut": cut})


def restore_home(store: JobStore, job_id: str) -> list[str]:
    """Every guarded path the job changed put back, the job's version of each file kept in the job's
    home-changes folder; the changes in words (empty when nothing changed)."""
    snapshot = load_snapshot(store.home_snapshot_path(job_id))
    if snapshot is None:
        return []
    home: str = snapshot["common"]
    kept_at = store.home_changes_path(job_id)
    files: dict[str, Any] = snapshot["files"]
    cut_before = [name for name in snapshot.get("cut", []) if name in GUARDED_NAMES]
    said = [f"{name} held more than {ENTRIES_PER_NAME} entries before the job: only the first were recorded, and "
            "only those are guarded" for name in cut_before]
    now, cut_now = guarded_paths(home, ENTRIES_AT_THE_END)
    for name in set(cut_now) - set(cut_before):  # fail safe: what the walk cannot see whole is replaced whole
        shutil.rmtree(os.path.join(home, name), ignore_errors=True)
        said.append(f"the job left more than {ENTRIES_AT_THE_END} entries under {name}: it was replaced by what it "
                    "held before the job")
    unguarded = tuple(os.path.join(home, name) + os.sep for name in cut_before)
    first_run = [name for name in FIRST_RUN_NAMES if files.get(os.path.join(home, name), 0) is None
                 and os.path.lexists(os.path.join(home, name))]
    kept_whole = tuple(os.path.join(home, name) for name in first_run if name not in FIRST_RUN_EMPTY)
    made_by_hermes = {os.path.join(home, name) for name in first_run}
    changes = [(path, before, after) for path, before, after in changed_entries(
               files, [path for path in now if not path.startswith(unguarded)])
               if not (path in made_by_hermes or path.startswith(tuple(top + os.sep for top in kept_whole)))]
    job_versions = {path: keep_job_version(path, kept_at / os.path.relpath(path, home))
                    for path, _, after in changes if after is not None and after.get("kind") == "file"}
    if first_run:
        said.append(f"{', '.join(first_run)} made (Hermes' first run in this home); kept"
                    + (f", but for what the job put in {' and '.join(set(first_run) & set(FIRST_RUN_EMPTY))}"
                       if set(first_run) & set(FIRST_RUN_EMPTY) else ""))
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

