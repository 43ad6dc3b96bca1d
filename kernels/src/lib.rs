//! loomem's numeric kernels: the arithmetic a model pass spends its time in.
//!
//! They live in their own crate so that every profile builds them optimised
//! (`[profile.dev.package.loomem-kernels]` in the root manifest): hand-written
//! SIMD kernels run two orders of magnitude slower at opt-level 0, where the
//! loomem crate itself is built for quick edit-compile cycles. Nothing here
//! knows about memories, streams or models; the embedding providers call in.

pub mod bf16;
pub mod nn;
