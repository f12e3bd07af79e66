//! CUDA path (work in progress).
