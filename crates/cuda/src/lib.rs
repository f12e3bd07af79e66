//! CUDA path: a whole batch's plans applied on the GPU, on the caller's stream.
//!
//! **The kernels have never run on a GPU.** No GPU has been lent to this project yet. Their one
//! source is Triton (`python/logits_processing/kernels/apply.py`), which the Python suite runs
//! through Triton's interpreter against the CPU path, bit for bit; this crate loads the same
//! source compiled ahead of time ([`images`](crate::images): cubins and PTX, checked in) and
//! launches it through the driver. So the first [`CudaBatchApplier`] on each device in a process
//! runs a self-check first: a batch covering every kind of edit, on that device, compared bit for
//! bit with the CPU path; on any difference every applier for that device fails with
//! [`CudaError::SelfCheck`], naming the first differing row and token, rather than ever giving
//! wrong logits.
//!
//! Design (docs/cuda.md has the whole of it): the batch plans on the host as on the CPU path; each
//! step the plans are packed ([`packed`]) into a few words per row plus each mask's words, copied
//! asynchronously from pinned memory to the device on the caller's stream; for rows that truncate,
//! a first kernel resolves each truncation's band (one program per row); then one launch edits
//! every listed row, each logit read and written at most once, with the CPU path's arithmetic bit
//! for bit. cudarc loads `libcuda` dynamically, so this crate builds and its tests run on machines
//! without CUDA, where [`cuda_available`] is `false` and [`CudaBatchApplier::new`] returns
//! [`CudaError::NoDriver`].

mod applier;
pub mod device;
mod driver;
mod error;
mod images;
pub mod packed;
mod readback;
pub mod round_trip;
mod self_check;
#[doc(hidden)]
pub mod testing;

pub use applier::CudaBatchApplier;
pub use error::CudaError;
pub use readback::Readback;

/// How many times this process's device path has waited for the device (a stream or an event
/// synchronized: the host round trip's read, a step's saved rows, a readback of outcomes for the
/// next step, back-pressure on the staging slots); over host memory (the tests' switches), the
/// waits a device would make. A step whose rows neither read their pass nor take the round trip
/// makes none.
pub fn device_waits() -> usize {
    WAITS.load(std::sync::atomic::Ordering::Relaxed)
}

static WAITS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Counts one wait ([`device_waits`]).
pub(crate) fn count_wait() {
    WAITS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// The kernels' images this build carries, for a person: `"sm_80, sm_90, sm_100 cubins and
/// compute_75 PTX (Triton 3.9.0)"`.
pub fn kernel_images() -> String {
    images::summary()
}

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
