#!/usr/bin/env bash
# Creates .venv beside this script's project and installs sglang-launch into it.
#   scripts/install.sh        the server and its serving runtime
#   scripts/install.sh test   the same plus what the test suite needs
# torch is installed first with an exact pin: on a machine without an accelerator that pin is a
# CPU build, where a plain "torch" requirement would pull a multi-GB CUDA build.
#
# Progress: on a terminal pip shows its own output and download progress bars; anywhere else
# (CI, a log file) pip is quiet and each step is one line when it starts and one when it ends,
# with the seconds it took.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="serve"
[[ "${1:-}" == "test" ]] && extras="serve,test"
py="${PYTHON:-python3}"
if [[ -t 1 ]]; then
  pip_output=(--progress-bar on)
else
  pip_output=(-q --progress-bar off)
fi
# --progress-bar is an option of "pip install", so the output options follow the command.
pip_install=(.venv/bin/python -m pip --disable-pip-version-check install "${pip_output[@]}")

step() {  # step "what" command...: one line before, one after with the time it took
  local what="$1" started=$SECONDS
  shift
  echo "[install] $what ..."
  "$@"
  echo "[install] $what: done in $((SECONDS - started))s"
}

if [[ ! -x .venv/bin/python ]]; then
  if ! "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "[install] sglang-launch needs Python >= 3.11; $py is $($py --version 2>&1). Set PYTHON=python3.11 (or newer) and rerun." >&2
    exit 1
  fi
  step "creating .venv with $($py --version)" "$py" -m venv .venv
fi
step "pip, setuptools, wheel (current releases: editable installs and the tests' plugin builds need them)" \
  "${pip_install[@]}" --upgrade pip setuptools wheel
step "torch==2.13.0 (the largest download: minutes on a slow link)" "${pip_install[@]}" "torch==2.13.0"
step "sglang-launch[$extras] (editable)" "${pip_install[@]}" -e ".[$extras]"
echo "[install] done: .venv/bin/sglang-launch --help"
