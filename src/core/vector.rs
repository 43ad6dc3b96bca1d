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

#[cfg(test)]
mod tests {
    use super::*;

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
