//! Where the driver cannot be used, every entry point says so with an error, never a panic. The
//! driver is made to look absent (`LOGITS_PROCESSING_NO_CUDA`), so this runs, and asserts one
//! outcome, on every machine, with or without a GPU. One test in its own binary: the variable is
//! read once per process, before any other CUDA call.

use logits_processing_cuda::device::Stream;
use logits_processing_cuda::{
    cuda_available, cuda_unavailable_reason, CudaBatchApplier, CudaError,
};

#[test]
fn without_a_driver_every_entry_point_is_an_error() {
    std::env::set_var("LOGITS_PROCESSING_NO_CUDA", "1");
    assert!(!cuda_available());
    let reason = cuda_unavailable_reason().expect("a reason");
    assert!(reason.contains("LOGITS_PROCESSING_NO_CUDA"), "{reason}");
    assert!(matches!(
        CudaBatchApplier::new(0, 8),
        Err(CudaError::NoDriver(_))
    ));
    assert!(matches!(
        CudaBatchApplier::new(1 << 20, 8),
        Err(CudaError::NoDriver(_))
    ));
    assert!(matches!(Stream::new(0), Err(CudaError::NoDriver(_))));
}
