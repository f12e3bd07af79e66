use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::processors::forced_sequence::{ForcedSequenceSpec, PositionSpec};
use crate::processors::{ForcedSequence, LogitsProcessor};
use crate::spec::{EngineContext, KindSpec};

/// `{"kind": "hello_world", "position": "calls"}`: the ids come from the engine's tokenizer
/// ([`EngineContext::hello_world`]).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HelloWorldSpec {
    #[serde(default)]
    pub position: PositionSpec,
}

impl HelloWorldSpec {
    fn forced(&self, context: &EngineContext) -> Result<ForcedSequenceSpec> {
        let (token_ids, eos_token_id) = context.hello_world.clone().ok_or_else(|| {
            Error::spec(
                "kind",
                "hello_world needs the engine's tokenizer and EOS id (its context's hello_world)",
            )
        })?;
        Ok(ForcedSequenceSpec {
            token_ids,
            eos_token_id,
            position: self.position,
        })
    }
}

impl KindSpec for HelloWorldSpec {
    fn needs_prompt_len(&self) -> bool {
        self.position == PositionSpec::Tokens
    }

    fn realize(
        &self,
        context: &EngineContext,
        prompt_len: usize,
    ) -> Result<Box<dyn LogitsProcessor>> {
        self.forced(context)?.realize(context, prompt_len)
    }

    fn validate(&self, context: &EngineContext) -> Option<Result<()>> {
        // Without an engine, the ids are the engine's to supply.
        (context.structure_only && context.hello_world.is_none()).then_some(Ok(()))
    }

    fn position_by_tokens(&mut self) {
        self.position = PositionSpec::Tokens;
    }

    fn resolve(&self, context: &EngineContext) -> Result<Option<serde_json::Value>> {
        if context.hello_world.is_none() {
            return Ok(None);
        }
        // "kind" first, as every spec is written back (maps keep their order).
        let mut object = serde_json::Map::new();
        object.insert("kind".into(), "forced_sequence".into());
        if let serde_json::Value::Object(fields) =
            serde_json::to_value(self.forced(context)?).expect("plain data")
        {
            object.extend(fields);
        }
        Ok(Some(object.into()))
    }
}

/// The reply [`hello_world`] forces.
pub const HELLO_WORLD_TEXT: &str = "Hello world!";

/// Anything that turns text into token ids without adding special tokens.
pub trait TextEncoder {
    fn encode_plain(&self, text: &str) -> Result<Vec<u32>>;
}

#[cfg(feature = "tokenizers")]
impl TextEncoder for tokenizers::Tokenizer {
    fn encode_plain(&self, text: &str) -> Result<Vec<u32>> {
        self.encode(text, false)
            .map(|encoding| encoding.get_ids().to_vec())
            .map_err(|e| Error::Tokenizer(e.to_string()))
    }
}

/// A forced sequence of the tokenizer's encoding of "Hello world!", then `eos_token_id`: the
/// reference's `HelloWorldLogitsProcessor`. A tokenizer without an EOS token is an error.
pub fn hello_world(
    tokenizer: &dyn TextEncoder,
    eos_token_id: Option<u32>,
) -> Result<ForcedSequence> {
    let eos_token_id = eos_token_id.ok_or(Error::MissingEosToken {
        processor: "HelloWorldLogitsProcessor",
    })?;
    ForcedSequence::new(
        tokenizer.encode_plain(HELLO_WORLD_TEXT)?,
        Some(eos_token_id),
    )
}
