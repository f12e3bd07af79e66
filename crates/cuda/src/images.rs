//! The kernels' machine code: `python/logits_processing/kernels/apply.py` (Triton, the one source
//! of the device kernels) compiled ahead of time by `python/tools/gen_kernels.py` into
//! `kernels/triton/`, checked in, and embedded here. A test of the Python suite compiles the
//! source again and requires the same bytes.
//!
//! Which image a device loads: the cubin built for its architecture where there is one (sm_80 for
//! every 8.x GPU, sm_90, sm_100), else the compute_75 PTX, which the driver compiles for the GPU
//! at first use (and keeps in its compute cache). The cubins come from CUDA 12.9's ptxas and the
//! PTX is ISA 8.0 (8.6 for sm_100's), so drivers of CUDA 12 and 13 alike load them.

use logits_processing::DType;

/// What an image holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Target {
    /// Machine code for one architecture (`90` for sm_90).
    Cubin(u32),
    /// PTX for an architecture and every later one, compiled by the driver.
    Ptx(u32),
}

/// One kernel for one element type and target, and how it is launched.
#[derive(Debug)]
pub(crate) struct Image {
    pub target: Target,
    pub kernel: &'static str,
    pub dtype: DType,
    /// Warps per block: the block has `32 * warps` threads.
    pub warps: u32,
    /// Shared memory a block takes, in bytes (passed at launch).
    pub shared: u32,
    /// The kernel's parameters in order, as the PTX declares them (`ptr`, `u32`, `u64`): the
    /// source's, then the two scratch pointers Triton adds (passed null: the images need none).
    #[cfg_attr(not(test), allow(dead_code))]
    pub params: &'static [&'static str],
    /// The cubin, or the PTX text with a closing NUL.
    pub bytes: &'static [u8],
}

include!("../kernels/triton/images.rs");

/// The target a GPU of compute capability `major.minor` loads: its cubin, or the PTX; `None`
/// below 7.5.
pub(crate) fn target_for(major: i32, minor: i32) -> Option<Target> {
    match (major, minor) {
        (8, _) => Some(Target::Cubin(80)),
        (9, 0) => Some(Target::Cubin(90)),
        (10, 0) => Some(Target::Cubin(100)),
        (7, 5..) | (8.., _) => Some(Target::Ptx(75)),
        _ => None,
    }
}

/// The image of `kernel` for `dtype` and `target`.
pub(crate) fn image(target: Target, kernel: &str, dtype: DType) -> Option<&'static Image> {
    IMAGES
        .iter()
        .find(|i| i.target == target && i.kernel == kernel && i.dtype == dtype)
}

/// How a target is named in messages: `sm_90 cubin`, `compute_75 PTX`.
pub(crate) fn describe(target: Target) -> String {
    match target {
        Target::Cubin(arch) => format!("sm_{arch} cubin"),
        Target::Ptx(arch) => format!("compute_{arch} PTX"),
    }
}

/// The targets carried, for a person.
pub(crate) fn summary() -> String {
    let mut cubins: Vec<u32> = vec![];
    let mut ptx: Vec<u32> = vec![];
    for image in IMAGES {
        let (list, arch) = match image.target {
            Target::Cubin(arch) => (&mut cubins, arch),
            Target::Ptx(arch) => (&mut ptx, arch),
        };
        if !list.contains(&arch) {
            list.push(arch);
        }
    }
    let names = |prefix: &str, archs: &[u32]| {
        archs
            .iter()
            .map(|a| format!("{prefix}_{a}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!(
        "{} cubins and {} PTX (Triton {TRITON_VERSION})",
        names("sm", &cubins),
        names("compute", &ptx)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

    /// Every target has both kernels in every dtype, built by the pinned Triton.
    #[test]
    fn every_target_has_every_kernel_and_dtype() {
        for target in [
            Target::Cubin(80),
            Target::Cubin(90),
            Target::Cubin(100),
            Target::Ptx(75),
        ] {
            for kernel in ["lp_bands", "lp_apply"] {
                for dtype in DTYPES {
                    let image = image(target, kernel, dtype)
                        .unwrap_or_else(|| panic!("no {kernel} {dtype:?} for {target:?}"));
                    assert!(image.bytes.len() > 1000);
                    assert_eq!(image.warps * 32, crate::packed::THREADS as u32);
                    match target {
                        Target::Ptx(_) => {
                            let text = std::str::from_utf8(image.bytes).unwrap();
                            assert!(text.ends_with('\0') && text.contains(".version 8.0\n"));
                            assert!(text.contains(&format!(".entry {kernel}(")));
                        }
                        // An ELF file.
                        Target::Cubin(_) => assert_eq!(&image.bytes[..4], b"\x7fELF"),
                    }
                }
            }
        }
        assert_eq!(IMAGES.len(), 4 * 2 * 3);
        assert!(!TRITON_VERSION.is_empty());
    }

    #[test]
    fn each_gpu_loads_its_own_cubin_or_the_ptx() {
        assert_eq!(target_for(8, 0), Some(Target::Cubin(80)));
        assert_eq!(target_for(8, 9), Some(Target::Cubin(80)));
        assert_eq!(target_for(9, 0), Some(Target::Cubin(90)));
        assert_eq!(target_for(10, 0), Some(Target::Cubin(100)));
        assert_eq!(target_for(10, 3), Some(Target::Ptx(75)));
        assert_eq!(target_for(12, 0), Some(Target::Ptx(75)));
        assert_eq!(target_for(7, 5), Some(Target::Ptx(75)));
        assert_eq!(target_for(7, 0), None);
    }
}
