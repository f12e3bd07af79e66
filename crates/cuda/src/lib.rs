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
//!
//! Design (docs/cuda.md has the whole of it): the batch plans on the host as on the CPU path; each
//! step the plans are packed ([`packed`]) into a few words per row, copied asynchronously from
//! pinned memory to the device on the caller's stream, and one kernel launch edits every listed
//! row, each logit read and written at most once, with the CPU path's arithmetic bit for bit.
//! The kernels ship as PTX compiled from `kernels/apply.cu` by NVRTC 13.0 for `compute_75` and
//! checked in; the driver JIT-compiles it once per device and process. cudarc loads `libcuda`
//! dynamically, so this crate builds and its tests run on machines without CUDA, where
//! [`cuda_available`] is `false` and [`CudaBatchApplier::new`] returns [`CudaError::NoDriver`].

mod applier;
pub mod device;
mod driver;
mod error;
pub mod nvrtc;
pub mod packed;

pub use applier::CudaBatchApplier;
pub use error::CudaError;

/// The kernel source (CUDA C++), compiled by NVRTC into [`KERNEL_PTX`].
pub const KERNEL_SOURCE: &str = include_str!("../kernels/apply.cu");

/// The checked-in PTX of [`KERNEL_SOURCE`] (`cargo run -p logits-processing-cuda --example gen_ptx`
/// regenerates it; a test fails when it is stale).
pub const KERNEL_PTX: &str = include_str!("../kernels/apply.ptx");

/// Whether a CUDA driver and at least one GPU can be used here. Never panics; the first call
/// initializes the driver (if there is one).
pub fn cuda_available() -> bool {
    driver::device_count().is_ok_and(|n| n > 0)
}

/// Why [`cuda_available`] is false (`None` when it is true): the message a skipped test prints.
pub fn cuda_unavailable_reason() -> Option<String> {
    match driver::device_count() {
        Ok(0) => Some("the CUDA driver sees no GPU".into()),
        Ok(_) => None,
        Err(e) => Some(e.to_string()),
    }
}
