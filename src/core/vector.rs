//! Vector arithmetic shared by the store's hot index, the pipeline's
//! within-batch checks and the embedders.

/// Scale `v` to unit length (left as is when it is all zeros).
pub fn l2_normalize(v: &mut [f32]) {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x /= norm);
    }
}

/// Cosine similarity of two unit vectors. The pipeline's within-batch checks
/// call this O(batch²) times, so it uses AVX2 when the CPU has it (the build
/// targets baseline x86-64, i.e. SSE2 only).
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2 (checked just above).
        return unsafe { dot_avx2(a, b) };
    }
    dot_lanes(a, b)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
    dot_lanes(a, b)
}

/// Sixteen independent partial sums let the compiler vectorise the loop (a
/// single running sum cannot be reordered) and keep two vector registers busy.
#[inline(always)]
fn dot_lanes(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let (lanes_a, rest_a) = a.as_chunks::<16>();
    let (lanes_b, rest_b) = b.as_chunks::<16>();
    let mut acc = [0.0f32; 16];
    for (x, y) in lanes_a.iter().zip(lanes_b) {
        for k in 0..16 {
            acc[k] += x[k] * y[k];
        }
    }
    let tail: f32 = rest_a.iter().zip(rest_b).map(|(x, y)| x * y).sum();
    acc.iter().sum::<f32>() + tail
}

/// Quantise the unit vector `v` to signed bytes with one scale (symmetric:
/// the largest magnitude maps to 127), written to `out` (as long as `v`);
/// returns the scale, so that `v[i] ≈ scale * out[i]`. An int8 copy is a
/// quarter of the f32 bytes, and a scan over many rows is bound by the bytes
/// it reads.
pub fn quantize_i8(v: &[f32], out: &mut [i8]) -> f32 {
    assert_eq!(v.len(), out.len(), "one byte per value");
    let max = v.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    if max == 0.0 || !max.is_finite() {
        out.fill(0);
        return 0.0;
    }
    let scale = max / 127.0;
    for (o, x) in out.iter_mut().zip(v) {
        *o = (x / scale).round().clamp(-127.0, 127.0) as i8;
    }
    scale
}

/// `q`'s int8 dot product (exact; with the scales of [`quantize_i8`] it
/// approximates the f32 dot) with each row of the row-major matrix `rows`
/// (`q.len()` bytes a row), into `out` (one per row). One call for many rows
/// keeps the AVX2 loop (when the CPU has it) free of per-row dispatch.
pub fn dot_i8_rows(q: &[i8], rows: &[i8], out: &mut [i32]) {
    let d = q.len();
    assert_eq!(
        rows.len(),
        d * out.len(),
        "one code of {d} bytes per output"
    );
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2 (checked just above).
        return unsafe { dot_i8_rows_avx2(q, rows, out) };
    }
    for (o, row) in out.iter_mut().zip(rows.chunks_exact(d.max(1))) {
        *o = dot_i8_plain(q, row);
    }
}

fn dot_i8_plain(a: &[i8], b: &[i8]) -> i32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| i32::from(*x) * i32::from(*y))
        .sum()
}

/// 32 bytes a step with `vpmaddubsw`, which multiplies unsigned by signed
/// bytes: |q| times (row with q's sign), summed in pairs into i16 (at most
/// 2·127·127, no saturation: codes stay within ±127), then widened and
/// summed into eight i32 lanes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn dot_i8_rows_avx2(q: &[i8], rows: &[i8], out: &mut [i32]) {
    use std::arch::x86_64::*;
    let d = q.len();
    let (q_lanes, q_rest) = q.as_chunks::<32>();
    let ones = _mm256_set1_epi16(1);
    for (o, row) in out.iter_mut().zip(rows.chunks_exact(d.max(1))) {
        let (r_lanes, r_rest) = row.as_chunks::<32>();
        let mut acc = _mm256_setzero_si256();
        for (x, y) in q_lanes.iter().zip(r_lanes) {
            // SAFETY: each chunk is 32 readable bytes; unaligned loads.
            let (vx, vy) = unsafe {
                (
                    _mm256_loadu_si256(x.as_ptr().cast()),
                    _mm256_loadu_si256(y.as_ptr().cast()),
                )
            };
            let pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(vx, vx), _mm256_sign_epi8(vy, vx));
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, ones));
        }
        let sum = _mm_add_epi32(
            _mm256_castsi256_si128(acc),
            _mm256_extracti128_si256::<1>(acc),
        );
        let sum = _mm_add_epi32(sum, _mm_shuffle_epi32::<0b01_00_11_10>(sum));
        let sum = _mm_add_epi32(sum, _mm_shuffle_epi32::<0b10_11_00_01>(sum));
        *o = _mm_cvtsi128_si32(sum) + dot_i8_plain(q_rest, r_rest);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dot_i8(a: &[i8], b: &[i8]) -> i32 {
        let mut out = [0i32];
        dot_i8_rows(a, b, &mut out);
        out[0]
    }

    #[test]
    fn int8_dot_matches_the_plain_sum_and_approximates_the_f32_dot() {
        for n in [0usize, 1, 31, 32, 33, 384, 1000] {
            let mut a: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
            let mut b: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
            l2_normalize(&mut a);
            l2_normalize(&mut b);
            let (mut qa, mut qb) = (vec![0; n], vec![0; n]);
            let (sa, sb) = (quantize_i8(&a, &mut qa), quantize_i8(&b, &mut qb));
            assert_eq!(dot_i8(&qa, &qb), dot_i8_plain(&qa, &qb), "n = {n}");
            let mut many = vec![0i32; 3];
            let rows: Vec<i8> = [&qb[..], &qa[..], &qb[..]].concat();
            dot_i8_rows(&qa, &rows, &mut many);
            assert_eq!(
                many,
                [
                    dot_i8_plain(&qa, &qb),
                    dot_i8_plain(&qa, &qa),
                    dot_i8_plain(&qa, &qb)
                ]
            );
            let approx = sa * sb * dot_i8(&qa, &qb) as f32;
            assert!((approx - dot(&a, &b)).abs() < 0.01, "n = {n}");
        }
        // Extremes neither saturate nor overflow a lane.
        let low = vec![-127i8; 4096];
        let high = vec![127i8; 4096];
        assert_eq!(dot_i8(&low, &low), 127 * 127 * 4096);
        assert_eq!(dot_i8(&low, &high), -127 * 127 * 4096);
        let mut zero = [7i8; 2];
        assert_eq!(quantize_i8(&[0.0, 0.0], &mut zero), 0.0);
        assert_eq!(zero, [0, 0]);
    }

    #[test]
    fn dot_matches_the_plain_sum_for_any_length() {
        for n in [0usize, 1, 7, 8, 9, 384, 1000] {
            let a: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
            let b: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
            let plain: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
            assert!((dot(&a, &b) - plain).abs() < 1e-3, "n = {n}");
        }
    }
}
