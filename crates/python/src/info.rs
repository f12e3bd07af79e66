//! What the command line (`logits_processing.cli`) reads from the extension: the spec language's
//! JSON Schema and what this build and machine can do.

use pyo3::prelude::*;
use pyo3::types::PyDict;

/// The JSON Schema (draft 2020-12) of the spec language, generated from the core's registry of
/// kinds: the text published as docs/spec.schema.json.
///
/// Returns:
///     str: The schema as JSON text (two-space indents, a final newline).
///
/// Example:
///     >>> import json
///     >>> from logits_processing import _lib
///     >>> "temperature" in json.loads(_lib.spec_schema())["$defs"]
///     True
#[pyfunction]
pub(crate) fn spec_schema() -> String {
    logits_processing::spec_schema::spec_schema_text()
}

/// What this build uses on this machine: the version, the CPU paths taken (the row pass's AVX2
/// and FMA kernels, else portable loops), whether the CUDA path is compiled in and whether a
/// CUDA driver with a GPU and NVRTC were found.
///
/// Returns:
///     dict: ``version``, ``cpu_path``, ``cpu_features`` (detected), ``cuda_support``,
///     ``cuda`` (``None`` when a GPU can be used, else why not), ``kernels`` (the device
///     kernels' images this build carries).
#[pyfunction]
pub(crate) fn build_info(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let info = PyDict::new(py);
    info.set_item("version", env!("CARGO_PKG_VERSION"))?;
    let mut detected: Vec<&str> = vec![];
    #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
    {
        use std::arch::is_x86_feature_detected as has;
        for (name, present) in [
            ("avx", has!("avx")),
            ("avx2", has!("avx2")),
            ("fma", has!("fma")),
            ("avx512f", has!("avx512f")),
        ] {
            if present {
                detected.push(name);
            }
        }
    }
    // The core's own decision (the CPU's features capped by `LOGITS_PROCESSING_CPU`).
    let path = match logits_processing::cpu::level() {
        logits_processing::cpu::CpuLevel::Avx512 => "avx512",
        logits_processing::cpu::CpuLevel::Avx2 => "avx2+fma",
        logits_processing::cpu::CpuLevel::Portable => "portable",
    };
    info.set_item("cpu_path", path)?;
    info.set_item("cpu_features", detected)?;
    info.set_item("cuda_support", cfg!(feature = "cuda"))?;
    #[cfg(feature = "cuda")]
    {
        let cuda = py.detach(logits_processing_cuda::cuda_unavailable_reason);
        info.set_item("cuda", cuda)?;
        info.set_item("kernels", logits_processing_cuda::kernel_images())?;
    }
    #[cfg(not(feature = "cuda"))]
    {
        info.set_item("cuda", "not compiled with the cuda feature")?;
        info.set_item("kernels", "not compiled with the cuda feature")?;
    }
    Ok(info)
}
