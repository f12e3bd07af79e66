//! The host round trip: a step's rows copied from the device to the host, edited there by the CPU
//! path, copied back. Exact by construction (it is the CPU path), so it carries the steps the
//! kernels cannot: plans they do not carry ([`crate::packed::needs_host`]), every step on a device
//! whose kernels failed to load or failed their self-check, and every step when a user asks for it
//! (`LOGITS_PROCESSING_DEVICE=host`). A failed step writes nothing back: the device keeps what it
//! had, and the CPU path has taken back every row's state.
//!
//! The copies go through [`CopiedMemory`]: the device's (on the caller's stream, staged in pinned
//! memory, one wait a step for the rows to reach the host) or, for tests on machines without a
//! GPU, host memory reached the same way.

use cudarc::driver::sys as cu;
use logits_processing::{bf16, f16, Batch, BatchLayout, DType, Error, Logit};

use crate::driver::{self, check, CurrentContext};

use crate::CudaError;

/// Memory that the host reaches only by queued copies (a device's, on one stream), through a host
/// staging buffer that the implementation owns.
pub trait CopiedMemory {
    /// The staging buffer, at least `bytes` long. Safe to write once the copies queued before this
    /// call from it are done (the implementation waits for those if it must).
    fn staging(&mut self, bytes: usize) -> Result<*mut u8, CudaError>;
    /// Queues a copy of `len` bytes at `from` in the memory to `to` in the staging buffer.
    fn read(&mut self, from: usize, to: usize, len: usize) -> Result<(), CudaError>;
    /// Queues a copy of `len` bytes at `from` in the staging buffer to `to` in the memory.
    fn write(&mut self, from: usize, to: usize, len: usize) -> Result<(), CudaError>;
    /// Waits until every queued copy is done (the host may then read the staging buffer).
    fn wait(&mut self) -> Result<(), CudaError>;
}

/// The listed rows of a block, staged on the host as a dense block of the same rows (row `r` at
/// `r * vocab`), to be edited there and written back.
pub struct HostRows<'m> {
    memory: &'m mut dyn CopiedMemory,
    host: *mut u8,
    rows: Vec<usize>,
    row_bytes: usize,
    stride_bytes: usize,
    layout: BatchLayout,
    /// Rows written to the device during the step (for an external step there), which a failed
    /// step writes back once the CPU path has restored them on the host.
    synced: Vec<usize>,
}

impl<'m> HostRows<'m> {
    /// Copies `rows` of the block (`layout` of `dtype` logits, `vocab` a row) to the host, and
    /// waits for them: the step's one wait.
    pub fn read(
        memory: &'m mut dyn CopiedMemory,
        rows: Vec<usize>,
        dtype: DType,
        layout: BatchLayout,
        vocab: usize,
    ) -> Result<Self, CudaError> {
        if let Some(&row) = rows.iter().find(|&&row| row >= layout.rows) {
            return Err(CudaError::InvalidArgument(format!(
                "row {row} is outside the block's {} rows",
                layout.rows
            )));
        }
        if layout.row_stride < vocab {
            return Err(CudaError::InvalidArgument(format!(
                "row stride {} is less than the vocab size {vocab}",
                layout.row_stride
            )));
        }
        let size = dtype.size();
        let row_bytes = vocab * size;
        let bytes = layout.rows.checked_mul(row_bytes).ok_or_else(|| {
            CudaError::InvalidArgument(format!("{} rows of {vocab} logits", layout.rows))
        })?;
        let host = memory.staging(bytes)?;
        let mut staged = Self {
            memory,
            host,
            rows,
            row_bytes,
            stride_bytes: layout.row_stride * size,
            layout: BatchLayout {
                rows: layout.rows,
                row_stride: vocab,
            },
            synced: vec![],
        };
        for k in 0..staged.rows.len() {
            staged.read_row(staged.rows[k])?;
        }
        staged.memory.wait()?;
        Ok(staged)
    }

    /// The staged block: its first element's address and its (dense) layout.
    pub fn host(&self) -> (*mut u8, BatchLayout) {
        (self.host, self.layout)
    }

    /// Before an external step edits `row` where it lives: the host's row written there.
    pub fn to_device(&mut self, row: usize) -> Result<(), CudaError> {
        self.write_row(row)?;
        self.synced.push(row);
        self.memory.wait()
    }

    /// After an external step edited `row` where it lives: its row read back to the host.
    pub fn from_device(&mut self, row: usize) -> Result<(), CudaError> {
        self.read_row(row)?;
        self.memory.wait()
    }

    /// The step succeeded: every listed row written back (queued; nothing waits for it).
    pub fn write_back(mut self) -> Result<(), CudaError> {
        let rows = std::mem::take(&mut self.rows);
        rows.into_iter().try_for_each(|row| self.write_row(row))
    }

    /// The step failed and the host's rows are as they were read: the rows an external step had
    /// changed on the device are written back, so the device holds what it had.
    pub fn restore(mut self) -> Result<(), CudaError> {
        let synced = std::mem::take(&mut self.synced);
        synced.into_iter().try_for_each(|row| self.write_row(row))
    }

    fn read_row(&mut self, row: usize) -> Result<(), CudaError> {
        self.memory.read(
            row * self.stride_bytes,
            row * self.row_bytes,
            self.row_bytes,
        )
    }

    fn write_row(&mut self, row: usize) -> Result<(), CudaError> {
        self.memory.write(
            row * self.row_bytes,
            row * self.stride_bytes,
            self.row_bytes,
        )
    }
}

/// A planned batch (after [`Batch::plan`]) applied by the host round trip: its rows read, the CPU
/// path's `apply_planned_raw` on them (external steps each get their row written to the device
/// before they run and read back after), written back. On error nothing more is written to the
/// device than what it held before the step, and every row's state is taken back.
pub fn apply_batch(
    memory: &mut dyn CopiedMemory,
    batch: &mut Batch,
    dtype: DType,
    layout: BatchLayout,
    external: &mut dyn FnMut(usize, u64) -> logits_processing::Result<()>,
) -> Result<(), CudaError> {
    fn run<T: Logit>(
        batch: &mut Batch,
        staged: &mut HostRows<'_>,
        external: &mut dyn FnMut(usize, u64) -> logits_processing::Result<()>,
    ) -> logits_processing::Result<()> {
        let (host, layout) = staged.host();
        let len = layout.rows * layout.row_stride;
        let copy = |error: CudaError| Error::External(error.to_string());
        // SAFETY: the staging buffer holds `len` elements of `T` for the whole call, and only this
        // call (through `external`'s row copies, between its own accesses) touches it.
        unsafe {
            batch.apply_planned_raw(host.cast::<T>(), len, layout, &mut |row, key| {
                staged.to_device(row).map_err(copy)?;
                external(row, key)?;
                staged.from_device(row).map_err(copy)
            })
        }
    }
    if let Err(error) = batch.check_layout(layout.required_len(batch.vocab_size()), layout) {
        batch.undo_plan();
        return Err(error.into());
    }
    let rows = batch.iter().map(|(row, _)| row).collect();
    let mut staged = match HostRows::read(memory, rows, dtype, layout, batch.vocab_size()) {
        Ok(staged) => staged,
        Err(error) => {
            batch.undo_plan();
            return Err(error);
        }
    };
    let applied = match dtype {
        DType::F32 => run::<f32>(batch, &mut staged, external),
        DType::F16 => run::<f16>(batch, &mut staged, external),
        DType::BF16 => run::<bf16>(batch, &mut staged, external),
    };
    match applied {
        Ok(()) => staged.write_back(),
        // The logits' memory may be gone: nothing is written to it.
        Err(error @ Error::LogitsMoved(_)) => Err(error.into()),
        Err(error) => {
            staged.restore()?;
            Err(error.into())
        }
    }
}

/// Host memory reached through [`CopiedMemory`] as a device's is: for the round trip's tests on
/// machines without a GPU (and the Python package's test switch). Counts its waits.
pub struct HostMemory {
    base: *mut u8,
    len: usize,
    staging: Vec<u64>,
    /// Waits so far (one a step, plus two for each external step).
    pub waits: usize,
}

impl HostMemory {
    /// Memory at `base`, `len` bytes.
    ///
    /// # Safety
    /// `base` must be valid for reads and writes of `len` bytes while this lives, and nothing else
    /// may access it during a copy.
    pub unsafe fn new(base: *mut u8, len: usize) -> Self {
        Self {
            base,
            len,
            staging: vec![],
            waits: 0,
        }
    }

    fn check(&self, at: usize, len: usize, staged: usize, what: &str) -> Result<(), CudaError> {
        let inside = |end: Option<usize>, limit: usize| end.is_some_and(|end| end <= limit);
        if inside(at.checked_add(len), self.len)
            && inside(staged.checked_add(len), self.staging.len() * 8)
        {
            Ok(())
        } else {
            Err(CudaError::InvalidArgument(format!(
                "{what} of {len} bytes at {at} (staging {staged}) is outside the memory"
            )))
        }
    }
}

impl CopiedMemory for HostMemory {
    fn staging(&mut self, bytes: usize) -> Result<*mut u8, CudaError> {
        if self.staging.len() * 8 < bytes {
            self.staging = vec![0; bytes.div_ceil(8)];
        }
        Ok(self.staging.as_mut_ptr().cast())
    }

    fn read(&mut self, from: usize, to: usize, len: usize) -> Result<(), CudaError> {
        self.check(from, len, to, "a read")?;
        // SAFETY: both ranges checked above; they are distinct allocations.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.base.add(from),
                self.staging.as_mut_ptr().cast::<u8>().add(to),
                len,
            )
        };
        Ok(())
    }

    fn write(&mut self, from: usize, to: usize, len: usize) -> Result<(), CudaError> {
        self.check(to, len, from, "a write")?;
        // SAFETY: both ranges checked above; they are distinct allocations.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.staging.as_ptr().cast::<u8>().add(from),
                self.base.add(to),
                len,
            )
        };
        Ok(())
    }

    fn wait(&mut self) -> Result<(), CudaError> {
        self.waits += 1;
        crate::count_wait();
        Ok(())
    }
}

/// A device's pinned staging buffer for the round trip, kept across steps (one per device).
pub struct DeviceStaging {
    ordinal: usize,
    ctx: cu::CUcontext,
    host: *mut u8,
    capacity: usize,
    /// Recorded after each write from the buffer: the buffer is rewritten only once it completed.
    written: cu::CUevent,
}

// SAFETY: the pinned buffer and the event are this value's own, used with its context pushed.
unsafe impl Send for DeviceStaging {}

impl DeviceStaging {
    /// An empty staging area on GPU `ordinal` (in its primary context, torch's); it grows as steps
    /// need it.
    pub fn new(ordinal: usize) -> Result<Self, CudaError> {
        let ctx = driver::primary_context(ordinal)?;
        let _current = CurrentContext::push(ctx)?;
        // SAFETY: the context is current.
        let written = unsafe { driver::new_event() }?;
        Ok(Self {
            ordinal,
            ctx,
            host: std::ptr::null_mut(),
            capacity: 0,
            written,
        })
    }

    /// The device this stages for.
    pub fn device_ordinal(&self) -> usize {
        self.ordinal
    }

    /// The block at device address `logits`, reached on `stream` (a raw `CUstream`, 0 the legacy
    /// default stream) through this staging buffer.
    ///
    /// # Safety
    /// `logits` must be a live allocation of this device covering every row the copies name, and
    /// `stream` a live stream of its primary context (or 0), for as long as the result lives.
    pub unsafe fn memory(
        &mut self,
        logits: u64,
        stream: u64,
    ) -> Result<DeviceMemory<'_>, CudaError> {
        let current = CurrentContext::push(self.ctx)?;
        Ok(DeviceMemory {
            staging: self,
            logits,
            stream: stream as cu::CUstream,
            _current: current,
        })
    }
}

impl Drop for DeviceStaging {
    fn drop(&mut self) {
        if let Ok(_current) = CurrentContext::push(self.ctx) {
            // SAFETY: this value's own buffer and event, its context current; nothing in flight
            // reads the buffer once the event has completed.
            unsafe {
                cu::cuEventSynchronize(self.written);
                if !self.host.is_null() {
                    cu::cuMemFreeHost(self.host.cast());
                }
                cu::cuEventDestroy_v2(self.written);
            }
        }
    }
}

/// A device block reached through its device's [`DeviceStaging`], on one stream, the device's
/// context current on this thread while it lives.
pub struct DeviceMemory<'s> {
    staging: &'s mut DeviceStaging,
    logits: u64,
    stream: cu::CUstream,
    _current: CurrentContext,
}

impl CopiedMemory for DeviceMemory<'_> {
    fn staging(&mut self, bytes: usize) -> Result<*mut u8, CudaError> {
        let staging = &mut *self.staging;
        // SAFETY: the context is current; the event and the buffer are the staging's own.
        unsafe {
            // The last step's write-back may still be reading the buffer (on another stream).
            check(
                cu::cuEventSynchronize(staging.written),
                "cuEventSynchronize",
            )?;
            if staging.capacity < bytes {
                if !staging.host.is_null() {
                    cu::cuMemFreeHost(staging.host.cast());
                    staging.host = std::ptr::null_mut();
                    staging.capacity = 0;
                }
                let capacity = bytes.next_power_of_two();
                let mut host = std::ptr::null_mut();
                check(cu::cuMemHostAlloc(&mut host, capacity, 0), "cuMemHostAlloc")?;
                staging.host = host.cast();
                staging.capacity = capacity;
            }
        }
        Ok(staging.host)
    }

    fn read(&mut self, from: usize, to: usize, len: usize) -> Result<(), CudaError> {
        // SAFETY: `memory`'s contract covers the device range; `to + len` is within the staging
        // buffer, which `HostRows` sized.
        check(
            unsafe {
                cu::cuMemcpyDtoHAsync_v2(
                    self.staging.host.add(to).cast(),
                    self.logits + from as u64,
                    len,
                    self.stream,
                )
            },
            "cuMemcpyDtoHAsync",
        )
    }

    fn write(&mut self, from: usize, to: usize, len: usize) -> Result<(), CudaError> {
        // SAFETY: as in `read`; the event tells the next step when the buffer is free again.
        unsafe {
            check(
                cu::cuMemcpyHtoDAsync_v2(
                    self.logits + to as u64,
                    self.staging.host.add(from).cast(),
                    len,
                    self.stream,
                ),
                "cuMemcpyHtoDAsync",
            )?;
            check(
                cu::cuEventRecord(self.staging.written, self.stream),
                "cuEventRecord",
            )
        }
    }

    fn wait(&mut self) -> Result<(), CudaError> {
        crate::count_wait();
        // SAFETY: the stream belongs to the current context (`memory`'s contract).
        check(
            unsafe { cu::cuStreamSynchronize(self.stream) },
            "cuStreamSynchronize",
        )
    }
}
