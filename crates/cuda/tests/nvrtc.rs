//! The kernel source compiles, and the checked-in PTX is the current source's. The compile runs
//! wherever libnvrtc is found (see `nvrtc::load`: `LOGITS_PROCESSING_NVRTC`, the loader path, a
//! CUDA toolkit, the `nvidia-cuda-nvrtc` wheel in the project's venv) and skips, saying why,
//! elsewhere. No GPU needed: syntax and register-constraint errors are caught on a CPU machine.

use logits_processing_cuda::{nvrtc, KERNEL_PTX, KERNEL_SOURCE};

#[test]
fn checked_in_ptx_is_of_the_current_source() {
    let first = KERNEL_PTX.lines().next().unwrap_or_default();
    assert_eq!(
        first,
        nvrtc::ptx_header(KERNEL_SOURCE),
        "kernels/apply.ptx is stale: regenerate it (docs/cuda.md)"
    );
    for entry in ["lp_apply_f32", "lp_apply_f16", "lp_apply_bf16"] {
        assert!(
            KERNEL_PTX.contains(&format!(".entry {entry}(")),
            "{entry} missing from the PTX"
        );
    }
    // ISA 9.0 (NVRTC 13.0) loads on every CUDA 13 driver.
    assert!(
        KERNEL_PTX.contains("\n.version 9.0\n"),
        "the PTX must be made by NVRTC 13.0"
    );
    assert!(KERNEL_PTX.contains("\n.target sm_75\n"));
    // IEEE division everywhere, never an approximate one.
    assert!(KERNEL_PTX.contains("div.rn.f32"));
    assert!(!KERNEL_PTX.contains("div.approx") && !KERNEL_PTX.contains("div.full"));
}

#[test]
fn kernel_source_compiles_with_nvrtc() {
    let (major, minor) = match nvrtc::version() {
        Ok(v) => v,
        Err(e) => {
            println!("SKIPPED: {e}");
            return;
        }
    };
    println!("NVRTC {major}.{minor}");
    let ptx = nvrtc::compile(KERNEL_SOURCE, nvrtc::PTX_ARCH, nvrtc::Output::Ptx).unwrap();
    let ptx = String::from_utf8(ptx).unwrap();
    for entry in ["lp_apply_f32", "lp_apply_f16", "lp_apply_bf16"] {
        assert!(ptx.contains(&format!(".entry {entry}(")), "{entry} missing");
    }
    if (major, minor) == (13, 0) {
        // The same compiler as the checked-in PTX's: the same text.
        let checked_in = KERNEL_PTX.split_once('\n').unwrap().1;
        assert!(
            checked_in == ptx,
            "kernels/apply.ptx differs from NVRTC 13.0's output: regenerate it"
        );
    }
    // Machine code for Turing, Ampere, Hopper (the H200) and Blackwell: ptxas accepts it all.
    for arch in ["sm_75", "sm_80", "sm_90", "sm_100"] {
        let cubin = nvrtc::compile(KERNEL_SOURCE, arch, nvrtc::Output::Cubin)
            .unwrap_or_else(|e| panic!("{arch}: {e}"));
        assert!(cubin.starts_with(b"\x7fELF"), "{arch}: not an ELF cubin");
    }
}
