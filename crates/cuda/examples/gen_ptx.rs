//! Regenerates `kernels/apply.ptx` from `kernel_source()` (the generated constants, then
//! `kernels/apply.cu`) with NVRTC.
//!
//! ```text
//! LOGITS_PROCESSING_NVRTC=/path/to/libnvrtc.so.13 cargo run -p logits-processing-cuda --example gen_ptx
//! ```
//!
//! Use NVRTC 13.0 (the `nvidia-cuda-nvrtc==13.0.88` wheel): the PTX then declares ISA 9.0, which
//! every CUDA 13 driver can JIT; a newer NVRTC writes a newer ISA that older 13.x drivers refuse.

use logits_processing_cuda::{kernel_source, nvrtc};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (major, minor) = nvrtc::version()?;
    if (major, minor) != (13, 0) {
        eprintln!("warning: NVRTC {major}.{minor}; the checked-in PTX is made with 13.0 (see docs/cuda.md)");
    }
    let source = kernel_source();
    let ptx = nvrtc::compile(&source, nvrtc::PTX_ARCH, nvrtc::Output::Ptx)?;
    let text = format!(
        "{}\n{}",
        nvrtc::ptx_header(&source),
        String::from_utf8(ptx)?
    );
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/kernels/apply.ptx");
    std::fs::write(path, text)?;
    println!("wrote {path} (NVRTC {major}.{minor}, {})", nvrtc::PTX_ARCH);
    Ok(())
}
