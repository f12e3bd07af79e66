//! Where a plan is carried out: on the host in place (the GIL released), or on the GPU through the
//! `logits-processing-cuda` crate (feature `cuda`): by its kernels, or by the host round trip (the
//! rows copied to the host, edited by the CPU path, copied back) for the plans the kernels do not
//! carry, on a device whose kernels could not load or failed their self-check, and for every step
//! with `LOGITS_PROCESSING_DEVICE=host`. With `LOGITS_PROCESSING_DEVICE=interpret`, host tensors
//! take the device path, the kernels being the Triton ones under Triton's interpreter (the test
//! command's way to run the device path without a GPU). Without the feature a CUDA tensor is a
//! `DeviceError` naming its device.

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

/// What a step on the device left for the processors' next step (the kernels' outcomes, read back:
/// `logits_processing_cuda::Readback`), collected before they plan again; nothing without the
/// `cuda` feature.
#[derive(Default)]
pub(crate) struct Pending {
    #[cfg(feature = "cuda")]
    readback: logits_processing_cuda::Readback,
}

impl Pending {
    /// Records the last step's outcomes in the batch's plans (waiting for their copy, when one is
    /// in flight): before the batch plans again, or its rows change.
    pub(crate) fn collect_batch(&mut self, py: Python<'_>, batch: &mut Batch) -> PyResult<()> {
        #[cfg(feature = "cuda")]
        return self.collect(py, |readback| readback.collect_batch(batch, true));
        #[cfg(not(feature = "cuda"))]
        {
            let _ = (py, batch);
            Ok(())
        }
    }

    /// [`Pending::collect_batch`] for a single row's pipeline.
    pub(crate) fn collect_pipeline(
        &mut self,
        py: Python<'_>,
        pipeline: &mut Pipeline,
    ) -> PyResult<()> {
        #[cfg(feature = "cuda")]
        return self.collect(py, |readback| readback.collect_pipeline(pipeline, true));
        #[cfg(not(feature = "cuda"))]
        {
            let _ = (py, pipeline);
            Ok(())
        }
    }

    /// Runs `collect` when outcomes wait, without the GIL; on an error they are dropped.
    #[cfg(feature = "cuda")]
    fn collect(
        &mut self,
        py: Python<'_>,
        collect: impl FnOnce(
                &mut logits_processing_cuda::Readback,
            ) -> Result<bool, logits_processing_cuda::CudaError>
            + Send,
    ) -> PyResult<()> {
        if !self.readback.is_armed() {
            return Ok(());
        }
        let readback = &mut self.readback;
        if let Err(error) = py.detach(|| collect(readback)) {
            readback.discard();
            return Err(new_err(ErrorClass::Device, error.to_string()));
        }
        Ok(())
    }

    /// Forgets the last step's outcomes (the processors start over).
    pub(crate) fn discard(&mut self) {
        #[cfg(feature = "cuda")]
        self.readback.discard();
    }
}

/// Applies a validated plan to the one row of `block`.
pub(crate) fn apply_row(py: Python<'_>, plan: &mut RowPlan, block: Block) -> PyResult<()> {
    if plan.is_empty() {
        return Ok(());
    }
    #[cfg(feature = "cuda")]
    if let Some(route) = cuda::route(py, block, || {
        logits_processing_cuda::packed::kernel_carries(plan)
    })? {
        return match route {
            cuda::Route::Kernels(ordinal) => {
                cuda::apply_plans(py, ordinal, &[(0, &*plan)], &|_| &[], block, None)
            }
            cuda::Route::Interpret => cuda::interpret_plans(
                py,
                || std::iter::once((0, &*plan)),
                &|_| &[],
                block,
                None,
                0,
            ),
            cuda::Route::RoundTrip => {
                cuda::on_host_copy(py, block, |host| edit_row(plan, host).py())
            }
        };
    }
    match block.device {
        Device::Cpu => py.detach(|| edit_row(plan, block)).py(),
        other => Err(unsupported(other)),
    }
}

/// `plan` applied to the host row `block`.
fn edit_row(plan: &mut RowPlan, block: Block) -> CoreResult<()> {
    // SAFETY: the dtype matches, the block is on the host, and this call has it alone.
    match block.dtype {
        DType::F32 => plan.apply(unsafe { block.slice::<f32>() }),
        DType::F16 => plan.apply(unsafe { block.slice::<f16>() }),
        DType::BF16 => plan.apply(unsafe { block.slice::<bf16>() }),
    }
}

/// Applies a pipeline's last (validated) plan, which has no external steps, to the one row of
/// `block`.
pub(crate) fn apply_pipeline_row(
    py: Python<'_>,
    pipeline: &mut Pipeline,
    block: Block,
    pending: &mut Pending,
) -> PyResult<()> {
    #[cfg(feature = "cuda")]
    if let Some(route) = cuda::route(py, block, || cuda::carries_pipeline(pipeline))? {
        // Without external steps, the pipeline's plan is its one stage.
        let plan = match pipeline.stages().first() {
            Some(logits_processing::Stage::Plan(plan)) => plan,
            _ => return Ok(()),
        };
        let readback = Some(&mut pending.readback);
        let eos = pipeline.eos_token_ids();
        return match route {
            cuda::Route::Kernels(ordinal) => {
                cuda::apply_plans(py, ordinal, &[(0, plan)], &|_| eos, block, readback)
            }
            cuda::Route::Interpret => cuda::interpret_plans(
                py,
                || std::iter::once((0, plan)),
                &|_| eos,
                block,
                readback,
                0,
            ),
            cuda::Route::RoundTrip => {
                cuda::on_host_copy(py, block, |host| edit_pipeline_row(pipeline, host).py())
            }
        };
    }
    let _ = pending;
    match block.device {
        Device::Cpu => py.detach(|| edit_pipeline_row(pipeline, block)).py(),
        other => Err(unsupported(other)),
    }
}

/// A pipeline's last (validated) plan, without external steps, applied to the host row `block`.
fn edit_pipeline_row(pipeline: &mut Pipeline, block: Block) -> CoreResult<()> {
    fn run<T: Logit>(pipeline: &mut Pipeline, block: Block) -> CoreResult<()> {
        // SAFETY: the dtype matches, the block is on the host, and this call has it alone.
        let row = unsafe { block.slice::<T>() };
        pipeline.apply_planned(row, &mut |key, _| {
            Err(Error::External(format!(
                "no callable for external step {key}"
            )))
        })
    }
    match block.dtype {
        DType::F32 => run::<f32>(pipeline, block),
        DType::F16 => run::<f16>(pipeline, block),
        DType::BF16 => run::<bf16>(pipeline, block),
    }
}

/// Applies a planned batch to `block` in place, where it lives (see [`apply_batch_host`] for the
/// host, `cuda::apply_batch` for a device).
pub(crate) fn apply_batch(
    py: Python<'_>,
    batch: &mut Batch,
    block: Block,
    external: &mut (dyn FnMut(usize, u64) -> CoreResult<()> + Send),
    pending: &mut Pending,
) -> PyResult<()> {
    #[cfg(feature = "cuda")]
    if cuda::takes(block) {
        return cuda::apply_batch(py, batch, block, external, &mut pending.readback);
    }
    let _ = pending;
    match block.device {
        Device::Cpu => apply_batch_host(py, batch, block, external),
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

/// The GPU path, against the contract in `crates/cuda/src/lib.rs`, and the host round trip.
#[cfg(feature = "cuda")]
pub(crate) mod cuda {
    use std::collections::hash_map::Entry;
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Mutex;

    use logits_processing::{Batch, BatchLayout, Pipeline, RowPlan, Stage};
    use logits_processing_cuda::packed::{
        kernel_carries, level_externals, level_net, level_plans, levels, needs_host,
        rows_ending_outside, PackedPlans,
    };
    use logits_processing_cuda::round_trip::{
        self, CopiedMemory, DeviceStaging, HostMemory, HostRows,
    };
    use logits_processing_cuda::{CudaBatchApplier, CudaError, Readback};
    use pyo3::prelude::*;

    use super::unsupported;
    use crate::errors::{new_err, ErrorClass, IntoPyResult};
    use crate::tensor::{Block, Device};

    /// A device's kernels: ready, or refused (they could not load, or failed the self-check; the
    /// warning said why), in which case its steps take the host round trip.
    enum Kernels {
        Ready(Box<CudaBatchApplier>),
        Refused,
    }

    // One entry per device: kernels loaded once, buffers reused.
    static KERNELS: Mutex<Option<HashMap<i32, Kernels>>> = Mutex::new(None);
    // One pinned staging buffer per device for the round trip.
    static STAGING: Mutex<Option<HashMap<i32, DeviceStaging>>> = Mutex::new(None);

    /// Test hooks: host tensors sent through the round trip (copies of host memory, as a device's
    /// are made), and the waits the round trip has made.
    pub(crate) static ROUND_TRIP_HOST_TENSORS: AtomicBool = AtomicBool::new(false);
    pub(crate) static ROUND_TRIP_WAITS: AtomicUsize = AtomicUsize::new(0);

    /// How a step on a device block is carried out.
    pub(crate) enum Route {
        /// The device's kernels.
        Kernels(i32),
        /// The Triton kernels under Triton's interpreter, on a host block.
        Interpret,
        RoundTrip,
    }

    /// `LOGITS_PROCESSING_DEVICE`.
    #[derive(PartialEq)]
    enum Setting {
        /// Unset or `auto`: the kernels, the round trip where they cannot.
        Auto,
        /// `host`: the round trip for every step on a device.
        Host,
        /// `interpret`: host tensors take the device path, with the Triton kernels under Triton's
        /// interpreter (`TRITON_INTERPRET=1`) where the kernels carry the step, the round trip
        /// where they do not; device tensors as with `auto`.
        Interpret,
    }

    fn setting() -> PyResult<Setting> {
        match std::env::var("LOGITS_PROCESSING_DEVICE") {
            Err(_) => Ok(Setting::Auto),
            Ok(value) => match value.as_str() {
                "" | "auto" => Ok(Setting::Auto),
                "host" => Ok(Setting::Host),
                "interpret" => Ok(Setting::Interpret),
                other => Err(new_err(
                    ErrorClass::Device,
                    format!(
                        "LOGITS_PROCESSING_DEVICE={other:?}: expected \"auto\", \"host\" or \
                         \"interpret\""
                    ),
                )),
            },
        }
    }

    /// Whether host tensors take the device path: under `LOGITS_PROCESSING_DEVICE=interpret`, or
    /// with the round-trip test hook on. An unknown setting is refused on device tensors only.
    fn host_takes_device_path() -> bool {
        ROUND_TRIP_HOST_TENSORS.load(Ordering::Relaxed)
            || setting().is_ok_and(|s| s == Setting::Interpret)
    }

    /// The route for a step on `block`: `None` for a host block edited in place (the host path),
    /// else the kernels when they carry the step (`carries`) and may run, or the round trip.
    pub(crate) fn route(
        py: Python<'_>,
        block: Block,
        carries: impl FnOnce() -> bool,
    ) -> PyResult<Option<Route>> {
        match block.device {
            Device::Cpu if ROUND_TRIP_HOST_TENSORS.load(Ordering::Relaxed) => {
                Ok(Some(Route::RoundTrip))
            }
            Device::Cpu if setting()? == Setting::Interpret => Ok(Some(if carries() {
                Route::Interpret
            } else {
                Route::RoundTrip
            })),
            Device::Cuda(ordinal) => {
                if setting()? == Setting::Host
                    || !carries()
                    || !kernels_usable(py, ordinal, block.vocab)?
                {
                    Ok(Some(Route::RoundTrip))
                } else {
                    Ok(Some(Route::Kernels(ordinal)))
                }
            }
            _ => Ok(None),
        }
    }

    /// Whether a batch step on `block` takes this module's path: a device block, or a host block
    /// under `interpret` or the test hook.
    pub(crate) fn takes(block: Block) -> bool {
        match block.device {
            Device::Cpu => host_takes_device_path(),
            _ => true,
        }
    }

    pub(crate) fn carries_pipeline(pipeline: &Pipeline) -> bool {
        pipeline.stages().iter().all(|stage| match stage {
            Stage::Plan(plan) => kernel_carries(plan),
            Stage::External(_) => true,
        })
    }

    /// Whether the device's kernels may run: loaded and self-checked on first use (at the block's
    /// vocab). Kernels that could not load or failed the self-check are refused for the process,
    /// with one warning naming why; that device's steps then take the round trip.
    fn kernels_usable(py: Python<'_>, ordinal: i32, vocab: usize) -> PyResult<bool> {
        if !logits_processing_cuda::cuda_available() {
            return Err(unsupported(Device::Cuda(ordinal)));
        }
        // The lock is taken without the GIL: a step holding it may call a user's processor,
        // which takes the GIL.
        let outcome = py.detach(|| {
            let mut guard = KERNELS.lock().unwrap_or_else(|e| e.into_inner());
            let kernels = guard.get_or_insert_with(HashMap::new);
            if let Some(entry) = kernels.get(&ordinal) {
                return Ok(Ok(matches!(entry, Kernels::Ready(_))));
            }
            match CudaBatchApplier::new(ordinal as usize, vocab) {
                Ok(applier) => {
                    kernels.insert(ordinal, Kernels::Ready(Box::new(applier)));
                    Ok(Ok(true))
                }
                Err(error @ (CudaError::SelfCheck(_) | CudaError::Compile(_))) => {
                    kernels.insert(ordinal, Kernels::Refused);
                    Ok(Err(error.to_string()))
                }
                Err(error) => Err(error),
            }
        });
        match outcome {
            Ok(Ok(usable)) => Ok(usable),
            Ok(Err(why)) => {
                let message = format!(
                    "logits_processing: cuda:{ordinal}: {why}; every step on this device now \
                     copies its rows to the host and back (exact, slower)"
                );
                let category = py.get_type::<pyo3::exceptions::PyRuntimeWarning>();
                PyErr::warn(
                    py,
                    &category,
                    &std::ffi::CString::new(message).unwrap_or_default(),
                    1,
                )?;
                Ok(false)
            }
            Err(error) => Err(device_error(ordinal, error)),
        }
    }

    fn device_error(ordinal: i32, error: CudaError) -> PyErr {
        new_err(ErrorClass::Device, format!("cuda:{ordinal}: {error}"))
    }

    fn with_applier<R>(
        ordinal: i32,
        f: impl FnOnce(&mut CudaBatchApplier) -> PyResult<R>,
    ) -> PyResult<R> {
        let mut guard = KERNELS.lock().unwrap_or_else(|e| e.into_inner());
        match guard.as_mut().and_then(|kernels| kernels.get_mut(&ordinal)) {
            Some(Kernels::Ready(applier)) => f(applier),
            // `route` chose the kernels only once they were ready.
            _ => Err(unsupported(Device::Cuda(ordinal))),
        }
    }

    /// Runs `f` on the memory of `block` reached by copies: the device's through its staging
    /// buffer, on the block's stream; or, for the test hook, the host block's own.
    fn with_memory<R>(
        block: Block,
        f: impl FnOnce(&mut dyn CopiedMemory) -> Result<R, CudaError>,
    ) -> PyResult<R> {
        match block.device {
            Device::Cuda(ordinal) => {
                let mut guard = STAGING.lock().unwrap_or_else(|e| e.into_inner());
                let staging = match guard.get_or_insert_with(HashMap::new).entry(ordinal) {
                    Entry::Occupied(entry) => entry.into_mut(),
                    Entry::Vacant(entry) => entry.insert(
                        DeviceStaging::new(ordinal as usize)
                            .map_err(|e| device_error(ordinal, e))?,
                    ),
                };
                // SAFETY: the block describes the caller's live CUDA tensor on `ordinal`, and its
                // stream is the producer's.
                let mut memory =
                    unsafe { staging.memory(block.data as u64, block.stream.unwrap_or(0)) }
                        .map_err(|e| device_error(ordinal, e))?;
                f(&mut memory).map_err(|e| device_error(ordinal, e))
            }
            _ => {
                let bytes = block.len() * block.dtype.size();
                // SAFETY: the host block is the caller's live tensor, edited by this call alone.
                let mut memory = unsafe { HostMemory::new(block.data, bytes) };
                let result = f(&mut memory);
                ROUND_TRIP_WAITS.fetch_add(memory.waits, Ordering::Relaxed);
                result.map_err(|e| new_err(ErrorClass::Device, e.to_string()))
            }
        }
    }

    /// One row (a processor's) by the round trip: copied to the host, `edit` run on the copy by
    /// the host path, copied back; on error nothing is written back. Without the GIL: the
    /// staging lock may be held by a step that calls a user's processor.
    pub(crate) fn on_host_copy(
        py: Python<'_>,
        block: Block,
        edit: impl FnOnce(Block) -> PyResult<()> + Send,
    ) -> PyResult<()> {
        let layout = BatchLayout {
            rows: 1,
            row_stride: block.vocab,
        };
        py.detach(|| {
            let mut edited = Ok(());
            let copied = with_memory(block, |memory| {
                let staged = HostRows::read(memory, vec![0], block.dtype, layout, block.vocab)?;
                let (host, _) = staged.host();
                let host_block = Block {
                    data: host,
                    row_stride: block.vocab,
                    rows: 1,
                    device: Device::Cpu,
                    stream: None,
                    ..block
                };
                edited = edit(host_block);
                match edited {
                    Ok(()) => staged.write_back(),
                    Err(_) => Ok(()),
                }
            });
            edited.and(copied)
        })
    }

    /// One launch for the listed rows' plans, on the producer's current stream, with the safety
    /// net of the rows `nets` gives EOS ids; what their processors read at the next step read
    /// back into `readback` when given.
    pub(crate) fn apply_plans<'e>(
        py: Python<'_>,
        ordinal: i32,
        plans: &[(usize, &RowPlan)],
        nets: &(dyn Fn(usize) -> &'e [u32] + Sync),
        block: Block,
        readback: Option<&mut Readback>,
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
                        nets,
                        readback,
                    )
                }
                .map_err(|e| device_error(ordinal, e))
            })
        })
    }

    /// One launch of the Triton kernels, under Triton's interpreter, for the listed rows' plans
    /// on the host block: the plans packed as for a device (`PackedPlans`), then
    /// `logits_processing.kernels.launch` runs the band and apply kernels on them; what the
    /// processors read at their next step is kept in `readback` (for stage `level`) when given.
    pub(crate) fn interpret_plans<'a, 'e, F, I>(
        py: Python<'_>,
        plans: F,
        nets: &dyn Fn(usize) -> &'e [u32],
        block: Block,
        readback: Option<&mut Readback>,
        level: usize,
    ) -> PyResult<()>
    where
        F: Fn() -> I,
        I: Iterator<Item = (usize, &'a RowPlan)>,
    {
        let host_error = |e: CudaError| new_err(ErrorClass::Device, e.to_string());
        let mut packed = PackedPlans::new();
        packed
            .pack_with_nets(plans, block.rows, block.vocab, nets)
            .map_err(host_error)?;
        if packed.slots() == 0 || block.vocab == 0 {
            return Ok(());
        }
        let (list, truncating) = packed.truncating();
        let words: Vec<u8> = packed
            .words()
            .iter()
            .flat_map(|w| w.to_ne_bytes())
            .collect();
        let left = py.import("logits_processing.kernels")?.call_method1(
            "launch",
            (
                pyo3::types::PyBytes::new(py, &words),
                packed.snapshot_words(),
                packed.slots(),
                list,
                truncating,
                block.vocab,
                block.row_stride,
                block.rows,
                block.dtype.name(),
                block.data as usize,
            ),
        )?;
        if let Some(readback) = readback {
            let bytes = left.cast::<pyo3::types::PyBytes>()?.as_bytes();
            let words = bytes
                .chunks_exact(4)
                .map(|w| u32::from_ne_bytes([w[0], w[1], w[2], w[3]]))
                .collect();
            readback.store(level, &packed, block.vocab, words);
        }
        Ok(())
    }

    /// A planned batch by the Triton kernels under the interpreter: one launch per stage level,
    /// `external(row, key)` for each external step after its level's launch (as the device's
    /// kernels run it).
    fn interpret_batch(
        py: Python<'_>,
        batch: &mut Batch,
        block: Block,
        external: &mut (dyn FnMut(usize, u64) -> logits_processing::Result<()> + Send),
        readback: &mut Readback,
    ) -> PyResult<()> {
        batch.check_layout(block.len(), block.layout()).py()?;
        for level in 0..levels(batch) {
            interpret_plans(
                py,
                || level_plans(batch, level),
                &|row| level_net(batch, level, row),
                block,
                Some(&mut *readback),
                level,
            )?;
            for (row, key) in level_externals(batch, level).collect::<Vec<_>>() {
                external(row, key).py()?;
            }
        }
        // The safety net of the rows whose step ends with an external step.
        let empty = RowPlan::new();
        interpret_plans(
            py,
            || rows_ending_outside(batch).map(|row| (row, &empty)),
            &|row| batch.get(row).map_or(&[], |p| p.eos_token_ids()),
            block,
            None,
            0,
        )
    }

    /// Runs `step` on the batch. A step of several stages (a user's processor between built-ins)
    /// edits the block more than once, so that a failure after the first launch would leave it
    /// half edited: its rows are first copied to the host (the step's one wait), and written back
    /// if the step fails.
    fn saving_rows(
        block: Block,
        batch: &mut Batch,
        step: impl FnOnce(&mut Batch) -> PyResult<()>,
    ) -> PyResult<()> {
        if levels(batch) < 2 {
            return step(batch);
        }
        let rows = batch.iter().map(|(row, _)| row).collect();
        let mut result = Ok(());
        with_memory(block, |memory| {
            let saved = HostRows::read(memory, rows, block.dtype, block.layout(), block.vocab)?;
            result = step(batch);
            match result {
                Ok(()) => Ok(()),
                Err(_) => saved.write_back(),
            }
        })?;
        result
    }

    /// A planned batch on a device block (or a host block, with the test hook): by the kernels
    /// (one launch per stage level, `external(row, key)` editing its row on the same stream in
    /// between), or by the round trip. A failed step takes back every row's plan and leaves the
    /// logits as they were (`saving_rows`; the round trip writes nothing back).
    pub(crate) fn apply_batch(
        py: Python<'_>,
        batch: &mut Batch,
        block: Block,
        external: &mut (dyn FnMut(usize, u64) -> logits_processing::Result<()> + Send),
        readback: &mut Readback,
    ) -> PyResult<()> {
        let route = match route(py, block, || !needs_host(batch)) {
            Ok(Some(route)) => route,
            Ok(None) => unreachable!("only device blocks and the test hook's take this path"),
            Err(error) => {
                batch.undo_plan();
                return Err(error);
            }
        };
        let result = match route {
            Route::Interpret => saving_rows(block, batch, |batch| {
                interpret_batch(py, batch, block, &mut *external, &mut *readback)
            }),
            Route::RoundTrip => {
                return py.detach(|| {
                    with_memory(block, |memory| {
                        round_trip::apply_batch(
                            memory,
                            batch,
                            block.dtype,
                            block.layout(),
                            external,
                        )
                    })
                })
            }
            Route::Kernels(ordinal) => {
                let stream = block.stream.unwrap_or(0);
                py.detach(|| {
                    saving_rows(block, batch, |batch| {
                        with_applier(ordinal, |applier| {
                            // SAFETY: the block describes the caller's live CUDA tensor on
                            // `ordinal`.
                            unsafe {
                                applier.apply_batch(
                                    batch,
                                    block.data as u64,
                                    block.dtype,
                                    block.layout(),
                                    stream,
                                    &mut |row, key| external(row, key).map_err(CudaError::from),
                                    &mut *readback,
                                )
                            }
                            .map_err(|e| device_error(ordinal, e))
                        })
                    })
                })
            }
        };
        if result.is_err() {
            batch.undo_plan();
            readback.discard();
        }
        result
    }
}
