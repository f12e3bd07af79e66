//! The end token the length kinds (`gen_length`, `max_time`) push toward, and when: the three
//! fields both specs carry, checked, realized and resolved once here; and [`Seen`], whether the
//! end token was written.

use crate::error::Result;
use crate::processors::token_text::{eos_or, sentence_ends, TextOrId};
use crate::spec::{structure_only, EngineContext};

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

/// Whether a token occurs among the generated ids, read incrementally (the zoo's `enabled`: the
/// boost token not written yet), and whether the last id ends a sentence.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(crate) struct Seen {
    cursor: crate::processors::cursor::Cursor,
    found: bool,
}

impl Seen {
    /// Reads the ids past what was read (all of them from `prompt_len` when they do not extend
    /// them) and says whether `token` is among the generated ones.
    pub fn update(
        &mut self,
        ids: &dyn crate::history::TokenHistory,
        prompt_len: usize,
        token: u32,
    ) -> bool {
        let from = if self.cursor.extended_by(ids) && self.cursor.seen() >= prompt_len {
            self.cursor.seen()
        } else {
            self.found = false;
            prompt_len
        };
        if !self.found {
            self.found = (from..ids.token_count()).any(|i| ids.token_at(i) == token);
        }
        self.cursor.read_all(ids);
        self.found
    }
}
