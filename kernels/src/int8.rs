//! Dense layers as int8 products on AVX-512 VNNI (`vpdpbusd`).
//!
//! `vpdpbusd` multiplies 64 unsigned bytes by 64 signed bytes and adds
//! them, four at a time, into 16 i32 lanes: twice the products of
//! `vdpbf16ps` an instruction (this machine retires 1,063 G int8 operations a
//! second a core against 486 GFLOP/s of bf16). A layer's weights are rounded
//! once, at load, to i8 with a scale per output column. A pass maps each
//! input row onto the bytes 0–255 with a step and a zero point of its own
//! (its smallest value to 0, its largest to 255), so a row of GELU outputs,
//! almost all positive, keeps nearly twice the resolution of a symmetric
//! i8. The zero point adds `zero · Σ w` to every column, which is
//! subtracted before the scales are applied. The sums are exact in i32; only
//! the roundings err, bounded in the tests.
//!
//! Only x86-64 CPUs with AVX-512 F, BW and VNNI run it; elsewhere
//! [`Linear::new`] returns None.

use crate::panels::{self, Dense, Out, LANES, PANEL, TILE_ROWS};

/// A dense layer `y = x·Wᵀ + b` with its weights packed for
/// [`Dense::forward_into`].
pub struct Linear {
    inputs: usize,
    /// Input values taken four at a time (`inputs` rounded up to a multiple
    /// of four, quartered).
    quads: usize,
    outputs: usize,
    /// Per panel, per quad of inputs, the quad's four i8 weights of each of
    /// the panel's columns as one word (lowest byte the first input).
    panels: Vec<u32>,
    /// Per column (zero-padded to whole panels): the weights' scale, and
    /// the sum of its rounded weights.
    scale: Vec<f32>,
    sums: Vec<f32>,
    bias: Vec<f32>,
}

/// Whether this CPU runs the int8 kernels.
pub fn supported() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// The scale that maps the largest magnitude of `values` to 127 (1 for
/// all zeros).
fn scale_of(values: &[f32]) -> f32 {
    let max = values.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    if max > 0.0 {
        max / 127.0
    } else {
        1.0
    }
}

/// `v / scale` rounded to the nearest integer (ties to even) in [-127, 127].
fn round_to_i8(v: f32, scale: f32) -> i32 {
    ((v * (1.0 / scale)).round_ties_even() as i32).clamp(-127, 127)
}

#[cfg(test)]
/// A row's step and zero point: the range from its smallest value to its
/// largest (widened to hold 0) over the bytes 0–255 (step 1 for all zeros).
fn affine_of(row: &[f32]) -> (f32, i32) {
    let (lo, hi) = row
        .iter()
        .fold((0.0f32, 0.0f32), |(lo, hi), &v| (lo.min(v), hi.max(v)));
    affine(lo, hi)
}

fn affine(lo: f32, hi: f32) -> (f32, i32) {
    let step = if hi > lo { (hi - lo) / 255.0 } else { 1.0 };
    let zero = ((-lo * (1.0 / step)).round_ties_even() as i32).clamp(0, 255);
    (step, zero)
}

#[cfg(test)]
/// `v` as a byte of the row stepped by `step` with zero point `zero`.
fn to_byte(v: f32, step: f32, zero: i32) -> i32 {
    ((v * (1.0 / step)).round_ties_even() as i32 + zero).clamp(0, 255)
}

impl Linear {
    /// Packs `weights` (`bias.len()` rows of `inputs` values, row-major), or
    /// None when this CPU lacks AVX-512 VNNI.
    pub fn new(weights: &[f32], bias: &[f32]) -> Option<Linear> {
        if !supported() {
            return None;
        }
        let (inputs, outputs, count) = panels::shape(weights, bias)?;
        let quads = inputs.div_ceil(4);
        let mut packed = vec![0u32; count * quads * PANEL];
        let mut scale = vec![0.0f32; count * PANEL];
        let mut sums = vec![0.0f32; count * PANEL];
        for (o, row) in weights.chunks_exact(inputs).enumerate() {
            let (panel, column) = (o / PANEL, o % PANEL);
            scale[o] = scale_of(row);
            let q: Vec<i32> = row.iter().map(|&w| round_to_i8(w, scale[o])).collect();
            sums[o] = q.iter().sum::<i32>() as f32;
            for (p, quad) in q.chunks(4).enumerate() {
                let word = quad
                    .iter()
                    .enumerate()
                    .fold(0u32, |w, (k, &v)| w | (u32::from(v as i8 as u8) << (8 * k)));
                packed[(panel * quads + p) * PANEL + column] = word;
            }
        }
        let mut bias = bias.to_vec();
        bias.resize(count * PANEL, 0.0);
        Some(Linear {
            inputs,
            quads,
            outputs,
            panels: packed,
            scale,
            sums,
            bias,
        })
    }

    #[cfg(not(target_arch = "x86_64"))]
    unsafe fn panel(&self, _: &Rows, _: usize, _: Out) {
        unreachable!("packed only where AVX-512 VNNI runs")
    }

    /// One panel's columns of every row, [`TILE_ROWS`] rows at a time.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512vnni")]
    unsafe fn panel(&self, input: &Rows, panel: usize, out: Out) {
        use std::arch::x86_64::*;
        let (xs, rows) = (input.bytes, input.count);
        let quads = self.quads;
        let w = self.panels.as_ptr().add(panel * quads * PANEL);
        for first in (0..rows).step_by(TILE_ROWS) {
            let x = xs.as_ptr().add(first * quads);
            let mut acc = [[_mm512_setzero_si512(); LANES]; TILE_ROWS];
            for p in 0..quads {
                let wp = w.add(p * PANEL);
                let ws: [__m512i; LANES] =
                    std::array::from_fn(|l| _mm512_loadu_si512(wp.add(16 * l).cast()));
                for (r, acc) in acc.iter_mut().enumerate() {
                    let xv = _mm512_set1_epi32(*x.add(r * quads + p) as i32);
                    for l in 0..LANES {
                        acc[l] = _mm512_dpbusd_epi32(acc[l], xv, ws[l]);
                    }
                }
            }
            for (r, acc) in acc.iter().enumerate().take(rows - first) {
                let step = _mm512_set1_ps(f32::from_bits(input.steps[first + r]));
                let zero = _mm512_set1_ps(input.zeros[first + r] as f32);
                for (l, acc) in acc.iter().enumerate() {
                    let column = panel * PANEL + 16 * l;
                    if column >= self.outputs {
                        break;
                    }
                    let weights = _mm512_loadu_ps(self.sums.as_ptr().add(column));
                    let sums = _mm512_fnmadd_ps(zero, weights, _mm512_cvtepi32_ps(*acc));
                    let scale =
                        _mm512_mul_ps(step, _mm512_loadu_ps(self.scale.as_ptr().add(column)));
                    let bias = _mm512_loadu_ps(self.bias.as_ptr().add(column));
                    let v = _mm512_fmadd_ps(sums, scale, bias);
                    let mask = panels::first_lanes(self.outputs - column);
                    _mm512_mask_storeu_ps(out.0.add((first + r) * self.outputs + column), mask, v);
                }
            }
        }
    }
}

impl Dense for Linear {
    fn forward_into(&self, x: &[f32], out: &mut Vec<f32>, xs: &mut Vec<u32>) {
        // Rows padded to whole tiles (their results are not stored).
        let (rows, padded) = panels::rows_of(x, self.inputs);
        let words = padded * self.quads;
        xs.resize(words + 2 * padded, 0);
        let (bytes, rest) = xs.split_at_mut(words);
        let (steps, zeros) = rest.split_at_mut(padded);
        for (r, (row, dst)) in x
            .chunks_exact(self.inputs)
            .zip(bytes.chunks_exact_mut(self.quads))
            .enumerate()
        {
            // SAFETY: `supported()` held when the layer was packed; `dst`
            // holds `row`'s quads.
            let (step, zero) = unsafe { quantize(row, dst) };
            (steps[r], zeros[r]) = (step.to_bits(), zero as u32);
        }
        out.resize(rows * self.outputs, 0.0);
        let dst = Out(out.as_mut_ptr());
        let rows_of = Rows {
            bytes,
            steps,
            zeros,
            count: rows,
        };
        panels::split(self.outputs.div_ceil(PANEL), |panel| {
            // SAFETY: as above; the tiles read within the rows' buffers and
            // the packed weights and write rows `< rows` of their own
            // panel's columns of `out`.
            unsafe { self.panel(&rows_of, panel, dst) }
        });
    }
}

/// A pass's input rows as bytes, with each row's step and zero point.
struct Rows<'a> {
    bytes: &'a [u32],
    steps: &'a [u32],
    zeros: &'a [u32],
    count: usize,
}

/// `row` as bytes by its own step and zero point (as `affine_of` and
/// `to_byte` in the tests), four a word into `dst` (`row.len()` quartered, rounded up;
/// the last word's missing bytes are 0, against weights of 0), 16 values at
/// a time; returns the step and the zero point.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn quantize(row: &[f32], dst: &mut [u32]) -> (f32, i32) {
    use std::arch::x86_64::*;
    debug_assert_eq!(dst.len(), row.len().div_ceil(4));
    let (mut lo, mut hi) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    for chunk in row.chunks(16) {
        let v = _mm512_maskz_loadu_ps(panels::first_lanes(chunk.len()), chunk.as_ptr());
        lo = _mm512_min_ps(lo, v);
        hi = _mm512_max_ps(hi, v);
    }
    let (step, zero) = affine(_mm512_reduce_min_ps(lo), _mm512_reduce_max_ps(hi));
    let inv = _mm512_set1_ps(1.0 / step);
    let (bottom, top, zero_point) = (
        _mm512_setzero_si512(),
        _mm512_set1_epi32(255),
        _mm512_set1_epi32(zero),
    );
    if let Some(last) = dst.last_mut() {
        *last = 0;
    }
    let bytes = dst.as_mut_ptr().cast::<i8>();
    for (c, chunk) in row.chunks(16).enumerate() {
        let mask = panels::first_lanes(chunk.len());
        let v = _mm512_maskz_loadu_ps(mask, chunk.as_ptr());
        // Round to nearest, ties to even (the default rounding mode).
        let q = _mm512_add_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(v, inv)), zero_point);
        let q = _mm512_min_epi32(_mm512_max_epi32(q, bottom), top);
        _mm512_mask_cvtepi32_storeu_epi8(bytes.add(16 * c), mask, q);
    }
    (step, zero)
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn quantize(_: &[f32], _: &mut [u32]) -> (f32, i32) {
    unreachable!("packed only where AVX-512 VNNI runs")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::values;

    #[test]
    fn the_vector_rounding_is_the_scalar_one() {
        if !supported() {
            return assert!(Linear::new(&[1.0], &[0.0]).is_none());
        }
        for len in [1, 3, 4, 15, 16, 17, 33, 385] {
            let row: Vec<f32> = values(len, len as u64).iter().map(|v| v * 7.0).collect();
            let mut got = vec![0u32; len.div_ceil(4)];
            // SAFETY: the CPU runs AVX-512 VNNI (checked above).
            let (step, zero) = unsafe { quantize(&row, &mut got) };
            assert_eq!((step, zero), affine_of(&row), "{len} values");
            let mut want = vec![0u32; len.div_ceil(4)];
            for (i, &v) in row.iter().enumerate() {
                want[i / 4] |= (to_byte(v, step, zero) as u32) << (8 * (i % 4));
            }
            assert_eq!(got, want, "{len} values");
        }
    }

    /// Odd sizes: a last quad with fewer than four values, a part panel, a
    /// part tile; a row of zeros; buffers kept from call to call.
    #[test]
    fn matches_the_f32_product_within_int8_rounding() {
        let mut xs = Vec::new();
        let mut out = Vec::new();
        for (rows, inputs, outputs) in [(1, 384, 384), (13, 7, 50), (20, 385, 1536), (3, 1536, 17)]
        {
            let mut x = values(rows * inputs, 1);
            if rows > 1 {
                x[..inputs].fill(0.0);
            }
            let (w, b) = (values(outputs * inputs, 2), values(outputs, 3));
            let Some(layer) = Linear::new(&w, &b) else {
                return assert!(!supported());
            };
            for threads in [1, 2] {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                pool.install(|| layer.forward_into(&x, &mut out, &mut xs));
                assert_eq!(out, layer.forward(&x), "kept buffers, {rows} rows");
                for r in 0..rows {
                    let xr = &x[r * inputs..][..inputs];
                    let (sx, _) = affine_of(xr);
                    for o in 0..outputs {
                        let wo = &w[o * inputs..][..inputs];
                        let sw = scale_of(wo);
                        let exact = b[o] + xr.iter().zip(wo).map(|(a, b)| a * b).sum::<f32>();
                        // Each value is off by at most half its step.
                        let bound: f32 = xr
                            .iter()
                            .zip(wo)
                            .map(|(a, b)| a.abs() * sw / 2.0 + b.abs() * sx / 2.0 + sx * sw / 4.0)
                            .sum();
                        let err = (out[r * outputs + o] - exact).abs();
                        assert!(err <= bound + 1e-5, "row {r} col {o}: {err} > {bound}");
                    }
                }
                if rows > 1 {
                    assert!(out[..outputs].iter().zip(&b).all(|(y, b)| y == b), "zeros");
                }
            }
        }
    }
}
