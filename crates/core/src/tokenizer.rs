//! Loading a Hugging Face `tokenizer.json`, and finding its EOS token.

use std::path::Path;

use tokenizers::Tokenizer;

use crate::error::{Error, Result};

/// Loads a `tokenizer.json`.
pub fn load(path: impl AsRef<Path>) -> Result<Tokenizer> {
    let path = path.as_ref();
    Tokenizer::from_file(path).map_err(|e| Error::Tokenizer(format!("{}: {e}", path.display())))
}

/// Reads a tokenizer from the text of a `tokenizer.json` (what `tokenizers.Tokenizer.to_str()`
/// gives in Python).
pub fn from_json(json: &str) -> Result<Tokenizer> {
    json.parse()
        .map_err(|e| Error::Tokenizer(format!("tokenizer.json text: {e}")))
}

/// The id of the EOS token named in the `tokenizer_config.json` beside a `tokenizer.json`
/// (`eos_token`, a string or `{"content": ...}`), if there is one and the tokenizer knows it.
pub fn eos_token_id_from_config(
    tokenizer: &Tokenizer,
    tokenizer_json: impl AsRef<Path>,
) -> Option<u32> {
    let config_path = tokenizer_json
        .as_ref()
        .with_file_name("tokenizer_config.json");
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(config_path).ok()?).ok()?;
    let eos = &config["eos_token"];
    let name = eos.as_str().or_else(|| eos["content"].as_str())?;
    tokenizer.token_to_id(name)
}
