"""[server] Hermes' skills for hermes_capabilities: the index, bounded walks of the skill folders."""
import os
import re
import threading
from pathlib import Path
from typing import Any

from .config import Config
from .safe_io import Refused, open_regular, shown
from .tools import clamp_number

SKILL_FRONT_MATTER_BYTES = 64 * 1024
SKILL_TREE_DEPTH = 6  # skills/<category>/<name>/SKILL.md, with room for nested categories
SKILL_TREE_FOLDERS = 20_000
SKILL_YAML_EVENTS = 5_000
SKILL_FIELD_CHARS = {"name": 128, "description": 2000, "tag": 64}
SKILL_MAX_TAGS = 32


class SkippedSkill(Exception):
    """A SKILL.md that breaks a rule (size, YAML anchors, field types): listed as skipped with the reason."""


def front_matter(path: str) -> dict[str, Any]:
    """The YAML front matter of a SKILL.md, read as untrusted input: skills come from hubs and from Hermes
    itself. At most 64 KiB is read; anchors and aliases (the 'billion laughs' bomb) are refused before
    anything is built, and so is a document of more than a few thousand YAML events."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        with open_regular(path) as handle:
            head = handle.read(SKILL_FRONT_MATTER_BYTES)
    except OSError as exc:
        raise SkippedSkill(f"unreadable: {exc.strerror or exc}") from None
    text = head.decode("utf-8", "replace")
    match = re.match(r"^---[ \t]*\r?\n(.*?)\r?\n---[ \t]*(?:\r?\n|$)", text, re.DOTALL)
    if not match:
        raise SkippedSkill(f"no YAML front matter within its first {SKILL_FRONT_MATTER_BYTES} bytes")
    try:
        for count, event in enumerate(yaml.parse(match.group(1), Loader=loader)):
            if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
                raise SkippedSkill("its front matter uses YAML anchors or aliases, which skills never need")
            if count > SKILL_YAML_EVENTS:
                raise SkippedSkill(f"its front matter has more than {SKILL_YAML_EVENTS} YAML nodes")
        front = yaml.load(match.group(1), Loader=loader)
    except yaml.YAMLError as exc:
        raise SkippedSkill(f"invalid YAML: {' '.join(str(exc).split())[:120]}") from None
    if not isinstance(front, dict):
        raise SkippedSkill("its front matter is not a mapping")
    return front


def short_text(front: dict[str, Any], key: str, limit: int) -> str:
    value = front.get(key)
    if value is None:
        return ""
    if not isinstance(value, (str, int, float)) or isinstance(value, bool):
        raise SkippedSkill(f"{key} is not text")
    text = " ".join(str(value).split())
    if len(text) > limit:
        raise SkippedSkill(f"{key} is longer than {limit} characters")
    return text


def parse_skill(path: str, skills_dir: str) -> dict[str, Any]:
    """A skill from its SKILL.md (name, category, description, tags), or SkippedSkill with the reason."""
    front = front_matter(path)
    folder = os.path.dirname(path)
    parts = os.path.relpath(path, skills_dir).split(os.sep)
    meta = front.get("metadata")
    hermes_meta = meta.get("hermes") if isinstance(meta, dict) else None
    tags = hermes_meta.get("tags") if isinstance(hermes_meta, dict) else None
    tags = tags if isinstance(tags, list) else []
    if len(tags) > SKILL_MAX_TAGS or not all(isinstance(t, str) and len(t) <= SKILL_FIELD_CHARS["tag"] for t in tags):
        raise SkippedSkill(f"its tags must be at most {SKILL_MAX_TAGS} short strings")
    return {
        "name": short_text(front, "name", SKILL_FIELD_CHARS["name"]) or os.path.basename(folder),
        "category": parts[0] if len(parts) > 2 else "uncategorised",
        "description": short_text(front, "description", SKILL_FIELD_CHARS["description"]),
        "tags": [" ".join(t.split()) for t in tags],
        "path": path,
    }


def folder_mtime(folder: str) -> int:
    try:
        return os.stat(folder, follow_symlinks=False).st_mtime_ns
    except OSError:
        return -1


class SkillIndex:
    """Hermes' skills as last read, per skills folder: the tree's folders with their mtimes and each
    SKILL.md with its stat, so a repeated call re-reads only what changed. One per server, passed to the
    tools that read skills."""

    def __init__(self) -> None:
        self.parsed: dict[str, tuple[tuple[int, int], dict[str, Any]]] = {}  # SKILL.md -> (stat, skill or skip)
        self.trees: dict[str, tuple[dict[str, int], list[str], str | None]] = {}  # dir -> (mtimes, files, note)
        self.lock = threading.Lock()

    def files(self, skills_dir: str) -> tuple[list[str], str | None]:
        """Every SKILL.md under skills_dir, walked iteratively with a depth and a folder cap (a hostile tree can
        be thousands of folders deep), without following symlinks; and a note when a cap was hit. The walk is
        redone only when a folder's mtime changed, so a repeated call costs one stat per folder."""
        cached = self.trees.get(skills_dir)
        if cached and all(folder_mtime(folder) == mtime for folder, mtime in cached[0].items()):
            return cached[1], cached[2]
        folders: dict[str, int] = {}
        files: list[str] = []
        note = None
        pending = [(skills_dir, 0)]
        while pending:
            folder, depth = pending.pop()
            if len(folders) >= SKILL_TREE_FOLDERS:
                note = f"stopped after {SKILL_TREE_FOLDERS} folders"
                break
            folders[folder] = folder_mtime(folder)
            try:
                with os.scandir(folder) as entries:
                    listed = sorted(entries, key=lambda e: e.name, reverse=True)
            except OSError:
                continue
            for entry in listed:
                if entry.name == "SKILL.md" and entry.is_file(follow_symlinks=False):
                    files.append(entry.path)
                elif entry.is_dir(follow_symlinks=False):
                    if depth + 1 > SKILL_TREE_DEPTH:
                        note = f"folders deeper than {SKILL_TREE_DEPTH} levels are not searched"
                    else:
                        pending.append((entry.path, depth + 1))
        files.sort()
        self.trees[skills_dir] = (folders, files, note)
        return files, note

    def skills(self, skills_dir: Path) -> tuple[list[dict[str, Any]], list[str]]:
        """Every skill under skills_dir (each file parsed once per version), and why others were skipped."""
        skills: list[dict[str, Any]] = []
        skipped: list[str] = []
        with self.lock:  # one walk at a time; a caller that cannot get it in time hits its tool deadline
            files, note = self.files(str(skills_dir))
            if note:
                skipped.append(f"{skills_dir}: {note}")
            for path in files:
                try:
                    info = os.stat(path, follow_symlinks=False)
                except OSError:
                    continue
                key = (info.st_mtime_ns, info.st_size)
                cached = self.parsed.get(path)
                if not cached or cached[0] != key:
                    try:
                        entry: dict[str, Any] = parse_skill(path, str(skills_dir))
                    except SkippedSkill as exc:
                        entry = {"skipped": str(exc)}
                    cached = (key, entry)
                    self.parsed[path] = cached
                if "skipped" in cached[1]:
                    skipped.append(f"{Path(os.path.relpath(path, skills_dir)).as_posix()}: {cached[1]['skipped']}")
                else:
                    skills.append(cached[1])
        return skills, skipped


def skill_score(skill: dict[str, Any], words: list[str]) -> int:
    name, description = skill["name"].lower(), skill["description"].lower()
    tags = [t.lower() for t in skill["tags"]]
    score = 0
    for word in words:
        score += 10 if word == name else 5 if word in name else 0
        score += 3 if word in tags else 1 if any(word in t for t in tags) else 0
        score += 1 if word in description else 0
    return score


SKILLS_USE = 'Preload skills with hermes_run(..., skills=["name"]).'


def capabilities(cfg: Config, index: SkillIndex, query: str | None, category: str | None, limit: int | None) -> str:
    """Hermes' skills in one of three modes: ranked matches for a query, one category, or the categories.
    The arguments are checked before the skills tree is walked."""
    if query is not None and not isinstance(query, str) or category is not None and not isinstance(category, str):
        raise Refused("query and category must be text")
    clamped = clamp_number("limit", limit, 20, 1, 200)
    count = int(clamped.value)
    skills_dir = cfg.hermes_home_path / "skills"
    skills, skipped = index.skills(skills_dir)
    header = [f"SKILLS_DIR: {shown(str(skills_dir))}", f"SKILLS: {len(skills)}"
              + (f" ({len(skipped)} skipped)" if skipped else "")]
    header += [f"NOTE: {note}" for note in clamped.notes]
    header += [f"SKIPPED: {shown(reason)}" for reason in skipped[:10]]
    if len(skipped) > 10:
        header.append(f"SKIPPED: ... and {len(skipped) - 10} more")
    if not skills:
        return "\n".join(header + ["No skills found. Hermes installs its skills under HERMES_HOME/skills."])
    if query:
        return "\n".join(header + skill_matches(skills, query, count) + [SKILLS_USE])
    if category:
        return "\n".join(header + category_members(skills, category, count) + [SKILLS_USE])
    return "\n".join(header + skill_categories(skills, count)
                     + ["Narrow with hermes_capabilities(query=...) or (category=...). " + SKILLS_USE])


def skill_matches(skills: list[dict[str, Any]], query: str, count: int) -> list[str]:
    words = [w for w in re.split(r"\W+", query.lower()) if w]
    ranked = sorted(((skill_score(s, words), s) for s in skills), key=lambda p: (-p[0], p[1]["name"]))
    hits = [s for score, s in ranked if score > 0]
    return [f"MATCHES for '{shown(query)}': {len(hits)}"] + [describe_skill(s) for s in hits[:count]]


def category_members(skills: list[dict[str, Any]], category: str, count: int) -> list[str]:
    members = sorted((s for s in skills if s["category"] == category), key=lambda s: s["name"])
    if not members:
        categories = sorted({s["category"] for s in skills})
        raise Refused(f"no category '{shown(category, 80)}'; categories: {shown(', '.join(categories), 1000)} "
                      f"({len(categories)} in all; hermes_capabilities() lists them)")
    return [f"CATEGORY {shown(category)}: {len(members)} skills"] + [describe_skill(s) for s in members[:count]]


def skill_categories(skills: list[dict[str, Any]], count: int) -> list[str]:
    by_category: dict[str, list[str]] = {}
    for skill in skills:
        by_category.setdefault(skill["category"], []).append(skill["name"])
    lines = [f"CATEGORIES: {len(by_category)}"]
    for name in sorted(by_category)[:count]:
        names = sorted(by_category[name])
        lines.append(f"{shown(name, 80)} ({len(names)}): {shown(', '.join(names[:5]), 400)}"
                     + (", ..." if len(names) > 5 else ""))
    return lines


def describe_skill(skill: dict[str, Any]) -> str:
    tags = f" (tags: {shown(', '.join(skill['tags']))})" if skill["tags"] else ""
    return f"- {shown(skill['name'])} [{shown(skill['category'])}]: {shown(skill['description'])}{tags}"


HEALTH_RECENT_JOBS = 200
