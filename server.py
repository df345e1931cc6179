#!/usr/bin/env python3
# /// script
# requires-python = ">=3.10"
# dependencies = ["mcp>=1.24,<3", "psutil>=7.1", "PyYAML>=6", "platformdirs>=4"]
# ///
"""claude-hermes-bridge: an MCP stdio server that gives a planner (Claude Desktop or any MCP host) an
executor, the Hermes Agent CLI, on the same machine. This is the file a user runs and registers; the code
is the package claude_hermes_bridge/ beside it.

The one decision that shapes it: a job never lives inside a request. A job is a record, a log and a detached
supervisor process on disk, so every tool returns within seconds and a job outlives the server that started it.

The package, one module per layer in the order data flows, each marked with the program that uses it: two
share it, the MCP server and the per-job supervisor (`--supervise ID`, which never loads a server module or
the MCP stack). A module imports only from modules above it in this list (tests/test_layout.py holds it):

  stdio_guard ........ [both] the client's pipes moved aside before anything can print (stdout is the protocol)
  preflight .......... [both] the dependencies checked, and named with their fix, before the rest is imported
  safe_io ............ [both] names and escaping (shown), paths (within_root), safe opening (open_regular), atomic
                       writes, a file lock, process identity (ProcessId), machine_clock, disk_error
  processes .......... [both] creation flags, Ownership (the proof before any signal), stop_tree, WindowsJob
  sandbox ............ [both] Landlock, seccomp, mounts: the step that confines Hermes before it becomes Hermes
  late_binding ....... [both] the step of a warm Hermes bound to its job's folder late, and its mount helper
  network ............ [both] a job's network: modes, hosts, Hermes' model endpoint, the job's proxy (JobProxy)
  config ............. [both] Config (each setting in SETTINGS), where it is found; the roots (confine_cwd,
                       confine_read); the audit log
  jobs ............... [both] JobRecord (every field checked, every list bounded), JobStore (the jobs folder),
                       ObservedJob (observe: orphaned, frozen, waiting for the disk)
  job_queue .......... [both] a job's supervisor started, and the queue past max_running_jobs, drained in order
  folder_changes ..... [both] what a job changed in its folder: listings compared (snapshot_folder), human_size
  git_calls .......... [both] the bridge's own git, which runs no program a repository's config or attributes name
  worktrees .......... [both] a worktree job's repository, its worktree made and removed, its work saved
  executors .......... [both] a job's commands elsewhere: a docker container, an ssh host (docs/executors.md)
  repo_guard ......... [both] a worktree job's shared repository: config and hooks put back, refs named
  landing ............ [server] a worktree job's work landed (hermes_land): merged, applied or discarded
  home_guard ......... [supervisor] a sandboxed job's Hermes settings (config.yaml, .env, skills, ...) put back
  hermes_cli ......... [both] locating Hermes, the options it declares, its command line, its exit codes in words
  hermes_store ....... [both] Hermes' state.db read with a deadline: activity, usage, current tool, answer
  hermes_acp ......... [both] whether this Hermes speaks ACP (choose_driver), its messages read, a warm Hermes
  acp_conversation ... [supervisor] one job's ACP conversation, Hermes' questions and the user's steers relayed
  job_network ........ [supervisor] one job's network: its proxy started, its questions asked, its refusals said
  drivers ............ [both] the seam: HermesRun, CliRun, AcpRun, DRIVERS, and the launch plan (plan_launch)
  supervised_job ..... [supervisor] SupervisedJob: the job as its supervisor holds it (record, saves, log notes)
  job_planning ....... [supervisor] JobPlanner: what is checked and made before Hermes starts (folder, sandbox)
  job_watching ....... [supervisor] JobWatch: the poll loop until Hermes exits (tree, log bound, stops, spend)
  job_finishing ...... [supervisor] JobFinish: the outcome and what surrounds it (reports, restores, the queue)
  supervisor ......... [supervisor] Supervisor (one detached process per job: the three phases) and main
  late_standby ....... [supervisor] a warm Hermes for default jobs in any folder, bound to the job late
  standby ............ [supervisor] a warm Hermes for the next job, and its program (--standby ID)
  taking ............. [both] which warm Hermes a job takes, the next one readied, an offered job's program
  launch ............. [server] JobRequest, launch_job (dedupe, limits, the record), start_job
  render ............. [server] the status block: job_details, render_status, ToolResult
  tools .............. [server] plain functions per tool: arguments, resuming, one job and the list, reading
  review ............. [server] a worktree job's patch as the job view's pages, file by file (hermes_view_patch)
  steer .............. [server] hermes_steer: guidance for a running ACP job, relayed through the jobs folder
  skills ............. [server] Hermes' skills for hermes_capabilities
  health ............. [server] hermes_health and the server's instructions
  bodies ............. [server] async tool bodies (run_tool_body, ...), disk work off the event loop, no MCP
  handshake .......... [server] the host's initialize answered before the SDK is imported, from the kept answer
  mcp_edge ........... [server] the only module importing mcp: JobTasks, McpEdge (both SDK lines), build_server
  cli ................ [server] --check, --try, --init-config, serving
  entry .............. [both] console_main: guard stdio, then the supervisor or the server

One hermes_run, end to end: mcp_edge (hermes_run) → bodies (run_tool_body) → tools (run_tool, job_request:
arguments, roots, Hermes, the launch plan from drivers) → bodies (launch_and_wait) → launch (launch_job writes the
record; start_job spawns `python -c SUPERVISOR_BOOT`, or taking hands it to a standby) → supervisor (Supervisor.run:
JobPlanner.plan, Hermes through drivers, JobWatch.watch, JobFinish.finish) ← bodies (wait_for_end polls the record).
"""

import os
import sys

# The package beside this file, however it is started (runpy, an embeddable CPython's ._pth leaves it off)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from claude_hermes_bridge.entry import console_main  # noqa: E402

if __name__ == "__main__":
    console_main()
