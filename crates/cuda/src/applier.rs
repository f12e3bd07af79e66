//! [`CudaBatchApplier`]: packs a step's plans, copies them from pinned memory, launches the band
//! kernel (rows that truncate) and the apply kernel.

use std::sync::Arc;

use cudarc::driver::sys::{self as cu, CUresult};
use logits_processing::{Batch, BatchLayout, DType, RowPlan};

use crate::driver::{self, check, CurrentContext, Kernel, Kernels};
use crate::packed::{
    level_externals, level_net, level_plans, levels, rows_ending_outside, tiles_per_row,
    PackedPlans,
};
use crate::{CudaError, Readback};

/// A staging area for one step's packed plans: pinned host memory, the device copy the kernel
/// reads, and an event recorded after the launch. Reused only once the event has completed, so a
/// copy or a kernel still in flight never sees its buffer overwritten.
struct Slot {
    host: *mut u8,
    device: cu::CUdeviceptr,
    capacity: usize,
    event: cu::CUevent,
}

/// A ring this long that is still entirely in flight makes the next step wait for the oldest
/// (the GPU is then this many steps behind the host; the wait is the back-pressure).
const MAX_SLOTS: usize = 16;
/// The smallest staging allocation; each growth doubles.
const MIN_CAPACITY: usize = 64 * 1024;

/// One device's kernels (loaded once per process, cached) and this applier's reusable pinned and
/// device buffers.
///
/// Each call packs the plans on the host (no allocation once the buffers have grown to the batch's
/// needs), copies them asynchronously from pinned memory to the device on the caller's stream, and
/// launches on that stream the band kernel when some row truncates, then one kernel that edits
/// every listed row in place, each logit read and written at most once. Nothing waits for the GPU: a staging slot is reused only after its event
/// has completed, and a new slot is added while all are in flight (up to 16; past that the call
/// waits for the oldest).
///
/// Not `Sync`: one applier per thread (or behind a lock); several appliers may share a device.
pub struct CudaBatchApplier {
    kernels: Arc<Kernels>,
    ordinal: usize,
    packed: PackedPlans,
    slots: Vec<Slot>,
    next: usize,
}

// SAFETY: the raw pointers are this applier's own pinned and device allocations and driver events,
// usable from any thread once its context is current (every method pushes it).
unsafe impl Send for CudaBatchApplier {}

impl std::fmt::Debug for CudaBatchApplier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaBatchApplier")
            .field("device", &self.ordinal)
            .field("kernels", &self.kernels.origin)
            .field("slots", &self.slots.len())
            .finish()
    }
}

impl CudaBatchApplier {
    /// An applier for GPU `device_ordinal`, loading the kernels there on first use in this process
    /// (the embedded cubin for its architecture, or the PTX the driver compiles; later appliers
    /// reuse them) and running the device's self-check once, at `vocab_size` (the engine's; at
    /// least 2,053): 256 rows covering every kind of edit, GPU against CPU, bit for bit;
    /// [`CudaError::SelfCheck`] with the first difference if they disagree, for this and every
    /// later applier on the device. A clear error, never a panic, where there is no driver
    /// ([`CudaError::NoDriver`]) or no such device ([`CudaError::NoDevice`]).
    pub fn new(device_ordinal: usize, vocab_size: usize) -> Result<Self, CudaError> {
        let kernels = driver::kernels(device_ordinal)?;
        crate::self_check::ensure(&kernels, device_ordinal, vocab_size)?;
        Ok(Self::with_kernels(kernels, device_ordinal))
    }

    /// An applier on kernels already loaded, without the self-check (which uses one).
    pub(crate) fn with_kernels(kernels: Arc<Kernels>, device_ordinal: usize) -> Self {
        Self {
            kernels,
            ordinal: device_ordinal,
            packed: PackedPlans::new(),
            slots: vec![],
            next: 0,
        }
    }

    /// The device this applier launches on.
    pub fn device_ordinal(&self) -> usize {
        self.ordinal
    }

    /// Staging slots allocated so far: how many steps have been in flight at once (at most 16).
    pub fn staging_slots(&self) -> usize {
        self.slots.len()
    }

    /// Which of the embedded images the device runs: `"sm_90 cubin"` (machine code for its
    /// architecture) or `"compute_75 PTX"` (compiled by the driver at first use).
    pub fn kernel_origin(&self) -> &str {
        &self.kernels.origin
    }

    /// Applies one plan per listed row in one launch (two when some rows truncate: their bands
    /// first); rows not listed, and rows with empty plans, are untouched. `logits`: device pointer to the block's first element; `stream`: a raw
    /// `CUstream` (0 = the legacy default stream). Returns once the work is queued.
    ///
    /// Errors (nothing is queued): a null or misaligned pointer, a row outside `layout` or listed
    /// twice, a stride below the vocab, a plan naming a token outside the vocab, a driver error.
    ///
    /// What the kernels resolve for the processors' next step (a conditional force's outcome,
    /// mirostat's kept probabilities) is read back into `readback` when given (collect it before
    /// the next plan: [`Readback::collect_batch`]), else not kept. A row `nets` gives EOS ids to
    /// gets them, every other logit `-inf`, where its plan leaves it no finite logit (the
    /// pipeline's safety net; `&|_| &[]` for none).
    ///
    /// # Safety
    /// `logits` must be a live device allocation on this device, in its primary context (torch's),
    /// covering `layout` (`layout.required_len(vocab_size)` elements of `dtype`), and `stream` a
    /// live stream of that context (or 0); nothing else may write those rows until the work is done.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn apply_plans<'e>(
        &mut self,
        plans: &[(usize, &RowPlan)],
        logits: u64,
        dtype: DType,
        layout: BatchLayout,
        vocab_size: usize,
        stream: u64,
        nets: &dyn Fn(usize) -> &'e [u32],
        mut readback: Option<&mut Readback>,
    ) -> Result<(), CudaError> {
        uncollected(readback.as_deref())?;
        let result = self
            .apply_rows(
                || plans.iter().copied(),
                nets,
                logits,
                dtype,
                layout,
                vocab_size,
                stream,
                readback.as_deref_mut().map(|r| (r, 0)),
            )
            .and_then(|()| record(self.kernels.ctx, stream, readback.as_deref_mut()));
        if let (Err(_), Some(readback)) = (&result, readback) {
            readback.discard();
        }
        result
    }

    /// A planned batch (after [`Batch::plan`]): stage by stage, one launch per stage level (the
    /// k-th stage of every row whose k-th stage is a plan), and `external(row, key)` for each
    /// external step in its place, after the launch of its level (the callback edits that row on
    /// the same stream). Levels with no plan launch nothing. What the processors read at their
    /// next step is read back into `readback`: collect it ([`Readback::collect_batch`]) before
    /// the batch is planned again or its rows change; on an error, it holds nothing.
    ///
    /// # Safety
    /// As for [`CudaBatchApplier::apply_plans`], with the batch's vocab size.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn apply_batch(
        &mut self,
        batch: &mut Batch,
        logits: u64,
        dtype: DType,
        layout: BatchLayout,
        stream: u64,
        external: &mut dyn FnMut(usize, u64) -> Result<(), CudaError>,
        readback: &mut Readback,
    ) -> Result<(), CudaError> {
        uncollected(Some(readback))?;
        let vocab = batch.vocab_size();
        batch.check_layout(layout.required_len(vocab), layout)?;
        let result = (|| {
            for level in 0..levels(batch) {
                self.apply_rows(
                    || level_plans(batch, level),
                    &|row| level_net(batch, level, row),
                    logits,
                    dtype,
                    layout,
                    vocab,
                    stream,
                    Some((&mut *readback, level)),
                )?;
                for (row, key) in level_externals(batch, level) {
                    external(row, key)?;
                }
            }
            // The safety net of the rows whose step ends with an external step.
            let empty = RowPlan::new();
            self.apply_rows(
                || rows_ending_outside(batch).map(|row| (row, &empty)),
                &|row| batch.get(row).map_or(&[], |p| p.eos_token_ids()),
                logits,
                dtype,
                layout,
                vocab,
                stream,
                None,
            )?;
            record(self.kernels.ctx, stream, Some(&mut *readback))
        })();
        if result.is_err() {
            readback.discard();
        }
        result
    }

    #[allow(clippy::too_many_arguments)]
    unsafe fn apply_rows<'a, 'e, F, I>(
        &mut self,
        plans: F,
        nets: &dyn Fn(usize) -> &'e [u32],
        logits: u64,
        dtype: DType,
        layout: BatchLayout,
        vocab_size: usize,
        stream: u64,
        readback: Option<(&mut Readback, usize)>,
    ) -> Result<(), CudaError>
    where
        F: Fn() -> I,
        I: Iterator<Item = (usize, &'a RowPlan)>,
    {
        if layout.row_stride < vocab_size {
            return Err(CudaError::InvalidArgument(format!(
                "row stride {} is less than the vocab size {vocab_size}",
                layout.row_stride
            )));
        }
        self.packed
            .pack_with_nets(plans, layout.rows, vocab_size, nets)?;
        let slots = self.packed.slots();
        if slots == 0 || vocab_size == 0 {
            return Ok(());
        }
        if logits == 0 || !logits.is_multiple_of(dtype.size() as u64) {
            return Err(CudaError::InvalidArgument(format!(
                "logits pointer {logits:#x} is null or not aligned to its {} elements",
                dtype.name()
            )));
        }
        let tiles = tiles_per_row(vocab_size);
        let blocks = slots
            .checked_mul(tiles)
            .filter(|&b| b <= i32::MAX as usize)
            .ok_or_else(|| {
                CudaError::InvalidArgument(format!(
                    "{slots} rows of {tiles} tiles are too many blocks"
                ))
            })?;
        let bytes = self.packed.words().len() * 4;
        // The device buffer also holds the snapshots the band kernel writes after the words.
        let capacity = bytes + self.packed.snapshot_words() * 4;

        let _current = CurrentContext::push(self.kernels.ctx)?;
        let stream = stream as cu::CUstream;
        let slot = self.acquire(capacity)?;
        let slot = &self.slots[slot];
        // The slot is idle: neither a copy nor a kernel reads it any more.
        std::ptr::copy_nonoverlapping(self.packed.words().as_ptr().cast::<u8>(), slot.host, bytes);
        check(
            cu::cuMemcpyHtoDAsync_v2(slot.device, slot.host.cast(), bytes, stream),
            "cuMemcpyHtoDAsync",
        )?;
        let (apply, bands) = self.kernels.for_dtype(dtype);
        let mut packed = slot.device;
        let mut vocab = vocab_size as u32;
        let mut row_stride = layout.row_stride as u64;
        let mut logits = logits;
        // Triton's scratch pointers: the kernels need none (python/tools/gen_kernels.py checks).
        let mut scratch: u64 = 0;
        let mut profile: u64 = 0;
        let (list, truncating) = self.packed.truncating();
        if truncating > 0 {
            let mut list = list as u32;
            // lp_bands(P, list_at, vocab, row_stride, X, scratch, profile): a test holds every
            // image to this list.
            let mut params: [*mut std::ffi::c_void; 7] = [
                (&mut packed as *mut u64).cast(),
                (&mut list as *mut u32).cast(),
                (&mut vocab as *mut u32).cast(),
                (&mut row_stride as *mut u64).cast(),
                (&mut logits as *mut u64).cast(),
                (&mut scratch as *mut u64).cast(),
                (&mut profile as *mut u64).cast(),
            ];
            launch(bands, truncating as u32, stream, &mut params)?;
        }
        let mut n_slots = slots as u32;
        let mut tiles_per_row = tiles as u32;
        // lp_apply(P, n_slots, tiles_per_row, vocab, row_stride, X, scratch, profile).
        let mut params: [*mut std::ffi::c_void; 8] = [
            (&mut packed as *mut u64).cast(),
            (&mut n_slots as *mut u32).cast(),
            (&mut tiles_per_row as *mut u32).cast(),
            (&mut vocab as *mut u32).cast(),
            (&mut row_stride as *mut u64).cast(),
            (&mut logits as *mut u64).cast(),
            (&mut scratch as *mut u64).cast(),
            (&mut profile as *mut u64).cast(),
        ];
        launch(apply, blocks as u32, stream, &mut params)?;
        if let Some((readback, level)) = readback {
            readback.copy_from_device(level, &self.packed, vocab_size, slot.device, stream)?;
        }
        check(cu::cuEventRecord(slot.event, stream), "cuEventRecord")?;
        Ok(())
    }

    /// An idle staging slot holding at least `bytes`, without waiting for the GPU unless
    /// [`MAX_SLOTS`] steps are in flight. Call with the context current.
    unsafe fn acquire(&mut self, bytes: usize) -> Result<usize, CudaError> {
        let n = self.slots.len();
        let mut found = None;
        for k in 0..n {
            let i = (self.next + k) % n;
            match cu::cuEventQuery(self.slots[i].event) {
                CUresult::CUDA_SUCCESS => {
                    found = Some(i);
                    break;
                }
                CUresult::CUDA_ERROR_NOT_READY => {}
                error => return Err(CudaError::Driver(format!("cuEventQuery failed: {error:?}"))),
            }
        }
        let i = match found {
            Some(i) => i,
            None if n < MAX_SLOTS => {
                self.slots.push(Slot::new()?);
                n
            }
            None => {
                let i = self.next % n;
                crate::count_wait();
                check(
                    cu::cuEventSynchronize(self.slots[i].event),
                    "cuEventSynchronize",
                )?;
                i
            }
        };
        self.next = (i + 1) % self.slots.len();
        if self.slots[i].capacity < bytes {
            self.slots[i].grow(bytes)?;
        }
        Ok(i)
    }
}

/// A readback holding a step nobody collected is refused: its outcomes would be lost.
fn uncollected(readback: Option<&Readback>) -> Result<(), CudaError> {
    match readback {
        Some(r) if r.is_armed() => Err(CudaError::InvalidArgument(
            "the previous step's readback was not collected (Readback::collect_batch)".into(),
        )),
        _ => Ok(()),
    }
}

/// Records the readback's event after the step's copies.
///
/// # Safety
/// `stream` is a live stream of `ctx` (or 0).
unsafe fn record(
    ctx: cu::CUcontext,
    stream: u64,
    readback: Option<&mut Readback>,
) -> Result<(), CudaError> {
    match readback {
        Some(readback) => {
            let _current = CurrentContext::push(ctx)?;
            readback.record(ctx, stream as cu::CUstream)
        }
        None => Ok(()),
    }
}

/// Queues `kernel` on `stream`: `blocks` programs of its threads.
///
/// # Safety
/// A context is current, and `params` point to live values of the kernel's parameters, in order.
unsafe fn launch(
    kernel: Kernel,
    blocks: u32,
    stream: cu::CUstream,
    params: &mut [*mut std::ffi::c_void],
) -> Result<(), CudaError> {
    check(
        cu::cuLaunchKernel(
            kernel.function,
            blocks,
            1,
            1,
            kernel.threads,
            1,
            1,
            kernel.shared,
            stream,
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        ),
        "cuLaunchKernel",
    )
}

impl Slot {
    /// An empty slot whose event reads as completed. Call with the context current.
    unsafe fn new() -> Result<Self, CudaError> {
        let event = driver::new_event()?;
        Ok(Self {
            host: std::ptr::null_mut(),
            device: 0,
            capacity: 0,
            event,
        })
    }

    /// Replaces the buffers with larger ones. The slot must be idle; the context current.
    unsafe fn grow(&mut self, bytes: usize) -> Result<(), CudaError> {
        self.free();
        let capacity = bytes.next_power_of_two().max(MIN_CAPACITY);
        let mut host = std::ptr::null_mut();
        check(cu::cuMemHostAlloc(&mut host, capacity, 0), "cuMemHostAlloc")?;
        self.host = host.cast();
        let mut device = 0;
        check(cu::cuMemAlloc_v2(&mut device, capacity), "cuMemAlloc")?;
        self.device = device;
        self.capacity = capacity;
        Ok(())
    }

    unsafe fn free(&mut self) {
        if !self.host.is_null() {
            cu::cuMemFreeHost(self.host.cast());
            self.host = std::ptr::null_mut();
        }
        if self.device != 0 {
            cu::cuMemFree_v2(self.device);
            self.device = 0;
        }
        self.capacity = 0;
    }
}

impl Drop for CudaBatchApplier {
    fn drop(&mut self) {
        let Ok(_current) = CurrentContext::push(self.kernels.ctx) else {
            return;
        };
        for slot in &mut self.slots {
            // SAFETY: our own event and buffers; waiting first means nothing still reads them.
            unsafe {
                cu::cuEventSynchronize(slot.event);
                slot.free();
                cu::cuEventDestroy_v2(slot.event);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::images::IMAGES;

    /// What `apply_rows` passes to each kernel, in order, as the images' PTX declares it.
    const BANDS_PARAMS: &[&str] = &["ptr", "u32", "u32", "u64", "ptr", "ptr", "ptr"];
    const APPLY_PARAMS: &[&str] = &["ptr", "u32", "u32", "u32", "u64", "ptr", "ptr", "ptr"];

    /// Every embedded image takes exactly the parameters the launches pass.
    #[test]
    fn launches_pass_what_every_image_declares() {
        for image in IMAGES {
            let expected = match image.kernel {
                "lp_bands" => BANDS_PARAMS,
                "lp_apply" => APPLY_PARAMS,
                other => panic!("an image of an unknown kernel {other}"),
            };
            assert_eq!(
                image.params, expected,
                "{} {:?}",
                image.kernel, image.target
            );
        }
    }
}
