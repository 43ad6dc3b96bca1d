//! loomem's numeric kernels: the arithmetic a model pass spends its time in.
//!
//! They live in their own crate so that every profile builds them optimised
//! (`[profile.dev.package.loomem-kernels]` in the root manifest): hand-written
//! SIMD kernels run two orders of magnitude slower at opt-level 0, where the
//! loomem crate itself is built for quick edit-compile cycles. Nothing here
//! knows about memories, streams or models; the embedding providers call in.

pub mod bf16;
pub mod int8;
pub mod nn;
mod panels;

pub use panels::Dense;

/// Inputs for the tests and for the `embed` bench's `kernels/…` group.
#[doc(hidden)]
pub mod testing {
    /// `n` pseudo-random values in [-0.5, 0.5), the same for the same `seed`.
    pub fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5
            })
            .collect()
    }
}
