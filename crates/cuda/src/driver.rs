//! The driver: found and initialized once, each device's kernels loaded once and cached.
//!
//! cudarc's dynamically loaded bindings panic when `libcuda` is missing, so nothing here calls a
//! driver function before [`init`] has checked that the library loads; and only entry points that
//! every CUDA 12 and 13 driver exports are called.

use std::ffi::CString;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::sys::{self as cu, CUresult};

use logits_processing::DType;

use crate::{images, CudaError};

pub(crate) fn check(result: CUresult, call: &str) -> Result<(), CudaError> {
    match result {
        CUresult::CUDA_SUCCESS => Ok(()),
        error => Err(CudaError::Driver(format!("{call} failed: {error:?}"))),
    }
}

/// Finds and initializes the driver, once per process.
pub(crate) fn init() -> Result<(), CudaError> {
    static INIT: OnceLock<Result<(), (bool, String)>> = OnceLock::new();
    let outcome = INIT.get_or_init(|| {
        if std::env::var_os("LOGITS_PROCESSING_NO_CUDA").is_some_and(|v| v != "0" && !v.is_empty())
        {
            return Err((false, "disabled by LOGITS_PROCESSING_NO_CUDA".into()));
        }
        // The checks below should make a panic impossible; a driver library that lacks a symbol
        // every driver has would still panic inside cudarc, and that is a missing driver too.
        std::panic::catch_unwind(|| {
            // SAFETY: only tries to open the library.
            if !unsafe { cu::is_culib_present() } {
                return Err((
                    false,
                    "libcuda.so.1 not found (no NVIDIA driver installed here)".into(),
                ));
            }
            // SAFETY: the library is present.
            match unsafe { cu::cuInit(0) } {
                CUresult::CUDA_SUCCESS => Ok(()),
                CUresult::CUDA_ERROR_NO_DEVICE => Err((true, "the driver found no GPU".into())),
                error => Err((false, format!("cuInit failed: {error:?}"))),
            }
        })
        .unwrap_or_else(|_| Err((false, "the CUDA driver library could not be used".into())))
    });
    match outcome {
        Ok(()) => Ok(()),
        Err((true, message)) => Err(CudaError::NoDevice(message.clone())),
        Err((false, message)) => Err(CudaError::NoDriver(message.clone())),
    }
}

/// GPUs the driver sees.
pub(crate) fn device_count() -> Result<usize, CudaError> {
    init()?;
    let mut count = 0;
    // SAFETY: the driver is initialized.
    check(
        unsafe { cu::cuDeviceGetCount(&mut count) },
        "cuDeviceGetCount",
    )?;
    Ok(count.max(0) as usize)
}

/// A new event without timing (what the staging slots, the round trip and the readback record).
///
/// # Safety
/// A context is current.
pub(crate) unsafe fn new_event() -> Result<cu::CUevent, CudaError> {
    let mut event = std::ptr::null_mut();
    check(
        cu::cuEventCreate(
            &mut event,
            cu::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32,
        ),
        "cuEventCreate",
    )?;
    Ok(event)
}

/// Makes a context current on this thread until dropped.
pub(crate) struct CurrentContext(());

impl CurrentContext {
    pub(crate) fn push(ctx: cu::CUcontext) -> Result<Self, CudaError> {
        // SAFETY: `ctx` is a retained primary context.
        check(unsafe { cu::cuCtxPushCurrent_v2(ctx) }, "cuCtxPushCurrent")?;
        Ok(Self(()))
    }
}

impl Drop for CurrentContext {
    fn drop(&mut self) {
        let mut popped = std::ptr::null_mut();
        // SAFETY: pops what `push` pushed.
        unsafe { cu::cuCtxPopCurrent_v2(&mut popped) };
    }
}

/// A loaded kernel and its launch shape.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Kernel {
    pub function: cu::CUfunction,
    pub threads: u32,
    pub shared: u32,
}

/// One device's primary context and kernels. Kept for the life of the process.
#[derive(Debug)]
pub(crate) struct Kernels {
    pub ctx: cu::CUcontext,
    /// The apply kernels and the band kernels (rows that truncate), by element type.
    pub apply: [Kernel; 3],
    pub bands: [Kernel; 3],
    /// Which image the device runs (`sm_90 cubin`, `compute_75 PTX`).
    pub origin: String,
    /// The outcome of the device's self-check, run once by the first applier.
    pub checked: OnceLock<Result<(), String>>,
}

impl Kernels {
    /// The (apply, bands) kernels for `dtype`.
    pub(crate) fn for_dtype(&self, dtype: DType) -> (Kernel, Kernel) {
        let i = dtype_index(dtype);
        (self.apply[i], self.bands[i])
    }
}

fn dtype_index(dtype: DType) -> usize {
    match dtype {
        DType::F32 => 0,
        DType::F16 => 1,
        DType::BF16 => 2,
    }
}

// SAFETY: contexts and functions are process-wide driver handles, usable from any thread.
unsafe impl Send for Kernels {}
unsafe impl Sync for Kernels {}

/// The device's kernels, loaded on first use and cached.
pub(crate) fn kernels(ordinal: usize) -> Result<Arc<Kernels>, CudaError> {
    static CACHE: Mutex<Vec<Option<Arc<Kernels>>>> = Mutex::new(Vec::new());
    let count = device_count()?;
    if ordinal >= count {
        return Err(CudaError::NoDevice(format!(
            "device {ordinal} asked for, {count} found"
        )));
    }
    let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    if cache.len() < count {
        cache.resize(count, None);
    }
    if let Some(kernels) = &cache[ordinal] {
        return Ok(kernels.clone());
    }
    let kernels = Arc::new(load(ordinal)?);
    cache[ordinal] = Some(kernels.clone());
    Ok(kernels)
}

/// Device `ordinal`'s primary context, the one torch and the runtime API use (pointers and streams
/// the caller hands us belong to it), retained once and kept for the life of the process.
pub(crate) fn primary_context(ordinal: usize) -> Result<cu::CUcontext, CudaError> {
    // Contexts as addresses: a raw pointer is not Send.
    static CONTEXTS: Mutex<Vec<usize>> = Mutex::new(Vec::new());
    let count = device_count()?;
    if ordinal >= count {
        return Err(CudaError::NoDevice(format!(
            "device {ordinal} asked for, {count} found"
        )));
    }
    let mut contexts = CONTEXTS.lock().unwrap_or_else(|e| e.into_inner());
    if contexts.len() < count {
        contexts.resize(count, 0);
    }
    if contexts[ordinal] == 0 {
        let mut device = 0;
        let mut ctx = std::ptr::null_mut();
        // SAFETY: the driver is initialized and `ordinal` is below the device count.
        unsafe {
            check(cu::cuDeviceGet(&mut device, ordinal as i32), "cuDeviceGet")?;
            check(
                cu::cuDevicePrimaryCtxRetain(&mut ctx, device),
                "cuDevicePrimaryCtxRetain",
            )?;
        }
        contexts[ordinal] = ctx as usize;
    }
    Ok(contexts[ordinal] as cu::CUcontext)
}

fn load(ordinal: usize) -> Result<Kernels, CudaError> {
    let ctx = primary_context(ordinal)?;
    let mut device = 0;
    // SAFETY: the driver is initialized and `ordinal` is below the device count.
    check(
        unsafe { cu::cuDeviceGet(&mut device, ordinal as i32) },
        "cuDeviceGet",
    )?;
    let attribute = |a| -> Result<i32, CudaError> {
        let mut v = 0;
        // SAFETY: a valid device and attribute.
        check(
            unsafe { cu::cuDeviceGetAttribute(&mut v, a, device) },
            "cuDeviceGetAttribute",
        )?;
        Ok(v)
    };
    let major = attribute(cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
    let minor = attribute(cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
    let target = images::target_for(major, minor).ok_or_else(|| {
        CudaError::Compile(format!(
            "compute capability {major}.{minor}: the kernels need 7.5 or later"
        ))
    })?;
    let _current = CurrentContext::push(ctx)?;
    let kernel = |name: &str, dtype: DType| -> Result<Kernel, CudaError> {
        let image = images::image(target, name, dtype)
            .expect("every target has every kernel (a unit test checks the images)");
        load_kernel(image).map_err(|e| {
            CudaError::Compile(format!(
                "loading {name} ({}, {}) on compute capability {major}.{minor}: {e}",
                dtype.name(),
                images::describe(target)
            ))
        })
    };
    let dtypes = [DType::F32, DType::F16, DType::BF16];
    Ok(Kernels {
        ctx,
        apply: [
            kernel("lp_apply", dtypes[0])?,
            kernel("lp_apply", dtypes[1])?,
            kernel("lp_apply", dtypes[2])?,
        ],
        bands: [
            kernel("lp_bands", dtypes[0])?,
            kernel("lp_bands", dtypes[1])?,
            kernel("lp_bands", dtypes[2])?,
        ],
        origin: images::describe(target),
        checked: OnceLock::new(),
    })
}

/// Loads one image (a module of its own) in the current context.
fn load_kernel(image: &images::Image) -> Result<Kernel, CudaError> {
    let mut module = std::ptr::null_mut();
    // SAFETY: `bytes` is a cubin, or a PTX text ending in NUL; a context is current.
    check(
        unsafe { cu::cuModuleLoadData(&mut module, image.bytes.as_ptr().cast()) },
        "cuModuleLoadData",
    )?;
    let name = CString::new(image.kernel).expect("a kernel name has no NUL");
    let mut function = std::ptr::null_mut();
    // SAFETY: `module` is loaded in the current context.
    check(
        unsafe { cu::cuModuleGetFunction(&mut function, module, name.as_ptr()) },
        "cuModuleGetFunction",
    )?;
    // Past 48 KiB a block's shared memory is granted only on request (none of today's need it).
    if image.shared > 48 * 1024 {
        // SAFETY: a function of a loaded module.
        check(
            unsafe {
                cu::cuFuncSetAttribute(
                    function,
                    cu::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    image.shared as i32,
                )
            },
            "cuFuncSetAttribute",
        )?;
    }
    Ok(Kernel {
        function,
        threads: 32 * image.warps,
        shared: image.shared,
    })
}
