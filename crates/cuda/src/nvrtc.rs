//! NVRTC: compiles the kernel source. Used to generate the checked-in PTX (`examples/gen_ptx.rs`),
//! by the tests that check the source compiles (no GPU needed), and at run time only as a fallback
//! when the driver refuses the embedded PTX (or `LOGITS_PROCESSING_CUDA_NVRTC=1` asks for it).
//!
//! libnvrtc is looked for, in order: the path in `LOGITS_PROCESSING_NVRTC`; the loader's own search
//! (`libnvrtc.so`, `libnvrtc.so.13`, ... on `LD_LIBRARY_PATH`); `$CUDA_HOME/lib64`,
//! `/usr/local/cuda/lib64`; the `nvidia-cuda-nvrtc` wheel (`site-packages/nvidia/cu13/lib`) in
//! `$VIRTUAL_ENV`, `$LOGITS_PROCESSING_VENV` or `~/.cache/logits-processing/venv`. A library
//! found by path is loaded globally first, so that cudarc's loading by name then finds it.

use std::ffi::{CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use cudarc::nvrtc::{result, sys};

use crate::CudaError;

/// The options every compile of the kernel uses: IEEE division and square root, no flushing of
/// subnormals, no contraction into fused multiply-adds (the CPU path rounds every operation).
pub const OPTIONS: &[&str] = &[
    "--ftz=false",
    "--prec-div=true",
    "--prec-sqrt=true",
    "--fmad=false",
];

/// The architecture the checked-in PTX targets: the oldest that CUDA 13 supports (Turing), so the
/// driver can JIT it for any GPU CUDA 13 runs on.
pub const PTX_ARCH: &str = "compute_75";

/// A candidate path for libnvrtc outside the loader's search, if one exists.
pub fn find_nvrtc() -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = vec![];
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(root) = std::env::var_os(var) {
            dirs.push(Path::new(&root).join("lib64"));
        }
    }
    dirs.push("/usr/local/cuda/lib64".into());
    let mut venvs: Vec<PathBuf> = vec![];
    for var in ["VIRTUAL_ENV", "LOGITS_PROCESSING_VENV"] {
        if let Some(v) = std::env::var_os(var) {
            venvs.push(v.into());
        }
    }
    if let Some(home) = std::env::var_os("HOME") {
        venvs.push(Path::new(&home).join(".cache/logits-processing/venv"));
    }
    for venv in venvs {
        if let Ok(entries) = std::fs::read_dir(venv.join("lib")) {
            for entry in entries.flatten() {
                dirs.push(entry.path().join("site-packages/nvidia/cu13/lib"));
            }
        }
    }
    dirs.into_iter()
        .map(|d| d.join("libnvrtc.so.13"))
        .find(|p| p.is_file())
}

/// Loads `path` (and the builtins library beside it) globally, for the rest of the process.
fn preload(path: &Path) -> Result<(), String> {
    use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};
    if let Some(dir) = path.parent() {
        if let Ok(entries) = std::fs::read_dir(dir) {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if name.starts_with("libnvrtc-builtins.so") && !name.contains(".alt") {
                    // SAFETY: NVIDIA's library; its initializers are plain.
                    if let Ok(lib) =
                        unsafe { Library::open(Some(entry.path()), RTLD_NOW | RTLD_GLOBAL) }
                    {
                        std::mem::forget(lib);
                    }
                }
            }
        }
    }
    // SAFETY: as above.
    let lib = unsafe { Library::open(Some(path), RTLD_NOW | RTLD_GLOBAL) }
        .map_err(|e| format!("{}: {e}", path.display()))?;
    std::mem::forget(lib);
    Ok(())
}

/// Makes libnvrtc loadable by cudarc, once; the error says where it was looked for.
pub fn load() -> Result<(), CudaError> {
    static LOADED: OnceLock<Result<(), String>> = OnceLock::new();
    LOADED
        .get_or_init(|| {
            if let Some(path) = std::env::var_os("LOGITS_PROCESSING_NVRTC") {
                preload(Path::new(&path))?;
            } else if !unsafe { sys::is_culib_present() } {
                match find_nvrtc() {
                    Some(path) => preload(&path)?,
                    None => {
                        return Err(
                            "libnvrtc not found: set LOGITS_PROCESSING_NVRTC to its path, \
                                    or install the nvidia-cuda-nvrtc wheel"
                                .into(),
                        )
                    }
                }
            }
            if unsafe { sys::is_culib_present() } {
                Ok(())
            } else {
                Err("libnvrtc was preloaded but cannot be found by name".into())
            }
        })
        .clone()
        .map_err(CudaError::Compile)
}

/// NVRTC's version, (major, minor).
pub fn version() -> Result<(i32, i32), CudaError> {
    load()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: libnvrtc is loaded; the pointers are to live locals.
    unsafe { sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .map_err(|e| CudaError::Compile(format!("nvrtcVersion: {e:?}")))?;
    Ok((major, minor))
}

/// What a compile produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// PTX text for a virtual architecture (`compute_75`).
    Ptx,
    /// Machine code for a real architecture (`sm_90`); NVRTC runs ptxas on it, so this also checks
    /// what PTX alone cannot (register constraints of inline assembly, for one).
    Cubin,
}

/// Compiles `source` for `arch` with [`OPTIONS`]. The error carries NVRTC's log.
pub fn compile(source: &str, arch: &str, output: Output) -> Result<Vec<u8>, CudaError> {
    load()?;
    let fail = |what: &str, e: &dyn std::fmt::Debug| CudaError::Compile(format!("{what}: {e:?}"));
    let src = CString::new(source).map_err(|e| fail("source", &e))?;
    let name = c"apply.cu";
    let program =
        result::create_program(&src, Some(name)).map_err(|e| fail("nvrtcCreateProgram", &e))?;
    let mut options: Vec<String> = OPTIONS.iter().map(|s| s.to_string()).collect();
    options.push(format!("--gpu-architecture={arch}"));
    // SAFETY: `program` is live until destroyed below; `src` and `name` outlive it.
    let out = unsafe {
        let compiled = result::compile_program(program, &options);
        let out = match compiled {
            Err(e) => {
                let log = result::get_program_log(program).unwrap_or_default();
                let log = CStr::from_ptr(log.as_ptr()).to_string_lossy().into_owned();
                Err(CudaError::Compile(format!("{e:?} for {arch}:\n{log}")))
            }
            Ok(()) => match output {
                Output::Ptx => result::get_ptx(program)
                    .map(|ptx| {
                        let bytes: Vec<u8> = ptx.iter().map(|&c| c as u8).collect();
                        // NVRTC's PTX ends with a NUL.
                        bytes.into_iter().take_while(|&b| b != 0).collect()
                    })
                    .map_err(|e| fail("nvrtcGetPTX", &e)),
                Output::Cubin => {
                    let mut size = 0usize;
                    match sys::nvrtcGetCUBINSize(program, &mut size).result() {
                        Err(e) => Err(fail("nvrtcGetCUBINSize", &e)),
                        Ok(()) => {
                            let mut cubin = vec![0u8; size];
                            sys::nvrtcGetCUBIN(program, cubin.as_mut_ptr().cast())
                                .result()
                                .map(|()| cubin)
                                .map_err(|e| fail("nvrtcGetCUBIN", &e))
                        }
                    }
                }
            },
        };
        let _ = result::destroy_program(program);
        out
    };
    out
}

/// A short hash of the kernel source (64-bit FNV-1a), written into the checked-in PTX's first line
/// so that a test can tell a stale PTX from a current one without NVRTC.
pub fn source_hash(source: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in source.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// The first line of the checked-in PTX for the current source.
pub fn ptx_header(source: &str) -> String {
    format!(
        "// logits-processing apply.cu source fnv1a64 {} ({PTX_ARCH}); regenerate: cargo run -p logits-processing-cuda --example gen_ptx",
        source_hash(source)
    )
}
