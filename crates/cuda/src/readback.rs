//! What a step's kernels resolved that its processors read at their next step: whether a
//! conditional force fired ([`logits_processing::RowPlan::fired`]), an observing truncation's band
//! over the row as it stood there ([`logits_processing::RowPlan::observed`], mirostat's).
//!
//! The band kernel writes them into the step's packed words on the device
//! ([`crate::packed::PackedPlans::observing`]); the applier queues a copy of those words to
//! pinned host memory after the kernels, on the caller's stream, and records an event. The step
//! returns without waiting. Before the processors plan their next step, [`Readback::collect_batch`]
//! (or [`Readback::collect_pipeline`]) waits for that event (never for the stream: by then the
//! engine has sampled the step, so the event has long completed) and records each outcome in its
//! row's plan ([`logits_processing::RowPlan::record_device_pass`]), as the host path's pass would
//! have left it. Only steps with such edits copy anything back.
//!
//! Collect before the batch's rows change (a row added, removed, moved, parked): the outcomes are
//! filed by row.

use cudarc::driver::sys as cu;
use logits_processing::{Band, Batch, DevicePass, Pipeline, RowPlan};

use crate::driver::{check, CurrentContext};
use crate::packed::{Observing, PackedPlans};
use crate::CudaError;

/// A step's outcomes to read back (see the module's documentation). Keep one per batch (or per
/// single-row pipeline) and reuse it: its buffers grow to the largest step and stay.
#[derive(Debug, Default)]
pub struct Readback {
    segments: Vec<Segment>,
    // Segments holding this step's outcomes.
    used: usize,
    // The device copies' event, while they may be in flight.
    pending: Option<(cu::CUcontext, cu::CUevent)>,
    // The event, kept between steps (with its context).
    event: Option<(cu::CUcontext, cu::CUevent)>,
    // Outcomes stored from the host (Triton's interpreter) wait to be collected.
    host_stored: bool,
}

// SAFETY: the raw pointers are driver handles and pinned host memory owned by this value.
unsafe impl Send for Readback {}

/// One launch's outcomes: its stage level, the edits, and the words they are in.
#[derive(Debug)]
struct Segment {
    level: usize,
    vocab: usize,
    entries: Vec<Observing>,
    words: Vec<u32>,
    // Pinned host memory the device copy lands in (device launches only).
    pinned: *mut u32,
    pinned_words: usize,
}

impl Readback {
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether a step's outcomes wait to be collected.
    pub fn is_armed(&self) -> bool {
        self.used > 0
    }

    /// Forgets the step's outcomes (a step that failed: nothing of it is recorded).
    pub fn discard(&mut self) {
        self.used = 0;
        self.pending = None;
        self.host_stored = false;
    }

    fn next_segment(&mut self, level: usize, packed: &PackedPlans, vocab: usize) -> &mut Segment {
        if self.used == self.segments.len() {
            self.segments.push(Segment::default());
        }
        let segment = &mut self.segments[self.used];
        self.used += 1;
        segment.level = level;
        segment.vocab = vocab;
        segment.entries.clear();
        segment.entries.extend_from_slice(packed.observing());
        segment
    }

    /// Keeps the outcomes of a launch run on the host (Triton's interpreter): `words`, the packed
    /// words as the kernels left them, with the snapshots after them. Collecting them counts the
    /// wait a device's copy would take ([`crate::device_waits`]).
    pub fn store(&mut self, level: usize, packed: &PackedPlans, vocab: usize, words: Vec<u32>) {
        if !packed.observing().is_empty() {
            self.next_segment(level, packed, vocab).words = words;
            self.host_stored = true;
        }
    }

    /// Queues, on `stream`, the copy of a launch's packed words (and snapshots) at `device` to
    /// pinned memory.
    ///
    /// # Safety
    ///
    /// `ctx` is current, and `device` holds the packed words and snapshots of `packed`, written
    /// by kernels queued on `stream`.
    pub(crate) unsafe fn copy_from_device(
        &mut self,
        level: usize,
        packed: &PackedPlans,
        vocab: usize,
        device: cu::CUdeviceptr,
        stream: cu::CUstream,
    ) -> Result<(), CudaError> {
        if packed.observing().is_empty() {
            return Ok(());
        }
        let len = packed.words().len() + packed.snapshot_words();
        let segment = self.next_segment(level, packed, vocab);
        if segment.pinned_words < len {
            segment.free_pinned();
            let mut host = std::ptr::null_mut();
            check(cu::cuMemHostAlloc(&mut host, len * 4, 0), "cuMemHostAlloc")?;
            segment.pinned = host.cast();
            segment.pinned_words = len;
        }
        segment.words.resize(len, 0);
        check(
            cu::cuMemcpyDtoHAsync_v2(segment.pinned.cast(), device, len * 4, stream),
            "cuMemcpyDtoHAsync",
        )
    }

    /// Records, after the step's copies on `stream`, the event [`Readback::collect_batch`] waits
    /// for.
    ///
    /// # Safety
    ///
    /// `ctx` is current and `stream` is one of its streams.
    pub(crate) unsafe fn record(
        &mut self,
        ctx: cu::CUcontext,
        stream: cu::CUstream,
    ) -> Result<(), CudaError> {
        if self.used == 0
            || self.segments[..self.used]
                .iter()
                .all(|s| s.pinned.is_null())
        {
            return Ok(());
        }
        let event = match self.event {
            Some((owner, event)) if owner == ctx => event,
            _ => {
                self.destroy_event();
                let event = crate::driver::new_event()?;
                self.event = Some((ctx, event));
                event
            }
        };
        check(cu::cuEventRecord(event, stream), "cuEventRecord")?;
        self.pending = Some((ctx, event));
        Ok(())
    }

    /// Whether the outcomes are on the host (waiting for the copies when `wait`); copies them
    /// out of pinned memory.
    fn ready(&mut self, wait: bool) -> Result<bool, CudaError> {
        if std::mem::take(&mut self.host_stored) {
            crate::count_wait();
        }
        if let Some((ctx, event)) = self.pending {
            let _current = CurrentContext::push(ctx)?;
            // SAFETY: our own event, recorded in `ctx`.
            unsafe {
                if wait {
                    crate::count_wait();
                    check(cu::cuEventSynchronize(event), "cuEventSynchronize")?;
                } else {
                    match cu::cuEventQuery(event) {
                        cu::CUresult::CUDA_SUCCESS => {}
                        cu::CUresult::CUDA_ERROR_NOT_READY => return Ok(false),
                        error => {
                            return Err(CudaError::Driver(format!(
                                "cuEventQuery failed: {error:?}"
                            )))
                        }
                    }
                }
            }
            for segment in &mut self.segments[..self.used] {
                let len = segment.words.len();
                // SAFETY: the copy into `pinned` (at least `len` words) has completed.
                segment
                    .words
                    .copy_from_slice(unsafe { std::slice::from_raw_parts(segment.pinned, len) });
            }
            self.pending = None;
        }
        Ok(true)
    }

    /// Records the step's outcomes in the batch's plans; with `wait`, waiting for the device's
    /// copies first (one wait, on their event), else returning `false`, and keeping them, while
    /// they are still in flight. A row no longer in the batch is skipped.
    pub fn collect_batch(&mut self, batch: &mut Batch, wait: bool) -> Result<bool, CudaError> {
        self.collect(wait, |row, level| {
            batch
                .get_mut(row)
                .and_then(|p| p.plan_mut(level))
                .map(|plan| plan as *mut RowPlan)
        })
    }

    /// [`Readback::collect_batch`] for the one row of a pipeline (a `Processor`'s).
    pub fn collect_pipeline(
        &mut self,
        pipeline: &mut Pipeline,
        wait: bool,
    ) -> Result<bool, CudaError> {
        self.collect(wait, |_, level| {
            pipeline.plan_mut(level).map(|plan| plan as *mut RowPlan)
        })
    }

    fn collect(
        &mut self,
        wait: bool,
        mut plan_at: impl FnMut(usize, usize) -> Option<*mut RowPlan>,
    ) -> Result<bool, CudaError> {
        if self.used == 0 {
            return Ok(true);
        }
        if !self.ready(wait)? {
            return Ok(false);
        }
        for segment in &self.segments[..self.used] {
            let mut begun = None;
            for entry in &segment.entries {
                let Some(plan) = plan_at(entry.row, segment.level) else {
                    continue;
                };
                // SAFETY: `plan_at` lends one plan at a time, borrowed from the batch or pipeline
                // that `collect_*` holds mutably for the call.
                let plan = unsafe { &mut *plan };
                if begun != Some(entry.row) {
                    plan.begin_device_pass();
                    begun = Some(entry.row);
                }
                plan.record_device_pass(entry.edit, segment.outcome(entry));
            }
        }
        self.used = 0;
        Ok(true)
    }

    fn destroy_event(&mut self) {
        if let Some((ctx, event)) = self.event.take() {
            if let Ok(_current) = CurrentContext::push(ctx) {
                // SAFETY: our own event, not waited on by anyone.
                unsafe { cu::cuEventDestroy_v2(event) };
            }
        }
    }
}

impl Default for Segment {
    fn default() -> Self {
        Self {
            level: 0,
            vocab: 0,
            entries: vec![],
            words: vec![],
            pinned: std::ptr::null_mut(),
            pinned_words: 0,
        }
    }
}

impl Segment {
    /// What the kernels resolved at `entry`'s edit.
    fn outcome(&self, entry: &Observing) -> DevicePass<'_> {
        let record = entry.record as usize;
        match entry.snapshot {
            None => DevicePass::Fired(self.words[record + 2] != 0),
            Some(snapshot) => {
                let snapshot = &self.words[snapshot as usize..snapshot as usize + self.vocab];
                // SAFETY: u32 and f32 have the same size and alignment.
                let values = unsafe {
                    std::slice::from_raw_parts(snapshot.as_ptr().cast::<f32>(), snapshot.len())
                };
                match entry.reshape {
                    true => DevicePass::Row { values },
                    false => DevicePass::Band {
                        values,
                        band: Band {
                            lo: f32::from_bits(self.words[record]),
                            hi: f32::from_bits(self.words[record + 1]),
                        },
                    },
                }
            }
        }
    }

    fn free_pinned(&mut self) {
        if !self.pinned.is_null() {
            // SAFETY: allocated by cuMemHostAlloc, no copy in flight (the step was collected).
            unsafe { cu::cuMemFreeHost(self.pinned.cast()) };
            self.pinned = std::ptr::null_mut();
            self.pinned_words = 0;
        }
    }
}

impl Drop for Readback {
    fn drop(&mut self) {
        if let Some((ctx, event)) = self.pending.take() {
            if let Ok(_current) = CurrentContext::push(ctx) {
                // SAFETY: our own event: the copies into pinned memory must end before it is freed.
                unsafe { cu::cuEventSynchronize(event) };
            }
        }
        self.destroy_event();
        for segment in &mut self.segments {
            segment.free_pinned();
        }
    }
}
