//! The clock of the wall-clock kinds (`max_time`, `trigger_phrase`'s `trigger_time`).

use std::sync::Arc;
use std::time::Instant;

/// Where the wall-clock kinds read the time: seconds from a fixed origin. Injectable, so a test
/// (or an engine with its own clock) decides what time it is.
pub trait Clock: Send + Sync + std::fmt::Debug {
    fn now(&self) -> f64;
}

/// The process's monotonic clock.
#[derive(Debug)]
pub struct SystemClock(Instant);

impl SystemClock {
    pub fn shared() -> Arc<dyn Clock> {
        static ORIGIN: std::sync::OnceLock<Arc<SystemClock>> = std::sync::OnceLock::new();
        ORIGIN
            .get_or_init(|| Arc::new(SystemClock(Instant::now())))
            .clone()
    }
}

impl Clock for SystemClock {
    fn now(&self) -> f64 {
        self.0.elapsed().as_secs_f64()
    }
}

/// A clock a test sets by hand.
#[derive(Debug, Default)]
pub struct ManualClock(std::sync::Mutex<f64>);

impl ManualClock {
    pub fn set(&self, seconds: f64) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = seconds;
    }
}

impl Clock for ManualClock {
    fn now(&self) -> f64 {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}
