//! MiniLM's dense layers as bf16 products on AVX-512 (`vdpbf16ps`).
//!
//! candle's matrix multiply runs AVX2 kernels on stable Rust: on this
//! project's machine (AMD EPYC with AVX-512 BF16) it reached ~66 GFLOP/s a
//! core on MiniLM's layers, where one core retires ~500 GFLOP/s of bf16
//! dot products. A layer's weights are rounded to bf16 once, at load, and laid
//! out in panels of [`PANEL`] output columns; each pass rounds its inputs to
//! bf16 and accumulates in f32. The golden-vector tests hold the sentence
//! vectors to cosine 0.999 against sentence-transformers, as in f32.
//!
//! Only x86-64 CPUs with AVX-512 F and BF16 run it; elsewhere [`Linear::new`]
//! returns None and the caller keeps its f32 path.

use crate::panels::{self, first_lanes, Dense, Out, LANES, PANEL, TILE_ROWS};

/// A dense layer `y = x·Wᵀ + b` with its weights packed for [`Dense::forward`].
pub struct Linear {
    inputs: usize,
    /// Input values taken two at a time (`inputs` rounded up to even, halved).
    pairs: usize,
    outputs: usize,
    /// Per panel, per pair of inputs, the pair's two bf16 weights of each of
    /// the panel's columns as one word (low half the even input).
    panels: Vec<u32>,
    /// The bias, zero-padded to whole panels.
    bias: Vec<f32>,
}

/// `v` rounded to the nearest bf16 (ties to even), as its 16 bits.
fn bf16(v: f32) -> u32 {
    let bits = v.to_bits();
    (bits + 0x7fff + ((bits >> 16) & 1)) >> 16
}

/// Values `2p` and `2p + 1` of `row` as one bf16 pair (zero past the end).
fn pair(row: &[f32], p: usize) -> u32 {
    let lo = bf16(row[2 * p]);
    let hi = row.get(2 * p + 1).map_or(0, |&v| bf16(v));
    lo | (hi << 16)
}

/// Whether this CPU runs the bf16 kernels.
pub fn supported() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

impl Linear {
    /// Packs `weights` (`bias.len()` rows of `inputs` values, row-major), or
    /// None when this CPU lacks AVX-512 BF16.
    pub fn new(weights: &[f32], bias: &[f32]) -> Option<Linear> {
        if !supported() {
            return None;
        }
        let (inputs, outputs, count) = panels::shape(weights, bias)?;
        let pairs = inputs.div_ceil(2);
        let mut panels = vec![0u32; count * pairs * PANEL];
        for (o, row) in weights.chunks_exact(inputs).enumerate() {
            let (panel, column) = (o / PANEL, o % PANEL);
            for p in 0..pairs {
                panels[(panel * pairs + p) * PANEL + column] = pair(row, p);
            }
        }
        let mut bias = bias.to_vec();
        bias.resize(count * PANEL, 0.0);
        Some(Linear {
            inputs,
            pairs,
            outputs,
            panels,
            bias,
        })
    }

    #[cfg(not(target_arch = "x86_64"))]
    unsafe fn panel(&self, _: &[u32], _: usize, _: usize, _: Out) {
        unreachable!("packed only where AVX-512 BF16 runs")
    }

    /// One panel's columns of every row, [`TILE_ROWS`] rows at a time.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bf16")]
    unsafe fn panel(&self, xs: &[u32], rows: usize, panel: usize, out: Out) {
        use std::arch::x86_64::*;
        let pairs = self.pairs;
        let w = self.panels.as_ptr().add(panel * pairs * PANEL);
        for first in (0..rows).step_by(TILE_ROWS) {
            let x = xs.as_ptr().add(first * pairs);
            let mut acc = [[_mm512_setzero_ps(); LANES]; TILE_ROWS];
            for p in 0..pairs {
                let wp = w.add(p * PANEL);
                let ws: [__m512bh; LANES] = std::array::from_fn(|l| {
                    std::mem::transmute(_mm512_loadu_si512(wp.add(16 * l).cast()))
                });
                for (r, acc) in acc.iter_mut().enumerate() {
                    let xv: __m512bh =
                        std::mem::transmute(_mm512_set1_epi32(*x.add(r * pairs + p) as i32));
                    for l in 0..LANES {
                        acc[l] = _mm512_dpbf16_ps(acc[l], xv, ws[l]);
                    }
                }
            }
            for (r, acc) in acc.iter().enumerate().take(rows - first) {
                for (l, acc) in acc.iter().enumerate() {
                    let column = panel * PANEL + 16 * l;
                    if column >= self.outputs {
                        break;
                    }
                    let v = _mm512_add_ps(*acc, _mm512_loadu_ps(self.bias.as_ptr().add(column)));
                    let mask = first_lanes(self.outputs - column);
                    _mm512_mask_storeu_ps(out.0.add((first + r) * self.outputs + column), mask, v);
                }
            }
        }
    }
}

impl Dense for Linear {
    fn forward_into(&self, x: &[f32], out: &mut Vec<f32>, xs: &mut Vec<u32>) {
        // The input as bf16 pairs, rows padded to whole tiles with zeros.
        let (rows, padded) = panels::rows_of(x, self.inputs);
        xs.resize(padded * self.pairs, 0);
        for (row, dst) in x
            .chunks_exact(self.inputs)
            .zip(xs.chunks_exact_mut(self.pairs))
        {
            // SAFETY: as in `panel` below; `dst` holds `row`'s pairs.
            unsafe { pairs_of(row, dst) };
        }
        xs[rows * self.pairs..].fill(0);
        // Every value is written below.
        out.resize(rows * self.outputs, 0.0);
        let dst = Out(out.as_mut_ptr());
        let xs: &[u32] = xs;
        panels::split(self.outputs.div_ceil(PANEL), |panel| {
            // SAFETY: `supported()` held when the layer was packed; the
            // tiles read within `xs` and `panels` and write rows `< rows`
            // of their own panel's columns of `out`.
            unsafe { self.panel(xs, rows, panel, dst) }
        });
    }
}

/// `row` as bf16 pairs into `dst` (`row.len()` halved, rounded up), as
/// [`pair`] rounds them, 32 values at a time.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn pairs_of(row: &[f32], dst: &mut [u32]) {
    use std::arch::x86_64::*;
    debug_assert_eq!(dst.len(), row.len().div_ceil(2));
    for (c, chunk) in row.chunks(32).enumerate() {
        let (lo, hi) = (chunk.len().min(16), chunk.len().saturating_sub(16));
        let a = _mm512_maskz_loadu_ps(first_lanes(lo), chunk.as_ptr());
        let b = _mm512_maskz_loadu_ps(first_lanes(hi), chunk.as_ptr().add(lo));
        // The first argument fills the upper 16 values.
        let v: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(b, a));
        let words = chunk.len().div_ceil(2);
        _mm512_mask_storeu_epi32(dst.as_mut_ptr().add(16 * c).cast(), first_lanes(words), v);
    }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn pairs_of(_: &[f32], _: &mut [u32]) {
    unreachable!("packed only where AVX-512 BF16 runs")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::values;

    #[test]
    fn bf16_rounds_to_nearest_even() {
        assert_eq!(bf16(1.0), 0x3f80);
        // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: ties go to even (1).
        assert_eq!(bf16(1.0 + 1.0 / 256.0), 0x3f80);
        assert_eq!(bf16(1.0 + 3.0 / 256.0), 0x3f82);
        assert_eq!(bf16(-2.0), 0xc000);
    }

    #[test]
    fn the_vector_conversion_rounds_as_the_scalar_one() {
        if !supported() {
            return assert!(Linear::new(&[1.0], &[0.0]).is_none());
        }
        for len in [1, 15, 16, 17, 31, 32, 33, 385] {
            let row: Vec<f32> = values(len, len as u64).iter().map(|v| v * 1e3).collect();
            let mut got = vec![0u32; len.div_ceil(2)];
            // SAFETY: the CPU runs AVX-512 BF16 (checked above).
            unsafe { pairs_of(&row, &mut got) };
            let want: Vec<u32> = (0..len.div_ceil(2)).map(|p| pair(&row, p)).collect();
            assert_eq!(got, want, "{len} values");
        }
    }

    /// One layer run into the same buffers at more rows, fewer, then more.
    #[test]
    fn buffers_kept_from_pass_to_pass_give_what_fresh_ones_do() {
        let (inputs, outputs) = (40, 70);
        let Some(layer) = Linear::new(&values(outputs * inputs, 2), &values(outputs, 3)) else {
            return assert!(!supported());
        };
        let (mut out, mut xs) = (Vec::new(), Vec::new());
        // Larger, smaller (stale values past the end), then larger again.
        for (rows, seed) in [(13, 4), (5, 5), (17, 6)] {
            let x = values(rows * inputs, seed);
            layer.forward_into(&x, &mut out, &mut xs);
            assert_eq!(out, layer.forward(&x), "{rows} rows");
        }
    }

    /// Odd sizes: a last pair with one value, a part panel, a part tile.
    #[test]
    fn matches_the_f32_product_within_bf16_rounding() {
        for (rows, inputs, outputs) in [(1, 384, 384), (13, 7, 50), (20, 385, 1536), (3, 1536, 17)]
        {
            let (x, w, b) = (
                values(rows * inputs, 1),
                values(outputs * inputs, 2),
                values(outputs, 3),
            );
            let Some(layer) = Linear::new(&w, &b) else {
                // Without AVX-512 BF16 nothing is packed and MiniLM stays f32.
                assert!(!supported());
                return;
            };
            for threads in [1, 2] {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                let got = pool.install(|| layer.forward(&x));
                assert_eq!(got.len(), rows * outputs);
                for r in 0..rows {
                    for o in 0..outputs {
                        let (xr, wo) = (&x[r * inputs..][..inputs], &w[o * inputs..][..inputs]);
                        let exact = b[o] + xr.iter().zip(wo).map(|(a, b)| a * b).sum::<f32>();
                        // Each product is off by at most ~2·2^-9 of itself.
                        let bound: f32 =
                            xr.iter().zip(wo).map(|(a, b)| (a * b).abs()).sum::<f32>() / 128.0;
                        let err = (got[r * outputs + o] - exact).abs();
                        assert!(err <= bound + 1e-6, "row {r} col {o}: {err} > {bound}");
                    }
                }
            }
        }
    }
}
