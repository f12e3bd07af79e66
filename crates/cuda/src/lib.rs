//! CUDA path: a whole batch's plans applied in one kernel launch on the caller's stream.
//!
//! CONTRACT (agreed between the CUDA crate and the Python binding; the CUDA helper implements it):
//!
//! ```ignore
//! /// Whether a CUDA driver and at least one GPU can be used here. Never panics.
//! pub fn cuda_available() -> bool;
//!
//! /// The crate's one error enum (thiserror): NoDriver / NoDevice / Driver(String) / Compile(String) / ...
//! pub enum CudaError { .. }
//!
//! /// One device's kernels (loaded once, cached) and reusable pinned + device buffers.
//! pub struct CudaBatchApplier { .. }
//! impl CudaBatchApplier {
//!     /// A clear error, never a panic, where there is no driver or no such device.
//!     pub fn new(device_ordinal: usize) -> Result<Self, CudaError>;
//!     /// Applies one plan per listed row in ONE launch; rows not listed are untouched.
//!     /// `logits`: device pointer to the block's first element; `stream`: a raw CUstream (0 = default).
//!     /// Safety: `logits` must be a live device allocation on this device covering `layout`.
//!     pub unsafe fn apply_plans(&mut self, plans: &[(usize, &logits_processing::RowPlan)],
//!         logits: u64, dtype: logits_processing::DType, layout: logits_processing::BatchLayout,
//!         vocab_size: usize, stream: u64) -> Result<(), CudaError>;
//!     /// A planned batch (after `Batch::plan`): stage by stage, one launch per stage level, and
//!     /// `external(row, key)` for each external step in its place (the caller edits that row on
//!     /// the same stream).
//!     pub unsafe fn apply_batch(&mut self, batch: &mut logits_processing::Batch, logits: u64,
//!         dtype: logits_processing::DType, layout: logits_processing::BatchLayout, stream: u64,
//!         external: &mut dyn FnMut(usize, u64) -> Result<(), CudaError>) -> Result<(), CudaError>;
//! }
//! ```
