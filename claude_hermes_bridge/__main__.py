"""`python -m claude_hermes_bridge`: the same program as server.py."""
from claude_hermes_bridge.entry import console_main

console_main()
