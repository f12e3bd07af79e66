//! Which SIMD paths the whole-row passes may take: what the CPU reports, capped by the
//! environment variable `LOGITS_PROCESSING_CPU`, read once per process.
//!
//! - `auto` (or unset): every path the CPU has;
//! - `avx2`: AVX, AVX2, FMA and F16C paths where the CPU has them, never AVX-512;
//! - `portable`: no SIMD path (the code the compiler writes for the build's target).
//!
//! Any other value is read as `auto`. Every path gives the same bits (the tests compare them),
//! so the setting changes speed alone; it exists to run and measure each path on one machine.
//!
//! ```
//! use logits_processing::cpu::{level, CpuLevel};
//! // Whatever the machine, the level is one of the three.
//! assert!(matches!(level(), CpuLevel::Portable | CpuLevel::Avx2 | CpuLevel::Avx512));
//! ```

use std::sync::OnceLock;

/// The widest SIMD paths allowed, in increasing order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum CpuLevel {
    /// No SIMD path.
    Portable,
    /// The AVX and AVX2 (+ FMA, F16C) paths.
    Avx2,
    /// The AVX-512 paths too.
    Avx512,
}

/// The level the passes run at: the CPU's (`Avx512` with AVX-512 F and DQ, `Avx2` with AVX2),
/// capped by `LOGITS_PROCESSING_CPU`.
pub fn level() -> CpuLevel {
    static LEVEL: OnceLock<CpuLevel> = OnceLock::new();
    *LEVEL.get_or_init(|| {
        let cap = match std::env::var("LOGITS_PROCESSING_CPU").as_deref() {
            Ok("portable") => CpuLevel::Portable,
            Ok("avx2") => CpuLevel::Avx2,
            _ => CpuLevel::Avx512,
        };
        detected().min(cap)
    })
}

#[cfg(target_arch = "x86_64")]
fn detected() -> CpuLevel {
    if std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512dq")
    {
        CpuLevel::Avx512
    } else if std::arch::is_x86_feature_detected!("avx2") {
        CpuLevel::Avx2
    } else {
        CpuLevel::Portable
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn detected() -> CpuLevel {
    CpuLevel::Portable
}

/// Whether the AVX paths may run.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn avx() -> bool {
    level() >= CpuLevel::Avx2 && std::arch::is_x86_feature_detected!("avx")
}

/// Whether the AVX2 paths may run.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn avx2() -> bool {
    level() >= CpuLevel::Avx2 && std::arch::is_x86_feature_detected!("avx2")
}

/// Whether the AVX2 + FMA paths may run.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn avx2_fma() -> bool {
    avx2() && std::arch::is_x86_feature_detected!("fma")
}

/// Whether the AVX2 + FMA + F16C paths may run.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn avx2_fma_f16c() -> bool {
    avx2_fma() && std::arch::is_x86_feature_detected!("f16c")
}

/// Whether the AVX-512 (F and DQ) paths may run.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn avx512() -> bool {
    level() == CpuLevel::Avx512
}
