//! The kernel source compiles, and the checked-in PTX is the current source's.
//!
//! The staleness check (a hash of the source in the PTX's first line) runs everywhere. The
//! compiles need libnvrtc (found as `nvrtc::load` says: `LOGITS_PROCESSING_NVRTC`, the loader
//! path, a CUDA toolkit, the `nvidia-cuda-nvrtc` wheel in the project's venv), so they are ignored
//! in a plain `cargo test`; `scripts/test.sh` and `scripts/gpu-check.sh` run them, and they fail,
//! never skip, where libnvrtc cannot be loaded. No GPU needed: syntax and register-constraint
//! errors are caught on a CPU machine.

use logits_processing_cuda::{kernel_source, nvrtc, KERNEL_PTX, KERNEL_SOURCE};

const ENTRIES: [&str; 6] = [
    "lp_apply_f32",
    "lp_apply_f16",
    "lp_apply_bf16",
    "lp_bands_f32",
    "lp_bands_f16",
    "lp_bands_bf16",
];

#[test]
fn checked_in_ptx_is_of_the_current_source() {
    let first = KERNEL_PTX.lines().next().unwrap_or_default();
    assert_eq!(
        first,
        nvrtc::ptx_header(&kernel_source()),
        "kernels/apply.ptx is stale (the kernel source or the constants in packed.rs changed): \
         regenerate it (docs/cuda.md)"
    );
    for entry in ENTRIES {
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
fn the_source_takes_its_constants_from_rust() {
    // The layout and the op codes are defined once, in packed.rs; the file itself must not define
    // them (a copy could drift).
    for name in [
        "OP_",
        "RULE_",
        "DESC_WORDS",
        "DENSE_WORDS",
        "SPARSE_WORDS",
        "NO_TOKEN",
        "EXP_",
        "FIXED_BITS",
    ] {
        assert!(
            !KERNEL_SOURCE.contains(&format!("#define {name}")),
            "apply.cu defines {name}"
        );
    }
    assert!(kernel_source().starts_with(&logits_processing_cuda::packed::kernel_header()));
}

fn nvrtc_version() -> (i32, i32) {
    nvrtc::version().unwrap_or_else(|e| {
        panic!("this test needs libnvrtc ({e}); run it through scripts/test.sh, which finds the venv's")
    })
}

#[test]
#[ignore = "needs libnvrtc; scripts/test.sh runs it with the venv's nvidia-cuda-nvrtc"]
fn kernel_source_compiles_with_nvrtc() {
    let (major, minor) = nvrtc_version();
    println!("NVRTC {major}.{minor}");
    let source = kernel_source();
    let ptx = nvrtc::compile(&source, nvrtc::PTX_ARCH, nvrtc::Output::Ptx).unwrap();
    let ptx = String::from_utf8(ptx).unwrap();
    for entry in ENTRIES {
        assert!(ptx.contains(&format!(".entry {entry}(")), "{entry} missing");
    }
    // Machine code for Turing, Ampere, Hopper (the H200) and Blackwell: ptxas accepts it all.
    for arch in ["sm_75", "sm_80", "sm_90", "sm_100"] {
        let cubin = nvrtc::compile(&source, arch, nvrtc::Output::Cubin)
            .unwrap_or_else(|e| panic!("{arch}: {e}"));
        assert!(cubin.starts_with(b"\x7fELF"), "{arch}: not an ELF cubin");
    }
}

#[test]
#[ignore = "needs NVRTC 13.0 (LOGITS_PROCESSING_NVRTC, see docs/cuda.md); scripts/test.sh runs it"]
fn checked_in_ptx_is_nvrtc_13_0_output() {
    let version = nvrtc_version();
    assert_eq!(
        version,
        (13, 0),
        "the checked-in PTX is made by NVRTC 13.0: point LOGITS_PROCESSING_NVRTC at it"
    );
    let ptx = nvrtc::compile(&kernel_source(), nvrtc::PTX_ARCH, nvrtc::Output::Ptx).unwrap();
    let checked_in = KERNEL_PTX.split_once('\n').unwrap().1;
    assert!(
        checked_in.as_bytes() == ptx.as_slice(),
        "kernels/apply.ptx differs from NVRTC 13.0's output: regenerate it (docs/cuda.md)"
    );
}
