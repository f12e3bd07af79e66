use std::sync::Arc;

use aho_corasick::automaton::{Automaton, StateID};
use aho_corasick::nfa::contiguous::NFA;
use aho_corasick::{Anchored, MatchKind};
use llguidance::api::{GrammarWithLexer, TopLevelGrammar};
use llguidance::Matcher;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::history::TokenHistory;
use crate::plan::{MaskId, RowPlan};
use crate::processors::cursor::Cursor;
use crate::processors::grammar::{check_vocab, GrammarSpec};
use crate::processors::{LogitsProcessor, TextOrIds};
use crate::spec::{EngineContext, KindSpec};
use crate::vocab::Vocab;

/// The most triggers one spec may hold.
pub const MAX_TRIGGERS: usize = 16;
/// The most bytes a `begin` or `end` text may hold.
pub const MAX_MARKER_BYTES: usize = 256;
/// The most ids a `begin` or `end` given as ids may hold.
pub const MAX_MARKER_IDS: usize = 64;

/// The name the grammar of a trigger with an `end` gets, when it has none, so that the grammar
/// that appends the end can refer to it.
const BODY: &str = "lazy_grammar_body";

/// `{"kind": "lazy_grammar", "triggers": [{"begin": "<tool_call>", "grammar": {"json_schema":
/// {"type": "object"}}, "end": "</tool_call>"}]}`: free text until a trigger's `begin` appears in
/// the output, then the text after it constrained to the trigger's `grammar` until the grammar
/// is complete (its `end`, if given, included), then free text again (vLLM's and xgrammar's
/// structural tags; llama.cpp's lazy grammars).
///
/// - `triggers`: 1 to 16, each `{"begin", "grammar", "end"}`:
///   - `begin`: a text (1 to 256 bytes), found in the output's text whatever tokens spell it
///     (split over several, or inside one: the rest of that token's text is the grammar's
///     first input), a special token's text being its name (`<tool_call>`); or ids (1 to 64),
///     found as that sequence of ids. The begin itself is not the grammar's input;
///   - `grammar`: the forms of the `grammar` kind (`json_schema`, `regex`, `lark` or
///     `llguidance`), with its limits;
///   - `end` (optional): a text or ids the grammar must end with, as if appended to it (a text
///     that is the name of a special token, Qwen's `</tool_call>`, also as that token).
///
/// While no grammar is active the row is left as it is; while one is, its mask is llguidance's
/// for the text after `begin`. The grammar is complete when llguidance can take nothing more
/// (a grammar that could go on only allows EOS besides its continuations). Where two triggers
/// complete at the same token, the first listed wins. Reads the output from `prompt_len` on and
/// needs the engine's tokenizer.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LazyGrammarSpec {
    pub triggers: Vec<LazyTrigger>,
}

/// One trigger of a [`LazyGrammarSpec`]: its `begin`, its `grammar`, and its optional `end`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LazyTrigger {
    pub begin: TextOrIds,
    pub grammar: GrammarSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<TextOrIds>,
}

fn check_marker(field: &str, marker: &TextOrIds) -> Result<()> {
    match marker {
        TextOrIds::Text(text) if text.is_empty() || text.len() > MAX_MARKER_BYTES => {
            Err(Error::spec(
                field,
                format!("must be 1 to {MAX_MARKER_BYTES} bytes, got {}", text.len()),
            ))
        }
        TextOrIds::Ids(ids) if ids.is_empty() || ids.len() > MAX_MARKER_IDS => Err(Error::spec(
            field,
            format!("must hold 1 to {MAX_MARKER_IDS} ids, got {}", ids.len()),
        )),
        _ => Ok(()),
    }
}

impl LazyTrigger {
    /// The grammar the matcher runs: the trigger's, followed by its `end` when it has one.
    fn composed(&self, env: &Vocab, field: &str) -> Result<TopLevelGrammar> {
        let mut top = self.grammar.grammar(field)?;
        let Some(end) = &self.end else {
            return Ok(top);
        };
        let Some(first) = top.grammars.first_mut() else {
            return Err(Error::spec(field, "holds no grammar"));
        };
        let name = first.name.get_or_insert_with(|| BODY.to_string()).clone();
        let end = match end {
            TextOrIds::Text(text) => {
                let literal = serde_json::to_string(text).expect("a string");
                match env.special_token_named(text)? {
                    Some(id) => format!("({literal} | <[{id}]>)"),
                    None => literal,
                }
            }
            TextOrIds::Ids(ids) => ids
                .iter()
                .map(|id| format!("<[{id}]>"))
                .collect::<Vec<_>>()
                .join(" "),
        };
        // Unnamed: llguidance names its grammars by their form, and the body may be a Lark one.
        let start = GrammarWithLexer {
            name: None,
            ..GrammarWithLexer::from_lark(format!("start: @{name} {end}"))
        };
        top.grammars.insert(0, start);
        Ok(top)
    }
}

impl KindSpec for LazyGrammarSpec {
    fn needs_prompt_len(&self) -> bool {
        true
    }

    fn check(&self) -> Result<()> {
        if self.triggers.is_empty() {
            return Err(Error::spec(
                "triggers",
                "must hold 1 to 16 triggers, got none",
            ));
        }
        if self.triggers.len() > MAX_TRIGGERS {
            return Err(Error::TooLarge {
                field: "triggers".into(),
                len: self.triggers.len(),
                limit: MAX_TRIGGERS,
            });
        }
        for (i, trigger) in self.triggers.iter().enumerate() {
            check_marker(&format!("triggers[{i}].begin"), &trigger.begin)?;
            if let Some(end) = &trigger.end {
                check_marker(&format!("triggers[{i}].end"), end)?;
            }
            trigger
                .grammar
                .check()
                .map_err(|e| e.in_spec(&format!("triggers[{i}].grammar")))?;
        }
        Ok(())
    }

    fn realize(
        &self,
        context: &EngineContext,
        prompt_len: usize,
    ) -> Result<Box<dyn LogitsProcessor>> {
        self.check()?;
        let env = context.vocab.as_ref().ok_or_else(|| {
            Error::spec(
                "triggers",
                "a lazy grammar needs the engine's tokenizer (its token texts and grammars); give \
                 it to the engine's context (in Python Batch(vocab_size, \
                 context=EngineContext(tokenizer)))",
            )
        })?;
        check_vocab(env, context)?;
        let mut fresh = Vec::with_capacity(self.triggers.len());
        for (i, trigger) in self.triggers.iter().enumerate() {
            for (name, marker) in [
                ("begin", Some(&trigger.begin)),
                ("end", trigger.end.as_ref()),
            ] {
                if let Some(TextOrIds::Ids(ids)) = marker {
                    let field = format!("triggers[{i}].{name}");
                    context.check_ids(&field, ids.iter().copied())?;
                    if let Some(&id) = ids.iter().find(|&&id| id as usize >= env.vocab_size()) {
                        return Err(Error::TokenOutOfVocab {
                            field,
                            token_id: id.into(),
                            vocab_size: env.vocab_size(),
                        });
                    }
                }
            }
            let at = format!("triggers[{i}].grammar");
            let field = trigger.grammar.field().map_err(|e| e.in_spec(&at))?;
            // Without an end, the matcher is the `grammar` kind's, from the same cache entry.
            let key = match &trigger.end {
                None => serde_json::to_string(&trigger.grammar),
                Some(_) => serde_json::to_string(&(&trigger.grammar, &trigger.end))
                    .map(|key| format!("lazy_grammar {key}")),
            }
            .expect("specs are plain data");
            let compiled = env
                .compiled(field, &key, || trigger.composed(env, field))
                .map_err(|e| e.in_spec(&at))?;
            fresh.push(compiled);
        }
        let watch = Watch::new(&self.triggers)?;
        Ok(Box::new(LazyGrammar::new(
            env.clone(),
            Arc::new(watch),
            fresh,
            prompt_len,
        )))
    }

    fn validate(&self, context: &EngineContext) -> Option<Result<()>> {
        if context.vocab.is_some() {
            return None;
        }
        // No tokenizer here (a frontend): the grammars are compiled without one.
        Some(self.check().and_then(|()| {
            self.triggers
                .iter()
                .enumerate()
                .try_for_each(|(i, trigger)| {
                    trigger
                        .grammar
                        .validate(context)
                        .unwrap_or(Ok(()))
                        .map_err(|e| e.in_spec(&format!("triggers[{i}].grammar")))
                })
        }))
    }
}

/// What finds the triggers: an automaton over the `begin` texts (a byte-level Aho-Corasick
/// NFA, advanced by each token's text) and the `begin` id sequences.
struct Watch {
    nfa: Option<NFA>,
    // The trigger of each of the NFA's patterns.
    text_trigger: Vec<usize>,
    id_triggers: Vec<(usize, Vec<u32>)>,
}

impl Watch {
    fn new(triggers: &[LazyTrigger]) -> Result<Self> {
        let mut texts = vec![];
        let mut text_trigger = vec![];
        let mut id_triggers = vec![];
        for (i, trigger) in triggers.iter().enumerate() {
            match &trigger.begin {
                TextOrIds::Text(text) => {
                    texts.push(text.as_bytes());
                    text_trigger.push(i);
                }
                TextOrIds::Ids(ids) => id_triggers.push((i, ids.clone())),
            }
        }
        let nfa = if texts.is_empty() {
            None
        } else {
            Some(
                NFA::builder()
                    .match_kind(MatchKind::Standard)
                    .build(texts)
                    .map_err(|e| Error::spec("triggers", e.to_string()))?,
            )
        };
        Ok(Self {
            nfa,
            text_trigger,
            id_triggers,
        })
    }

    fn start(&self) -> StateID {
        self.nfa.as_ref().map_or(StateID::ZERO, |nfa| {
            nfa.start_state(Anchored::No)
                .expect("an unanchored search starts")
        })
    }
}

/// Where a watch stands: the automaton's state after the text since `since` (the position the
/// watch began at: the prompt's end, or the token after a completed grammar).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Watching {
    state: StateID,
    since: usize,
}

/// Why an active grammar stopped: at position `at` of the ids, the token there (`None`: the
/// mask could not be computed).
#[derive(Debug, Clone, PartialEq)]
struct Failure {
    at: usize,
    token: Option<u32>,
    reason: String,
}

/// A grammar that a trigger started.
struct Active {
    trigger: usize,
    // The position of the first id after the trigger's last token.
    start: usize,
    // The ids read up to `start`, to tell a rollback that stays inside the grammar.
    at_start: Cursor,
    // How many of `fed` spell the text after the trigger inside the trigger's last token.
    lead: usize,
    // The tokens the matcher accepted: `lead` of them, then the ids from `start` on.
    fed: Vec<u32>,
    matcher: Matcher,
    failure: Option<Failure>,
}

/// An [`Active`] without its matcher, as it stood before a plan.
struct ActiveState {
    trigger: usize,
    start: usize,
    at_start: Cursor,
    lead: usize,
    fed: Vec<u32>,
    failure: Option<Failure>,
}

enum Mode {
    Watching(Watching),
    // Boxed: a matcher is large, a watch small.
    Active(Box<Active>),
}

enum SavedMode {
    Watching(Watching),
    Active(ActiveState),
}

/// The state before the last plan, for `undo`: the cursor, the mode (an active grammar without
/// its matcher), and the grammar the plan left, if it is the one to go back to.
struct Saved {
    cursor: Cursor,
    mode: SavedMode,
    parked: Option<Box<Active>>,
}

/// `lazy_grammar`: see [`LazyGrammarSpec`]. Watching, a step costs the new tokens' text through
/// the triggers' automaton and a comparison per id trigger, and the row is left alone; active,
/// it costs what a `grammar` step costs (llguidance's mask, computed in
/// [`LogitsProcessor::finish`], rows in parallel). The state is a function of the ids: ids that
/// do not extend those read roll the grammar back when they differ only inside it, and are
/// rescanned from `prompt_len` otherwise. A token the active grammar does not allow leaves only
/// EOS from then on, and [`LogitsProcessor::failure`] says why, as the `grammar` kind does.
pub struct LazyGrammar {
    env: Vocab,
    watch: Arc<Watch>,
    // Each trigger's matcher as compiled, before any token.
    fresh: Vec<Arc<Matcher>>,
    prompt_len: usize,
    cursor: Cursor,
    mode: Mode,
    mask: Option<MaskId>,
    saved: Option<Saved>,
}

impl std::fmt::Debug for LazyGrammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut f = f.debug_struct("LazyGrammar");
        match &self.mode {
            Mode::Watching(w) => f.field("watching_since", &w.since),
            Mode::Active(a) => f
                .field("trigger", &a.trigger)
                .field("start", &a.start)
                .field("failure", &a.failure),
        };
        f.finish_non_exhaustive()
    }
}

impl Active {
    /// The matcher in the state of `fed[..keep]` (which it accepted before): rolled back when it
    /// can be, else replayed from the compiled grammar.
    fn rewind_to(&mut self, keep: usize, fresh: &Matcher) {
        let drop = self.fed.len() - keep;
        self.fed.truncate(keep);
        if drop == 0 && !self.matcher.is_error() {
            return;
        }
        if self.matcher.is_error() || self.matcher.rollback(drop).is_err() {
            self.matcher = fresh.deep_clone();
            // These tokens were accepted from this state before: they are again.
            let _ = self.matcher.consume_tokens(&self.fed);
        }
    }

    fn state(&self) -> ActiveState {
        ActiveState {
            trigger: self.trigger,
            start: self.start,
            at_start: self.at_start,
            lead: self.lead,
            fed: self.fed.clone(),
            failure: self.failure.clone(),
        }
    }

    fn is_complete(&self) -> bool {
        self.failure.is_none() && self.matcher.is_stopped() && !self.matcher.is_error()
    }

    /// Feeds `tokens` (from position `at`, or the lead when `at` is `None`), stopping at the
    /// first rejected one (a failure) or when the grammar is complete; returns how many it
    /// took.
    fn feed(&mut self, tokens: &[u32], at: Option<usize>, vocab: usize) -> usize {
        for (i, &token) in tokens.iter().enumerate() {
            if self.failure.is_some() || self.is_complete() {
                return i;
            }
            let position = at.map_or(self.start.saturating_sub(1), |at| at + i);
            let reason = if token as usize >= vocab {
                Some(format!(
                    "token {position} (id {token}) is not a token of the tokenizer ({vocab} \
                     tokens)"
                ))
            } else {
                match self.matcher.try_consume_tokens(&[token]) {
                    Ok(1) => {
                        self.fed.push(token);
                        None
                    }
                    Ok(_) => Some(match at {
                        Some(_) => format!(
                            "token {position} (id {token}) is not allowed by trigger {}'s \
                             grammar",
                            self.trigger
                        ),
                        None => format!(
                            "the text after trigger {}'s begin in token {position} is not \
                             allowed by its grammar",
                            self.trigger
                        ),
                    }),
                    Err(e) => Some(e.to_string()),
                }
            };
            if let Some(reason) = reason {
                self.failure = Some(Failure {
                    at: position,
                    token: Some(token),
                    reason,
                });
                return i;
            }
        }
        tokens.len()
    }
}

impl LazyGrammar {
    fn new(env: Vocab, watch: Arc<Watch>, fresh: Vec<Arc<Matcher>>, prompt_len: usize) -> Self {
        let mode = Mode::Watching(Watching {
            state: watch.start(),
            since: prompt_len,
        });
        Self {
            env,
            watch,
            fresh,
            prompt_len,
            cursor: Cursor::default(),
            mode,
            mask: None,
            saved: None,
        }
    }

    fn watching_from(&self, since: usize) -> Mode {
        Mode::Watching(Watching {
            state: self.watch.start(),
            since,
        })
    }

    /// The trigger the token at `pos` completes, and where in its text the grammar's input
    /// begins; the automaton advanced by its text until then.
    fn watch_token(
        &self,
        watching: &mut Watching,
        ids: &dyn TokenHistory,
        pos: usize,
    ) -> Result<Option<(usize, usize)>> {
        let text = self.env.token_text(ids.token_at(pos))?;
        let mut hit: Option<(usize, usize)> = None;
        if let Some(nfa) = &self.watch.nfa {
            for (i, &byte) in text.iter().enumerate() {
                watching.state = nfa.next_state(Anchored::No, watching.state, byte);
                if nfa.is_match(watching.state) {
                    let trigger = (0..nfa.match_len(watching.state))
                        .map(|k| {
                            self.watch.text_trigger[nfa.match_pattern(watching.state, k).as_usize()]
                        })
                        .min()
                        .expect("a match has a pattern");
                    hit = Some((trigger, i + 1));
                    break;
                }
            }
        }
        for (trigger, seq) in &self.watch.id_triggers {
            if hit.is_some_and(|(t, _)| t < *trigger) {
                break;
            }
            let ends_here = pos + 1 >= watching.since + seq.len()
                && seq
                    .iter()
                    .enumerate()
                    .all(|(k, &id)| ids.token_at(pos + 1 - seq.len() + k) == id);
            if ends_here {
                hit = Some((*trigger, text.len()));
                break;
            }
        }
        Ok(hit)
    }

    /// Reads the ids from `from` on, starting grammars at triggers and leaving them when they
    /// complete. A grammar left that the saved state names is kept in `parked`.
    fn advance(
        &mut self,
        ids: &dyn TokenHistory,
        from: usize,
        parked: &mut Option<Box<Active>>,
        wanted: Option<(usize, usize)>,
    ) -> Result<()> {
        let count = ids.token_count();
        let vocab = self.env.vocab_size();
        let mut pos = from;
        while pos < count {
            match &mut self.mode {
                Mode::Watching(watching) => {
                    let mut w = *watching;
                    let hit = self.watch_token(&mut w, ids, pos)?;
                    pos += 1;
                    let Some((trigger, offset)) = hit else {
                        self.mode = Mode::Watching(w);
                        continue;
                    };
                    let text = self.env.token_text(ids.token_at(pos - 1))?;
                    let lead_tokens = self.env.tokenize_bytes(&text[offset..])?;
                    let mut at_start = Cursor::default();
                    at_start.read_all(&Prefix(ids, pos));
                    let mut active = Active {
                        trigger,
                        start: pos,
                        at_start,
                        lead: 0,
                        fed: vec![],
                        matcher: self.fresh[trigger].deep_clone(),
                        failure: None,
                    };
                    active.lead = active.feed(&lead_tokens, None, vocab);
                    if let Some(failure) = &mut active.failure {
                        // The trigger's token is at fault, and stands while the ids hold it.
                        failure.token = Some(ids.token_at(pos - 1));
                    }
                    self.mode = Mode::Active(Box::new(active));
                }
                Mode::Active(active) => {
                    if active.failure.is_none() && !active.is_complete() {
                        let new: Vec<u32> = (pos..count).map(|i| ids.token_at(i)).collect();
                        pos += active.feed(&new, Some(pos), vocab);
                    }
                    if active.failure.is_some() {
                        // The grammar stays failed; nothing after its failure is read.
                        break;
                    }
                    if active.is_complete() {
                        let done = {
                            let next = self.watching_from(pos);
                            std::mem::replace(&mut self.mode, next)
                        };
                        if let Mode::Active(done) = done {
                            if wanted == Some((done.trigger, done.start)) {
                                *parked = Some(done);
                            }
                        }
                    }
                }
            }
        }
        // A grammar complete in the trigger's own token (its lead) returns to free text.
        if let Mode::Active(active) = &self.mode {
            if active.is_complete() {
                let done = {
                    let next = self.watching_from(count);
                    std::mem::replace(&mut self.mode, next)
                };
                if let Mode::Active(done) = done {
                    if wanted == Some((done.trigger, done.start)) {
                        *parked = Some(done);
                    }
                }
            }
        }
        Ok(())
    }

    /// When `ids` differ from those read only inside the active grammar, rolls it back to the
    /// ids they share and returns the position to read on from.
    fn rewind_inside(&mut self, ids: &dyn TokenHistory) -> Option<usize> {
        let Mode::Active(active) = &mut self.mode else {
            return None;
        };
        if !active.at_start.extended_by(ids) {
            return None;
        }
        let count = ids.token_count();
        let segment = active.fed.len() - active.lead;
        let shared = (0..segment.min(count - active.start))
            .take_while(|&i| ids.token_at(active.start + i) == active.fed[active.lead + i])
            .count();
        if let Some(failure) = &active.failure {
            let stands = shared == segment
                && failure
                    .token
                    .is_none_or(|token| count > failure.at && ids.token_at(failure.at) == token);
            if stands {
                return Some(count);
            }
            active.failure = None;
        }
        let keep = active.lead + shared;
        active.rewind_to(keep, &self.fresh[active.trigger]);
        Some(active.start + shared)
    }
}

/// The first `len` ids of a history.
struct Prefix<'a>(&'a dyn TokenHistory, usize);

impl TokenHistory for Prefix<'_> {
    fn token_count(&self) -> usize {
        self.1
    }

    fn token_at(&self, index: usize) -> u32 {
        self.0.token_at(index)
    }
}

impl LogitsProcessor for LazyGrammar {
    fn plan(&mut self, ids: &dyn TokenHistory, plan: &mut RowPlan) -> Result<()> {
        let saved_mode = match &self.mode {
            Mode::Watching(w) => SavedMode::Watching(*w),
            Mode::Active(a) => SavedMode::Active(a.state()),
        };
        let wanted = match &saved_mode {
            SavedMode::Active(a) => Some((a.trigger, a.start)),
            SavedMode::Watching(_) => None,
        };
        let saved_cursor = self.cursor;
        let mut parked = None;
        let from = if self.cursor.extended_by(ids) {
            self.cursor.seen().max(self.prompt_len)
        } else if let Some(from) = self.rewind_inside(ids) {
            from
        } else {
            let old = {
                let next = self.watching_from(self.prompt_len);
                std::mem::replace(&mut self.mode, next)
            };
            if let Mode::Active(old) = old {
                parked = Some(old);
            }
            self.prompt_len
        };
        let advanced = self.advance(ids, from, &mut parked, wanted);
        self.cursor.read_all(ids);
        self.saved = Some(Saved {
            cursor: saved_cursor,
            mode: saved_mode,
            parked,
        });
        if let Err(e) = advanced {
            self.undo();
            return Err(e);
        }
        self.mask = match self.mode {
            Mode::Active(_) => Some(plan.reserve_mask(self.env.vocab_size().div_ceil(32), false)),
            Mode::Watching(_) => None,
        };
        Ok(())
    }

    fn finishes(&self) -> bool {
        true
    }

    fn finish(&mut self, plan: &mut RowPlan) {
        let Some(id) = self.mask.take() else {
            return;
        };
        let Mode::Active(active) = &mut self.mode else {
            return;
        };
        if active.failure.is_none() {
            match active.matcher.compute_mask() {
                Ok(mask) => {
                    let words = plan.mask_words_mut(id);
                    let n = words.len().min(mask.as_slice().len());
                    words[..n].copy_from_slice(&mask.as_slice()[..n]);
                    return;
                }
                Err(e) => {
                    active.failure = Some(Failure {
                        at: active.start + active.fed.len() - active.lead,
                        token: None,
                        reason: format!("trigger {}'s grammar's mask failed: {e}", active.trigger),
                    })
                }
            }
        }
        // Built: the grammars were compiled in it.
        let eos = self.env.eos_words().unwrap_or_default();
        let words = plan.mask_words_mut(id);
        let n = words.len().min(eos.len());
        words[..n].copy_from_slice(&eos[..n]);
    }

    fn undo(&mut self) {
        let Some(saved) = self.saved.take() else {
            return;
        };
        self.cursor = saved.cursor;
        self.mask = None;
        let state = match saved.mode {
            SavedMode::Watching(w) => {
                self.mode = Mode::Watching(w);
                return;
            }
            SavedMode::Active(state) => state,
        };
        let current = {
            let next = self.watching_from(self.prompt_len);
            std::mem::replace(&mut self.mode, next)
        };
        let fresh = &self.fresh[state.trigger];
        let mut active = match current {
            Mode::Active(a) if a.trigger == state.trigger && a.start == state.start => a,
            _ => saved.parked.unwrap_or_else(|| {
                Box::new(Active {
                    trigger: state.trigger,
                    start: state.start,
                    at_start: state.at_start,
                    lead: 0,
                    fed: vec![],
                    matcher: fresh.deep_clone(),
                    failure: None,
                })
            }),
        };
        let shared = active
            .fed
            .iter()
            .zip(&state.fed)
            .take_while(|(a, b)| a == b)
            .count();
        active.rewind_to(shared, fresh);
        if state.fed.len() > shared {
            // Tokens the undone step rolled back: consumed again.
            let _ = active.matcher.consume_tokens(&state.fed[shared..]);
        }
        active.fed = state.fed;
        active.lead = state.lead;
        active.at_start = state.at_start;
        active.failure = state.failure;
        self.mode = Mode::Active(active);
    }

    fn failure(&self) -> Option<String> {
        match &self.mode {
            Mode::Active(active) => active.failure.as_ref().map(|f| f.reason.clone()),
            Mode::Watching(_) => None,
        }
    }

    fn reset(&mut self) {
        self.mode = self.watching_from(self.prompt_len);
        self.cursor = Cursor::default();
        self.mask = None;
        self.saved = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocab::byte_level_vocab;
    use serde_json::json;

    // Ids 0..256 are the bytes; then these pieces.
    const PIECES: [&str; 7] = [
        "<tool_call>",
        "</tool_call>",
        "Sure<to",
        "ol_call>{\"",
        "<tool",
        "_call>",
        "<tool_call>x",
    ];
    const CALL: u32 = 256;

    fn env() -> &'static Vocab {
        static ENV: std::sync::OnceLock<Vocab> = std::sync::OnceLock::new();
        ENV.get_or_init(|| byte_level_vocab(&PIECES))
    }

    fn context() -> EngineContext {
        EngineContext {
            vocab: Some(env().clone()),
            ..Default::default()
        }
    }

    fn realize(mut spec: serde_json::Value) -> Box<dyn LogitsProcessor> {
        spec.as_object_mut().unwrap().remove("kind");
        let spec: LazyGrammarSpec = serde_json::from_value(spec).unwrap();
        spec.realize(&context(), 0).unwrap()
    }

    fn bytes(text: &str) -> Vec<u32> {
        text.bytes().map(u32::from).collect()
    }

    /// The allowed tokens after `ids` (`None`: the row untouched).
    fn allowed(p: &mut dyn LogitsProcessor, ids: &[u32]) -> Option<Vec<u32>> {
        let mut plan = RowPlan::new();
        p.plan(&ids.to_vec(), &mut plan).unwrap();
        p.finish(&mut plan);
        let vocab = env().vocab_size();
        let mut row = vec![0.0f32; vocab];
        plan.apply(&mut row).unwrap();
        let allowed: Vec<u32> = (0..vocab as u32)
            .filter(|&t| row[t as usize] == 0.0)
            .collect();
        (allowed.len() < vocab).then_some(allowed)
    }

    fn tool_call() -> serde_json::Value {
        json!({"kind": "lazy_grammar", "triggers": [
            {"begin": "<tool_call>", "grammar": {"regex": "\\{\"[a-z]+\"\\}"}, "end": "</tool_call>"}]})
    }

    #[test]
    fn free_until_the_trigger_then_the_grammar_then_free_again() {
        let mut p = realize(tool_call());
        let mut ids = bytes("Hi <tool");
        assert_eq!(allowed(p.as_mut(), &ids), None);
        ids.extend(bytes("_call>"));
        assert_eq!(allowed(p.as_mut(), &ids), Some(vec![u32::from(b'{')]));
        ids.extend(bytes("{\"ab\"}"));
        // The end, forced: llguidance allows its canonical tokens (here its bytes).
        assert_eq!(allowed(p.as_mut(), &ids), Some(vec![u32::from(b'<')]));
        ids.extend(bytes("</tool_call"));
        assert_eq!(allowed(p.as_mut(), &ids), Some(vec![u32::from(b'>')]));
        ids.extend(bytes(">"));
        assert_eq!(allowed(p.as_mut(), &ids), None);
        // A second call.
        ids.push(CALL);
        assert_eq!(allowed(p.as_mut(), &ids), Some(vec![u32::from(b'{')]));
    }

    #[test]
    fn the_text_after_the_trigger_inside_a_token_is_the_grammar_s_first_input() {
        let mut p = realize(tool_call());
        // "Sure<to" + "ol_call>{\"": the trigger split over two tokens, the second going on.
        let ids = vec![258, 259];
        let allowed = allowed(p.as_mut(), &ids).unwrap();
        assert!(allowed.contains(&u32::from(b'a')) && !allowed.contains(&u32::from(b'{')));
    }

    #[test]
    fn id_triggers_and_the_first_listed_wins() {
        let spec = json!({"kind": "lazy_grammar", "triggers": [
            {"begin": [CALL], "grammar": {"regex": "x"}},
            {"begin": "<tool_call>", "grammar": {"regex": "y"}}]});
        let mut p = realize(spec);
        assert_eq!(allowed(p.as_mut(), &[CALL]), Some(vec![u32::from(b'x')]));
        let mut p = realize(json!({"kind": "lazy_grammar", "triggers": [
            {"begin": "<tool_call>", "grammar": {"regex": "y"}},
            {"begin": [CALL], "grammar": {"regex": "x"}}]}));
        assert_eq!(allowed(p.as_mut(), &[CALL]), Some(vec![u32::from(b'y')]));
        // Complete after one byte: free again.
        assert_eq!(allowed(p.as_mut(), &[CALL, u32::from(b'y')]), None);
    }

    #[test]
    fn a_rejected_token_leaves_only_eos_and_a_rollback_clears_it() {
        let mut p = realize(tool_call());
        let mut ids = vec![CALL, u32::from(b'x')];
        let eos = env().eos_token_ids().unwrap().to_vec();
        assert_eq!(allowed(p.as_mut(), &ids), Some(eos));
        assert!(
            p.failure().unwrap().contains("not allowed"),
            "{:?}",
            p.failure()
        );
        ids.pop();
        assert_eq!(allowed(p.as_mut(), &ids), Some(vec![u32::from(b'{')]));
        assert_eq!(p.failure(), None);
        // The text after the begin in the trigger's own token, rejected: the same, blamed on it.
        let eos = env().eos_token_ids().unwrap().to_vec();
        let ids = vec![u32::from(b'a'), 262];
        assert_eq!(allowed(p.as_mut(), &ids), Some(eos.clone()));
        assert!(
            p.failure()
                .unwrap()
                .contains("after trigger 0's begin in token 1"),
            "{:?}",
            p.failure()
        );
        assert_eq!(allowed(p.as_mut(), &[u32::from(b'a'), 262, 1]), Some(eos));
        assert_eq!(allowed(p.as_mut(), &[u32::from(b'a')]), None);
        assert_eq!(p.failure(), None);
    }

    #[test]
    fn undo_and_rescans_plan_as_a_fresh_processor() {
        let history = {
            let mut ids = bytes("a<tool_call>{\"b\"}</tool_call>c");
            ids.extend([CALL, u32::from(b'{')]);
            ids
        };
        let mut p = realize(tool_call());
        for n in 0..=history.len() {
            // Plan one further, undo, then this prefix; or jump back and forth.
            if n < history.len() {
                let mut plan = RowPlan::new();
                p.plan(&history[..n + 1].to_vec(), &mut plan).unwrap();
                p.undo();
            }
            let mut fresh = realize(tool_call());
            assert_eq!(
                allowed(p.as_mut(), &history[..n]),
                allowed(fresh.as_mut(), &history[..n]),
                "after {n} ids"
            );
        }
        for n in (0..history.len()).rev().step_by(3) {
            let mut fresh = realize(tool_call());
            assert_eq!(
                allowed(p.as_mut(), &history[..n]),
                allowed(fresh.as_mut(), &history[..n]),
                "back at {n} ids"
            );
        }
    }

    #[test]
    fn every_grammar_form_takes_an_end() {
        let forms = [
            json!({"lark": "start: \"a\"+"}),
            json!({"llguidance": {"grammars": [{"lark_grammar": "start: \"a\"+"}]}}),
            json!({"llguidance": {"grammars": [{"name": "mine", "lark_grammar": "start: \"a\"+"}]}}),
            json!({"regex": "a+"}),
            json!({"json_schema": {"type": "string", "enum": ["a"]}}),
        ];
        for grammar in forms {
            let mut p = realize(json!({"kind": "lazy_grammar", "triggers": [
                {"begin": [CALL], "grammar": grammar, "end": [u32::from(b'!')]}]}));
            let first = allowed(p.as_mut(), &[CALL]).unwrap();
            let a = if grammar.get("json_schema").is_some() {
                b'"'
            } else {
                b'a'
            };
            assert_eq!(first, vec![u32::from(a)], "{grammar}");
            let body: &[u8] = if a == b'"' { b"\"a\"" } else { b"a" };
            let mut ids = vec![CALL];
            ids.extend(body.iter().map(|&b| u32::from(b)));
            let next = allowed(p.as_mut(), &ids).unwrap();
            assert!(next.contains(&u32::from(b'!')), "{grammar}: {next:?}");
            ids.push(u32::from(b'!'));
            assert_eq!(allowed(p.as_mut(), &ids), None, "{grammar}");
        }
    }

    #[test]
    fn bad_specs_are_typed_errors_naming_the_field() {
        let refused = |spec: serde_json::Value, field: &str| {
            let spec: LazyGrammarSpec = serde_json::from_value(spec).unwrap();
            let error = spec.realize(&context(), 0).unwrap_err().to_string();
            assert!(error.contains(field), "{error}");
        };
        refused(json!({"triggers": []}), "triggers");
        let many: Vec<_> = (0..17)
            .map(|_| json!({"begin": "a", "grammar": {"regex": "a"}}))
            .collect();
        refused(json!({ "triggers": many }), "triggers");
        refused(
            json!({"triggers": [{"begin": "", "grammar": {"regex": "a"}}]}),
            "triggers[0].begin",
        );
        refused(
            json!({"triggers": [{"begin": "a".repeat(257), "grammar": {"regex": "a"}}]}),
            "triggers[0].begin",
        );
        refused(
            json!({"triggers": [{"begin": "a", "grammar": {"regex": "a{100000}"}}]}),
            "triggers[0].grammar.regex",
        );
        refused(
            json!({"triggers": [{"begin": "a", "grammar": {"lark": "start: nope"}}]}),
            "triggers[0].grammar",
        );
        refused(
            json!({"triggers": [{"begin": [1_000_000], "grammar": {"regex": "a"}}]}),
            "triggers[0].begin",
        );
        assert!(serde_json::from_value::<LazyGrammarSpec>(
            json!({"triggers": [{"begin": "a", "grammar": {"regex": "a"}, "extra": 1}]})
        )
        .is_err());
        let spec: LazyGrammarSpec =
            serde_json::from_value(json!({"triggers": tool_call()["triggers"]})).unwrap();
        let error = spec
            .realize(&EngineContext::default(), 0)
            .unwrap_err()
            .to_string();
        assert!(error.contains("tokenizer"), "{error}");
    }

    proptest::proptest! {
        /// Grown, rewound, replaced and undone histories over pieces that spell triggers, grammar
        /// text and free text: every plan equals a fresh processor's on the same ids.
        #[test]
        fn any_history_plans_as_a_fresh_processor(
            steps in proptest::collection::vec((0usize..4, proptest::collection::vec(0usize..13, 1..4)), 1..24),
        ) {
            // Triggers, grammar text, end text and free text, as pieces and bytes.
            let alphabet: [u32; 13] = [CALL, 258, 259, 260, 261, 257, 262, u32::from(b'{'),
                u32::from(b'"'), u32::from(b'a'), u32::from(b'}'), u32::from(b'<'), u32::from(b'x')];
            let spec = json!({"kind": "lazy_grammar", "triggers": [
                {"begin": "<tool_call>", "grammar": {"regex": "\\{\"[a-z]+\"\\}"}, "end": "</tool_call>"},
                {"begin": [u32::from(b'x'), u32::from(b'x')], "grammar": {"regex": "a+"}}]});
            let mut p = realize(spec.clone());
            let mut ids: Vec<u32> = vec![];
            for (action, pieces) in steps {
                let pieces: Vec<u32> = pieces.iter().map(|&i| alphabet[i]).collect();
                match action {
                    0 | 1 => ids.extend(&pieces),
                    2 => {
                        let keep = ids.len().saturating_sub(pieces.len());
                        ids.truncate(keep);
                    }
                    _ => {
                        let mut further = ids.clone();
                        further.extend(&pieces);
                        let mut plan = RowPlan::new();
                        p.plan(&further, &mut plan).unwrap();
                        p.undo();
                    }
                }
                let mut fresh = realize(spec.clone());
                proptest::prop_assert_eq!(
                    allowed(p.as_mut(), &ids),
                    allowed(fresh.as_mut(), &ids),
                    "ids {:?}", ids
                );
                proptest::prop_assert_eq!(p.failure(), fresh.failure());
            }
        }
    }
}
