use std::collections::HashMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::history::TokenHistory;
use crate::plan::{Edit, RowPlan};
use crate::processors::cursor::Cursor;
use crate::processors::repetition_penalty::vocab_limit;
use crate::processors::{LogitsProcessor, MAX_BIAS};
use crate::spec::{check_texts, EngineContext, KindSpec, MAX_TOKEN_IDS};

/// `{"kind": "dry", "multiplier": 0.8, "base": 1.75, "allowed_length": 2, "penalty_last_n": 64,
/// "sequence_breaker_ids": [[198], [25]]}`: "Don't Repeat Yourself" (p-e-w's, as llama.cpp's
/// `llama_sampler_init_dry` implements it).
///
/// - `multiplier` (finite; 0 turns it off), `base` (finite, default 1.75; below 1 turns it off),
///   `allowed_length` (int >= 0, default 2), `penalty_last_n` (default 64, llama.cpp's; -1 the
///   whole history, 0 off);
/// - `sequence_breakers`: texts, at most 40 bytes each (llama.cpp truncates a longer one; here
///   it is refused). Each is resolved through the engine's tokenizer as llama.cpp does: every
///   token whose text contains it is a one-token breaker, and a token whose text ends with its
///   beginning is a head followed by the tokens of the rest (at most 20). When neither this
///   nor `sequence_breaker_ids` is given, llama.cpp's defaults `["\n", ":", "\"", "*"]` apply.
///   Text needs the engine's tokenizer: without one the spec is refused, naming this field
///   (give `sequence_breaker_ids`, `[]` for none);
/// - `sequence_breaker_ids`: id sequences, besides any texts. A breaker's first id is its head;
///   the repetition the step looks at may not reach back past the most recent head whose whole
///   sequence follows it, and a single-id breaker is never penalized.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DrySpec {
    pub multiplier: f64,
    #[serde(default = "default_base")]
    pub base: f64,
    #[serde(default = "default_allowed_length")]
    pub allowed_length: u32,
    #[serde(default = "default_last_n")]
    #[schemars(range(min = -1))]
    pub penalty_last_n: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequence_breaker_ids: Option<Vec<Vec<u32>>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequence_breakers: Option<Vec<String>>,
}

/// llama.cpp's default breakers.
pub const DEFAULT_SEQUENCE_BREAKERS: [&str; 4] = ["\n", ":", "\"", "*"];
/// llama.cpp's limits on a text breaker: its bytes, and the tokens of its tail.
const MAX_BREAKER_BYTES: usize = 40;
#[cfg(feature = "tokenizers")]
const MAX_BREAKER_TAIL: usize = 20;
const MAX_BREAKERS: usize = 64;
/// The most new ids a step pushes one by one; more are read by a rescan.
const MAX_PUSHES: usize = 16;

fn default_base() -> f64 {
    1.75
}

fn default_allowed_length() -> u32 {
    2
}

fn default_last_n() -> i64 {
    64
}

impl DrySpec {
    /// The texts to resolve: those given, or llama.cpp's defaults when no breaker is given.
    fn texts(&self) -> Result<Vec<&str>> {
        let texts: Vec<&str> = match (&self.sequence_breakers, &self.sequence_breaker_ids) {
            (Some(texts), _) => texts.iter().map(String::as_str).collect(),
            (None, None) => DEFAULT_SEQUENCE_BREAKERS.to_vec(),
            (None, Some(_)) => vec![],
        };
        check_texts(
            "sequence_breakers",
            texts.iter().copied(),
            MAX_BREAKERS,
            MAX_BREAKER_BYTES,
        )?;
        Ok(texts)
    }

    /// Every breaker as ids: those given, then each text's through the engine's tokenizer.
    fn breaker_ids(&self, context: &EngineContext) -> Result<Vec<Vec<u32>>> {
        let breakers = self.sequence_breaker_ids.clone().unwrap_or_default();
        let texts = self.texts()?;
        if texts.is_empty() {
            return Ok(breakers);
        }
        #[cfg(feature = "tokenizers")]
        if let Some(env) = &context.vocab {
            let mut breakers = breakers;
            for text in texts {
                let resolved = env.derived(&format!("dry breaker {text}"), |env| {
                    overlapping_sequences(env, text)
                })?;
                breakers.extend(resolved.iter().cloned());
            }
            // The ids the texts resolve to count against the limit under the field written.
            if breakers.iter().map(Vec::len).sum::<usize>() > MAX_TOKEN_IDS {
                return Err(Error::spec(
                    "sequence_breakers",
                    format!("the texts resolve to more than {MAX_TOKEN_IDS} breaker ids"),
                ));
            }
            return Ok(breakers);
        }
        let _ = context;
        Err(Error::spec(
            "sequence_breakers",
            "text breakers (llama.cpp's defaults when no breaker is given) need the engine's \
             tokenizer, which this context has not got: give sequence_breaker_ids ([] for none)",
        ))
    }

    fn build(&self, breakers: Vec<Vec<u32>>, vocab_size: Option<usize>) -> Result<Dry> {
        let window = match self.penalty_last_n {
            -1 => None,
            n if n >= 0 => Some(usize::try_from(n).unwrap_or(usize::MAX)),
            n => {
                return Err(Error::argument(
                    "penalty_last_n",
                    format!("must be -1 (the whole history), 0 (off) or a count of ids, got {n}"),
                ))
            }
        };
        Dry::new(
            self.multiplier,
            self.base,
            self.allowed_length,
            window,
            breakers,
            vocab_size,
        )
    }
}

/// llama.cpp's breakers of `text` over the vocab (`get_overlapping_token_sequences`): each token
/// whose text contains it, alone; each token whose text ends with a beginning of it, followed by
/// the tokens of the rest (at most [`MAX_BREAKER_TAIL`]).
#[cfg(feature = "tokenizers")]
fn overlapping_sequences(env: &crate::vocab::Vocab, text: &str) -> Result<Vec<Vec<u32>>> {
    use crate::processors::TextEncoder;
    let text = text.as_bytes();
    let mut sequences: Vec<Vec<u32>> = vec![];
    for (id, word) in env.token_texts()? {
        if word.windows(text.len()).any(|w| w == text) {
            sequences.push(vec![id]);
            continue;
        }
        let first = sequences.len();
        // Every place the token's text ends with a proper beginning of `text`.
        let ends = (word.len().saturating_sub(text.len() - 1)..word.len())
            .filter(|&p| word[p..] == text[..word.len() - p]);
        for pos in ends {
            let rest = String::from_utf8_lossy(&text[word.len() - pos..]);
            let mut sequence = vec![id];
            sequence.extend(env.encode_plain(&rest)?.into_iter().take(MAX_BREAKER_TAIL));
            if !sequences[first..].contains(&sequence) {
                sequences.push(sequence);
            }
        }
    }
    Ok(sequences)
}

impl KindSpec for DrySpec {
    fn check(&self) -> Result<()> {
        self.texts()?;
        self.build(self.sequence_breaker_ids.clone().unwrap_or_default(), None)
            .map(drop)
    }

    fn realize(&self, context: &EngineContext, _: usize) -> Result<Box<dyn LogitsProcessor>> {
        for (i, breaker) in self.sequence_breaker_ids.iter().flatten().enumerate() {
            context.check_ids(
                &format!("sequence_breaker_ids[{i}]"),
                breaker.iter().copied(),
            )?;
        }
        Ok(Box::new(
            self.build(self.breaker_ids(context)?, context.vocab_size)?,
        ))
    }

    fn validate(&self, context: &EngineContext) -> Option<Result<()>> {
        // Without an engine, texts are the engine's to resolve.
        (context.structure_only && !context.has_token_texts()).then(|| self.check())
    }

    fn resolve(&self, context: &EngineContext) -> Result<Option<serde_json::Value>> {
        if self.texts()?.is_empty() || !context.has_token_texts() {
            return Ok(None);
        }
        let mut explicit = self.clone();
        explicit.sequence_breaker_ids = Some(self.breaker_ids(context)?);
        explicit.sequence_breakers = Some(vec![]);
        let mut value = serde_json::json!({"kind": "dry"});
        if let (serde_json::Value::Object(object), serde_json::Value::Object(fields)) = (
            &mut value,
            serde_json::to_value(explicit).expect("plain data"),
        ) {
            object.extend(fields);
        }
        Ok(Some(value))
    }
}

/// DRY: see [`DrySpec`]. With `L` the ids in the window (the last `penalty_last_n` of the
/// history, prompt included), a token `t` that would extend a repetition gets
/// `x - multiplier * base^(n - allowed_length)`, `n` the longest `k` such that the window's last
/// `k` ids also occur earlier in it followed by `t` (at most the ids since the latest breaker),
/// when `n >= allowed_length`. The penalty saturates at `±1e30` ([`crate::processors::MAX_BIAS`];
/// llama.cpp's overflows to infinity for a large `multiplier`, and a negative one would make
/// `-inf` logits NaN).
///
/// llama.cpp recomputes every match length each step (a Z-algorithm over the window, `O(L)`).
/// Here the state carries them: after a new id `c`, the matches are exactly the earlier
/// occurrences `e` of `c`, each one longer than the match that ended at `e - 1`, so a step costs
/// `O(occurrences of c in the window)` (a per-token list of positions), plus the breaker check
/// over the last `max breaker length` ids. A rescan (ids that do not extend those read, or more
/// than 16 new ids at once, as a fresh processor's prompt) runs the Z-algorithm once, `O(L)`.
///
/// ```
/// use logits_processing::{process_row, processors::Dry};
/// let mut dry = Dry::new(1.0, 2.0, 2, None, vec![], None)?;
/// let mut row = [0.0f32; 5];
/// // "1 2 3 4 1 2 3": 4 would make "1 2 3 4" a repeat of length 4 (3 ids matched): 1 * 2^(3-2).
/// process_row(&mut dry, &[1u32, 2, 3, 4, 1, 2, 3], &mut row)?;
/// assert_eq!(row, [0.0, 0.0, 0.0, 0.0, -2.0]);
/// # Ok::<(), logits_processing::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct Dry {
    multiplier: f32,
    base: f32,
    allowed_length: usize,
    window: Option<usize>,
    // Breakers by head: each tail (possibly empty).
    breakers: HashMap<u32, Vec<Vec<u32>>>,
    longest_tail: usize,
    limit: u32,
    state: State,
    // For `undo`: how the last plan changed the state, or (when it rescanned) the state before.
    last: Option<Change>,
    before: Option<Box<State>>,
    penalties: Vec<(u32, usize)>,
}

#[derive(Debug, Clone, Default)]
struct State {
    cursor: Cursor,
    ids: Vec<u32>,
    // Positions of each token in `ids`, ascending.
    positions: HashMap<u32, Vec<u32>>,
    // The matches: every position `e <= len - 2` in the window with `ids[e]` equal to the last id,
    // ascending, each with the length of the longest common suffix of `ids[start..=e]` and
    // `ids[..len]` (at least 1).
    matches: Vec<(u32, u32)>,
    // The most recent breaker head whose whole sequence follows it, and that sequence's tail
    // length (the longest that matches).
    breaker: Option<(usize, usize)>,
    // The matches before the last push, kept for their allocation.
    spare: Vec<(u32, u32)>,
}

#[derive(Debug, Clone)]
struct Change {
    cursor: Cursor,
    appended: usize,
    matches: Vec<(u32, u32)>,
    breaker: Option<(usize, usize)>,
}

impl Dry {
    /// `window`: the last ids that count (`None`: all). Ids at or above `vocab_size` (when given)
    /// are never penalized.
    pub fn new(
        multiplier: f64,
        base: f64,
        allowed_length: u32,
        window: Option<usize>,
        sequence_breaker_ids: Vec<Vec<u32>>,
        vocab_size: Option<usize>,
    ) -> Result<Self> {
        let finite = |name: &str, v: f64| {
            if v.is_finite() && (v as f32).is_finite() {
                Ok(v as f32)
            } else {
                Err(Error::argument(name, format!("must be finite, got {v}")))
            }
        };
        let multiplier = finite("multiplier", multiplier)?;
        let base = finite("base", base)?;
        if sequence_breaker_ids.iter().map(Vec::len).sum::<usize>() > MAX_TOKEN_IDS {
            return Err(Error::argument(
                "sequence_breaker_ids",
                format!("more than {MAX_TOKEN_IDS} ids"),
            ));
        }
        let mut breakers: HashMap<u32, Vec<Vec<u32>>> = HashMap::new();
        for (i, breaker) in sequence_breaker_ids.into_iter().enumerate() {
            let Some((&head, tail)) = breaker.split_first() else {
                return Err(Error::argument(
                    format!("sequence_breaker_ids[{i}]"),
                    "must not be empty",
                ));
            };
            let tails = breakers.entry(head).or_default();
            if !tails.iter().any(|t| t == tail) {
                tails.push(tail.to_vec());
            }
        }
        let longest_tail = breakers.values().flatten().map(Vec::len).max().unwrap_or(0);
        Ok(Self {
            multiplier,
            base,
            allowed_length: allowed_length as usize,
            window,
            breakers,
            longest_tail,
            limit: vocab_limit(vocab_size),
            state: State::default(),
            last: None,
            before: None,
            penalties: vec![],
        })
    }

    fn enabled(&self) -> bool {
        self.multiplier != 0.0 && self.base >= 1.0 && self.window != Some(0)
    }

    /// The first position of the window when the ids end at `len`.
    fn start(&self, len: usize) -> usize {
        self.window.map_or(0, |w| len.saturating_sub(w))
    }

    /// The tail length of the longest breaker whose head is at `p` and whose tail follows it
    /// within `ids`.
    fn breaker_at(&self, ids: &[u32], p: usize) -> Option<usize> {
        let tails = self.breakers.get(&ids[p])?;
        tails
            .iter()
            .filter(|tail| {
                ids.len() - 1 - p >= tail.len() && ids[p + 1..p + 1 + tail.len()] == ***tail
            })
            .map(Vec::len)
            .max()
    }

    /// The most recent complete breaker among the positions `from..len` (latest head first).
    fn latest_breaker(&self, ids: &[u32], from: usize) -> Option<(usize, usize)> {
        (from..ids.len())
            .rev()
            .find_map(|p| self.breaker_at(ids, p).map(|tail| (p, tail)))
    }

    /// Appends one id to the state.
    fn push(&self, state: &mut State, token: u32) {
        let len = state.ids.len() + 1;
        let start = self.start(len);
        let mut matches = std::mem::take(&mut state.spare);
        matches.clear();
        if let Some(positions) = state.positions.get(&token) {
            let at = positions.partition_point(|&p| (p as usize) < start);
            // Both ascending: the match that ended at `e - 1`, if any, by a merge.
            let mut previous = state.matches.iter().peekable();
            for &e in &positions[at..] {
                let e = e as usize;
                let before = match e.checked_sub(1) {
                    Some(d) => {
                        while previous.next_if(|m| (m.0 as usize) < d).is_some() {}
                        previous
                            .peek()
                            .filter(|m| m.0 as usize == d)
                            .map_or(0, |m| m.1)
                    }
                    None => 0,
                };
                let n = (before + 1).min((e + 1 - start) as u32);
                matches.push((e as u32, n));
            }
        }
        state.spare = std::mem::replace(&mut state.matches, matches);
        state.ids.push(token);
        state
            .positions
            .entry(token)
            .or_default()
            .push(len as u32 - 1);
        // A head among the last ids may now have its whole tail; an older one keeps its place.
        let recent = (len - 1).saturating_sub(self.longest_tail);
        if let Some(found) = self.latest_breaker(&state.ids, recent) {
            state.breaker = Some(found);
        }
    }

    /// Takes the last id back out of the state (not the matches or the breaker: the caller
    /// restores those).
    fn pop(state: &mut State) {
        if let Some(token) = state.ids.pop() {
            if let Some(positions) = state.positions.get_mut(&token) {
                positions.pop();
                if positions.is_empty() {
                    state.positions.remove(&token);
                }
            }
        }
    }

    /// The state for `ids` from scratch: the matches by a Z-algorithm over the reversed window.
    fn rescan(&self, ids: &dyn TokenHistory) -> State {
        let len = ids.token_count();
        let ids: Vec<u32> = (0..len).map(|i| ids.token_at(i)).collect();
        let start = self.start(len);
        let mut positions: HashMap<u32, Vec<u32>> = HashMap::new();
        for (p, &token) in ids.iter().enumerate().skip(start) {
            positions.entry(token).or_default().push(p as u32);
        }
        let mut matches = Vec::new();
        if len > start {
            let reversed: Vec<u32> = ids[start..].iter().rev().copied().collect();
            let z = z_function(&reversed);
            // z[k]: the common suffix of the window and the window less its last k ids, which
            // ends at e = len - 1 - k.
            for k in (1..reversed.len()).rev() {
                if z[k] > 0 {
                    matches.push(((len - 1 - k) as u32, z[k] as u32));
                }
            }
        }
        let breaker = self.latest_breaker(&ids, start);
        State {
            cursor: {
                let mut cursor = Cursor::default();
                cursor.read_all(&ids);
                cursor
            },
            ids,
            positions,
            matches,
            breaker,
            spare: Vec::new(),
        }
    }

    /// The penalized tokens and their repeat lengths, by token.
    fn find_penalties(&mut self) {
        self.penalties.clear();
        let state = &self.state;
        let len = state.ids.len();
        let start = self.start(len);
        let in_window = len - start;
        if in_window <= self.allowed_length {
            return;
        }
        let rep_limit = match state.breaker {
            Some((p, tail)) if p >= start => len - 1 - p - tail,
            _ => in_window,
        };
        if rep_limit < self.allowed_length {
            return;
        }
        let mut push = |e: usize, n: u32| {
            let n = (n as usize).min(rep_limit);
            if n >= self.allowed_length {
                let token = state.ids[e + 1];
                if token < self.limit {
                    self.penalties.push((token, n));
                }
            }
        };
        if self.allowed_length == 0 {
            // As llama.cpp: a repeat of length 0 is long enough, so every id that follows another
            // in the window is penalized (a step then costs O(window)).
            let mut matches = state.matches.iter().peekable();
            for e in start..len - 1 {
                let n = match matches.next_if(|m| m.0 as usize == e) {
                    Some(&(_, n)) => n,
                    None => 0,
                };
                push(e, n);
            }
        } else {
            for &(e, n) in &state.matches {
                push(e as usize, n);
            }
        }
        // By token, the longest first; then one per token.
        self.penalties.sort_unstable_by_key(|&(token, n)| {
            (token as u64) << 32 | (u32::MAX - n as u32) as u64
        });
        self.penalties.dedup_by_key(|p| p.0);
    }
}

/// `z[k]`: the length of the longest common prefix of `s` and `s[k..]` (`z[0]` is `s.len()`).
fn z_function(s: &[u32]) -> Vec<usize> {
    let n = s.len();
    let mut z = vec![0; n];
    if n == 0 {
        return z;
    }
    z[0] = n;
    let (mut l, mut r) = (0, 0);
    for k in 1..n {
        if k < r {
            z[k] = z[k - l].min(r - k);
        }
        while k + z[k] < n && s[z[k]] == s[k + z[k]] {
            z[k] += 1;
        }
        if k + z[k] > r {
            l = k;
            r = k + z[k];
        }
    }
    z
}

impl LogitsProcessor for Dry {
    fn plan(&mut self, ids: &dyn TokenHistory, plan: &mut RowPlan) -> Result<()> {
        if !self.enabled() {
            return Ok(());
        }
        self.last = None;
        self.before = None;
        // Pushing costs `O(occurrences)` per id, so many new ids at once (a fresh processor's
        // prompt) are read by the one Z-algorithm pass of a rescan, which is `O(L)`.
        let extends = self.state.cursor.extended_by(ids)
            && ids.token_count() - self.state.ids.len() <= MAX_PUSHES;
        if extends {
            let mut state = std::mem::take(&mut self.state);
            let change = Change {
                cursor: state.cursor,
                appended: ids.token_count() - state.ids.len(),
                matches: state.matches.clone(),
                breaker: state.breaker,
            };
            for i in state.ids.len()..ids.token_count() {
                self.push(&mut state, ids.token_at(i));
            }
            state.cursor.read_all(ids);
            self.state = state;
            self.last = Some(change);
        } else {
            let fresh = self.rescan(ids);
            self.before = Some(Box::new(std::mem::replace(&mut self.state, fresh)));
        }
        self.find_penalties();
        // llama.cpp: exponents past this would overflow f32 (`88.72 / ln base`, in f32).
        let max_exponent = if self.base > 1.000_001 {
            (88.722_84_f32 / self.base.ln()) as i64
        } else {
            0
        };
        for &(token, n) in &self.penalties {
            let single = self
                .breakers
                .get(&token)
                .is_some_and(|tails| tails.iter().any(Vec::is_empty));
            if single {
                continue;
            }
            let mut exponent = n as i64 - self.allowed_length as i64;
            if max_exponent > 0 && exponent > max_exponent {
                exponent = max_exponent;
            }
            // As llama.cpp: `multiplier * std::pow(base, exponent)` in double, rounded to f32;
            // past f32's range (where llama.cpp's is infinite), saturated.
            let penalty = (self.multiplier as f64 * (self.base as f64).powf(exponent as f64))
                .clamp(-MAX_BIAS, MAX_BIAS) as f32;
            plan.push(Edit::Bias {
                token,
                bias: -penalty,
            });
        }
        Ok(())
    }

    fn undo(&mut self) {
        if let Some(before) = self.before.take() {
            self.state = *before;
        } else if let Some(change) = self.last.take() {
            for _ in 0..change.appended {
                Self::pop(&mut self.state);
            }
            self.state.matches = change.matches;
            self.state.breaker = change.breaker;
            self.state.cursor = change.cursor;
        }
    }

    fn max_token_id(&self) -> Option<u32> {
        self.breakers
            .iter()
            .flat_map(|(head, tails)| std::iter::once(*head).chain(tails.iter().flatten().copied()))
            .max()
    }

    fn reset(&mut self) {
        self.state = State::default();
        self.last = None;
        self.before = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// llama.cpp's `llama_sampler_dry_apply`, written out over the window (rat(i) = the i-th id
    /// from the end): the penalty of each token.
    fn llama(
        ids: &[u32],
        multiplier: f32,
        base: f32,
        allowed: usize,
        last_n: usize,
        breakers: &[Vec<u32>],
    ) -> Vec<(u32, f32)> {
        let window = &ids[ids.len().saturating_sub(last_n)..];
        let l = window.len();
        let rat = |i: usize| window[l - 1 - i];
        if l <= allowed {
            return vec![];
        }
        let mut rep_limit = l;
        'scan: for i in 0..l {
            let mut longest: i64 = -1;
            for b in breakers.iter().filter(|b| b[0] == rat(i)) {
                let tail = &b[1..];
                if tail.len() as i64 > longest
                    && tail.len() <= i
                    && (0..tail.len()).all(|o| tail[o] == rat(i - o - 1))
                {
                    longest = tail.len() as i64;
                }
            }
            if longest >= 0 {
                rep_limit = i - longest as usize;
                break 'scan;
            }
        }
        if rep_limit < allowed {
            return vec![];
        }
        let mut max: HashMap<u32, usize> = HashMap::new();
        for e in 0..l - 1 {
            // The common suffix of window[..=e] and the window, by brute force.
            let mut n = 0;
            while n <= e && window[e - n] == window[l - 1 - n] {
                n += 1;
            }
            let n = n.min(rep_limit);
            if n >= allowed {
                let t = window[e + 1];
                let m = max.entry(t).or_insert(0);
                *m = (*m).max(n);
            }
        }
        let max_exponent = if base > 1.000_001 {
            (88.722_84_f32 / base.ln()) as i64
        } else {
            0
        };
        let mut out: Vec<(u32, f32)> = max
            .into_iter()
            .filter(|(t, _)| !breakers.iter().any(|b| b.len() == 1 && b[0] == *t))
            .map(|(t, n)| {
                let mut exp = n as i64 - allowed as i64;
                if max_exponent > 0 && exp > max_exponent {
                    exp = max_exponent;
                }
                (
                    t,
                    (multiplier as f64 * (base as f64).powf(exp as f64)) as f32,
                )
            })
            .collect();
        out.sort_by_key(|p| p.0);
        out
    }

    fn planned(dry: &mut Dry, ids: &[u32]) -> Vec<(u32, f32)> {
        let mut plan = RowPlan::new();
        dry.plan(&ids, &mut plan).unwrap();
        plan.edits()
            .iter()
            .map(|e| match *e {
                Edit::Bias { token, bias } => (token, -bias),
                _ => unreachable!(),
            })
            .collect()
    }

    proptest! {
        /// Growing histories, steps undone and rewound: every step's penalties are llama.cpp's,
        /// and a fresh processor given the same ids plans the same.
        #[test]
        fn every_step_equals_llama_cpps_rescan(
            steps in proptest::collection::vec((proptest::collection::vec(0u32..5, 0..4), 0u8..10), 1..60),
            allowed in 0u32..4,
            last_n in prop_oneof![Just(-1i64), 1i64..40],
            breakers in proptest::collection::vec(proptest::collection::vec(0u32..6, 1..4), 0..3),
        ) {
            let window = (last_n >= 0).then_some(last_n as usize);
            let mut dry = Dry::new(0.8, 1.75, allowed, window, breakers.clone(), None).unwrap();
            let mut ids: Vec<u32> = vec![];
            for (new, what) in steps {
                match what {
                    0 => {
                        planned(&mut dry, &[&ids[..], &new[..]].concat());
                        dry.undo();
                    }
                    1 => ids.truncate(ids.len().saturating_sub(3)),
                    _ => ids.extend(new),
                }
                let got = planned(&mut dry, &ids);
                let n = window.unwrap_or(usize::MAX);
                let want = llama(&ids, 0.8, 1.75, allowed as usize, n, &breakers);
                prop_assert_eq!(&got, &want, "{:?}", ids);
                let mut fresh = Dry::new(0.8, 1.75, allowed, window, breakers.clone(), None).unwrap();
                prop_assert_eq!(planned(&mut fresh, &ids), want);
            }
        }
    }

    /// Seconds `dry` takes to plan `ids`.
    fn plan_time(dry: &mut Dry, ids: &[u32]) -> f64 {
        let mut plan = RowPlan::default();
        let start = std::time::Instant::now();
        dry.plan(&ids, &mut plan).unwrap();
        start.elapsed().as_secs_f64()
    }

    #[test]
    fn a_fresh_processor_reads_a_long_prompt_in_the_time_of_a_rescan() {
        let shapes: [fn(usize) -> Vec<u32>; 3] = [
            |n| vec![5; n],
            |n| (0..n as u32).collect(),
            |n| (0..n as u32).rev().collect(),
        ];
        for n in [32_768, 131_072] {
            for shape in shapes {
                let ids = shape(n);
                let new = || Dry::new(1.0, 1.75, 2, None, vec![], None).unwrap();
                let fresh = plan_time(&mut new(), &ids);
                let mut rewound = new();
                plan_time(&mut rewound, &[7, 7, 7]);
                let rescan = plan_time(&mut rewound, &ids);
                // Same order of cost: a generous ratio, with a floor for timer noise.
                assert!(
                    fresh <= 20.0 * rescan + 0.05,
                    "{n} ids: fresh {fresh:.3}s, rewound {rescan:.3}s"
                );
            }
        }
    }

    #[test]
    fn a_breaker_limits_the_repeat_and_a_single_id_breaker_is_never_penalized() {
        // "1 2 3 9 1 2": 3 would repeat "1 2 3"; after the breaker 9 only "1 2" counts.
        let mut dry = Dry::new(1.0, 2.0, 2, None, vec![vec![9]], None).unwrap();
        assert_eq!(planned(&mut dry, &[1, 2, 3, 9, 1, 2]), [(3, 1.0)]);
        let mut dry = Dry::new(1.0, 2.0, 1, None, vec![vec![9]], None).unwrap();
        assert_eq!(planned(&mut dry, &[5, 9, 5]), []);
    }

    #[test]
    #[cfg(feature = "tokenizers")]
    fn text_breakers_resolve_as_llama_cpp_does() {
        // Ids 256.. are the pieces.
        let env = crate::vocab::byte_level_vocab(&["a:b", "xy", "zx", "bz", "<|end|>"]);
        let breakers = overlapping_sequences(&env, "xyz").unwrap();
        // "xy" holds no "xyz": it ends with "xy", so it heads "z"; "zx" ends with "x" and heads
        // "yz" (byte tokens); nothing else ends with a beginning of "xyz" but the byte "x".
        assert_eq!(
            breakers,
            [
                vec![b'x' as u32, b'y' as u32, b'z' as u32],
                vec![257, b'z' as u32],
                vec![258, b'y' as u32, b'z' as u32]
            ]
        );
        // A one-character breaker: every token whose text holds it, alone.
        assert_eq!(
            overlapping_sequences(&env, ":").unwrap(),
            [vec![b':' as u32], vec![256]]
        );
        assert_eq!(
            overlapping_sequences(&env, "|").unwrap(),
            [vec![b'|' as u32], vec![260]]
        );

        let spec = |text: &str| -> DrySpec { serde_json::from_str(text).unwrap() };
        let context = EngineContext {
            vocab: Some(env.clone()),
            ..Default::default()
        };
        // Without breakers: llama.cpp's defaults, so "a:b" (holding ":") is a breaker, never
        // penalized: "5 a:b 5" would repeat "5 a:b".
        let mut dry = spec(r#"{"multiplier": 1, "base": 2, "allowed_length": 1}"#)
            .realize(&context, 0)
            .unwrap();
        let row = |dry: &mut Box<dyn LogitsProcessor>, ids: &[u32]| {
            let mut row = vec![0.0f32; 261];
            crate::process_row(dry.as_mut(), &ids, &mut row).unwrap();
            row
        };
        assert_eq!(row(&mut dry, &[5, 9, 5])[9], -1.0);
        assert_eq!(row(&mut dry, &[5, 256, 5])[256], 0.0);
        // Ids given and no text: no default texts.
        let ids_only =
            r#"{"multiplier": 1, "base": 2, "allowed_length": 1, "sequence_breaker_ids": []}"#;
        let mut ids_only = spec(ids_only).realize(&context, 0).unwrap();
        assert_eq!(row(&mut ids_only, &[5, 256, 5])[256], -1.0);
        // Without the engine's tokenizer, text (the defaults included) is refused naming the field.
        for text in [
            r#"{"multiplier": 1}"#,
            r#"{"multiplier": 1, "sequence_breakers": [":"]}"#,
        ] {
            let error = spec(text)
                .realize(&EngineContext::default(), 0)
                .unwrap_err();
            assert!(error.to_string().contains("sequence_breakers"), "{error}");
            spec(text).check().unwrap();
        }
        let empty = spec(r#"{"multiplier": 1, "sequence_breakers": [""]}"#);
        assert!(empty
            .check()
            .unwrap_err()
            .to_string()
            .contains("sequence_breakers[0]"));
        // Resolved for a worker without the tokenizer: the same breakers, as ids.
        let resolved = spec(r#"{"multiplier": 1, "base": 2, "sequence_breakers": [":"]}"#)
            .resolve(&context)
            .unwrap()
            .unwrap();
        assert_eq!(
            resolved["sequence_breaker_ids"],
            serde_json::json!([[58], [256]])
        );
        assert_eq!(resolved["sequence_breakers"], serde_json::json!([]));
    }
}
