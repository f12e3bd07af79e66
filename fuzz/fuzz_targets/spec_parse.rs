//! Spec parsing and validation: any bytes either parse into specs that realize (or fail with an
//! error) or fail with an error; never a panic, and what parses survives a round trip through
//! `resolve` and parses again.
#![no_main]

use libfuzzer_sys::fuzz_target;
use logits_processing::{parse_pipeline, Pipeline, EngineContext, ThinkingTokenConfig};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(specs) = parse_pipeline(text) else {
        return;
    };
    let context = EngineContext {
        vocab_size: Some(64),
        hello_world: Some((vec![1, 2, 3], 0)),
        thinking_tokens: Some(ThinkingTokenConfig {
            start_token_id: 5,
            end_token_id: 6,
            newline_token_id: 7,
        }),
        ..Default::default()
    };
    for spec in &specs {
        if let Ok(value) = spec.resolve(&context) {
            let again = parse_pipeline(&value.to_string()).expect("a resolved spec parses again");
            assert_eq!(again.len(), 1);
        }
    }
    if let Ok(mut pipeline) = Pipeline::from_specs(&specs, &context, 0) {
        pipeline
            .validate(64)
            .expect("a realized pipeline names only ids in its vocab");
        let mut row = [0.5f32; 64];
        let _ = pipeline.process(&[5u32, 9, 7], &mut row);
    }
});
