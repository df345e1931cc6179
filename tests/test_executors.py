"""Issue 66 in the fast tier: the executors table read as untrusted input, what a docker job's container mounts
and reaches, Hermes' terminal section, and each refusal before any process (the real daemon and sshd:
test_real_executors.py)."""
import os
import subprocess
from pathlib import Path

import pytest

from claude_hermes_bridge.config import Executor, executor_named, parse_executors
from claude_hermes_bridge.executors import (
    LABEL_JOB,
    container_network,
    launch_refusal,
    ssh_refusal,
    ssh_wrappers,
    terminal_section,
    volume_mounts,
)
from claude_hermes_bridge.safe_io import Refused
from harness import config_for

BOX = Executor(name="box", kind="docker", image="debian:bookworm")


def test_a_good_table_is_read_and_every_bad_entry_voids_it_naming_the_problem():
    table, problems = parse_executors({"box": {"kind": "docker", "image": "debian:bookworm"}, "lab": {
        "kind": "ssh", "host": "h.example", "user": "me", "key": "/k", "port": 2222}})
    assert problems == [] and table["lab"].port == 2222 and table["box"].network == "job"
    for bad, words in [({"local": {"kind": "docker", "image": "x"}}, "not a name"),
                       ({"box": {"kind": "podman", "image": "x"}}, 'kind must be "docker" or "ssh"'),
                       ({"box": {"kind": "docker"}}, "image missing"),
                       ({"box": {"kind": "docker", "image": "x", "privileged": True}}, "unknown privileged"),
                       ({"box": {"kind": "docker", "image": "-v/:/host"}}, "image not one word"),
                       ({"box": {"kind": "docker", "image": "x y"}}, "image not one word"),
                       ({"box": {"kind": "docker", "image": "x", "network": "host"}}, 'network must be "job" or'),
                       ({"lab": {"kind": "ssh", "host": "h", "user": "u", "key": "k"}}, "key must be an absolute"),
                       ({"lab": {"kind": "ssh", "host": "h", "user": "u", "key": "/k", "port": 0}}, "port must be"),
                       ({"lab": {"kind": "ssh", "host": "h", "user": "u", "key": "/k", "port": True}}, "port not"),
                       ([], "a table of names")]:
        table, problems = parse_executors(bad)
        assert table == {} and words in problems[0], (bad, problems)


def test_a_malformed_table_is_a_config_problem_and_an_unknown_name_is_refused_with_the_known_ones(tmp_path):
    cfg = config_for(tmp_path, executors={"box": {"kind": "docker"}}, default_executor="box")
    assert any(problem.startswith("executors: box (docker): image missing") for problem in cfg.problems)
    assert cfg.default_executor == "local" and executor_named(cfg, None) is None
    with pytest.raises(Refused, match="known: local.*The table is ignored: executors: box .docker.: image missing"):
        executor_named(cfg, "box")
    good = config_for(tmp_path, executors={"box": {"kind": "docker", "image": "x"}}, default_executor="box")
    assert executor_named(good, None) == Executor(name="box", kind="docker", image="x")
    assert executor_named(good, "local") is None
    with pytest.raises(Refused, match="'elsewhere' is not in the executors table .*known: local, box"):
        executor_named(good, "elsewhere")


def test_a_docker_job_mounts_its_folder_twice_and_its_git_folder_read_only_inside_it_too(tmp_path):
    folder = tmp_path / "repo"
    (folder / ".git").mkdir(parents=True)
    outside = tmp_path / "objects"
    outside.mkdir()
    specs = volume_mounts(str(folder), [str(outside)], [f"ro:{folder}/.git", f"hide:{tmp_path}/docker.sock",
                                                        f"ro:{tmp_path}/gone"])
    assert specs == [f"{folder}:/workspace", f"{folder}:{folder}", f"{outside}:{outside}",
                     f"{folder}/.git:{folder}/.git:ro", f"{folder}/.git:/workspace/.git:ro"]


def test_the_container_gets_a_network_only_for_an_open_job_on_an_executor_that_allows_it(tmp_path):
    assert container_network(BOX, "open")
    for mode in ("model-only", "allow-list", "ask"):
        assert not container_network(BOX, mode)
    assert not container_network(Executor(name="b", kind="docker", image="x", network="none"), "open")
    section = terminal_section(BOX, "20261206-1", tmp_path, "/w", ["/w:/workspace"], "ask", {"GIT_DIR": "/g"})
    assert section["backend"] == "docker" and section["docker_network"] is False
    assert section["container_persistent"] is False and section["docker_persist_across_processes"] is False
    assert section["docker_env"] == {"GIT_DIR": "/g"} and section["docker_forward_env"] == []
    assert f"{LABEL_JOB}=20261206-1" in section["docker_extra_args"]


def test_launch_refusals_name_the_fix():
    lab = Executor(name="lab", kind="ssh", host="h", user="u", key="/k")
    assert "needs the ACP driver" in str(launch_refusal(BOX, "cli", "0.22.2", None, "/w"))
    assert "upgrade Hermes to 0.22" in str(launch_refusal(BOX, "acp", "0.19.0", None, "/w"))
    assert launch_refusal(BOX, "acp", "0.22.2", None, "/w") is None
    assert launch_refusal(BOX, "acp", None, None, "/w") is None
    assert "holds ':' or ','" in str(launch_refusal(BOX, "acp", "0.22.2", None, "/w:x"))
    assert 'give isolation="worktree"' in str(launch_refusal(lab, "acp", "0.22.2", None, "/w"))
    assert launch_refusal(lab, "acp", "0.22.2", {"repo": "/r"}, "/w") is None


@pytest.mark.posix("file modes and ssh-keygen")
def test_an_ssh_key_readable_by_others_or_an_unknown_host_key_is_refused_before_any_connection(tmp_path,
                                                                                               monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    key = tmp_path / "id"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    lab = Executor(name="lab", kind="ssh", host="127.0.0.1", user="u", key=str(key), port=1)
    assert "does not exist" in str(ssh_refusal(Executor(name="lab", kind="ssh", host="h", user="u",
                                                        key=str(tmp_path / "none"))))
    key.chmod(0o640)
    assert "chmod 600" in str(ssh_refusal(lab))
    key.chmod(0o600)
    refusal = str(ssh_refusal(lab))
    assert "[127.0.0.1]:1 is not in" in refusal and "never accepts one silently" in refusal
    (tmp_path / ".ssh").mkdir()
    host_key = (tmp_path / "id.pub").read_text().split()
    (tmp_path / ".ssh" / "known_hosts").write_text(f"[127.0.0.1]:1 {host_key[0]} {host_key[1]}\n")
    assert "failed" in str(ssh_refusal(lab))  # known now: refused only because nothing listens on port 1


@pytest.mark.posix("sh wrappers")
def test_hermes_own_ssh_is_made_strict_with_the_key_copied_and_the_host_alone_known(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    key = tmp_path / "id"
    key.write_text("secret")
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "known_hosts").write_text("[h]:2 ssh-ed25519 AAAA\nother ssh-ed25519 BBBB\n")
    policy = tmp_path / "policy"
    policy.mkdir()
    folder = Path(ssh_wrappers(Executor(name="lab", kind="ssh", host="h", user="u", key=str(key), port=2), policy))
    assert (folder / "key").read_text() == "secret" and oct((folder / "key").stat().st_mode & 0o777) == "0o600"
    known = (folder / "known_hosts").read_text()
    assert "AAAA" in known and "BBBB" not in known
    wrapper = (folder / "ssh").read_text()
    assert "-o StrictHostKeyChecking=yes" in wrapper and f"UserKnownHostsFile={folder}/known_hosts" in wrapper
    assert os.access(folder / "ssh", os.X_OK) and (folder / "scp").exists()


def test_health_names_the_executors_without_the_key_and_without_starting_anything(tmp_path):
    from claude_hermes_bridge.health import executors_line

    cfg = config_for(tmp_path, executors={"box": {"kind": "docker", "image": "debian:bookworm"},
                                          "lab": {"kind": "ssh", "host": "h", "user": "u", "key": "/secret/id"}},
                     default_executor="box")
    line = executors_line(cfg)
    assert line.startswith("local (this machine); also box (docker image debian:bookworm), lab (ssh u@h)")
    assert "a job given none runs on box" in line and "/secret/id" not in line


def test_the_mount_probe_is_a_fresh_file_read_back_through_a_container_and_left_nowhere(tmp_path, monkeypatch):
    from claude_hermes_bridge import executors

    folder = tmp_path / "work"
    folder.mkdir()
    (folder / "kept.txt").write_text("x")
    seen: list[tuple[str, str]] = []

    def container(argv, *_rest, **_options):
        name = argv[-1].rsplit("/", 1)[1]
        seen.append((name, (folder / name).read_text()))
        assert "--network" in argv and argv[argv.index("--network") + 1] == "none"
        return 0, (folder / name).read_text()

    monkeypatch.setattr(executors, "run_tool", container)
    assert executors.probe_mount(BOX, "20261206-1", tmp_path, str(folder), network=False) is None
    assert seen[0][0].startswith(".claude-hermes-bridge-probe-") and seen[0][1] == "20261206-1"
    assert sorted(path.name for path in folder.iterdir()) == ["kept.txt"]
    monkeypatch.setattr(executors, "run_tool", lambda *_args, **_options: (0, ""))  # a daemon that sees another folder
    refusal = executors.probe_mount(BOX, "20261206-2", tmp_path, str(folder), network=True)
    assert "could not read the job's folder" in str(refusal) and "another machine" in str(refusal)
    assert sorted(path.name for path in folder.iterdir()) == ["kept.txt"]
