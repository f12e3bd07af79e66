//! CUDA path: a whole batch's plans applied on the GPU, on the caller's stream.
//!
//! **The kernels have never run on a GPU.** No GPU has been lent to this project yet, and the
//! machines it is developed on have none: the kernels are compiled (NVRTC, for several
//! architectures) and their algorithm is checked on the host ([`packed::emulate`] against the CPU
//! path, bit for bit), but nothing has executed them. So the first [`CudaBatchApplier`] on each
//! device in a process runs a self-check first: a small batch covering every kind of edit, on
//! that device, compared bit for bit with the CPU path; on any difference every applier for that
//! device fails with [`CudaError::SelfCheck`], naming the first differing row and token, rather
//! than ever giving wrong logits.
//!
//! Design (docs/cuda.md has the whole of it): the batch plans on the host as on the CPU path; each
//! step the plans are packed ([`packed`]) into a few words per row plus each mask's words, copied
//! asynchronously from pinned memory to the device on the caller's stream; for rows that truncate,
//! a first kernel resolves each truncation's band (one block per row); then one launch edits every
//! listed row, each logit read and written at most once, with the CPU path's arithmetic bit for
//! bit. The kernels ship as PTX compiled from [`kernel_source`] by NVRTC 13.0 for `compute_75` and
//! checked in; the driver JIT-compiles it once per device and process. cudarc loads `libcuda`
//! dynamically, so this crate builds and its tests run on machines without CUDA, where
//! [`cuda_available`] is `false` and [`CudaBatchApplier::new`] returns [`CudaError::NoDriver`].

mod applier;
pub mod device;
mod driver;
mod error;
pub mod nvrtc;
pub mod packed;
pub mod round_trip;
mod self_check;

pub use applier::CudaBatchApplier;
pub use error::CudaError;

/// The kernels' source file (CUDA C++) as written, without its constants: compile
/// [`kernel_source`], which prepends them.
pub const KERNEL_SOURCE: &str = include_str!("../kernels/apply.cu");

/// The source NVRTC compiles: [`packed::kernel_header`] (the layout's constants and the op codes,
/// from their one definition in Rust) followed by [`KERNEL_SOURCE`].
pub fn kernel_source() -> String {
    format!("{}{}", packed::kernel_header(), KERNEL_SOURCE)
}

/// The checked-in PTX of [`kernel_source`] (`cargo run -p logits-processing-cuda --example gen_ptx`
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
