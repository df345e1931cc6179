"""The user's page stays a user's page: every link in README.md and docs/ leads somewhere, README is short,
puts Hermes and installing before configuration, and gives the test command CI runs."""
import re
from pathlib import Path

import pytest

from harness import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK_RE = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
TEST_COMMAND = ("python3 -m venv .venv && .venv/bin/python -m pip install -r requirements-dev.txt && "
                ".venv/bin/python -m pytest")


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    found = set()
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            found.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_relative_link_leads_to_a_file_and_heading_that_exist(page):
    broken = []
    for target in LINK_RE.findall(page.read_text(encoding="utf-8")):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target}: no file {linked}")
        elif anchor and anchor not in anchors(linked):
            broken.append(f"{target}: no heading #{anchor} in {linked.name}")
    assert broken == []


TEST_NAME_RE = re.compile(r"(tests/test_\w+\.py)(?:::(test_\w+))?")


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_test_a_page_names_exists(page):
    """security.md pairs each promise with its test: a test moved or renamed must take its name along."""
    missing = []
    for path, name in TEST_NAME_RE.findall(page.read_text(encoding="utf-8")):
        source = REPO / path
        if not source.exists():
            missing.append(f"{path}: no such file")
        elif name and not re.search(rf"^(?:async )?def {name}\(", source.read_text(encoding="utf-8"), re.MULTILINE):
            missing.append(f"{path}::{name}: no such test")
    assert missing == []


def test_readme_is_a_users_page_hermes_and_install_before_configuration():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(text.encode()) <= 20 * 1024
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    order = [next(i for i, heading in enumerate(headings) if word in heading)
             for word in ("Hermes first", "Install", "Configuration")]
    assert order == sorted(order), headings


def test_readme_gives_the_test_command_ci_runs():
    assert TEST_COMMAND in (REPO / "README.md").read_text(encoding="utf-8")
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert "-r requirements-dev.txt" in ci and "\n.venv/bin/python -m pytest\n" in ci


def test_every_setting_is_in_the_example_config_and_a_table_the_internal_ones_out_of_readme():
    import json

    from claude_hermes_bridge.config import SETTINGS
    example = {key for key in json.loads((REPO / "config.example.json").read_text()) if not key.startswith("_")}
    def table(page: str) -> set[str]:
        return set(re.findall(r"^\| `(\w+)` \|", (REPO / page).read_text(encoding="utf-8"), re.MULTILINE))
    assert example <= set(SETTINGS)
    assert set(SETTINGS) - {"yolo"} <= example  # yolo: the older spelling of approvals
    assert set(SETTINGS) <= table("README.md") | table("docs/configuration.md")
    assert not table("README.md") & INTERNAL_SETTINGS, "README keeps what every user sets; the rest is in docs/"
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    configuration = readme[readme.index("## 3. Configuration"):readme.index("## 4. ")]
    rows = re.findall(r"^\| `(\w+)` \|", configuration, re.MULTILINE)
    assert len(rows) <= 12, f"README's configuration table keeps at most 12 settings (issue 37), has {rows}"


# What most users never change: documented in docs/configuration.md, kept out of README (issue 28).
INTERNAL_SETTINGS = {"max_output_chars", "hermes_cli_form", "extra_args", "logs_dir", "kill_grace_s", "retention_days",
                     "retention_max_jobs", "audit_max_bytes", "max_log_bytes", "changed_files_skip",
                     "changed_files_max_entries", "changed_files_max_s"}
