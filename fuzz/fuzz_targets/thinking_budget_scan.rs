//! The thinking budget's incremental scan (one instance over a history that grows, is rewound
//! and rewritten) against the reference's rule applied to the whole history each step. Rewrites
//! stay within what the scan's fingerprint covers (the last `CHECKED_TAIL` ids): a history
//! rewritten further back, at the same length, is documented as taken for an extension.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use logits_processing::processors::CHECKED_TAIL;
use logits_processing::{ThinkingBudget, ThinkingTokenConfig};

#[derive(Arbitrary, Debug)]
enum Change {
    /// Appends ids (from a small alphabet, so that markers are common).
    Append(Vec<u8>),
    /// Drops this many ids from the end (a rewind).
    Rewind(u8),
    /// Replaces the id this far from the end (a history that is not an extension of the last).
    Rewrite(u16, u8),
}

#[derive(Arbitrary, Debug)]
struct Input {
    max_thinking_tokens: u8,
    overflow_percent: u8,
    changes: Vec<Change>,
}

const START: u32 = 1;
const END: u32 = 2;
const NEWLINE: u32 = 3;

/// The reference's rule, on the whole history.
fn must_end(ids: &[u32], max: usize, overflow: usize) -> bool {
    let Some(start) = ids.iter().rposition(|&t| t == START) else {
        return false;
    };
    if ids[start + 1..].contains(&END) {
        return false;
    }
    let n = ids.len() - start - 1;
    n >= max && (ids.last() == Some(&NEWLINE) || n >= max + overflow)
}

fuzz_target!(|input: Input| {
    let max = input.max_thinking_tokens as usize;
    let percentage = input.overflow_percent as f64 / 100.0;
    let tokens = ThinkingTokenConfig {
        start_token_id: START,
        end_token_id: END,
        newline_token_id: NEWLINE,
    };
    let mut budget = ThinkingBudget::new(tokens, max, percentage).unwrap();
    let overflow = budget.overflow_budget();
    let mut ids: Vec<u32> = vec![];
    for change in input.changes {
        match change {
            Change::Append(new) => ids.extend(new.iter().map(|&t| u32::from(t % 6))),
            Change::Rewind(n) => ids.truncate(ids.len().saturating_sub(n as usize)),
            Change::Rewrite(at, t) => {
                if !ids.is_empty() {
                    let back = at as usize % ids.len().min(CHECKED_TAIL);
                    let at = ids.len() - 1 - back;
                    ids[at] = u32::from(t % 6);
                }
            }
        }
        assert_eq!(
            budget.must_end(&ids.as_slice()),
            must_end(&ids, max, overflow),
            "ids {ids:?}, budget {max} + {overflow}"
        );
    }
});
