use crate::error::{Error, Result};
use crate::processors::ForcedSequence;

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
