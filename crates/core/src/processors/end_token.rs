//! The end token the length kinds (`gen_length`, `max_time`) push toward, and when: the three
//! fields both specs carry, checked, realized and resolved once here.

use crate::error::Result;
use crate::processors::zoo::{eos_or, sentence_ends, structure_only, TextOrId};
use crate::spec::EngineContext;

/// A length kind's `boost_token`, `complete_sentences` and `sentence_end_ids`.
pub(crate) struct EndToken<'a> {
    pub boost_token: Option<&'a TextOrId>,
    pub complete_sentences: bool,
    pub sentence_end_ids: Option<&'a [u32]>,
}

impl EndToken<'_> {
    pub fn check(&self) -> Result<()> {
        match self.sentence_end_ids {
            Some(ids) => crate::spec::check_len("sentence_end_ids", ids.len()),
            None => Ok(()),
        }
    }

    /// The end token's id (default the engine's EOS id) and, with `complete_sentences`, the ids
    /// that end a sentence (default the zoo's full stop and new line, from the tokenizer).
    pub fn ids(&self, context: &EngineContext) -> Result<(u32, Option<Vec<u32>>)> {
        let boost = match self.boost_token {
            Some(token) => token.id(context, "boost_token")?,
            None => eos_or(context, None, "boost_token")?,
        };
        if let Some(ids) = self.sentence_end_ids {
            context.check_ids("sentence_end_ids", ids.iter().copied())?;
        }
        let ends = self
            .complete_sentences
            .then(|| sentence_ends(context, self.sentence_end_ids, "sentence_end_ids"))
            .transpose()?;
        Ok((boost, ends))
    }

    /// [`crate::KindSpec::validate`]: without an engine, only the structure is checked when
    /// realizing needs the engine's tokenizer or EOS id.
    pub fn validate(&self, context: &EngineContext) -> Option<Result<()>> {
        let needs_engine = self.boost_token.is_none_or(TextOrId::is_text)
            || (self.complete_sentences && self.sentence_end_ids.is_none());
        structure_only(context, needs_engine).then_some(Ok(()))
    }

    /// The fields with everything the engine knows made explicit (the end token as an id, the
    /// sentence ends as ids), or None where the context cannot say.
    pub fn resolved(&self, context: &EngineContext) -> Option<(TextOrId, Option<Vec<u32>>)> {
        let (boost, ends) = self.ids(context).ok()?;
        Some((TextOrId::Id(boost), ends))
    }
}
