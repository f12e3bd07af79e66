//! Minimal device memory and streams for tests, examples and benchmarks (production callers bring
//! their own: torch's tensors and streams).

use std::marker::PhantomData;
use std::sync::Arc;

use cudarc::driver::sys as cu;

use crate::driver::{self, check, CurrentContext, Kernels};
use crate::CudaError;

/// A stream of a device's primary context.
#[derive(Debug)]
pub struct Stream {
    kernels: Arc<Kernels>,
    stream: cu::CUstream,
}

impl Stream {
    /// A new non-blocking stream on GPU `device_ordinal`.
    pub fn new(device_ordinal: usize) -> Result<Self, CudaError> {
        let kernels = driver::kernels(device_ordinal)?;
        let _current = CurrentContext::push(kernels.ctx)?;
        let mut stream = std::ptr::null_mut();
        // SAFETY: a context is current.
        check(
            unsafe {
                cu::cuStreamCreate(
                    &mut stream,
                    cu::CUstream_flags::CU_STREAM_NON_BLOCKING as u32,
                )
            },
            "cuStreamCreate",
        )?;
        Ok(Self { kernels, stream })
    }

    /// The raw `CUstream`, as [`crate::CudaBatchApplier`] takes it.
    pub fn raw(&self) -> u64 {
        self.stream as u64
    }

    /// Waits until everything queued on the stream is done.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        let _current = CurrentContext::push(self.kernels.ctx)?;
        // SAFETY: our own live stream.
        check(
            unsafe { cu::cuStreamSynchronize(self.stream) },
            "cuStreamSynchronize",
        )
    }
}

impl Stream {
    /// Per-call device time of `f`, in µs: the median over `blocks` of CUDA-event time around
    /// `calls` back-to-back calls, each block after `prepare` (not timed) and a wait for the stream.
    /// Back-to-back calls make host time show wherever the host cannot keep the GPU busy.
    pub fn time_us(
        &self,
        calls: usize,
        blocks: usize,
        prepare: &mut dyn FnMut() -> Result<(), CudaError>,
        f: &mut dyn FnMut() -> Result<(), CudaError>,
    ) -> Result<f64, CudaError> {
        let _current = CurrentContext::push(self.kernels.ctx)?;
        let event = || -> Result<cu::CUevent, CudaError> {
            let mut e = std::ptr::null_mut();
            // SAFETY: a context is current.
            check(unsafe { cu::cuEventCreate(&mut e, 0) }, "cuEventCreate")?;
            Ok(e)
        };
        let (start, end) = (event()?, event()?);
        let mut times = vec![];
        let result = (|| -> Result<(), CudaError> {
            for _ in 0..blocks {
                prepare()?;
                self.synchronize()?;
                // SAFETY: our own live events and stream.
                unsafe {
                    check(cu::cuEventRecord(start, self.stream), "cuEventRecord")?;
                    for _ in 0..calls {
                        f()?;
                    }
                    check(cu::cuEventRecord(end, self.stream), "cuEventRecord")?;
                    check(cu::cuEventSynchronize(end), "cuEventSynchronize")?;
                    times.push(elapsed_ms(start, end)? as f64 * 1000.0 / calls as f64);
                }
            }
            Ok(())
        })();
        // SAFETY: our own events, no longer recorded into.
        unsafe {
            cu::cuEventDestroy_v2(start);
            cu::cuEventDestroy_v2(end);
        }
        result?;
        times.sort_by(f64::total_cmp);
        Ok(times.get(times.len() / 2).copied().unwrap_or(f64::NAN))
    }
}

/// `cuEventElapsedTime_v2` (CUDA 12.8+ drivers; older ones get an error, not cudarc's panic).
unsafe fn elapsed_ms(start: cu::CUevent, end: cu::CUevent) -> Result<f32, CudaError> {
    let present = cu::culib()
        .get::<unsafe extern "C" fn()>(b"cuEventElapsedTime_v2")
        .is_ok();
    if !present {
        return Err(CudaError::Driver(
            "this driver lacks cuEventElapsedTime_v2 (CUDA 12.8+)".into(),
        ));
    }
    let mut ms = 0f32;
    check(
        cu::cuEventElapsedTime_v2(&mut ms, start, end),
        "cuEventElapsedTime_v2",
    )?;
    Ok(ms)
}

impl Drop for Stream {
    fn drop(&mut self) {
        if let Ok(_current) = CurrentContext::push(self.kernels.ctx) {
            // SAFETY: our own stream; the driver finishes its queued work first.
            unsafe { cu::cuStreamDestroy_v2(self.stream) };
        }
    }
}

/// A device allocation of `len` elements of `T` (plain data: f32, f16, bf16, u32...).
#[derive(Debug)]
pub struct DeviceBuffer<T: Copy> {
    kernels: Arc<Kernels>,
    ptr: cu::CUdeviceptr,
    len: usize,
    _marker: PhantomData<T>,
}

impl<T: Copy> DeviceBuffer<T> {
    /// A copy of `host` on GPU `device_ordinal` (synchronous: complete on return, for every stream).
    pub fn from_host(device_ordinal: usize, host: &[T]) -> Result<Self, CudaError> {
        let kernels = driver::kernels(device_ordinal)?;
        let _current = CurrentContext::push(kernels.ctx)?;
        let bytes = std::mem::size_of_val(host).max(1);
        let mut ptr = 0;
        // SAFETY: a context is current; the copy reads `bytes` of `host` (or allocates 1 byte for
        // an empty slice and copies nothing).
        unsafe {
            check(cu::cuMemAlloc_v2(&mut ptr, bytes), "cuMemAlloc")?;
            let buffer = Self {
                kernels: kernels.clone(),
                ptr,
                len: host.len(),
                _marker: PhantomData,
            };
            if !host.is_empty() {
                check(
                    cu::cuMemcpyHtoD_v2(ptr, host.as_ptr().cast(), std::mem::size_of_val(host)),
                    "cuMemcpyHtoD",
                )?;
                // A copy from pageable memory may return before its DMA is done, and work on a
                // non-blocking stream does not wait for it: finish it here.
                check(cu::cuCtxSynchronize(), "cuCtxSynchronize")?;
            }
            Ok(buffer)
        }
    }

    /// The device pointer.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Overwrites the buffer with `host` (synchronous: complete on return, for every stream;
    /// `host.len()` must equal `len()`).
    pub fn upload(&mut self, host: &[T]) -> Result<(), CudaError> {
        assert_eq!(host.len(), self.len, "upload of a different length");
        let _current = CurrentContext::push(self.kernels.ctx)?;
        if host.is_empty() {
            return Ok(());
        }
        // SAFETY: both sides hold `len` elements.
        check(
            unsafe {
                cu::cuMemcpyHtoD_v2(self.ptr, host.as_ptr().cast(), std::mem::size_of_val(host))
            },
            "cuMemcpyHtoD",
        )?;
        // As in `from_host`: the copy is complete when this returns.
        // SAFETY: a context is current.
        check(unsafe { cu::cuCtxSynchronize() }, "cuCtxSynchronize")
    }

    /// Queues a copy of `src` (same length) into this buffer on `stream`: a device-to-device copy,
    /// the memory floor that the benchmarks compare the kernel with.
    pub fn copy_from_async(
        &mut self,
        src: &DeviceBuffer<T>,
        stream: &Stream,
    ) -> Result<(), CudaError> {
        assert_eq!(src.len, self.len, "copy of a different length");
        let _current = CurrentContext::push(self.kernels.ctx)?;
        // SAFETY: both buffers hold `len` elements; the stream is live.
        check(
            unsafe {
                cu::cuMemcpyDtoDAsync_v2(
                    self.ptr,
                    src.ptr,
                    self.len * std::mem::size_of::<T>(),
                    stream.stream,
                )
            },
            "cuMemcpyDtoDAsync",
        )
    }

    /// The buffer's content (synchronous: waits for all work on the device that writes it through
    /// the legacy default stream; synchronize other streams first).
    pub fn to_host(&self, host: &mut [T]) -> Result<(), CudaError> {
        assert_eq!(host.len(), self.len, "download of a different length");
        let _current = CurrentContext::push(self.kernels.ctx)?;
        if host.is_empty() {
            return Ok(());
        }
        // SAFETY: both sides hold `len` elements.
        check(
            unsafe {
                cu::cuMemcpyDtoH_v2(
                    host.as_mut_ptr().cast(),
                    self.ptr,
                    std::mem::size_of_val(host),
                )
            },
            "cuMemcpyDtoH",
        )
    }
}

impl<T: Copy> Drop for DeviceBuffer<T> {
    fn drop(&mut self) {
        if let Ok(_current) = CurrentContext::push(self.kernels.ctx) {
            // SAFETY: our own allocation.
            unsafe { cu::cuMemFree_v2(self.ptr) };
        }
    }
}
