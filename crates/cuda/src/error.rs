//! The crate's one error type.

/// Everything the CUDA path can fail with. Every variant carries a message meant for a person.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// No usable CUDA driver library (`libcuda.so.1`) here, or it failed to initialize.
    #[error("no CUDA driver: {0}")]
    NoDriver(String),
    /// The driver works but there is no GPU, or none with the ordinal asked for.
    #[error("no CUDA device: {0}")]
    NoDevice(String),
    /// A driver call failed (the message names the call and CUDA's error name).
    #[error("CUDA driver error: {0}")]
    Driver(String),
    /// The kernels could not be compiled or loaded on the device.
    #[error("CUDA kernel compile or load failed: {0}")]
    Compile(String),
    /// A bad argument: a null or misaligned pointer, a row outside the block, a row listed twice.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A plan holds an edit the kernel does not carry out (one for which
    /// [`logits_processing::RowPlan::cpu_only`] is true); the message names the row.
    #[error("not supported on the CUDA path: {0}")]
    Unsupported(String),
    /// A plan or a batch the core refuses (a token outside the vocab, a bad layout).
    #[error(transparent)]
    Core(#[from] logits_processing::Error),
    /// The kernels disagreed with the CPU path on this device's self-check (the first use of the
    /// device in the process): the first differing row and token, with both values.
    #[error("the CUDA kernels fail their self-check on this device: {0}")]
    SelfCheck(String),
    /// An external step's callback failed (its own message).
    #[error("external step failed: {0}")]
    External(String),
}
