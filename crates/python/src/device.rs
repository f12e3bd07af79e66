//! Where a plan is carried out: on the host in place (the GIL released), or on the GPU through the
//! `logits-processing-cuda` crate (feature `cuda`). Without that feature a CUDA tensor is a
//! `DeviceError` naming its device; logits are never copied to the host behind the caller's back.

use logits_processing::{
    bf16, f16, Batch, DType, Error, Logit, Pipeline, Result as CoreResult, RowPlan,
};
use pyo3::prelude::*;

use crate::errors::{new_err, ErrorClass, IntoPyResult};
use crate::tensor::{Block, Device};

/// The error for logits on a device this build cannot edit.
pub(crate) fn unsupported(device: Device) -> PyErr {
    let why = match device {
        Device::Cuda(_) if cfg!(feature = "cuda") => "no CUDA driver or device could be used",
        Device::Cuda(_) => "this build of logits_processing has no CUDA support",
        _ => "only host (CPU) and CUDA memory are supported",
    };
    new_err(
        ErrorClass::Device,
        format!("logits are on {device}: {why} (they are edited in place and were not copied)"),
    )
}

/// An error unless this build can edit logits on `device`.
pub(crate) fn check_supported(device: Device) -> PyResult<()> {
    match device {
        Device::Cpu => Ok(()),
        Device::Cuda(_) if cfg!(feature = "cuda") => Ok(()),
        other => Err(unsupported(other)),
    }
}

/// Applies a validated plan to the one row of `block`.
pub(crate) fn apply_row(py: Python<'_>, plan: &mut RowPlan, block: Block) -> PyResult<()> {
    if plan.is_empty() {
        return Ok(());
    }
    match block.device {
        Device::Cpu => {
            // SAFETY: the dtype matches, the block is on the host, and this call has it alone.
            py.detach(|| match block.dtype {
                DType::F32 => plan.apply(unsafe { block.slice::<f32>() }),
                DType::F16 => plan.apply(unsafe { block.slice::<f16>() }),
                DType::BF16 => plan.apply(unsafe { block.slice::<bf16>() }),
            })
            .py()
        }
        #[cfg(feature = "cuda")]
        Device::Cuda(ordinal) => cuda::apply_plans(py, ordinal, &[(0, &*plan)], block),
        other => Err(unsupported(other)),
    }
}

/// Applies a pipeline's last (validated) plan, which has no external steps, to the one row of
/// `block`.
pub(crate) fn apply_pipeline_row(
    py: Python<'_>,
    pipeline: &mut Pipeline,
    block: Block,
) -> PyResult<()> {
    match block.device {
        Device::Cpu => {
            fn run<T: Logit>(pipeline: &mut Pipeline, block: Block) -> CoreResult<()> {
                // SAFETY: the dtype matches, the block is on the host, and this call has it alone.
                let row = unsafe { block.slice::<T>() };
                pipeline.apply_planned(row, &mut |key, _| {
                    Err(Error::External(format!(
                        "no callable for external step {key}"
                    )))
                })
            }
            py.detach(|| match block.dtype {
                DType::F32 => run::<f32>(pipeline, block),
                DType::F16 => run::<f16>(pipeline, block),
                DType::BF16 => run::<bf16>(pipeline, block),
            })
            .py()
        }
        #[cfg(feature = "cuda")]
        Device::Cuda(ordinal) => {
            for stage in pipeline.stages() {
                if let logits_processing::Stage::Plan(plan) = stage {
                    cuda::apply_plans(py, ordinal, &[(0, plan)], block)?;
                }
            }
            Ok(())
        }
        other => Err(unsupported(other)),
    }
}

/// Applies a planned batch to `block` on the host: rows with external steps first, on this
/// thread, calling `external(row, key)` for each external step in its place (it takes the GIL and
/// writes the row through the caller's own tensor); then the other rows in parallel, with the GIL
/// released.
pub(crate) fn apply_batch_host(
    py: Python<'_>,
    batch: &mut Batch,
    block: Block,
    external: &mut (dyn FnMut(usize, u64) -> CoreResult<()> + Send),
) -> PyResult<()> {
    fn run<T: Logit>(
        batch: &mut Batch,
        block: Block,
        external: &mut (dyn FnMut(usize, u64) -> CoreResult<()> + Send),
    ) -> CoreResult<()> {
        // SAFETY: the dtype matches and the block is host memory that the caller's tensor keeps
        // alive for this call. No Rust reference to it is alive while an external step writes it
        // through the tensor; a step after which the memory may be gone returns
        // `Error::LogitsMoved`, and the core then touches the block no more.
        unsafe {
            batch.apply_planned_raw(block.data as *mut T, block.len(), block.layout(), external)
        }
    }
    py.detach(|| match block.dtype {
        DType::F32 => run::<f32>(batch, block, external),
        DType::F16 => run::<f16>(batch, block, external),
        DType::BF16 => run::<bf16>(batch, block, external),
    })
    .py()
}

/// [`apply_batch_host`] reading `source` and writing `block` (one layout, no overlap, checked by
/// the caller): each row read and written once, `source` left as it is.
pub(crate) fn apply_batch_host_into(
    py: Python<'_>,
    batch: &mut Batch,
    source: Block,
    block: Block,
    external: &mut (dyn FnMut(usize, u64) -> CoreResult<()> + Send),
) -> PyResult<()> {
    fn run<T: Logit>(
        batch: &mut Batch,
        source: Block,
        block: Block,
        external: &mut (dyn FnMut(usize, u64) -> CoreResult<()> + Send),
    ) -> CoreResult<()> {
        // SAFETY: as in `apply_batch_host`, for both blocks; the caller checked that they do
        // not overlap.
        unsafe {
            batch.apply_planned_into_raw(
                source.data as *const T,
                source.len(),
                block.data as *mut T,
                block.len(),
                block.layout(),
                external,
            )
        }
    }
    py.detach(|| match block.dtype {
        DType::F32 => run::<f32>(batch, source, block, external),
        DType::F16 => run::<f16>(batch, source, block, external),
        DType::BF16 => run::<bf16>(batch, source, block, external),
    })
    .py()
}

/// The GPU path, against the contract in `crates/cuda/src/lib.rs`.
#[cfg(feature = "cuda")]
pub(crate) mod cuda {
    use std::collections::hash_map::Entry;
    use std::collections::HashMap;
    use std::sync::Mutex;

    use logits_processing::{Batch, RowPlan};
    use logits_processing_cuda::CudaBatchApplier;
    use pyo3::prelude::*;

    use super::unsupported;
    use crate::errors::{new_err, ErrorClass};
    use crate::tensor::{Block, Device};

    // One applier per device: kernels loaded once, buffers reused.
    static APPLIERS: Mutex<Option<HashMap<i32, CudaBatchApplier>>> = Mutex::new(None);

    fn with_applier<R>(
        ordinal: i32,
        f: impl FnOnce(&mut CudaBatchApplier) -> PyResult<R>,
    ) -> PyResult<R> {
        if !logits_processing_cuda::cuda_available() {
            return Err(unsupported(Device::Cuda(ordinal)));
        }
        let mut guard = APPLIERS.lock().unwrap_or_else(|e| e.into_inner());
        let appliers = guard.get_or_insert_with(HashMap::new);
        let applier = match appliers.entry(ordinal) {
            Entry::Occupied(entry) => entry.into_mut(),
            Entry::Vacant(entry) => entry.insert(
                CudaBatchApplier::new(ordinal as usize)
                    .map_err(|e| new_err(ErrorClass::Device, format!("cuda:{ordinal}: {e}")))?,
            ),
        };
        f(applier)
    }

    /// One launch for the listed rows' plans, on the producer's current stream.
    pub(crate) fn apply_plans(
        py: Python<'_>,
        ordinal: i32,
        plans: &[(usize, &RowPlan)],
        block: Block,
    ) -> PyResult<()> {
        let stream = block.stream.unwrap_or(0);
        py.detach(|| {
            with_applier(ordinal, |applier| {
                // SAFETY: the block describes the caller's live CUDA tensor on `ordinal`.
                unsafe {
                    applier.apply_plans(
                        plans,
                        block.data as u64,
                        block.dtype,
                        block.layout(),
                        block.vocab,
                        stream,
                    )
                }
                .map_err(|e| new_err(ErrorClass::Device, format!("cuda:{ordinal}: {e}")))
            })
        })
    }

    /// A planned batch on the GPU; `external(row, key)` edits a row on the same stream.
    pub(crate) fn apply_batch(
        py: Python<'_>,
        ordinal: i32,
        batch: &mut Batch,
        block: Block,
        external: &mut (dyn FnMut(usize, u64) -> Result<(), logits_processing_cuda::CudaError>
                  + Send),
    ) -> PyResult<()> {
        let stream = block.stream.unwrap_or(0);
        py.detach(|| {
            with_applier(ordinal, |applier| {
                // SAFETY: the block describes the caller's live CUDA tensor on `ordinal`.
                unsafe {
                    applier.apply_batch(
                        batch,
                        block.data as u64,
                        block.dtype,
                        block.layout(),
                        stream,
                        external,
                    )
                }
                .map_err(|e| new_err(ErrorClass::Device, format!("cuda:{ordinal}: {e}")))
            })
        })
    }
}
