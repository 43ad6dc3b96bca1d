//! Vector arithmetic shared by the store's hot index, the pipeline's
//! within-batch checks and the embedders.

/// Scale `v` to unit length (left as is when it is all zeros). The norm is
/// summed in [`dot`]'s lanes: a single running sum cannot be vectorised, and
/// a stream's load into the hot index normalises every vector it reads.
pub fn l2_normalize(v: &mut [f32]) {
    let norm = dot(v, v).sqrt();
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

/// `a · b` with `b` in half precision, decoded a block at a time (with F16C
/// where the CPU has it): the hot index re-scores its scan's best rows from
/// f16 copies of their vectors, half the bytes of f32.
pub fn dot_f16(a: &[f32], b: &[half::f16]) -> f32 {
    use half::slice::HalfFloatSliceExt;
    const BLOCK: usize = 128;
    let mut wide = [0f32; BLOCK];
    a.chunks(BLOCK)
        .zip(b.chunks(BLOCK))
        .map(|(a, b)| {
            let wide = &mut wide[..b.len()];
            b.convert_to_f32_slice(wide);
            dot(a, wide)
        })
        .sum()
}

/// A half-precision vector widened to f32.
pub fn widen(v: &[half::f16]) -> Vec<f32> {
    use half::slice::HalfFloatSliceExt;
    v.to_f32_vec()
}

/// Quantise the unit vector `v` to signed bytes with one scale (symmetric:
/// the largest magnitude maps to 127), written to `out` (as long as `v`);
/// returns the scale, so that `v[i] ≈ scale * out[i]`. An int8 copy is a
/// quarter of the f32 bytes, and a scan over many rows is bound by the bytes
/// it reads.
pub fn quantize_i8(v: &[f32], out: &mut [i8]) -> f32 {
    quantize_i8_within(v, out, 127)
}

/// As [`quantize_i8`], with the largest magnitude mapped to `top` (1 to 127)
/// instead of 127: coarser codes, for a kernel that needs them small
/// ([`scan_top`]).
pub fn quantize_i8_within(v: &[f32], out: &mut [i8], top: i8) -> f32 {
    assert_eq!(v.len(), out.len(), "one byte per value");
    assert!(top > 0, "a positive top code");
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2 (checked just above).
        return unsafe { quantize_avx2(v, out, top) };
    }
    quantize_lanes(v, out, top)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn quantize_avx2(v: &[f32], out: &mut [i8], top: i8) -> f32 {
    quantize_lanes(v, out, top)
}

/// [`quantize_i8_within`]'s body, built for whichever CPU its caller is.
#[inline(always)]
fn quantize_lanes(v: &[f32], out: &mut [i8], top: i8) -> f32 {
    let max = max_abs(v);
    if max == 0.0 || !max.is_finite() {
        out.fill(0);
        return 0.0;
    }
    let top = f32::from(top);
    steps(v, top / max, top, out);
    max / top
}

/// Each of `v` times `inv`, rounded half away from zero (as `f32::round`,
/// without its library call per value: adding ±0.5 and truncating) and
/// held within ±`top`, into `out`; a NaN becomes 0. The value is clamped
/// first, so the truncation is a plain conversion rather than Rust's
/// saturating cast, whose checks kept the loop from being vectorised (the
/// whole coding of a 384-value vector took three times as long: README,
/// session 81).
#[inline(always)]
fn steps(v: &[f32], inv: f32, top: f32, out: &mut [i8]) {
    for (o, x) in out.iter_mut().zip(v) {
        let y = x * inv;
        let y = if y.is_nan() { 0.0 } else { y };
        let r = (y + 0.5f32.copysign(y)).clamp(-top, top);
        // SAFETY: `r` is finite (not NaN, clamped) and within ±`top`
        // (at most 127), so it truncates to an i32 in range.
        *o = unsafe { r.to_int_unchecked::<i32>() } as i8;
    }
}

/// The largest magnitude in `v` (NaNs skipped).
#[inline(always)]
fn max_abs(v: &[f32]) -> f32 {
    lanes_max(v, 0.0, f32::abs)
}

/// The highest value in `v` (−∞ for none; NaNs skipped).
#[inline(always)]
pub fn highest(v: &[f32]) -> f32 {
    lanes_max(v, f32::NEG_INFINITY, |x| x)
}

/// The highest `f(x)` over `v`, and at least `floor` (NaNs skipped), in
/// sixteen lanes: one running maximum is one dependent instruction a value
/// and cannot be vectorised. Each lane keeps a value only when it is
/// greater, which a NaN never is: one `maxps` a step.
#[inline(always)]
fn lanes_max(v: &[f32], floor: f32, f: impl Fn(f32) -> f32) -> f32 {
    let greater = |m: f32, x: f32| if x > m { x } else { m };
    let (lanes, rest) = v.as_chunks::<16>();
    let mut acc = [floor; 16];
    for x in lanes {
        for k in 0..16 {
            acc[k] = greater(acc[k], f(x[k]));
        }
    }
    rest.iter().map(|&x| f(x)).chain(acc).fold(floor, greater)
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

/// [`dot_i8_rows`] for four codes at once: `qs` holds four codes of `d`
/// bytes back to back, and `out[k * n + r]` gets the dot of code `k` with
/// row `r` of the `n` rows. Each row is read once for all four, so a scan
/// of many codes against one matrix streams the matrix a quarter as often.
/// `top` is the largest magnitude of any code (127 for [`quantize_i8`]'s):
/// codes within [`NARROW_TOP`] take a faster kernel on a CPU with AVX2 and
/// without AVX-512's byte dot products.
pub fn dot_i8_rows4(qs: &[i8], rows: &[i8], out: &mut [i32], top: i8) {
    let d = qs.len() / 4;
    assert_eq!(qs.len(), 4 * d, "four codes");
    let n = out.len() / 4;
    assert_eq!(out.len(), 4 * n, "four outputs per row");
    assert_eq!(rows.len(), d * n, "one code of {d} bytes per row");
    // The four codes only: a scan's rows are its earlier codes, checked
    // when they were the four, and reading every row again on each call
    // would double a debug build's scan.
    debug_assert!(
        qs.iter().all(|c| c.unsigned_abs() <= top.unsigned_abs()),
        "codes within ±{top}"
    );
    #[cfg(target_arch = "x86_64")]
    if has_vnni() {
        // SAFETY: the CPU supports AVX-512 F, BW and VNNI (checked just above).
        return unsafe { dot_i8_rows4_vnni(qs, rows, out) };
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2 (checked just above). (Codes past
        // `top` would give wrong sums in the narrow kernel, not unsafety.)
        return unsafe {
            if top <= NARROW_TOP {
                dot_i8_rows4_narrow_avx2(qs, rows, out)
            } else {
                dot_i8_rows4_avx2(qs, rows, out)
            }
        };
    }
    for (k, q) in qs.chunks_exact(d.max(1)).enumerate().take(4) {
        dot_i8_rows(q, rows, &mut out[k * n..(k + 1) * n]);
    }
}

/// The largest code for which [`dot_i8_rows4`]'s AVX2 kernel takes the
/// rows as unsigned bytes (`y + 64`) and sums [`NARROW_STEPS`] steps' byte
/// products in 16 bits before widening them.
pub const NARROW_TOP: i8 = 63;
/// The steps (32 bytes each) the narrow kernel sums in 16 bits: two pairs
/// of at most 2·127·63 = 16,002 make 32,004, within an i16.
const NARROW_STEPS: usize = 2;

/// The top code a scan of many codes against many ([`dot_i8_rows4`]) is
/// fastest with on this CPU: [`NARROW_TOP`] where the AVX2 kernel is the
/// one taken (the narrow kernel needs neither sign instructions nor a
/// widening every step, which makes up for the error bounds' doubling:
/// the scans recheck what the bounds leave in question), 127 elsewhere
/// (AVX-512's `vpdpbusd` widens as it multiplies, at any code).
pub fn scan_top() -> i8 {
    #[cfg(target_arch = "x86_64")]
    if !has_vnni() && std::arch::is_x86_feature_detected!("avx2") {
        return NARROW_TOP;
    }
    127
}

/// Whether the CPU has AVX-512's byte dot products (`vpdpbusd`).
#[cfg(target_arch = "x86_64")]
fn has_vnni() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512vnni")
}

/// 64 bytes a step with `vpdpbusd`, which multiplies unsigned by signed
/// bytes and sums each four into an i32 lane: each code is shifted into
/// unsigned bytes (`x + 128`), so a lane sums `(x + 128)·y`, and `128·Σy`
/// (the row's own sum, from one more `vpdpbusd` by ones) is taken back off.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn dot_i8_rows4_vnni(qs: &[i8], rows: &[i8], out: &mut [i32]) {
    use std::arch::x86_64::*;
    let d = qs.len() / 4;
    let n = out.len() / 4;
    let full = d / 64;
    // The four codes' whole 64-byte steps, shifted to unsigned.
    let shifted: Vec<__m512i> = (0..4)
        .flat_map(|k| (0..full).map(move |c| (k, c)))
        .map(|(k, c)| {
            let at = &qs[k * d + c * 64..k * d + (c + 1) * 64];
            // SAFETY: 64 readable bytes; an unaligned load.
            let v = unsafe { _mm512_loadu_si512(at.as_ptr().cast()) };
            _mm512_xor_si512(v, _mm512_set1_epi8(i8::MIN))
        })
        .collect();
    let ones = _mm512_set1_epi8(1);
    for (r, row) in rows.chunks_exact(d.max(1)).enumerate().take(n) {
        let mut acc = [_mm512_setzero_si512(); 4];
        let mut sum = _mm512_setzero_si512();
        for c in 0..full {
            // SAFETY: as above.
            let vy = unsafe { _mm512_loadu_si512(row[c * 64..].as_ptr().cast()) };
            for (k, a) in acc.iter_mut().enumerate() {
                *a = _mm512_dpbusd_epi32(*a, shifted[k * full + c], vy);
            }
            sum = _mm512_dpbusd_epi32(sum, ones, vy);
        }
        let correction = 128 * _mm512_reduce_add_epi32(sum);
        for (k, a) in acc.iter().enumerate() {
            let tail = dot_i8_plain(&qs[k * d + full * 64..(k + 1) * d], &row[full * 64..]);
            out[k * n + r] = _mm512_reduce_add_epi32(*a) - correction + tail;
        }
    }
}

/// As [`dot_i8_rows_avx2`], with the signs the other way round (the row's
/// absolute value, each code with the row's sign) so that one row's bytes,
/// loaded once, serve all four codes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn dot_i8_rows4_avx2(qs: &[i8], rows: &[i8], out: &mut [i32]) {
    use std::arch::x86_64::*;
    let d = qs.len() / 4;
    let n = out.len() / 4;
    let q: [&[i8]; 4] = std::array::from_fn(|k| &qs[k * d..(k + 1) * d]);
    let lanes: [&[[i8; 32]]; 4] = std::array::from_fn(|k| q[k].as_chunks::<32>().0);
    let full = lanes[0].len();
    let ones = _mm256_set1_epi16(1);
    for (r, row) in rows.chunks_exact(d.max(1)).enumerate().take(n) {
        let (r_lanes, r_rest) = row.as_chunks::<32>();
        let mut acc = [_mm256_setzero_si256(); 4];
        for (c, y) in r_lanes.iter().enumerate().take(full) {
            // SAFETY: each chunk is 32 readable bytes; unaligned loads.
            let vy = unsafe { _mm256_loadu_si256(y.as_ptr().cast()) };
            let ay = _mm256_sign_epi8(vy, vy);
            for k in 0..4 {
                // SAFETY: as above.
                let vx = unsafe { _mm256_loadu_si256(lanes[k][c].as_ptr().cast()) };
                let pairs = _mm256_maddubs_epi16(ay, _mm256_sign_epi8(vx, vy));
                acc[k] = _mm256_add_epi32(acc[k], _mm256_madd_epi16(pairs, ones));
            }
        }
        for k in 0..4 {
            out[k * n + r] = hsum_epi32(acc[k]) + dot_i8_plain(&q[k][full * 32..], r_rest);
        }
    }
}

/// As [`dot_i8_rows4_avx2`] for codes within ±[`NARROW_TOP`], without its
/// sign instructions: each row's bytes are shifted to unsigned (`y + 64`,
/// 1 to 127) and multiply the codes as they are, so a lane sums
/// `(y + 64)·x` and `64·Σx` (each code's own sum, once a call) is taken
/// back off. A pair of products is at most 2·127·63 = 16,002, so
/// [`NARROW_STEPS`] steps' pairs are summed in i16 lanes and widened
/// (`vpmaddwd`) once for them: 6 multiplies a step and no signs, against
/// 8 and 5. On Zen 2, four codes against 2,048 rows of 384 bytes: 6.8
/// cycles a step against 9.3 (README, session 87).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn dot_i8_rows4_narrow_avx2(qs: &[i8], rows: &[i8], out: &mut [i32]) {
    use std::arch::x86_64::*;
    let d = qs.len() / 4;
    let n = out.len() / 4;
    let q: [&[i8]; 4] = std::array::from_fn(|k| &qs[k * d..(k + 1) * d]);
    // Each code in groups of NARROW_STEPS steps of 32 bytes, and what is left.
    let groups: [&[[[i8; 32]; NARROW_STEPS]]; 4] =
        std::array::from_fn(|k| q[k].as_chunks::<32>().0.as_chunks::<NARROW_STEPS>().0);
    let grouped = groups[0].len() * NARROW_STEPS * 32;
    let shifted_off: [i32; 4] =
        std::array::from_fn(|k| 64 * q[k][..grouped].iter().map(|&x| i32::from(x)).sum::<i32>());
    let ones = _mm256_set1_epi16(1);
    let shift = _mm256_set1_epi8(64);
    for (r, row) in rows.chunks_exact(d.max(1)).enumerate().take(n) {
        let (row_groups, _) = row.as_chunks::<32>().0.as_chunks::<NARROW_STEPS>();
        let mut acc = [_mm256_setzero_si256(); 4];
        for (g, ys) in row_groups.iter().enumerate() {
            let mut pairs = [_mm256_setzero_si256(); 4];
            for (s, y) in ys.iter().enumerate() {
                // SAFETY: each chunk is 32 readable bytes; unaligned loads.
                let vy = unsafe { _mm256_loadu_si256(y.as_ptr().cast()) };
                let uy = _mm256_add_epi8(vy, shift);
                for k in 0..4 {
                    // SAFETY: as above.
                    let vx = unsafe { _mm256_loadu_si256(groups[k][g][s].as_ptr().cast()) };
                    pairs[k] = _mm256_add_epi16(pairs[k], _mm256_maddubs_epi16(uy, vx));
                }
            }
            for k in 0..4 {
                acc[k] = _mm256_add_epi32(acc[k], _mm256_madd_epi16(pairs[k], ones));
            }
        }
        for k in 0..4 {
            out[k * n + r] = hsum_epi32(acc[k]) - shifted_off[k]
                + dot_i8_plain(&q[k][grouped..], &row[grouped..]);
        }
    }
}

/// The sum of the eight i32 lanes of `acc`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn hsum_epi32(acc: std::arch::x86_64::__m256i) -> i32 {
    use std::arch::x86_64::*;
    let sum = _mm_add_epi32(
        _mm256_castsi256_si128(acc),
        _mm256_extracti128_si256::<1>(acc),
    );
    let sum = _mm_add_epi32(sum, _mm_shuffle_epi32::<0b01_00_11_10>(sum));
    let sum = _mm_add_epi32(sum, _mm_shuffle_epi32::<0b10_11_00_01>(sum));
    _mm_cvtsi128_si32(sum)
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
        *o = hsum_epi32(acc) + dot_i8_plain(q_rest, r_rest);
    }
}

/// A dense layer's product for a few rows, written transposed: for the `rows`
/// rows of `x` (`k` values each, row-major) and the `bias.len()` rows of `w`
/// (the layer's weights, `k` values each), `out_t[o · rows + r] = bias[o] +
/// x[r] · w[o]`. Each weight row is read once for all rows of `x`, straight
/// from where it lies: a general matrix multiply first copies the weights
/// into its own blocked layout, which for a handful of rows costs more than
/// the arithmetic (see `providers::embed::minilm`).
pub fn linear_t(x: &[f32], k: usize, w: &[f32], bias: &[f32], out_t: &mut [f32]) {
    let n = bias.len();
    let rows = x.len().checked_div(k).unwrap_or(0);
    assert_eq!(x.len(), rows * k, "x holds whole rows of {k}");
    assert_eq!(w.len(), n * k, "one weight row of {k} per bias");
    assert_eq!(
        out_t.len(),
        n * rows,
        "one output per weight row and row of x"
    );
    #[cfg(target_arch = "x86_64")]
    if avx2_fma() {
        // SAFETY: the CPU supports AVX2 and FMA (checked just above).
        return unsafe { linear_t_avx2(x, k, w, bias, out_t) };
    }
    for (o, (wo, b)) in w.chunks_exact(k.max(1)).zip(bias).enumerate() {
        for r in 0..rows {
            out_t[o * rows + r] = b + dot_lanes(&x[r * k..(r + 1) * k], wo);
        }
    }
}

/// Whether the CPU has AVX2 and FMA (the dense-layer kernels need both).
#[cfg(target_arch = "x86_64")]
fn avx2_fma() -> bool {
    std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
}

/// Tiles of four weight rows by three rows of `x`: twelve accumulators, three
/// `x` vectors and one weight vector fill the sixteen AVX registers, and each
/// step of eight values does twelve fused multiply-adds for seven loads.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn linear_t_avx2(x: &[f32], k: usize, w: &[f32], bias: &[f32], out_t: &mut [f32]) {
    let (n, rows) = (bias.len(), x.len() / k.max(1));
    let t = Tile {
        x,
        w,
        k,
        rows,
        bias,
    };
    for o in (0..n).step_by(4) {
        for r in (0..rows).step_by(3) {
            // SAFETY: the tile's rows lie within `w`, `x` and `out_t` (sizes
            // checked by the caller); AVX2 and FMA are enabled here.
            unsafe {
                match (n - o, rows - r) {
                    (4.., 3..) => t.run::<4, 3>(o, r, out_t),
                    (4.., 2) => t.run::<4, 2>(o, r, out_t),
                    (4.., 1) => t.run::<4, 1>(o, r, out_t),
                    (3, 3..) => t.run::<3, 3>(o, r, out_t),
                    (3, 2) => t.run::<3, 2>(o, r, out_t),
                    (3, 1) => t.run::<3, 1>(o, r, out_t),
                    (2, 3..) => t.run::<2, 3>(o, r, out_t),
                    (2, 2) => t.run::<2, 2>(o, r, out_t),
                    (2, 1) => t.run::<2, 1>(o, r, out_t),
                    (1, 3..) => t.run::<1, 3>(o, r, out_t),
                    (1, 2) => t.run::<1, 2>(o, r, out_t),
                    _ => t.run::<1, 1>(o, r, out_t),
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
struct Tile<'a> {
    x: &'a [f32],
    w: &'a [f32],
    k: usize,
    rows: usize,
    bias: &'a [f32],
}

#[cfg(target_arch = "x86_64")]
impl Tile<'_> {
    /// Weight rows `o..o + A` against rows `r..r + B` of `x`.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn run<const A: usize, const B: usize>(&self, o: usize, r: usize, out_t: &mut [f32]) {
        use std::arch::x86_64::*;
        let k = self.k;
        let whole = k - k % 8;
        let (xp, wp) = (self.x.as_ptr(), self.w.as_ptr());
        let mut acc = [[_mm256_setzero_ps(); B]; A];
        let mut i = 0;
        while i < whole {
            // SAFETY: rows r..r+B of x and o..o+A of w hold k values, i + 8 <= k.
            unsafe {
                let mut xv = [_mm256_setzero_ps(); B];
                for (b, v) in xv.iter_mut().enumerate() {
                    *v = _mm256_loadu_ps(xp.add((r + b) * k + i));
                }
                for (a, row) in acc.iter_mut().enumerate() {
                    let wv = _mm256_loadu_ps(wp.add((o + a) * k + i));
                    for (b, s) in row.iter_mut().enumerate() {
                        *s = _mm256_fmadd_ps(wv, xv[b], *s);
                    }
                }
            }
            i += 8;
        }
        for (a, row) in acc.iter().enumerate() {
            let wo = &self.w[(o + a) * k..(o + a + 1) * k];
            for (b, s) in row.iter().enumerate() {
                let xr = &self.x[(r + b) * k..(r + b + 1) * k];
                let half = _mm_add_ps(_mm256_castps256_ps128(*s), _mm256_extractf128_ps::<1>(*s));
                let half = _mm_add_ps(half, _mm_movehl_ps(half, half));
                let one = _mm_add_ss(half, _mm_shuffle_ps::<0b01>(half, half));
                let tail: f32 = wo[whole..]
                    .iter()
                    .zip(&xr[whole..])
                    .map(|(p, q)| p * q)
                    .sum();
                out_t[(o + a) * self.rows + r + b] = self.bias[o + a] + _mm_cvtss_f32(one) + tail;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The f16 product is the f32 one within half precision's rounding, at
    /// lengths on and off its block, and widening gives back what was kept.
    #[test]
    fn the_f16_product_follows_the_f32_one() {
        use half::slice::HalfFloatSliceExt;
        for dim in [1, 127, 128, 130, 384, 1536] {
            let mut a: Vec<f32> = (0..dim)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
                .collect();
            let mut b: Vec<f32> = (0..dim)
                .map(|i| ((i * 53 % 89) as f32 - 44.0) / 44.0)
                .collect();
            l2_normalize(&mut a);
            l2_normalize(&mut b);
            let mut h = vec![half::f16::ZERO; dim];
            h.convert_from_f32_slice(&b);
            let exact = dot(&a, &b);
            let got = dot_f16(&a, &h);
            assert!((got - exact).abs() < 1e-3, "{dim}: {got} vs {exact}");
            let back = widen(&h);
            assert_eq!(back.len(), dim);
            assert!(back
                .iter()
                .zip(&b)
                .all(|(x, y)| (x - y).abs() <= y.abs() / 1024.0 + 1e-7));
            if dim <= 128 {
                assert_eq!(got, dot(&a, &back), "{dim}: one block's product is dot's");
            }
        }
    }

    fn dot_i8(a: &[i8], b: &[i8]) -> i32 {
        let mut out = [0i32];
        dot_i8_rows(a, b, &mut out);
        out[0]
    }

    /// [`dot_i8_rows4`]'s answer from the portable loop and from each SIMD
    /// kernel the CPU can run.
    fn rows4_by_each_kernel(qs: &[i8], rows: &[i8], n: usize) -> Vec<Vec<i32>> {
        let d = qs.len() / 4;
        let mut plain = vec![0i32; 4 * n];
        for k in 0..4 {
            for r in 0..n {
                plain[k * n + r] = dot_i8_plain(&qs[k * d..(k + 1) * d], &rows[r * d..(r + 1) * d]);
            }
        }
        let mut all = vec![plain];
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2") {
                let mut out = vec![0i32; 4 * n];
                // SAFETY: the CPU supports AVX2.
                unsafe { dot_i8_rows4_avx2(qs, rows, &mut out) };
                all.push(out);
            }
            let narrow = qs
                .iter()
                .chain(rows)
                .all(|c| c.unsigned_abs() <= NARROW_TOP as u8);
            if narrow && std::arch::is_x86_feature_detected!("avx2") {
                let mut out = vec![0i32; 4 * n];
                // SAFETY: the CPU supports AVX2; the codes are within NARROW_TOP.
                unsafe { dot_i8_rows4_narrow_avx2(qs, rows, &mut out) };
                all.push(out);
            }
            if has_vnni() {
                let mut out = vec![0i32; 4 * n];
                // SAFETY: the CPU supports AVX-512 F, BW and VNNI.
                unsafe { dot_i8_rows4_vnni(qs, rows, &mut out) };
                all.push(out);
            }
        }
        let top = qs
            .iter()
            .chain(rows)
            .map(|c| c.unsigned_abs())
            .max()
            .unwrap_or(0);
        let mut dispatched = vec![0i32; 4 * n];
        dot_i8_rows4(qs, rows, &mut dispatched, top.clamp(1, 127) as i8);
        all.push(dispatched);
        all
    }

    #[test]
    fn each_value_quantises_to_its_nearest_step() {
        let mut v: Vec<f32> = (0..384).map(|i| (i as f32 * 0.731).sin()).collect();
        l2_normalize(&mut v);
        let largest = (0..v.len())
            .max_by(|&a, &b| v[a].abs().total_cmp(&v[b].abs()))
            .unwrap();
        for top in [127i8, NARROW_TOP, 1] {
            let mut q = vec![0i8; v.len()];
            let scale = quantize_i8_within(&v, &mut q, top);
            assert_eq!(scale, v[largest].abs() / f32::from(top));
            for (x, &c) in v.iter().zip(&q) {
                assert!((x / scale - f32::from(c)).abs() <= 0.5 + 1e-4, "{x} → {c}");
            }
            assert_eq!(q[largest].abs(), top);
            assert!(q.iter().all(|c| c.abs() <= top), "top {top}");
        }
        // Signs stay, and a value far below a step goes to zero.
        let mut q = [0i8; 4];
        quantize_i8(&[1.0, -1.0, 1e-4, -0.3], &mut q);
        assert_eq!(q, [127, -127, 0, -38]);
        quantize_i8_within(&[1.0, -1.0, 1e-4, -0.3], &mut q, NARROW_TOP);
        assert_eq!(q, [63, -63, 0, -19]);
    }

    #[test]
    fn narrow_codes_give_the_plain_sums_at_any_length_and_their_extremes() {
        // Codes spread over ±NARROW_TOP, at lengths around the kernel's
        // 32-byte steps and its groups of NARROW_STEPS of them.
        for d in [1usize, 31, 32, 33, 96, 127, 128, 129, 160, 384, 1000] {
            let code = |seed: usize, i: usize| ((seed * 7919 + i * 104_729) % 127) as i8 - 63;
            let qs: Vec<i8> = (0..4 * d).map(|i| code(1, i)).collect();
            let rows: Vec<i8> = (0..5 * d).map(|i| code(2, i)).collect();
            let all = rows4_by_each_kernel(&qs, &rows, 5);
            for other in &all[1..] {
                assert_eq!(other, &all[0], "d = {d}");
            }
        }
        // Every product at its largest, both signs: the i16 sums of a
        // group (the rows shifted by 64) hold 2 · 2 · 127 · 63 without
        // saturating.
        let d = 4096 + 40;
        let low = vec![-NARROW_TOP; d];
        let high = vec![NARROW_TOP; d];
        let codes = [&low[..], &high[..], &low[..], &high[..]].concat();
        let (lo, hi) = (63 * 63 * d as i32, -63 * 63 * d as i32);
        let all = rows4_by_each_kernel(&codes, &[&high[..], &low[..]].concat(), 2);
        for four in all {
            assert_eq!(four, [hi, lo, lo, hi, hi, lo, lo, hi]);
        }
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
            // Four codes at once give the same sums, with every kernel the CPU has.
            let codes: Vec<i8> = [&qa[..], &qb[..], &qb[..], &qa[..]].concat();
            for four in rows4_by_each_kernel(&codes, &rows, 3) {
                for k in 0..4 {
                    let mut one = vec![0i32; 3];
                    dot_i8_rows(&codes[k * n..(k + 1) * n], &rows, &mut one);
                    assert_eq!(four[k * 3..(k + 1) * 3], one[..], "n = {n}, code {k}");
                }
            }
            let approx = sa * sb * dot_i8(&qa, &qb) as f32;
            assert!((approx - dot(&a, &b)).abs() < 0.01, "n = {n}");
        }
        // Extremes neither saturate nor overflow a lane.
        let low = vec![-127i8; 4096];
        let high = vec![127i8; 4096];
        assert_eq!(dot_i8(&low, &low), 127 * 127 * 4096);
        assert_eq!(dot_i8(&low, &high), -127 * 127 * 4096);
        let codes = [&low[..], &high[..], &low[..], &high[..]].concat();
        let (lo, hi) = (127 * 127 * 4096, -127 * 127 * 4096);
        for four in rows4_by_each_kernel(&codes, &[&high[..], &low[..]].concat(), 2) {
            assert_eq!(four, [hi, lo, lo, hi, hi, lo, lo, hi]);
        }
        let mut zero = [7i8; 2];
        assert_eq!(quantize_i8(&[0.0, 0.0], &mut zero), 0.0);
        assert_eq!(zero, [0, 0]);
    }

    /// The quantisation as it was written first: Rust's saturating cast.
    fn quantize_plain(v: &[f32], out: &mut [i8]) -> f32 {
        let max = v.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        if max == 0.0 || !max.is_finite() {
            out.fill(0);
            return 0.0;
        }
        let inv = 127.0 / max;
        for (o, x) in out.iter_mut().zip(v) {
            let y = x * inv;
            *o = (y + 0.5f32.copysign(y)).clamp(-127.0, 127.0) as i8;
        }
        max / 127.0
    }

    #[test]
    fn quantising_gives_the_plain_codes_for_any_length_nans_and_halves() {
        for n in [0usize, 1, 7, 8, 31, 32, 33, 384, 1000] {
            let mut v: Vec<f32> = (0..n).map(|i| (i as f32 * 0.731).sin()).collect();
            if n > 7 {
                // A NaN, and values half a step from zero.
                v[3] = f32::NAN;
                let max = v.iter().fold(0.0f32, |m, x| m.max(x.abs()));
                v[5] = 0.5 * max / 127.0;
                v[6] = -v[5];
            }
            let (mut fast, mut plain) = (vec![1i8; n], vec![2i8; n]);
            let scale = quantize_i8(&v, &mut fast);
            assert_eq!(scale, quantize_plain(&v, &mut plain), "n = {n}");
            assert_eq!(fast, plain, "n = {n}");
            if n > 7 {
                assert_eq!(fast[3], 0, "a NaN is 0");
            }
        }
        let mut q = [9i8; 3];
        assert_eq!(quantize_i8(&[f32::INFINITY, 1.0, 0.0], &mut q), 0.0);
        assert_eq!(q, [0, 0, 0]);
    }

    #[test]
    fn max_abs_is_the_plain_maximum_for_any_length_and_skips_nans() {
        for n in [0usize, 1, 15, 16, 17, 384, 1000] {
            let mut v: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin() * i as f32).collect();
            let plain = v.iter().fold(0.0f32, |m, x| m.max(x.abs()));
            assert_eq!(max_abs(&v), plain, "n = {n}");
            if n > 3 {
                v[2] = f32::NAN;
                v[n - 1] = -1e9;
                assert_eq!(max_abs(&v), 1e9, "n = {n}");
            }
        }
    }

    #[test]
    fn highest_is_the_plain_maximum_for_any_length_and_skips_nans() {
        assert_eq!(highest(&[]), f32::NEG_INFINITY);
        for n in (1usize..70).chain([384, 1000]) {
            let mut v: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin() - 2.0).collect();
            let plain = v.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            assert_eq!(highest(&v), plain, "n = {n}");
            // The highest in the last (partial) run, then a NaN beside it.
            v[n - 1] = 5.0;
            assert_eq!(highest(&v), 5.0, "n = {n}");
            if n > 3 {
                v[2] = f32::NAN;
                assert_eq!(highest(&v), 5.0, "n = {n}");
            }
        }
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

    #[test]
    fn linear_t_matches_the_plain_product_for_any_shape() {
        for (rows, k, n) in [
            (1, 384, 1536),
            (7, 384, 13),
            (12, 1536, 384),
            (3, 10, 5),
            (0, 8, 4),
            (5, 3, 2),
        ] {
            let x: Vec<f32> = (0..rows * k).map(|i| (i as f32 * 0.37).sin()).collect();
            let w: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.11).cos() * 0.1).collect();
            let bias: Vec<f32> = (0..n).map(|i| i as f32 * 0.01).collect();
            let mut out_t = vec![f32::NAN; n * rows];
            linear_t(&x, k, &w, &bias, &mut out_t);
            for o in 0..n {
                for r in 0..rows {
                    let plain: f32 =
                        bias[o] + (0..k).map(|i| x[r * k + i] * w[o * k + i]).sum::<f32>();
                    let got = out_t[o * rows + r];
                    assert!(
                        (got - plain).abs() <= 1e-4 * (1.0 + plain.abs()),
                        "rows {rows}, k {k}, n {n}: [{o}][{r}] {got} against {plain}"
                    );
                }
            }
        }
    }
}
