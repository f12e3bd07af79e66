//! What a truncation rule resolves to: the band of values it keeps, and the scratch space of the
//! selections.

/// Values outside `lo..=hi` become `-inf`; values inside (and NaN) are kept.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Band {
    pub lo: f32,
    pub hi: f32,
}

impl Band {
    /// Keeps everything.
    pub const ALL: Band = Band {
        lo: f32::NEG_INFINITY,
        hi: f32::INFINITY,
    };

    /// Not a band of values: marks an [`crate::Edit::ForceIf`] whose condition held.
    pub const FIRED: Band = Band {
        lo: f32::INFINITY,
        hi: f32::NEG_INFINITY,
    };

    #[inline]
    pub fn removes(&self, x: f32) -> bool {
        x < self.lo || x > self.hi
    }
}

/// Scratch space for [`Truncation::band`](super::Truncation::band): (key, weight, value) entries.
pub type Work = Vec<(u32, u64, f32)>;
