#!/usr/bin/env bash
# Runs every fuzz target (fuzz/fuzz_targets) for FUZZ_SECONDS each (default 20): the test command's
# short run. For a long run: FUZZ_SECONDS=3600 scripts/fuzz.sh, or one target:
# scripts/fuzz.sh batch_lifecycle. cargo-fuzz is installed from crates.io into ~/.cache on first
# use; the targets build with the nightly toolchain (libFuzzer's instrumentation needs it) into a
# target directory under ~/.cache that later clones reuse. A crash leaves its input in
# fuzz/artifacts/<target>/ and fails the script.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

cache="$HOME/.cache/logits-processing"
seconds="${FUZZ_SECONDS:-20}"
export PATH="$cache/cargo-fuzz/bin:$PATH"
if ! rustup toolchain list | grep -q '^nightly'; then
  rustup toolchain install nightly --profile minimal
fi
if ! command -v cargo-fuzz > /dev/null; then
  cargo install cargo-fuzz --locked --root "$cache/cargo-fuzz"
fi
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets < <(cd fuzz && cargo +nightly fuzz list)
fi
cd fuzz
for target in "${targets[@]}"; do
  echo "-- fuzz $target for ${seconds}s"
  log="$(mktemp)"
  if ! cargo +nightly fuzz run -O --target-dir "$cache/fuzz-target" "$target" -- \
    -max_total_time="$seconds" -rss_limit_mb=4096 -print_final_stats=1 > "$log" 2>&1; then
    tail -40 "$log" >&2
    echo "fuzz $target failed (a failing input is kept in fuzz/artifacts/$target)" >&2
    exit 1
  fi
  grep -E '^(Done|stat::number_of_executed_units)' "$log" || true
  rm -f "$log"
  if [ -n "$(ls -A "artifacts/$target" 2>/dev/null)" ]; then
    echo "fuzz $target found a failing input: fuzz/artifacts/$target" >&2
    exit 1
  fi
done
