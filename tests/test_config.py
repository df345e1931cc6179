"""The config: where it is found, what each setting takes and what a bad value becomes, what a file a job can write may
not do, and the host's settings on the command line."""
import json
import sys

import pytest

from claude_hermes_bridge.cli import init_config, without_unset_settings
from claude_hermes_bridge.config import SETTINGS_ENV, Config, config_path, load_config
from claude_hermes_bridge.hermes_cli import hermes_env
from claude_hermes_bridge.preflight import SERVER_DIR
from harness import (
    SERVER,
    config_for,
    refused,
)


def test_config_problems_name_the_spot_and_keep_defaults(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"allowed_roots": [1], "max_running_jobs": true, "kill_grace_s": -1}')
    cfg = load_config(path)
    joined = "\n".join(cfg.problems)
    assert "allowed_roots must be a list of folder paths" in joined
    assert "max_running_jobs must be a whole number" in joined
    assert cfg.kill_grace_s == 5 and cfg.max_running_jobs == 4
    assert "no config file" in load_config(tmp_path / "missing.json").problems[0]


@pytest.mark.parametrize(("key", "value", "problem", "used"), [
    ("approvals", "maybe", "approvals maybe is not deny, ask or yolo (deny used)", "deny"),
    ("hermes_driver", "ssh", "hermes_driver ssh is not auto, acp or cli (auto used)", "auto"),
    ("hermes_cli_form", "x\ny", "hermes_cli_form x\\ny is not auto, query-file or query-arg (auto used)", "auto"),
    ("max_wait_s", 0.5, "max_wait_s 0.5 is outside 1..50", 1),
    ("approval_timeout_s", 1, "approval_timeout_s 1 must be at least 5 (default 300 used)", 300),
    ("default_max_turns", 0, "default_max_turns 0 must be at least 1 (Hermes' own default used)", None),
], ids=["approvals", "driver", "cli-form-escaped", "wait-clamped", "number-below-its-minimum", "turns"])
def test_a_setting_out_of_its_choices_or_range_is_named_and_replaced(tmp_path, key, value, problem, used):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"allowed_roots": [str(tmp_path)], key: value}))
    cfg = load_config(path)
    assert len(cfg.problems) == 1 and cfg.problems[0].startswith(problem), cfg.problems
    assert getattr(cfg, key) == used


def test_hermes_home_from_the_config_wins_and_otherwise_the_environment_is_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("HERMES_HOME", "/from/the/environment")
    assert hermes_env(config_for(tmp_path))["HERMES_HOME"] == "/from/the/environment"
    home = tmp_path / "hermes-home"
    home.mkdir()
    assert hermes_env(config_for(tmp_path, hermes_home=str(home)))["HERMES_HOME"] == str(home)


def test_a_config_beside_server_py_is_used_only_without_hermes_bridge_config(tmp_path, monkeypatch):
    chosen = tmp_path / "chosen.json"
    monkeypatch.setenv("HERMES_BRIDGE_CONFIG", str(chosen))
    assert config_path() == chosen
    monkeypatch.delenv("HERMES_BRIDGE_CONFIG")
    monkeypatch.setattr("claude_hermes_bridge.config.SERVER_DIR", tmp_path)
    (tmp_path / "config.json").write_text("{}")
    assert config_path() == tmp_path / "config.json"


@pytest.mark.parametrize(("yolo", "approvals", "mode"), [
    (False, None, "deny"), (True, None, "yolo"), (True, "deny", "yolo"), (True, "ask", "ask"),
    (False, "yolo", "yolo"), (False, "ask", "ask")])
def test_the_bundles_auto_approve_box_wins_over_its_default_deny_but_not_over_ask(yolo, approvals, mode):
    cfg = Config(path=SERVER_DIR / "config.json", yolo=yolo, approvals=approvals)
    assert cfg.approval_mode == mode


@pytest.mark.posix("FIFOs, symlinks and POSIX signals")
@pytest.mark.parametrize("extra", [["--in=/"], ["--in", "/"], ["-q", "x"], ["--yolo"], ["--res=1"], ["-Qv"],
                                   ["--query-file=-"], ["--resume=abc"], ["--oneshot"]])
def test_extra_args_may_not_carry_an_option_the_bridge_sets(tmp_path, extra):
    (tmp_path / "root").mkdir()
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"allowed_roots": [str(tmp_path / "root")], "extra_args": extra}))
    cfg = load_config(path)
    assert cfg.extra_args == [] and any("extra_args holds options the bridge sets" in p for p in cfg.problems)


@pytest.mark.posix("FIFOs, symlinks and POSIX signals")
def test_extra_args_of_other_options_pass_through(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"extra_args": ["--worktree", "--checkpoints", "--source=tool"]}))
    assert load_config(path).extra_args == ["--worktree", "--checkpoints", "--source=tool"]


@pytest.mark.posix("FIFOs, symlinks and POSIX signals")
def test_a_file_cannot_widen_reads_past_roots_the_host_pinned_and_health_sees_it_change(bridge):
    outside = bridge.tmp / "secret.txt"
    outside.write_text("secret")
    pinned_root = str(bridge.root)
    command = [sys.executable, str(SERVER), "--allowed-roots", pinned_root]
    with bridge.client(command=command) as client:
        before = client.call("hermes_health").text
        assert "changed after this server started" not in before
        bridge.configure(read_anywhere=True, extra_args=[f"--in={bridge.tmp}"])
        refused(client.call("hermes_read", path=str(outside)), "outside the allowed roots")
        health = client.call("hermes_health").text
        assert "read_anywhere" in health and "cannot widen what the host pinned" in health
        assert "extra_args holds options the bridge sets" in health
        assert "CONFIG_CHANGED: " in health
        result = client.call("hermes_run", task="where am I", wait_s=20)
        assert result.field("STATUS") == "ok"
    assert all(f"--in={bridge.tmp}" not in run["argv"] for run in bridge.runs())


def test_a_config_beside_server_py_wins_over_the_per_user_one_and_with_neither_the_per_user_is_named(
        tmp_path, monkeypatch):
    monkeypatch.delenv("HERMES_BRIDGE_CONFIG", raising=False)
    install, per_user = tmp_path / "install", tmp_path / "user"
    install.mkdir()
    per_user.mkdir()
    monkeypatch.setattr("claude_hermes_bridge.config.SERVER_DIR", install)
    monkeypatch.setattr("claude_hermes_bridge.config.user_dir", lambda kind: per_user / kind)
    assert config_path() == per_user / "config" / "config.json"
    (per_user / "config").mkdir()
    (per_user / "config" / "config.json").write_text("{}")
    (install / "config.json").write_text("{}")
    assert config_path() == install / "config.json"


@pytest.mark.parametrize(("settings", "approvals"), [({"yolo": True}, "yolo"), ({}, "deny"),
                                                     ({"approvals": "ask"}, "ask")])
def test_init_config_writes_the_approvals_its_settings_say(tmp_path, monkeypatch, settings, approvals):
    monkeypatch.delenv("HERMES_BRIDGE_CONFIG", raising=False)
    monkeypatch.setattr("claude_hermes_bridge.config.user_dir", lambda kind: tmp_path / kind)
    assert init_config(settings, force=False) == 0
    written = json.loads((tmp_path / "config" / "config.json").read_text())
    assert written["approvals"] == approvals and "yolo" not in written


def test_a_placeholder_among_real_values_of_one_option_is_dropped_and_the_real_values_kept():
    argv = ["--allowed-roots", "/work/a", "${user_config.extra_root}", "/work/b", "--hermes-exe",
            "${user_config.hermes_exe}", "--approvals", "ask"]
    assert without_unset_settings(argv) == ["--allowed-roots", "/work/a", "/work/b", "--approvals", "ask"]


@pytest.mark.parametrize(("pinned", "approvals", "problem"), [
    ({"yolo": False}, "ask", True), ({"yolo": True}, "yolo", False), ({}, "yolo", False),
    ({"yolo": False, "approvals": "deny"}, "deny", False),
], ids=["yolo-false-lowers", "yolo-true-leaves", "nothing-leaves", "approvals-pinned"])
def test_a_hosts_yolo_false_lowers_a_files_approvals_yolo_to_ask(tmp_path, monkeypatch, pinned, approvals, problem):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"allowed_roots": [str(tmp_path)], "approvals": "yolo"}))
    monkeypatch.setenv(SETTINGS_ENV, json.dumps(pinned))
    cfg = load_config(path)
    assert cfg.approvals == approvals
    lowered = [p for p in cfg.problems if "lowered to ask" in p]
    assert bool(lowered) == problem and all("--yolo false" in p for p in lowered)
