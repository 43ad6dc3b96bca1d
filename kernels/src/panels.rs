//! What the dense kernels share: the tile shape, and the split of a
//! layer's output panels over the threads of the current rayon pool.

/// Output columns of one panel: three AVX-512 registers of 16 lanes.
pub(crate) const LANES: usize = 3;
pub(crate) const PANEL: usize = 16 * LANES;
/// Rows of the input multiplied per tile: with [`LANES`] it keeps 24
/// accumulators, three weight vectors and one broadcast input in the 32
/// vector registers.
pub(crate) const TILE_ROWS: usize = 8;

/// A dense layer `y = x·Wᵀ + b`, its weights packed for one of the kernels.
pub trait Dense: Send + Sync {
    /// `x·Wᵀ + b` for `x` of whole rows of the layer's inputs, row-major, as
    /// rows of its outputs, into `out` (resized to the result), with `xs`
    /// for the input as the kernel takes it: buffers kept from pass to pass
    /// are neither allocated nor cleared again (fresh ones cost page faults
    /// and zeroing, a tenth of a long pass). The panels split over the
    /// current rayon pool's threads.
    fn forward_into(&self, x: &[f32], out: &mut Vec<f32>, xs: &mut Vec<u32>);

    /// [`Dense::forward_into`] into fresh buffers.
    fn forward(&self, x: &[f32]) -> Vec<f32> {
        let mut out = Vec::new();
        self.forward_into(x, &mut out, &mut Vec::new());
        out
    }
}

/// A layer's shape from its `weights` (`bias.len()` rows, row-major): its
/// inputs, its outputs and its panels; None when the weights are not whole
/// rows or there are none.
pub(crate) fn shape(weights: &[f32], bias: &[f32]) -> Option<(usize, usize, usize)> {
    let outputs = bias.len();
    if outputs == 0 || !weights.len().is_multiple_of(outputs) {
        return None;
    }
    Some((weights.len() / outputs, outputs, outputs.div_ceil(PANEL)))
}

/// The rows of `x` (whole rows of `inputs` values) and that count padded to
/// whole tiles.
pub(crate) fn rows_of(x: &[f32], inputs: usize) -> (usize, usize) {
    let rows = x.len() / inputs;
    assert_eq!(x.len(), rows * inputs, "x holds whole rows");
    (rows, rows.div_ceil(TILE_ROWS) * TILE_ROWS)
}

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
