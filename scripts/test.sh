#!/usr/bin/env bash
# Every test: formatting and lints, the Rust workspace's tests (unit, property, doc), a short run of
# each fuzz target, the Python package built into the venv and its tests (differential against the
# reference, adapters, docs' examples, bad input, threads, the slow churn test), the portable wheel
# and the sdist (scripts/test-wheel.sh), then the engine adapters against the real vLLM and SGLang
# packages in their own venvs. This is what CI runs (.ci/run).
#
# scripts/test.sh --quick: the fast tier for an edit: fmt, clippy, the Rust workspace's tests (the
# DeepSeek-tokenizer ones included; once, not again under each capped CPU level), the package
# built into the venv and its Python suite without the tests marked slow (the churn run, the
# device kernels compiled again), one process per core (pytest-xdist); no fuzz run, no llama.cpp build (its
# differential tests run only if the library is already built, else they skip saying so), no
# wheel, no engine venvs (the engine tests skip in the main venv, saying so).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
quick=0
case "${1-}" in
  "") ;;
  --quick) quick=1 ;;
  *) echo "usage: scripts/test.sh [--quick]" >&2; exit 2 ;;
esac
source scripts/lib.sh

echo "== cargo fmt --check"
cargo fmt --all --check
echo "== cargo clippy -D warnings"
cargo clippy --workspace --all-targets --all-features -- -D warnings
echo "== the core without its default features: the token texts without llguidance, then neither"
cargo clippy -p logits-processing --no-default-features --features tokenizers --all-targets -- -D warnings
cargo clippy -p logits-processing --no-default-features --all-targets -- -D warnings
cargo test -p logits-processing --no-default-features --features tokenizers --lib -- ban_strings dry multiple_choice
echo "== cargo test"
DEEPSEEK_TOKENIZER_JSON="$(deepseek_tokenizer_json)"
export DEEPSEEK_TOKENIZER_JSON
cargo test --workspace --exclude logits-processing-python
# The core's tests that need the DeepSeek tokenizer are ignored by a plain `cargo test`; run them.
cargo test -p logits-processing --test tokenizer -- --ignored
cargo test -p logits-processing --test grammar -- --ignored

if [ "$quick" = 1 ]; then
  echo "== python package (quick: no slow tests)"
  "$venv/bin/ruff" check python
  "$venv/bin/maturin" develop --release --quiet --manifest-path crates/python/Cargo.toml
  "$venv/bin/python" -m pytest -q -m "not slow" -n auto python/tests
  exit 0
fi

# The core's unit and property tests again with its SIMD dispatch capped (LOGITS_PROCESSING_CPU):
# the AVX2 paths on a CPU that also has AVX-512, and the portable path.
for level in avx2 portable; do
  LOGITS_PROCESSING_CPU="$level" cargo test -p logits-processing --lib
done

echo "== fuzz: a short run of each target (scripts/fuzz.sh; FUZZ_SECONDS, default 20)"
scripts/fuzz.sh

echo "== llama.cpp's library, the samplers' reference (scripts/llamacpp.sh: built once, 2.5 min on 2 cores)"
LLAMACPP_LIB="$(JOBS="${JOBS:-2}" scripts/llamacpp.sh)"
export LLAMACPP_LIB

echo "== python package"
"$venv/bin/ruff" check python
"$venv/bin/maturin" develop --release --quiet --manifest-path crates/python/Cargo.toml
"$venv/bin/python" -m pytest -q python/tests

echo "== the portable wheel (manylinux2014, abi3) and the sdist, installed where there is no Rust"
venv="$venv" scripts/test-wheel.sh

echo "== engine adapters against vLLM and SGLang"
scripts/test-engines.sh
