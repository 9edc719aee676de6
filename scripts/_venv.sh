# Sourced by the scripts: make ./.venv with the project installed (with the given extras).
# Re-installs only when pyproject.toml changes, so repeated runs start fast; compiles the
# project's modules.
# With the spark extra it also checks for Java (Spark runs on a JVM) and points PySpark's
# workers at the venv's interpreter.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "creating .venv" >&2
  "$PY" -m venv .venv
fi
extras="${1:-test}"
stamp=".venv/.installed-${extras//,/-}"
want="$(sha1sum pyproject.toml | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "installing shardnode[$extras] into .venv" >&2
  .venv/bin/python -m pip install -q --disable-pip-version-check -e ".[$extras]"
  echo "$want" > "$stamp"
fi
# The project's own bytecode, written here once (0.5 s; 0.1 s when nothing changed): every
# actor is a fresh interpreter, and where PYTHONDONTWRITEBYTECODE is set nothing else writes
# it, so every process compiled the project again: a node took 2.2 s to start, not 1.6.
# What compileall says goes to stderr: a script's stdout is what it was asked for.
.venv/bin/python -m compileall -q node actors wire config scripts tests >&2
if [[ ",$extras," == *",spark,"* ]]; then
  if ! command -v java >/dev/null 2>&1 && [ -z "${JAVA_HOME:-}" ]; then
    echo "Spark needs Java 17 or newer, and there is no 'java' on PATH and no JAVA_HOME." >&2
    echo "Install a JDK (e.g. 'apt-get install openjdk-17-jre-headless') and run this again." >&2
    exit 3
  fi
  export PYSPARK_PYTHON="$ROOT/.venv/bin/python"
  export PYSPARK_DRIVER_PYTHON="$ROOT/.venv/bin/python"
fi
