#!/usr/bin/env bash
# Lint, format check and type check, with the tools of the project's virtualenv:
#   scripts/lint.sh            ruff check, ruff format --check, mypy, lint-imports (the layering
#                              contracts); all configured in pyproject.toml
#   VENV=/path/to/venv scripts/lint.sh   the same with another virtualenv
# Runs every check even when one fails; exits non-zero when any of them failed.
set -uo pipefail
cd "$(dirname "$0")/.."
venv="${VENV:-.venv}"
for tool in ruff mypy lint-imports; do
  if [[ ! -x "$venv/bin/$tool" ]]; then
    echo "[lint] $venv/bin/$tool is missing; run scripts/install.sh test (it installs the test extra)" >&2
    exit 2
  fi
done
status=0
run() {
  echo "[lint] $*"
  "$@" || status=1
}
run "$venv/bin/ruff" check .
run "$venv/bin/ruff" format --check .
run "$venv/bin/mypy"
run "$venv/bin/lint-imports" --no-cache
if [[ $status -ne 0 ]]; then
  echo "[lint] failed" >&2
fi
exit $status
