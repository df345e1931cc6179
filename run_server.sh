#!/bin/sh
# Run the bridge by hand (for debugging): the project's virtual environment if there is one, else python3.
# It speaks MCP on stdin/stdout, so it waits for a client; its log lines go to stderr.
here="$(cd "$(dirname "$0")" && pwd)"
if [ -x "$here/.venv/bin/python" ]; then
  exec "$here/.venv/bin/python" "$here/server.py" "$@"
fi
exec python3 "$here/server.py" "$@"
