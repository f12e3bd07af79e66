//! The driver: found and initialized once, each device's kernels loaded once and cached.
//!
//! cudarc's dynamically loaded bindings panic when `libcuda` is missing, so nothing here calls a
//! driver function before [`init`] has checked that the library loads; and only entry points that
//! every CUDA 12 and 13 driver exports are called.

use std::ffi::CString;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::sys::{self as cu, CUresult};

use crate::{nvrtc, CudaError};

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

/// One device's primary context and kernels. Kept for the life of the process.
#[derive(Debug)]
pub(crate) struct Kernels {
    pub ctx: cu::CUcontext,
    pub f32: cu::CUfunction,
    pub f16: cu::CUfunction,
    pub bf16: cu::CUfunction,
    /// The band kernels (rows that truncate), by element type.
    pub bands_f32: cu::CUfunction,
    pub bands_f16: cu::CUfunction,
    pub bands_bf16: cu::CUfunction,
    /// Where the code came from: the embedded PTX or NVRTC.
    pub origin: &'static str,
    /// The outcome of the device's self-check, run once by the first applier.
    pub checked: OnceLock<Result<(), String>>,
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
    let _current = CurrentContext::push(ctx)?;
    let force_nvrtc =
        std::env::var_os("LOGITS_PROCESSING_CUDA_NVRTC").is_some_and(|v| v != "0" && !v.is_empty());
    let (module, origin) = if force_nvrtc {
        (load_nvrtc(device)?, "nvrtc")
    } else {
        let ptx = CString::new(crate::KERNEL_PTX).expect("the PTX has no NUL");
        match load_image(ptx.as_bytes_with_nul()) {
            Ok(module) => (module, "ptx"),
            Err(ptx_error) => match load_nvrtc(device) {
                Ok(module) => (module, "nvrtc"),
                Err(nvrtc_error) => {
                    return Err(CudaError::Compile(format!(
                        "the driver refused the embedded PTX ({ptx_error}) and NVRTC could not \
                         replace it ({nvrtc_error})"
                    )))
                }
            },
        }
    };
    let function = |name: &std::ffi::CStr| -> Result<cu::CUfunction, CudaError> {
        let mut f = std::ptr::null_mut();
        // SAFETY: `module` is loaded in the current context.
        check(
            unsafe { cu::cuModuleGetFunction(&mut f, module, name.as_ptr()) },
            "cuModuleGetFunction",
        )?;
        Ok(f)
    };
    Ok(Kernels {
        ctx,
        f32: function(c"lp_apply_f32")?,
        f16: function(c"lp_apply_f16")?,
        bf16: function(c"lp_apply_bf16")?,
        bands_f32: function(c"lp_bands_f32")?,
        bands_f16: function(c"lp_bands_f16")?,
        bands_bf16: function(c"lp_bands_bf16")?,
        origin,
        checked: OnceLock::new(),
    })
}

fn load_image(image: &[u8]) -> Result<cu::CUmodule, CudaError> {
    let mut module = std::ptr::null_mut();
    // SAFETY: `image` is a NUL-terminated PTX text or a cubin; a context is current.
    check(
        unsafe { cu::cuModuleLoadData(&mut module, image.as_ptr().cast()) },
        "cuModuleLoadData",
    )?;
    Ok(module)
}

/// Compiles the source for this device's own architecture with NVRTC and loads the machine code.
fn load_nvrtc(device: cu::CUdevice) -> Result<cu::CUmodule, CudaError> {
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
    let cubin = nvrtc::compile(
        &crate::kernel_source(),
        &format!("sm_{major}{minor}"),
        nvrtc::Output::Cubin,
    )?;
    load_image(&cubin)
        .map_err(|e| CudaError::Compile(format!("loading NVRTC's sm_{major}{minor} cubin: {e}")))
}
