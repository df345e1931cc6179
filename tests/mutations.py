"""Issue 50's one-line bugs, each written into the code in turn and run against the tests that pin it.

    .venv/bin/python tests/mutations.py [NUMBER ...]      (from the repository's top)

Each mutation replaces one exact text of a module (it must occur once: a mutation whose text the code no
longer holds is STALE, to be written again where the behaviour now lives), runs its tests serially, and puts the
module back whatever happens. CAUGHT: a test failed on an assertion, as it must (the test is printed); a test that
errored in its setup, or a run that failed otherwise, is an ERROR, not a catch. MISSED: they passed with the bug
in. The exit code is 0 only when every mutation run was caught. It edits the working tree while it runs: not beside
another run of the suite from the same folder.
"""
import dataclasses
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "claude_hermes_bridge"


@dataclasses.dataclass(frozen=True)
class Mutation:
    number: int
    bug: str  # what a user would see
    module: str
    old: str
    new: str
    tests: str  # the test files
    select: str = ""  # pytest's -k expression among them

    def run(self) -> str:
        """CAUGHT and the test that failed, MISSED, STALE, or ERROR and pytest's exit code."""
        path = PACKAGE / self.module
        text = path.read_text(encoding="utf-8")
        if text.count(self.old) != 1:
            return "STALE"
        path.write_text(text.replace(self.old, self.new), encoding="utf-8")
        try:
            done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n0", "-x", "-rfE", "-p", "no:cacheprovider",
                                   "-m", "e2e or not e2e",
                                   *self.tests.split(), *(["-k", self.select] if self.select else [])],
                                  cwd=REPO, capture_output=True, text=True, timeout=1200, check=False)
        finally:
            path.write_text(text, encoding="utf-8")
        failed = [line.split(" ", 1)[1].split(" - ")[0] for line in done.stdout.splitlines()
                  if line.startswith("FAILED ")]
        if done.returncode == 1 and failed:
            return f"CAUGHT by {failed[0]}"
        return "MISSED" if done.returncode == 0 else f"ERROR {done.returncode}"


MUTATIONS = (
    Mutation(1, 'a warm-started job runs unconfined while its SANDBOX line says its writes are limited',
             'standby.py', '    writable = sandbox_writable(cfg, own, private_tmp, worktree) if private_tmp else []',
             '    writable = []',
             'tests/test_standby.py', 'held_by'),
    Mutation(2, 'a sandboxed job can truncate a file outside its folders (truncate(2) by path)',
             'sandbox.py', ' | (TRUNCATE if abi >= 3 else 0)',
             '',
             'tests/test_sandbox.py', 'every_escape'),
    Mutation(3, 'inside its own folders a sandboxed job cannot move a file from one folder to another (EXDEV)',
             'sandbox.py', 'rights | (REFER if abi >= 2 else 0) |',
             'rights |',
             'tests/test_sandbox.py', 'every_escape'),
    Mutation(4, 'a sandboxed worktree job started in a subfolder cannot write the rest of its own worktree',
             'job_planning.py', 'own = [record.worktree["path"]] if record.worktree else [folder]',
             'own = [folder]',
             'tests/test_worktrees.py', 'subfolder'),
    Mutation(5, "a sandboxed worktree job can move or delete any of the user's branches",
             'worktrees.py',
             '"heads", WORKTREE_BRANCH_PREFIX.rstrip("/")),\n'
             '               os.path.join(common, "logs", "refs", "heads", WORKTREE_BRANCH_PREFIX.rstrip("/"))]',
             '"heads"),\n               os.path.join(common, "logs", "refs", "heads")]',
             'tests/test_containment.py', 'cannot_touch_the_history'),
    Mutation(6, 'a file put back loses its mode (a restored hook is no longer executable)',
             'repo_guard.py', '        os.chmod(path, int(entry.get("mode", 0o644)))',
             '        pass',
             'tests/test_containment.py', 'hook_and_settings_put_back'),
    Mutation(7, "a plugin a sandboxed job planted in Hermes' home stays",
             'home_guard.py', '"cron", "plugins", "skills")',
             '"cron", "skills")',
             'tests/test_sandbox.py', 'hermes_settings or skills_hides or every_escape'),
    Mutation(8, "after the user edits Hermes' config.yaml, the next job takes a warm Hermes started with the old one",
             'standby.py', 'str(home), home_stamp(home), folder,',
             'str(home), folder,',
             'tests/test_standby.py', 'guarded_name or same_size'),
    Mutation(9, 'a standby for one folder does not step aside when a job elsewhere wants one',
             'standby.py', '\n                    or (wanted_key and wanted_key != standby.key)):',
             '):',
             'tests/test_standby_handover.py'),
    Mutation(10, 'a steer sent before Hermes has claimed the turn is taken as the turn itself',
             'acp_conversation.py', 'self.turn_seen or time.time() - prompt_sent >= STEER_AFTER_PROMPT_S)',
             'True)',
             'tests/test_acp_conversation.py', 'steer'),
    Mutation(11, 'a steer Hermes refused is shown as taken',
             'acp_conversation.py',
             'steer["state"] = "refused" if steer["hermes"].startswith(STEER_REFUSALS) else "acknowledged"',
             'steer["state"] = "acknowledged"',
             'tests/test_acp_conversation.py', 'steer'),
    Mutation(12, "a job that moves the user's branch is not reported",
             'repo_guard.py', '"moved": [name for name in now if name in before and now[name] != before[name]],',
             '"moved": [],',
             'tests/test_containment.py',
             'cannot_touch_the_history or rewrite_the_history or hook_and_settings_put_back'),
    Mutation(13, "a file named by the user's includeIf that the job changed is not put back",
             'repo_guard.py', '(name in INCLUDE_KEYS or (name.startswith("includeif.") and name.endswith(".path")))',
             '(name in INCLUDE_KEYS)',
             'tests/test_repository_guard.py', 'whatever_includes'),
    Mutation(14, "an ext:: remote the repository's config allows runs a command through the bridge's git",
             'git_calls.py', '("protocol.ext.allow", "never"), ',
             '',
             'tests/test_pins.py', 'ext_remote'),
    Mutation(15, "the spend and the cap go down when a job rewrites Hermes' store",
             'job_watching.py', 'record.spend = never_lower(found, record.spend)',
             'record.spend = found',
             'tests/test_budgets.py', 'rewrites_hermes or never_goes_down'),
    Mutation(16, 'a multi-line command read from the content is shown by its first line',
             'hermes_acp.py', 'return "\\n".join([line[2:], *lines[index + 1:]]).strip()',
             'return line[2:].strip()',
             'tests/test_acp_conversation.py', 'multi_line'),
    Mutation(17, 'a sandbox_writable folder that does not exist yet makes every sandboxed job fail to start',
             'hermes_cli.py', 'if os.path.isabs(path) and os.path.isdir(path)]',
             'if os.path.isabs(path)]',
             'tests/test_sandbox.py', 'does_not_exist'),
    Mutation(18, "a warm job's SANDBOX names a TMPDIR its Hermes does not use; the standby's folder is never removed",
             'job_planning.py',
             'self.private_tmp = self.warm.private_tmp if self.warm and self.warm.private_tmp else private_tmp_of(',
             'self.private_tmp = private_tmp_of(',
             'tests/test_standby.py', 'held_by or next_job_in_the_folder'),
    Mutation(19, 'an untracked dangling link at a path the job adds is overwritten by the landing',
             'landing.py', '        if os.path.lexists(os.path.join(top, name)) or blocking:',
             '        if os.path.exists(os.path.join(top, name)) or blocking:',
             'tests/test_repository_guard.py', 'never_overwrites'),
    Mutation(20, "a discard deletes whatever folder now sits at the worktree's path",
             'worktrees.py', '        elif is_own_folder(worktree):',
             '        elif os.path.isdir(path):',
             'tests/test_repository_guard.py', 'discard_removes_only'),
    Mutation(21, "a discard removes another worktree's administrative folder",
             'worktrees.py', '    return admin if os.path.normpath(os.path.dirname(named)) in expected else None',
             '    return admin',
             'tests/test_repository_guard.py', 'discard_removes_only'),
    Mutation(22, "the drivers are read from the folder's repository, not the pinned --git-dir: a rewritten .git "
                 "file hides them",
             'git_calls.py', 'override_environment(driver_names(exe, folder, locating), transport, protocol)',
             'override_environment(driver_names(exe, folder, []), transport, protocol)',
             'tests/test_pins.py', 'pinned_repository'),
    Mutation(23, "the server's GIT_* environment steers the bridge's git",
             'git_calls.py', ' if not key.startswith("GIT_")}',
             '}',
             'tests/test_pins.py', 'git_environment'),
    Mutation(24, 'a job claims a standby that replaced the one it checked',
             'taking.py', 'if (read_json(claimed) or {}).get("marker") != record.standby_marker:',
             'if False:',
             'tests/test_standby_handover.py'),
    Mutation(25, 'a standby that answered just after the deadline serves the job while the server also starts it cold',
             'taking.py', '    return (folder / f"serving-{record.id}.json").exists()',
             '    return False',
             'tests/test_standby_handover.py'),
    Mutation(26, 'a standby whose settings went stale keeps waiting',
             'standby.py', 'stale = not still_fits(cfg, standby)',
             'stale = False',
             'tests/test_standby_handover.py'),
    Mutation(27, "a warm job refused before Hermes got its task leaves the standby's Hermes running",
             'standby.py', 'if standby.warm.hermes.proc.poll() is None:  # a job refused',
             'if False:  # a job refused',
             'tests/test_standby_handover.py'),
    Mutation(28, 'guidance with replacement characters is sent as is',
             'steer.py', 'if "\\ufffd" in guidance or count_hiding(guidance, "\\n\\t"):',
             'if count_hiding(guidance, "\\n\\t"):',
             'tests/test_pins.py', 'replacement'),
    Mutation(29, 'the 21st steer is accepted and never sent or recorded',
             'steer.py', '    if len(record.steers) >= STEERS_KEPT:\n        raise',
             '    if False:\n        raise',
             'tests/test_pins.py', 'past_the_last or steered_as_often'),
    Mutation(30, "a steer relayed after the supervisor's last look is missing from the final block",
             'acp_conversation.py', '        if late:\n',
             '        if False:\n',
             'tests/test_acp_conversation.py', 'relayed_after'),
    Mutation(31, 'a file start that straddles a 1 MiB read is missed: the next page skips files',
             'review.py', '        carried = chunk[-len(FILE_START):]',
             '        carried = b""',
             'tests/test_review.py', 'straddle'),
    Mutation(32, "a running job's block has no SANDBOX line",
             'render.py', '    lines += start_line(record) + sandbox_lines(record) + spend_line(record)',
             '    lines += start_line(record) + spend_line(record)',
             'tests/test_pins.py', 'running_jobs_block'),
    Mutation(33, "START counts from Hermes' start, not the call",
             'render.py', 'max(0.0, record.prompt_sent_at - record.created_at)',
             'max(0.0, record.prompt_sent_at - (record.started_at or record.created_at))',
             'tests/test_pins.py', 'start_counts'),
    Mutation(34, "a steered job's SESSION_ID says none captured",
             'render.py', 'f"SESSION_ID: {shown(session) if session else \'none captured\'}"',
             'f"SESSION_ID: {shown(session) if session and not record.steers else \'none captured\'}"',
             'tests/test_steer.py', 'reaches_the_running'),
    Mutation(35, 'max_cost_usd=inf is accepted: a budget that never fires',
             'tools.py', '            or not math.isfinite(value) or value <= 0:',
             '            or value <= 0:',
             'tests/test_pins.py', 'could_never_fire'),
    Mutation(36, 'a write the disk refused is retried only at the next heartbeat',
             'job_watching.py', 'if now >= self.due or self.job.unsaved:',
             'if now >= self.due:',
             'tests/test_failures.py', 'tried_again or full_disk or read_only or first_write'),
    # issue 68's survivors, and what issues 63 and 64 added
    Mutation(37, 'a network-limited job takes a warm Hermes started without its proxy and reaches any host',
             'taking.py', '    if readied != shape["network"]:',
             '    if False:',
             'tests/test_standby.py', 'network_limited'),
    Mutation(38, "the bridge's git lazily fetches through a remote a job wrote, running its command unconfined",
             'git_calls.py', 'override_environment(driver_names(exe, folder, locating), transport, protocol)',
             'override_environment(driver_names(exe, folder, locating), True, protocol)',
             'tests/test_read_only.py', 'lazily'),
    Mutation(39, "a default job writes its repository's git folder (commondir, hooks, a commit)",
             'drivers.py', '    return [*git_folder_mounts(folder, worktree), *install_mounts(exe, writable),',
             '    return [*install_mounts(exe, writable),',
             'tests/test_read_only.py', 'default_job'),
    Mutation(40, "a worktree job's rewritten admin folder is trusted when its work is saved",
             'worktrees.py', '        if os.path.realpath(os.path.join(admin, said)) != os.path.realpath(wanted):',
             '        if False:',
             'tests/test_read_only.py', 'admin_folder'),
    Mutation(41, "the bridge's git on a worktree follows the commondir its job wrote",
             'git_calls.py', '            return {"GIT_COMMON_DIR": os.path.dirname(os.path.dirname(admin))}',
             '            return {}',
             'tests/test_read_only.py', 'admin_folder'),
    Mutation(42, 'a repository with a planted .git/commondir is worked on',
             'worktrees.py', '    if os.path.isdir(os.path.join(top, ".git")) and os.path.lexists(planted):',
             '    if False:',
             'tests/test_read_only.py', 'admin_folder'),
    Mutation(43, "a job's commands reach the Docker daemon's socket",
             'drivers.py', '            *(f"hide:{path}" for path in daemon_sockets())]',
             '            ]',
             'tests/test_read_only.py', 'sockets'),
    Mutation(44, "600 files in .git/hooks leave a planted hook in place (the guard's walk cut, not put back whole)",
             'repo_guard.py', ' if hooks_of(os.path.join(folder, GUARDED_FOLDER))[1]]',
             ' if False]',
             'tests/test_repository_guard.py', 'planted_hook_past'),
    Mutation(45, "a submodule's git folder is not guarded: its config's fsmonitor runs at the user's git status",
             'repo_guard.py', '                found.append(parent)',
             '                pass',
             'tests/test_repository_guard.py', 'every_file'),
    Mutation(46, '.git moved aside behind a gitdir file stays so',
             'repo_guard.py', '    said = [moved] if (moved := put_back_dot_git(top, snapshot.get("dot_git"))) else []',
             '    said = []',
             'tests/test_repository_guard.py', 'moved_aside'),
    Mutation(47, "uv hard-links a job's packages from the cache: a job writing the cache's copy changes the venv",
             'drivers.py', '"npm_config_update_notifier": "false", "UV_LINK_MODE": "copy"}',
             '"npm_config_update_notifier": "false"}',
             'tests/test_containment.py', 'npm_install_and_uv'),
    Mutation(48, "a job is handed every variable not shaped as a secret (DATABASE_URL, SENTRY_DSN, BW_SESSION, ...)",
             'hermes_cli.py', '            or upper.endswith(ENVIRONMENT_SUFFIXES))',
             '            or upper.endswith(ENVIRONMENT_SUFFIXES) or True)',
             'tests/test_secrets.py', 'left_out'),
    Mutation(49, "a malformed network_allow entry: the list is said ignored, its valid entries stay allowed",
             'config.py', '        cfg.network_allow = []',
             '        pass',
             'tests/test_pins_round8.py', 'malformed_network_allow'),
    Mutation(50, "the server's NO_PROXY sends the hosts it names around a limited job's proxy",
             'drivers.py', '        env = {key: value for key, value in env.items() if key not in NO_PROXY_VARIABLES}',
             '        env = dict(env)',
             'tests/test_pins_round8.py', 'every_proxy_variable'),
    Mutation(51, "curl http:// goes around the job's proxy (lower-case http_proxy not set)",
             'network.py', 'PROXY_VARIABLES = ("http_proxy", ',
             'PROXY_VARIABLES = (',
             'tests/test_pins_round8.py', 'every_proxy_variable'),
    Mutation(52, "the proxy forwards Proxy-Authorization and Connection to a plain-http host",
             'network.py', 'if not line.lower().startswith((b"proxy-", b"connection:"))]',
             ']',
             'tests/test_pins_round8.py', 'hop_headers'),
    Mutation(53, "seccomp lets TIOCSTI through: a job types into its controlling terminal",
             'sandbox.py', '("", BPF_JEQ_K, "deny", "", TIOCSTI),',
             '("", BPF_JEQ_K, "deny", "", 0x7FFF),',
             'tests/test_pins_round8.py', 'controlling_terminal'),
    Mutation(54, "a working-tree job takes a worktree readied at HEAD, without the user's uncommitted files",
             'worktrees.py', '    if planned.get("from") != "head":',
             '    if False:',
             'tests/test_pins_round8.py', 'uncommitted_files'),
    Mutation(55, "a readied worktree that changed is handed to a job",
             'worktrees.py', '    if (git_text(old_path, *pinned, "status", "--porcelain", "--untracked-files=all")',
             '    if (False',
             'tests/test_pins_round8.py', 'readied_worktree_that_changed'),
    Mutation(56, "a ready.json naming a worktree outside the jobs folder is taken as the job's worktree",
             'taking.py', '    if (os.path.dirname(path) != str(store.root / "worktrees") or not STANDBY_NAME_RE',
             '    if (False or not STANDBY_NAME_RE',
             'tests/test_pins_round8.py', 'outside_the_jobs_folder'),
    Mutation(57, "a queued job cancelled between the queue's look and its start is started anyway",
             'job_queue.py', '            if not store.write(record):',
             '            if not store.write(record) and False:',
             'tests/test_pins_round8.py', 'cancelled_between'),
    Mutation(58, "a standby whose settings changed while it waited still takes the next job",
             'standby.py', 'usable_hermes(cfg), standby.shape) == standby.key',
             'usable_hermes(cfg), standby.shape) == standby.key or True',
             'tests/test_pins_round8.py', 'settings_changed'),
    Mutation(59, "where no /proc tells Hermes from its tools, each job opens asking about Hermes' own start-up host",
             'network.py', 'host in HERMES_START_HOSTS and not CAN_TELL_HERMES)',
             'False)',
             'tests/test_pins_round8.py', 'cannot_tell'),
    Mutation(60, "a standby whose settings changed by the time a job takes it serves the job with the old ones",
             'standby.py', 'if not still_fits(cfg, standby) or not handed_over(cfg, store, standby, job_id):',
             'if not handed_over(cfg, store, standby, job_id):',
             'tests/test_pins_round8.py', 'takes_it'),
    Mutation(61, "a job launched while a slot is free but jobs wait starts ahead of them",
             'launch.py', 'full = len(running) >= cfg.max_running_jobs or queued',
             'full = len(running) >= cfg.max_running_jobs',
             'tests/test_pins_round8.py', 'goes_behind'),
    Mutation(62, "jobs left queued with no supervisor left wait until a tool happens to look at the queue",
             'mcp_edge.py', '    threading.Thread(target=start_queued, args=(cfg, JobStore.of(cfg)), name="the queue", '
             'daemon=True).start()', '    pass',
             'tests/test_pins_round8.py', 'queue_when'),
    Mutation(63, "a job that waited past START_GRACE_S in the queue is orphaned before its supervisor reports",
             'jobs.py', 'launched = record.dequeued_clock or record.created_clock',
             'launched = record.created_clock',
             'tests/test_pins_round8.py', 'dequeued_after'),
    Mutation(64, "a docker job under a limited network gets the daemon's network in its container",
             'executors.py', 'return network_mode == "open" and executor.network == "job"',
             'return executor.network == "job"',
             'tests/test_executors.py', 'network'),
    Mutation(65, "Hermes' own ssh accepts a host key it never saw (its accept-new wins)",
             'executors.py', 'strict = f"-o StrictHostKeyChecking=yes',
             'strict = f"-o StrictHostKeyChecking=accept-new',
             'tests/test_executors.py', 'strict'),
    Mutation(66, "a default docker job's .git is writable through /workspace, where its commands run",
             'executors.py', '            specs.append(f"{path}:{WORKSPACE}{path[len(folder):]}{mode}")',
             '            pass',
             'tests/test_executors.py', 'twice'),
    Mutation(67, "an ssh key readable by others is used",
             'executors.py', 'if not stat.S_ISREG(info.st_mode) or info.st_mode & 0o077:',
             'if not stat.S_ISREG(info.st_mode):',
             'tests/test_executors.py', 'readable_by_others'),
    Mutation(68, "a limited job shares this machine's network: a port it listens on without bind() is reachable",
             'drivers.py', 'held.namespace_channel() if held and not also_ports', 'None if held and not also_ports',
             'tests/test_network.py', 'unbound_listener'),
    Mutation(69, "only the last job's folder keeps a warm Hermes: jobs taking turns in two projects all start cold",
             'standby.py', '*(store.root / f"standby-{number}" for number in range(1, count))]', ']',
             'tests/test_standby.py', 'taking_turns'),
    Mutation(70, "a warm job opens a session of its own: the warm-up session is thrown away, session/new paid again",
             'hermes_acp.py', 'if folder != self.warm_folder:', 'if folder:',
             'tests/test_standby.py', 'next_job_in_the_folder'),
    Mutation(71, "a job sent while its standby is readied starts a second Hermes beside it, cold",
             'launch.py', 'OFFERED if offered else "--supervise"', '"--supervise"',
             'tests/test_standby.py', 'still_starting_waits'),
    Mutation(72, "jobs started together leave one warm Hermes: the next ones together start cold but one",
             'standby.py', '(read_json(slot / "holder.json") or {}).get("key") == wanted["key"]', 'False',
             'tests/test_standby.py', 'started_together'),
    Mutation(73, "a job the queue starts never takes the warm Hermes waiting for it",
             'job_queue.py', 'spawn_supervisor(cfg, store, record, log, OFFERED)',
             'spawn_supervisor(cfg, store, record, log)', 'tests/test_standby.py', 'queued_job_takes'),
    Mutation(74, "on Windows a Hermes that exits fast ends `error` with EXIT_CODE none: its own code is lost",
             'supervisor.py', 'self.hermes = started_process(proc.pid)', 'self.hermes = psutil.Process(proc.pid)',
             'tests/test_supervisor.py', 'gone_before'),
    Mutation(75, "a Hermes installed without bytecode compiles every module at each job's start, 2 s slower",
             'launch.py', '    compile_at_start(cfg)\n    standby_at_start(cfg)', '    standby_at_start(cfg)',
             'tests/test_bytecode.py', 'once_confined'),
    Mutation(76, "the bridge's compile of Hermes' install runs unconfined, outside any sandbox",
             'hermes_cli.py', 'with confined_call(cfg, [python, "-I", "-S", "-m", "compileall", "-q", site], (site,))',
             'with contextlib.nullcontext(([python, "-I", "-S", "-m", "compileall", "-q", site], hermes_env(cfg)))',
             'tests/test_bytecode.py', 'once_confined'),
)


def main(numbers: list[int]) -> int:
    results = []
    for mutation in MUTATIONS:
        if numbers and mutation.number not in numbers:
            continue
        started = time.monotonic()
        result = mutation.run()
        results.append(result)
        verdict, _, test = result.partition(" by ")
        print(f"{verdict:7} {mutation.number:2} {mutation.module}: {mutation.bug} ({time.monotonic() - started:.0f} s)"
              + (f"\n           by {test}" if test else ""), flush=True)
    caught = sum(result.startswith("CAUGHT") for result in results)
    print(f"{caught} of {len(results)} caught")
    return 0 if results and caught == len(results) else 1


if __name__ == "__main__":
    sys.exit(main([int(number) for number in sys.argv[1:]]))
