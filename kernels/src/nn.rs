//! A transformer encoder's steps besides its dense layers: residual add and
//! layer norm, self-attention of each text over its own tokens, GELU.
//!
//! Each is a plain loop over lanes of 16 values, compiled once more with
//! AVX-512 enabled and once with AVX2, one chosen at run time, so the
//! compiler vectorises it (sums are kept in 16 partial lanes: a float sum in
//! one accumulator does not vectorise). A public step runs its `…_lanes`
//! body through a `…_wide` copy with the AVX-512 target feature or an
//! `…_avx2` copy with AVX2's: the body is inlined into that copy and
//! vectorised with its features (a closure handed to one generic wrapper was
//! not always inlined, and then ran as SSE code). Attention's inner loops,
//! which the compiler did not keep in registers, are intrinsics for each.

use std::ops::Range;

const LANES: usize = 16;

/// Whether this CPU runs the AVX-512 copies of the loops.
fn avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Whether this CPU runs the AVX2 copies (where it lacks AVX-512). The
/// copies give the plain code's results: the compiler does not reorder
/// float sums, nor fuse a multiply and an add that the code keeps apart.
fn avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Σ a·b over lanes of 16 partial sums.
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; LANES];
    let (ac, bc) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let tail: f32 = ac
        .remainder()
        .iter()
        .zip(bc.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ac.zip(bc) {
        for l in 0..LANES {
            acc[l] += x[l] * y[l];
        }
    }
    acc.iter().sum::<f32>() + tail
}

#[inline(always)]
fn sum(a: &[f32]) -> f32 {
    let mut acc = [0.0f32; LANES];
    let chunks = a.chunks_exact(LANES);
    let tail: f32 = chunks.remainder().iter().sum();
    for x in chunks {
        for l in 0..LANES {
            acc[l] += x[l];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// Each row of `x` (rows of `gamma.len()` values) becomes
/// `layer_norm(x + add) · gamma + beta`, with the variance's `eps`.
pub fn add_layer_norm(x: &mut [f32], add: &[f32], gamma: &[f32], beta: &[f32], eps: f32) {
    assert_eq!(x.len(), add.len(), "one residual per value");
    assert_eq!(gamma.len(), beta.len(), "one shift per scale");
    #[cfg(target_arch = "x86_64")]
    {
        if avx512() {
            // SAFETY: the CPU supports AVX-512 F (checked just above).
            return unsafe { add_layer_norm_wide(x, add, gamma, beta, eps) };
        }
        if avx2() {
            // SAFETY: the CPU supports AVX2 and FMA (checked just above).
            return unsafe { add_layer_norm_avx2(x, add, gamma, beta, eps) };
        }
    }
    add_layer_norm_lanes(x, add, gamma, beta, eps)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn add_layer_norm_wide(x: &mut [f32], add: &[f32], gamma: &[f32], beta: &[f32], eps: f32) {
    add_layer_norm_lanes(x, add, gamma, beta, eps)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn add_layer_norm_avx2(x: &mut [f32], add: &[f32], gamma: &[f32], beta: &[f32], eps: f32) {
    add_layer_norm_lanes(x, add, gamma, beta, eps)
}

#[inline(always)]
fn add_layer_norm_lanes(x: &mut [f32], add: &[f32], gamma: &[f32], beta: &[f32], eps: f32) {
    let width = gamma.len();
    for (row, add) in x.chunks_exact_mut(width).zip(add.chunks_exact(width)) {
        for (v, a) in row.iter_mut().zip(add) {
            *v += a;
        }
        let mean = sum(row) / width as f32;
        for v in row.iter_mut() {
            *v -= mean;
        }
        let var = dot(row, row) / width as f32;
        let inv = 1.0 / (var + eps).sqrt();
        for ((v, g), b) in row.iter_mut().zip(gamma).zip(beta) {
            *v = *v * inv * g + b;
        }
    }
}

/// e^x for x ≤ 0 (softmax's shifted scores), to ~2 ulp: x = n·ln 2 + r with
/// |r| ≤ ln 2 / 2 (ln 2 in two parts, the first exact in few bits, so n·ln 2
/// loses nothing), e^r by its Taylor series to r⁷, 2^n put in the exponent.
/// n is rounded by adding and taking away 1.5·2²³, which vectorises.
#[inline(always)]
fn exp_neg(x: f32) -> f32 {
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    const ROUND: f32 = 12_582_912.0;
    let x = x.max(-87.0);
    let shifted = x * std::f32::consts::LOG2_E + ROUND;
    let n = shifted - ROUND;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let mut p = 1.0 / 5040.0;
    for c in [
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        0.5,
        1.0,
        1.0,
    ] {
        p = p * r + c;
    }
    // `shifted`'s low bits hold n (its bits are ROUND's plus n): 2^n from
    // integer operations alone. A float-to-int cast here kept the loop from
    // vectorising cleanly (lane inserts in the profile).
    p * f32::from_bits(shifted.to_bits().wrapping_sub(ROUND.to_bits() - 127) << 23)
}

/// The head sizes [`attention`] runs (a head's values are kept in registers).
pub const HEAD_DIMS: [usize; 2] = [32, 64];

/// Multi-head self-attention: `qkv` holds one row per token, its query, key
/// and value (`hidden` values each, heads side by side); each text (a range
/// of rows) attends over its own tokens only, so no padding enters. Writes
/// each token's attended values (`hidden`, heads side by side) to `out`.
/// Heads must be one of [`HEAD_DIMS`] values wide.
pub fn attention(
    qkv: &[f32],
    hidden: usize,
    heads: usize,
    texts: &[Range<usize>],
    out: &mut [f32],
) {
    attention_with(Scratch::default(), qkv, hidden, heads, texts, out)
}

fn attention_with(
    mut scratch: Scratch,
    qkv: &[f32],
    hidden: usize,
    heads: usize,
    texts: &[Range<usize>],
    out: &mut [f32],
) {
    let dim = hidden / heads;
    assert_eq!(dim * heads, hidden, "heads split the hidden size");
    assert_eq!(out.len() * 3, qkv.len(), "one output row per token");
    for text in texts {
        for h in 0..heads {
            let text = text.clone();
            match dim {
                32 => scratch.head::<32>(qkv, hidden, h, text, out),
                64 => scratch.head::<64>(qkv, hidden, h, text, out),
                _ => panic!("attention runs heads of {HEAD_DIMS:?} values, not {dim}"),
            }
        }
    }
}

/// [`attention`]'s buffers, reused from head to head.
#[derive(Default)]
struct Scratch {
    /// One head's keys transposed (`D` rows of the text's length rounded up
    /// to whole lanes, zero beyond it).
    keys_t: Vec<f32>,
    /// One head's values, a row of `D` per token.
    values: Vec<f32>,
    /// The scores of [`QUERIES`] queries, a row of the padded length each.
    scores: Vec<f32>,
    /// Plain code even where AVX-512 runs (the tests check both).
    plain: bool,
}

/// Queries whose attention is computed together.
const QUERIES: usize = 4;

impl Scratch {
    /// Head `h` of the tokens `text`.
    fn head<const D: usize>(
        &mut self,
        qkv: &[f32],
        hidden: usize,
        h: usize,
        text: Range<usize>,
        out: &mut [f32],
    ) {
        let len = text.len();
        let wide = len.next_multiple_of(LANES);
        // Where token `t`'s query (0), key (1) or value (2) of this head starts.
        let at = |t: usize, which: usize| (text.start + t) * 3 * hidden + which * hidden + h * D;
        let part = |t: usize, which: usize| -> &[f32; D] {
            qkv[at(t, which)..][..D].try_into().expect("D values")
        };
        self.keys::<D>(qkv, 3 * hidden, len, |t| at(t, 1));
        self.values.clear();
        for t in 0..len {
            self.values.extend_from_slice(part(t, 2));
        }
        self.scores.resize(QUERIES * wide, 0.0);
        for first in (0..len).step_by(QUERIES) {
            let mut q = [[0.0f32; D]; QUERIES];
            for (r, q) in q.iter_mut().enumerate().take(len - first) {
                *q = *part(first + r, 0);
            }
            let rows = (len - first).min(QUERIES);
            let dst = |r: usize| (text.start + first + r) * hidden + h * D;
            #[cfg(target_arch = "x86_64")]
            if !self.plain && avx512() {
                // SAFETY: the CPU supports AVX-512 F (checked just above);
                // the buffers hold what `queries_avx512` reads.
                unsafe { self.queries_avx512::<D>(&q, len, rows, dst, out) };
                continue;
            }
            #[cfg(target_arch = "x86_64")]
            if !self.plain && avx2() {
                // SAFETY: the CPU supports AVX2 and FMA (checked just above).
                unsafe { self.queries_avx2::<D>(&q, len, rows, dst, out) };
                continue;
            }
            self.queries_plain::<D>(&q, len, rows, dst, out);
        }
    }

    /// `self.keys_t`: the keys (`D` values from `key_at(t)` for each of the
    /// `len` tokens, a token's row `stride` values after the one before)
    /// transposed, zero past the text's length. Blocks of 16 tokens by 16
    /// values are turned in registers where AVX-512 runs; a value at a
    /// time, a row of keys apart, was two fifths of the head's setup.
    fn keys<const D: usize>(
        &mut self,
        qkv: &[f32],
        stride: usize,
        len: usize,
        key_at: impl Fn(usize) -> usize,
    ) {
        let wide = len.next_multiple_of(LANES);
        #[cfg(target_arch = "x86_64")]
        if !self.plain && avx512() && D.is_multiple_of(LANES) {
            // Every value up to `D · wide` is written below.
            if self.keys_t.len() < D * wide {
                self.keys_t.resize(D * wide, 0.0);
            }
            for t in (0..len).step_by(LANES) {
                for d in (0..D).step_by(LANES) {
                    // SAFETY: the CPU supports AVX-512 F (checked above);
                    // the rows read are the text's tokens' (`len - t` of
                    // them, at most 16), each `LANES` values of its key
                    // from `d`; the rows written lie in `keys_t`'s
                    // `D · wide` values.
                    unsafe {
                        transpose16(
                            qkv[key_at(t) + d..].as_ptr(),
                            stride,
                            (len - t).min(LANES),
                            self.keys_t[d * wide + t..].as_mut_ptr(),
                            wide,
                        )
                    };
                }
            }
            return;
        }
        self.keys_t.clear();
        self.keys_t.resize(D * wide, 0.0);
        for t in 0..len {
            for (d, k) in qkv[key_at(t)..][..D].iter().enumerate() {
                self.keys_t[d * wide + t] = *k;
            }
        }
    }

    /// Each of the [`QUERIES`] rows of raw scores in `self.scores` turned
    /// into its softmax, unnormalised (e^(scaled score − max)); returns each
    /// row's 1 / sum.
    #[inline(always)]
    fn softmax<const D: usize>(&mut self, len: usize) -> [f32; QUERIES] {
        let wide = len.next_multiple_of(LANES);
        let scale = 1.0 / (D as f32).sqrt();
        let mut norm = [0.0f32; QUERIES];
        for (r, norm) in norm.iter_mut().enumerate() {
            let scores = &mut self.scores[r * wide..][..len];
            // Whole lanes, then the rest: a partial last chunk in the loop
            // made it keep `top` on the stack, a masked store and a reload
            // each 16 scores (an eighth of the encoder's time on long texts).
            let mut top = [f32::MIN; LANES];
            let chunks = scores.chunks_exact(LANES);
            let rest = chunks.remainder();
            for chunk in chunks {
                for (t, s) in top.iter_mut().zip(chunk) {
                    *t = if *s > *t { *s } else { *t };
                }
            }
            let max = top
                .iter()
                .chain(rest)
                .fold(f32::MIN, |m, &t| if t > m { t } else { m });
            for s in scores.iter_mut() {
                *s = exp_neg((*s - max) * scale);
            }
            *norm = 1.0 / sum(scores);
        }
        norm
    }

    /// [`QUERIES`] queries (`rows` of them real) attended over the text:
    /// each key row and value row loaded serves all of them, and their sums
    /// are independent chains of fused multiply-adds in registers.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn queries_avx512<const D: usize>(
        &mut self,
        q: &[[f32; D]; QUERIES],
        len: usize,
        rows: usize,
        dst: impl Fn(usize) -> usize,
        out: &mut [f32],
    ) {
        use std::arch::x86_64::*;
        let wide = len.next_multiple_of(LANES);
        let (keys, scores) = (self.keys_t.as_ptr(), self.scores.as_mut_ptr());
        // Two blocks of 16 keys at a time: eight chains of fused
        // multiply-adds, enough to keep both FMA pipes busy through each
        // one's latency (four chains, one block, kept them half idle);
        // each score still sums its products in the same order.
        let blocks = wide / LANES;
        for block in (0..blocks - blocks % 2).step_by(2) {
            scores_of::<D, 2>(keys, wide, block, q, scores);
        }
        if blocks % 2 == 1 {
            scores_of::<D, 1>(keys, wide, blocks - 1, q, scores);
        }
        let norm = self.softmax::<D>(len);
        // Up to four registers of 16 values per query (heads of 64).
        let mut o = [[_mm512_setzero_ps(); 4]; QUERIES];
        let (values, scores) = (self.values.as_ptr(), self.scores.as_ptr());
        for t in 0..len {
            for (r, o) in o.iter_mut().enumerate() {
                let p = _mm512_set1_ps(*scores.add(r * wide + t));
                for (j, o) in o.iter_mut().enumerate().take(D / LANES) {
                    *o = _mm512_fmadd_ps(p, _mm512_loadu_ps(values.add(t * D + j * LANES)), *o);
                }
            }
        }
        for (r, (o, norm)) in o.iter().zip(norm).enumerate().take(rows) {
            let at = out[dst(r)..][..D].as_mut_ptr();
            for (j, o) in o.iter().enumerate().take(D / LANES) {
                _mm512_storeu_ps(at.add(j * LANES), _mm512_mul_ps(*o, _mm512_set1_ps(norm)));
            }
        }
    }

    /// [`Scratch::queries_avx512`] in AVX2's registers of 8: the scores
    /// as there; the attended values 16 of a head's values at a time, so
    /// that the [`QUERIES`] queries' sums (8 registers), a token's values and
    /// the queries' weights fit the 16 registers.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn queries_avx2<const D: usize>(
        &mut self,
        q: &[[f32; D]; QUERIES],
        len: usize,
        rows: usize,
        dst: impl Fn(usize) -> usize,
        out: &mut [f32],
    ) {
        use std::arch::x86_64::*;
        const WIDTH: usize = 8;
        let wide = len.next_multiple_of(LANES);
        let (keys, scores) = (self.keys_t.as_ptr(), self.scores.as_mut_ptr());
        for block in 0..wide / WIDTH {
            let mut acc = [_mm256_setzero_ps(); QUERIES];
            for d in 0..D {
                let k = _mm256_loadu_ps(keys.add(d * wide + block * WIDTH));
                for (acc, q) in acc.iter_mut().zip(q) {
                    *acc = _mm256_fmadd_ps(_mm256_set1_ps(q[d]), k, *acc);
                }
            }
            for (r, acc) in acc.iter().enumerate() {
                _mm256_storeu_ps(scores.add(r * wide + block * WIDTH), *acc);
            }
        }
        let norm = self.softmax::<D>(len);
        let (values, scores) = (self.values.as_ptr(), self.scores.as_ptr());
        for part in (0..D).step_by(2 * WIDTH) {
            let mut o = [[_mm256_setzero_ps(); 2]; QUERIES];
            for t in 0..len {
                let v = values.add(t * D + part);
                let v = [_mm256_loadu_ps(v), _mm256_loadu_ps(v.add(WIDTH))];
                for (r, o) in o.iter_mut().enumerate() {
                    let p = _mm256_set1_ps(*scores.add(r * wide + t));
                    for (o, v) in o.iter_mut().zip(v) {
                        *o = _mm256_fmadd_ps(p, v, *o);
                    }
                }
            }
            for (r, (o, norm)) in o.iter().zip(norm).enumerate().take(rows) {
                let at = out[dst(r) + part..][..2 * WIDTH].as_mut_ptr();
                for (j, o) in o.iter().enumerate() {
                    _mm256_storeu_ps(at.add(j * WIDTH), _mm256_mul_ps(*o, _mm256_set1_ps(norm)));
                }
            }
        }
    }

    /// What [`Scratch::queries_avx512`] computes, in plain code.
    fn queries_plain<const D: usize>(
        &mut self,
        q: &[[f32; D]; QUERIES],
        len: usize,
        rows: usize,
        dst: impl Fn(usize) -> usize,
        out: &mut [f32],
    ) {
        let wide = len.next_multiple_of(LANES);
        for (r, q) in q.iter().enumerate() {
            for t in 0..len {
                self.scores[r * wide + t] = (0..D).map(|d| q[d] * self.keys_t[d * wide + t]).sum();
            }
        }
        let norm = self.softmax::<D>(len);
        for (r, norm) in norm.iter().enumerate().take(rows) {
            let o = &mut out[dst(r)..][..D];
            o.fill(0.0);
            for (t, v) in self.values.chunks_exact(D).enumerate() {
                let p = self.scores[r * wide + t] * norm;
                for (o, v) in o.iter_mut().zip(v) {
                    *o += p * v;
                }
            }
        }
    }
}

/// The raw scores of the [`QUERIES`] queries `q` against `B` blocks of 16
/// keys from block `first` of `keys` (transposed, rows `wide` apart) into
/// `scores` (a row of `wide` per query).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn scores_of<const D: usize, const B: usize>(
    keys: *const f32,
    wide: usize,
    first: usize,
    q: &[[f32; D]; QUERIES],
    scores: *mut f32,
) {
    use std::arch::x86_64::*;
    let mut acc = [[_mm512_setzero_ps(); QUERIES]; B];
    for d in 0..D {
        let k: [__m512; B] =
            std::array::from_fn(|b| _mm512_loadu_ps(keys.add(d * wide + (first + b) * LANES)));
        for (r, q) in q.iter().enumerate() {
            let qd = _mm512_set1_ps(q[d]);
            for b in 0..B {
                acc[b][r] = _mm512_fmadd_ps(qd, k[b], acc[b][r]);
            }
        }
    }
    for (b, acc) in acc.iter().enumerate() {
        for (r, acc) in acc.iter().enumerate() {
            _mm512_storeu_ps(scores.add(r * wide + (first + b) * LANES), *acc);
        }
    }
}

/// The 16 × 16 values at `src` (rows `stride` apart; the first `rows` of
/// them read, the rest taken as 0) transposed into `dst` (rows `dst_stride`
/// apart): pairs of values interleaved, then pairs of pairs, then the
/// 128-bit quarters gathered in two steps.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn transpose16(
    src: *const f32,
    stride: usize,
    rows: usize,
    dst: *mut f32,
    dst_stride: usize,
) {
    use std::arch::x86_64::*;
    let r: [__m512; 16] = std::array::from_fn(|i| {
        if i < rows {
            _mm512_loadu_ps(src.add(i * stride))
        } else {
            _mm512_setzero_ps()
        }
    });
    // t[2i], t[2i + 1]: rows 2i and 2i + 1 interleaved, values 0–1 and 2–3
    // of each quarter.
    let t: [__m512; 16] = std::array::from_fn(|i| {
        let (a, b) = (r[i & !1], r[i | 1]);
        if i % 2 == 0 {
            _mm512_unpacklo_ps(a, b)
        } else {
            _mm512_unpackhi_ps(a, b)
        }
    });
    // u[4i + j]: rows 4i to 4i + 3 at value j of each quarter.
    let u: [__m512; 16] = std::array::from_fn(|i| {
        let (group, j) = (i / 4, i % 4);
        let a = _mm512_castps_pd(t[4 * group + j / 2]);
        let b = _mm512_castps_pd(t[4 * group + j / 2 + 2]);
        _mm512_castpd_ps(if j % 2 == 0 {
            _mm512_unpacklo_pd(a, b)
        } else {
            _mm512_unpackhi_pd(a, b)
        })
    });
    for j in 0..4 {
        // Quarters 0 and 2, and 1 and 3, of rows 0–7 and of rows 8–15.
        let even_lo = _mm512_shuffle_f32x4::<0x88>(u[j], u[4 + j]);
        let odd_lo = _mm512_shuffle_f32x4::<0xDD>(u[j], u[4 + j]);
        let even_hi = _mm512_shuffle_f32x4::<0x88>(u[8 + j], u[12 + j]);
        let odd_hi = _mm512_shuffle_f32x4::<0xDD>(u[8 + j], u[12 + j]);
        // Value 4k + j of every row.
        let out = [
            _mm512_shuffle_f32x4::<0x88>(even_lo, even_hi),
            _mm512_shuffle_f32x4::<0x88>(odd_lo, odd_hi),
            _mm512_shuffle_f32x4::<0xDD>(even_lo, even_hi),
            _mm512_shuffle_f32x4::<0xDD>(odd_lo, odd_hi),
        ];
        for (k, v) in out.into_iter().enumerate() {
            _mm512_storeu_ps(dst.add((4 * k + j) * dst_stride), v);
        }
    }
}

/// BERT's GELU, `x/2 · (1 + erf(x/√2))`, in place. erf is a rational
/// function of x² on [-4, 4] (beyond, erf is ±1 in f32) whose error stays
/// under 5·10⁻⁷, so the loop vectorises; the C library's `erff`, one value
/// at a time, was a tenth of MiniLM's time.
pub fn gelu_erf(v: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if avx512() {
            // SAFETY: the CPU supports AVX-512 F (checked just above).
            return unsafe { gelu_erf_wide(v) };
        }
        if avx2() {
            // SAFETY: the CPU supports AVX2 and FMA (checked just above).
            return unsafe { gelu_erf_avx2(v) };
        }
    }
    gelu_erf_lanes(v)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn gelu_erf_wide(v: &mut [f32]) {
    gelu_erf_lanes(v)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn gelu_erf_avx2(v: &mut [f32]) {
    gelu_erf_lanes(v)
}

#[inline(always)]
fn gelu_erf_lanes(v: &mut [f32]) {
    for x in v.iter_mut() {
        *x = 0.5 * *x * (1.0 + erf(*x * std::f32::consts::FRAC_1_SQRT_2));
    }
}

/// erf(x) as the ratio of an odd polynomial of degree 13 and an even one of
/// degree 8 (the coefficients Eigen and XLA use for single precision).
#[inline(always)]
fn erf(x: f32) -> f32 {
    let x = x.clamp(-4.0, 4.0);
    let x2 = x * x;
    let p = -2.726_142_3e-10_f32;
    let p = p * x2 + 2.770_681_4e-8;
    let p = p * x2 - 2.101_024e-6;
    let p = p * x2 - 5.692_506_4e-5;
    let p = p * x2 - 7.349_906_3e-4;
    let p = p * x2 - 2.954_6e-3;
    let p = p * x2 - 1.609_603_3e-2;
    let q = -1.456_607_2e-5_f32;
    let q = q * x2 - 2.133_740_6e-4;
    let q = q * x2 - 1.682_827e-3;
    let q = q * x2 - 7.373_329_2e-3;
    let q = q * x2 - 1.426_474e-2;
    x * p / q
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::values;

    #[test]
    fn exp_follows_the_library_exp() {
        // Down to -87, where it is clamped (e^-87 is near f32's smallest normal).
        for i in 0..=1740 {
            let x = -(i as f32) * 0.05;
            let (got, want) = (exp_neg(x), x.exp());
            assert!(
                (got - want).abs() <= want * 3e-7 + 1e-38,
                "exp({x}) = {got}, not {want}"
            );
        }
        // Far below, it stays a tiny positive number (never NaN or negative).
        let far = exp_neg(-200.0);
        assert!((0.0..1e-37).contains(&far), "{far}");
    }

    /// The copy this CPU runs (AVX-512, AVX2 or none) against the plain
    /// loops: the same bits.
    #[test]
    fn the_wide_copies_give_the_plain_results() {
        let width = 384;
        let (x, add) = (values(5 * width, 7), values(5 * width, 8));
        let (gamma, beta) = (values(width, 9), values(width, 10));
        let (mut wide, mut plain) = (x.clone(), x.clone());
        add_layer_norm(&mut wide, &add, &gamma, &beta, 1e-12);
        add_layer_norm_lanes(&mut plain, &add, &gamma, &beta, 1e-12);
        assert_eq!(wide, plain, "layer norm");
        let (mut wide, mut plain) = (x.iter().map(|v| v * 9.0).collect::<Vec<_>>(), Vec::new());
        plain.extend_from_slice(&wide);
        gelu_erf(&mut wide);
        gelu_erf_lanes(&mut plain);
        assert_eq!(wide, plain, "GELU");
    }

    #[test]
    fn layer_norm_matches_the_definition() {
        let width = 37;
        let (mut x, add) = (values(3 * width, 1), values(3 * width, 2));
        let (gamma, beta) = (values(width, 3), values(width, 4));
        let want: Vec<f32> = x
            .chunks(width)
            .zip(add.chunks(width))
            .flat_map(|(x, a)| {
                let v: Vec<f64> = x.iter().zip(a).map(|(x, a)| (x + a) as f64).collect();
                let mean = v.iter().sum::<f64>() / width as f64;
                let var = v.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / width as f64;
                v.iter()
                    .enumerate()
                    .map(|(i, v)| {
                        ((v - mean) / (var + 1e-12).sqrt() * gamma[i] as f64 + beta[i] as f64)
                            as f32
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        add_layer_norm(&mut x, &add, &gamma, &beta, 1e-12);
        for (g, w) in x.iter().zip(&want) {
            assert!((g - w).abs() < 1e-4, "{g} against {w}");
        }
    }

    /// Texts of 3, 18 and 7 tokens (whole groups of queries, partial ones,
    /// and rows of scores that end within a lane), two heads of each
    /// supported size, the vector code and the plain: each token's output is
    /// the softmax-weighted mean of its own text's values (in f64).
    #[test]
    fn attention_keeps_to_each_texts_tokens() {
        for (dim, plain) in HEAD_DIMS.into_iter().flat_map(|d| [(d, false), (d, true)]) {
            let (heads, texts) = (2, [0..3, 3..21, 21..28]);
            let hidden = heads * dim;
            // Scores of a few units: softmaxes neither flat nor one-hot.
            let qkv: Vec<f32> = values(28 * 3 * hidden, dim as u64)
                .iter()
                .map(|v| v * 4.0)
                .collect();
            let mut out = vec![f32::NAN; 28 * hidden];
            let scratch = Scratch {
                plain,
                ..Scratch::default()
            };
            attention_with(scratch, &qkv, hidden, heads, &texts, &mut out);
            let at = |t: usize, which: usize, h: usize, d: usize| {
                f64::from(qkv[t * 3 * hidden + which * hidden + h * dim + d])
            };
            for text in &texts {
                for i in text.clone() {
                    for h in 0..heads {
                        let weights: Vec<f64> = text
                            .clone()
                            .map(|t| {
                                let s: f64 =
                                    (0..dim).map(|d| at(i, 0, h, d) * at(t, 1, h, d)).sum();
                                (s / (dim as f64).sqrt()).exp()
                            })
                            .collect();
                        let total: f64 = weights.iter().sum();
                        for d in 0..dim {
                            let want: f64 = text
                                .clone()
                                .zip(&weights)
                                .map(|(t, w)| w * at(t, 2, h, d))
                                .sum::<f64>()
                                / total;
                            let got = f64::from(out[i * hidden + h * dim + d]);
                            assert!(
                                (got - want).abs() < 1e-4,
                                "token {i} head {h}: {got} against {want}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn gelu_erf_follows_the_exact_erf() {
        // erf from its series (|x| < 3) or its asymptotic tail, in f64.
        fn erf64(x: f64) -> f64 {
            if x.abs() >= 3.0 {
                let t = 1.0 / (x * x);
                let tail = (-x * x).exp() / (x.abs() * std::f64::consts::PI.sqrt())
                    * (1.0 - 0.5 * t + 0.75 * t * t - 1.875 * t * t * t);
                return x.signum() * (1.0 - tail);
            }
            let (mut term, mut sum) = (x, x);
            for n in 1..200 {
                term *= -x * x / n as f64;
                sum += term / (2 * n + 1) as f64;
            }
            sum * 2.0 / std::f64::consts::PI.sqrt()
        }
        let xs: Vec<f32> = (-8000..=8000).map(|i| i as f32 / 1000.0).collect();
        let mut got = xs.clone();
        gelu_erf(&mut got);
        for (x, g) in xs.iter().zip(&got) {
            let x64 = f64::from(*x);
            let exact = 0.5 * x64 * (1.0 + erf64(x64 / std::f64::consts::SQRT_2));
            assert!(
                (f64::from(*g) - exact).abs() <= 1e-6 * (1.0 + x64.abs()),
                "gelu({x}) = {g}, exact {exact}"
            );
        }
    }
}
