//! What the dense kernels share: the tile shape, and the split of a
//! layer's output panels over the threads of the current rayon pool.

/// Output columns of one panel: three AVX-512 registers of 16 lanes.
pub(crate) const LANES: usize = 3;
pub(crate) const PANEL: usize = 16 * LANES;
/// Rows of the input multiplied per tile: with [`LANES`] it keeps 24
/// accumulators, three weight vectors and one broadcast input in the 32
/// vector registers.
pub(crate) const TILE_ROWS: usize = 8;

/// A pointer to the output that the panels' threads share: each writes only
/// its own panels' columns.
#[derive(Clone, Copy)]
pub(crate) struct Out(pub(crate) *mut f32);
// SAFETY: the threads write disjoint columns (see `split`'s callers).
unsafe impl Send for Out {}
unsafe impl Sync for Out {}

/// The mask of the first `n` (at most 16) lanes of a register.
#[cfg(target_arch = "x86_64")]
pub(crate) fn first_lanes(n: usize) -> std::arch::x86_64::__mmask16 {
    (((1u32 << n.min(16)) - 1) & 0xffff) as u16
}

/// `panel(i)` for each of `count` panels, in runs of consecutive panels,
/// one run per thread of the current rayon pool.
pub(crate) fn split(count: usize, panel: impl Fn(usize) + Sync) {
    let threads = rayon::current_num_threads().clamp(1, count.max(1));
    let per = count.div_ceil(threads).max(1);
    let run = |first: usize| {
        for i in first..(first + per).min(count) {
            panel(i);
        }
    };
    if threads == 1 {
        run(0);
    } else {
        use rayon::prelude::*;
        (0..count).into_par_iter().step_by(per).for_each(run);
    }
}
