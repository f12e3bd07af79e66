#!/usr/bin/env bash
# Installs this checkout's package into VENV as a release wheel (abi3: one build serves every
# venv), built into WHEELS with the main venv's maturin, rebuilt only when the Rust or Python
# sources change (a stamp in VENV). Used by scripts/engine-venv.sh and scripts/llamacpp-python.sh.
#
#   scripts/checkout-wheel.sh VENV UV WHEELS
set -euo pipefail
venv="$1" uv="$2" wheels="$3"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
sources="$(cd "$root" && git ls-files -co --exclude-standard -- crates python/logits_processing \
  pyproject.toml Cargo.toml Cargo.lock | sort | xargs sha256sum 2>/dev/null | sha256sum | cut -d' ' -f1)"
pkg_stamp="$venv/.logits-processing.sha256"
if [ "$(cat "$pkg_stamp" 2>/dev/null)" != "$sources" ]; then
  main_venv="$("$root/scripts/venv.sh")"
  rm -rf "$wheels" && mkdir -p "$wheels"
  (cd "$root" && CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}" \
    "$main_venv/bin/maturin" build --release -q -i "$venv/bin/python" -o "$wheels" >&2)
  "$uv" pip install -q -p "$venv/bin/python" --no-deps --reinstall "$wheels"/logits_processing-*.whl >&2
  echo "$sources" > "$pkg_stamp"
fi
