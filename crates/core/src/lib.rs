//! Logits processors for LLM decoding.
//!
//! A *processor* is per-request state that, each decode step, decides from the request's token ids
//! how the row of next-token logits is edited: scaled (temperature), forced to one token (a fixed
//! reply, the end of a thinking block), banned or biased. Decisions are cheap and stateful; the
//! edit touches every one of 150k+ logits. So processors only *plan* ([`RowPlan`]), and a plan is
//! applied in one pass over the row; a [`Batch`] plans every row of a `[rows, vocab]` block and
//! applies them in parallel.
//!
//! The built-ins match NVIDIA Dynamo's `dynamo.logits_processing` where it defines a behaviour; the
//! docs of each say where we differ on purpose.
//!
//! ```
//! use logits_processing::{process_row, Temperature};
//! let mut row = vec![2.0f32; 8];
//! process_row(&mut Temperature::new(0.5)?, &[1u32, 2, 3], &mut row)?;
//! assert!(row.iter().all(|&x| x == 4.0));
//! # Ok::<(), logits_processing::Error>(())
//! ```

mod batch;
#[cfg(feature = "tokenizers")]
mod budget;
pub mod context;
pub mod cpu;
mod drafts;
mod error;
#[cfg(feature = "grammar")]
pub mod grammar;
mod history;
mod kernels;
mod logit;
mod pipeline;
mod plan;
mod processor;
pub mod processors;
mod raw;
mod reshape;
pub mod spec;
pub mod spec_schema;
pub mod synthid;
#[cfg(feature = "tokenizers")]
pub mod tokenizer;
pub mod truncation;
#[cfg(feature = "tokenizers")]
pub mod vocab;
pub mod watermark;
mod whole;

pub use batch::{Batch, BatchLayout, ExternalCall, StepBitmask};
pub use error::{Error, Result};
pub use history::TokenHistory;
pub use logit::{DType, Logit};
pub use pipeline::{has_finite_logit, Pipeline, PipelineEntry, Stage, Step};
pub use plan::{
    Band, Bitmask, DevicePass, Edit, ForcedValue, MaskId, Reshape, RowPlan, Shape, Trigger,
    Truncation, WholeRow,
};
pub use processors::{
    canonical_order, check_order, check_prompt_len, get_thinking_token_config, hello_world,
    process_row, register_thinking_token_config, BanTokens, Checkpoint, ForcedSequence, LogitBias,
    LogitsProcessor, Position, Temperature, TextEncoder, ThinkingBudget, ThinkingTokenConfig,
};
pub use spec::{parse_pipeline, reads_history, EngineContext, Kind, KindSpec, ProcessorSpec};
#[cfg(feature = "tokenizers")]
pub use vocab::Vocab;

pub use half::{bf16, f16};

// The README's Rust example runs with the doc tests.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeDoctests;
