@echo off
rem Run the bridge by hand (for debugging): the project virtual environment if there is one, else py.
rem It speaks MCP on stdin/stdout, so it waits for a client; its log lines go to stderr.
set "HERE=%~dp0"
if exist "%HERE%.venv\Scripts\python.exe" (
  "%HERE%.venv\Scripts\python.exe" "%HERE%server.py" %*
) else (
  py -3 "%HERE%server.py" %*
)
exit /b %ERRORLEVEL%
