"""Property-based tests of the confinement decision: for generated trees of folders and symlinks (in, out,
chained, looping), `..`, case variants and prefix siblings, the bridge decides as a plain reference does:
resolve every symlink, then whole-component containment."""
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import server

pytestmark = pytest.mark.posix("symlinks need privileges on Windows")

NAMES = st.sampled_from(["a", "A", "ab", "b", "work", "work2", "Work"])
COMPONENTS = st.one_of(NAMES, st.sampled_from(["..", ".", "link0", "link1", "link2"]))


@st.composite
def trees(draw):
    """Folders under two tops, `root` (allowed) and `root2` (a prefix sibling, not allowed), then symlinks
    whose targets are folders in either, other links (chains, loops) or missing paths."""
    folders = ["root", "root2"]
    for _ in range(draw(st.integers(0, 8))):
        parent = draw(st.sampled_from(folders))
        folders.append(f"{parent}/{draw(NAMES)}")
    links = {}
    for index in range(draw(st.integers(0, 3))):
        where = draw(st.sampled_from(folders))
        target = draw(st.one_of(st.sampled_from(folders), st.sampled_from([f"link{i}" for i in range(3)]),
                                st.just("missing")))
        links[f"{where}/link{index}"] = target
    return folders, links


def build(base: Path, folders, links) -> None:
    for folder in folders:
        (base / folder).mkdir(parents=True, exist_ok=True)
    for link, target in links.items():
        path = base / link
        if not path.exists() and not path.is_symlink():
            target_path = base / target if not target.startswith("link") else base / "root" / target
            path.symlink_to(target_path)


def reference_allows(base: Path, query: str) -> bool:
    """Plain reference: pathlib resolves strictly, then compares whole components."""
    try:
        resolved = Path(query).resolve(strict=True)
    except (OSError, RuntimeError):
        return False
    return resolved.is_dir() and resolved.is_relative_to((base / "root").resolve())


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tree=trees(), path=st.lists(COMPONENTS, min_size=0, max_size=5), top=st.sampled_from(["root", "root2"]))
def test_confine_cwd_decides_as_the_reference(tree, path, top):
    folders, links = tree
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp).resolve()
        build(base, folders, links)
        cfg = server.Config(path=base / "config.json", allowed_roots=[str(base / "root")])
        query = os.path.join(str(base / top), *path)
        try:
            decided = server.confine_cwd(cfg, query)
            allowed = True
        except server.Refused:
            allowed = False
        assert allowed == reference_allows(base, query), query
        if allowed:
            assert decided == str(Path(query).resolve(strict=True))
