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
//! Where the CPU has AVX2 but not VNNI (AMD EPYCs before Zen 4, many
//! Intel desktops), the same bytes run through `vpmaddubsw`, which adds two
//! byte products into a saturating i16, then `vpmaddwd` into i32 lanes:
//! three instructions for 32 products where `vpdpbusd` takes one for 64,
//! still ~2.5× the products a second of f32 fused multiply-adds on an AMD
//! EPYC (Zen 3): 85 against 34 G a second a core, in a probe. Two products
//! of a byte up to 255 and weights up to 127 could pass i16's 32,767, so
//! there a column's scale also keeps the two weights of every pair within
//! 128 together ([`pair_scale_of`]): 255 · 128 = 32,640 fits, and no sum
//! saturates. A column then spans ~100 steps instead of 127 (measured on
//! MiniLM: the vectors stay at cosine ≥ 0.99 of sentence-transformers').
//! Moving each byte's sign onto the weights (`vpsignb`) would keep all 127
//! steps, but cost 40% of the kernel's speed. Both AVX2 multiplies run on
//! one pipe on AMD's Zen 2, so the AVX2 kernel also takes the last
//! [`FLOAT_COLUMNS`] of each panel in f32 fused multiply-adds, which
//! another pipe runs beside them (those columns are the product of the
//! rows as they are and of the weights rounded to halves, far finer than
//! the int8 columns' steps).
//!
//! Where the CPU also has AMX (Intel's Xeons since Sapphire Rapids) and
//! Linux lets the process use its tiles, a layer whose inputs are whole
//! tiles (a multiple of 64) runs on `tdpbusd` instead: one instruction
//! multiplies a tile of 16 rows of 64 bytes by one of 64 × 16 weights,
//! 16,384 products, on the same bytes, weights and packing as VNNI, so its
//! sums are the same integers ([`Kernel::Amx`]).
//!
//! Only x86-64 CPUs with AVX-512 F, BW and VNNI, or with AVX2, run it;
//! elsewhere [`Linear::new`] returns None.

use crate::panels::{self, Dense, Out, LANES, PANEL, TILE_ROWS};

/// A dense layer `y = x·Wᵀ + b` with its weights packed for
/// [`Dense::forward_into`].
pub struct Linear {
    kernel: Kernel,
    inputs: usize,
    /// Input values taken four at a time (`inputs` rounded up to a multiple
    /// of four, quartered).
    quads: usize,
    outputs: usize,
    /// Per panel, per quad of inputs, the quad's four i8 weights of each of
    /// the panel's int8 columns as one word (lowest byte the first input):
    /// all [`PANEL`] of them for VNNI, the first [`INT_COLUMNS`] for AVX2
    /// ([`Kernel::words`]).
    panels: Lines,
    /// Per column (zero-padded to whole panels): the weights' scale, and
    /// the sum of its rounded weights.
    scale: Vec<f32>,
    sums: Vec<f32>,
    bias: Vec<f32>,
    /// AVX2 only: per panel, per input (rounded up to whole quads, zeros
    /// past `inputs`), the weights of the panel's last [`FLOAT_COLUMNS`]
    /// columns as IEEE halves, which that kernel widens and multiplies in
    /// f32 (see `panel_avx2`): half the bytes of f32 weights, which a
    /// query's few rows read from memory rather than from a core's cache.
    floats: Vec<u16>,
}

/// The columns of each panel that the AVX2 kernel takes in f32 fused
/// multiply-adds beside the int8 products of the others: one register.
const FLOAT_COLUMNS: usize = 8;
/// The AVX2 kernel's int8 columns, the first of each panel.
const INT_COLUMNS: usize = PANEL - FLOAT_COLUMNS;
// `panel_avx2` keeps the f32 columns' sums in one register a chain.
const _: () = assert!(FLOAT_COLUMNS == 8);

/// Where [`Linear::floats`] keeps the weight of input `i` in column `o`, one
/// of the AVX2 kernel's f32 columns, for a layer of `quads` quads of inputs.
#[cfg(target_arch = "x86_64")]
fn float_at(quads: usize, o: usize, i: usize) -> usize {
    ((o / PANEL) * quads * 4 + i) * FLOAT_COLUMNS + o % PANEL - INT_COLUMNS
}

/// Words of a cache line.
const LINE_WORDS: usize = 16;

/// Rows of an AMX tile, and the quads of inputs each of its rows of 64
/// bytes holds.
const AMX_ROWS: usize = 16;
const AMX_QUADS: usize = 16;

/// Words that start on a cache line: a tile of AMX's reads its 16 rows of
/// 64 bytes at half the speed when each straddles two lines.
struct Lines(Vec<Line>);

#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u32; LINE_WORDS]);

impl Lines {
    fn of(words: &[u32]) -> Lines {
        let mut lines = vec![Line([0; LINE_WORDS]); words.len().div_ceil(LINE_WORDS)];
        for (line, chunk) in lines.iter_mut().zip(words.chunks(LINE_WORDS)) {
            line.0[..chunk.len()].copy_from_slice(chunk);
        }
        Lines(lines)
    }

    fn words(&self) -> &[u32] {
        // SAFETY: `Line` is `LINE_WORDS` u32s with no padding.
        unsafe { std::slice::from_raw_parts(self.0.as_ptr().cast(), self.0.len() * LINE_WORDS) }
    }
}

/// Where [`Linear::panels`] keeps the word of quad `p` of column `o`, one of
/// a panel's first `words` columns, for a layer of `quads` quads of inputs.
fn word_at(quads: usize, words: usize, o: usize, p: usize) -> usize {
    ((o / PANEL) * quads + p) * words + o % PANEL
}

/// Which of the int8 kernels this CPU runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    /// AMX's `tdpbusd` on tiles, the epilogue in AVX-512 (see [`amx`]).
    Amx,
    /// AVX-512 VNNI's `vpdpbusd`.
    Vnni,
    /// AVX2's `vpmaddubsw` and `vpmaddwd`, with weights scaled so that no
    /// pair of products saturates.
    Avx2,
}

impl Kernel {
    /// The int8 columns of a panel: the words a quad of [`Linear::panels`].
    fn words(self) -> usize {
        match self {
            Kernel::Amx | Kernel::Vnni => PANEL,
            Kernel::Avx2 => INT_COLUMNS,
        }
    }

    /// The rows a pass pads its input to: whole tiles of the kernel.
    fn tile_rows(self) -> usize {
        match self {
            Kernel::Amx => AMX_ROWS,
            Kernel::Vnni | Kernel::Avx2 => TILE_ROWS,
        }
    }
}

/// The kernel this CPU runs: AMX where it can (for layers of whole tiles,
/// [`Linear::new`]), else VNNI, else AVX2 (with FMA), else none.
/// `LOOMEM_INT8_KERNEL=vnni` keeps a CPU with AMX on VNNI, `avx2` any on
/// AVX2 (to compare them, or to step around a CPU or hypervisor that
/// misbehaves).
pub fn kernel() -> Option<Kernel> {
    static KERNEL: std::sync::OnceLock<Option<Kernel>> = std::sync::OnceLock::new();
    *KERNEL.get_or_init(|| {
        let best = fastest()?;
        // Every CPU with AVX-512 has AVX2, FMA and F16C.
        Some(match std::env::var("LOOMEM_INT8_KERNEL").as_deref() {
            Ok("avx2") => Kernel::Avx2,
            Ok("vnni") if best == Kernel::Amx => Kernel::Vnni,
            _ => best,
        })
    })
}

/// The fastest kernel this CPU runs.
fn fastest() -> Option<Kernel> {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vnni")
        {
            return Some(match amx::usable() {
                true => Kernel::Amx,
                false => Kernel::Vnni,
            });
        }
        // The AVX2 kernel's epilogue, its f32 columns and the row
        // quantisation use FMA too, and its f32 columns' weights are halves
        // (F16C).
        if std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("f16c")
        {
            return Some(Kernel::Avx2);
        }
    }
    None
}

/// Whether this CPU runs the int8 kernels.
pub fn supported() -> bool {
    kernel().is_some()
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

/// [`scale_of`], widened so that every pair of values (`2k`, `2k + 1`)
/// stays within 128 in size together once rounded: within 127 before the
/// rounding, which moves each by at most a half.
fn pair_scale_of(values: &[f32]) -> f32 {
    let pairs = values
        .chunks(2)
        .map(|p| p.iter().map(|v| v.abs()).sum::<f32>())
        .fold(0.0f32, f32::max);
    scale_of(values).max(pairs / 127.0)
}

/// The AVX2 kernel's f32 columns (the last [`FLOAT_COLUMNS`] of each
/// panel) of `weights` (rows of `inputs` values), laid out as
/// [`Linear::floats`], each weight an IEEE half's bits rounded to the
/// nearest (ties to even).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "f16c")]
unsafe fn halves_of(weights: &[f32], inputs: usize, quads: usize) -> Vec<u16> {
    use std::arch::x86_64::*;
    let count = (weights.len() / inputs).div_ceil(PANEL);
    let mut floats = vec![0u16; count * quads * 4 * FLOAT_COLUMNS];
    for (o, row) in weights.chunks_exact(inputs).enumerate() {
        if o % PANEL >= INT_COLUMNS {
            for (i, &w) in row.iter().enumerate() {
                let half = _mm_extract_epi16::<0>(_mm_cvtps_ph::<0>(_mm_set_ss(w))) as u16;
                floats[float_at(quads, o, i)] = half;
            }
        }
    }
    floats
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

/// `v` as a byte of the row stepped by `step` with zero point `zero`.
#[inline(always)]
fn to_byte(v: f32, step: f32, zero: i32) -> i32 {
    ((v * (1.0 / step)).round_ties_even() as i32 + zero).clamp(0, 255)
}

impl Linear {
    /// Packs `weights` (`bias.len()` rows of `inputs` values, row-major), or
    /// None when this CPU runs neither kernel.
    pub fn new(weights: &[f32], bias: &[f32]) -> Option<Linear> {
        Linear::packed(kernel()?, weights, bias)
    }

    /// [`Linear::new`] for a given kernel (the tests run each this CPU
    /// runs). AMX takes the inputs a tile's width (64) at a time: a layer
    /// of other inputs runs on VNNI.
    fn packed(kernel: Kernel, weights: &[f32], bias: &[f32]) -> Option<Linear> {
        let (inputs, outputs, count) = panels::shape(weights, bias)?;
        let kernel = match kernel {
            Kernel::Amx if inputs % (4 * AMX_QUADS) != 0 => Kernel::Vnni,
            kernel => kernel,
        };
        let quads = inputs.div_ceil(4);
        let words = kernel.words();
        let mut packed = vec![0u32; count * quads * words];
        // The scales and sums of the f32 columns stay 0: unread.
        let mut scale = vec![0.0f32; count * PANEL];
        let mut sums = vec![0.0f32; count * PANEL];
        for (o, row) in weights.chunks_exact(inputs).enumerate() {
            if o % PANEL >= words {
                continue;
            }
            scale[o] = match kernel {
                Kernel::Amx | Kernel::Vnni => scale_of(row),
                Kernel::Avx2 => pair_scale_of(row),
            };
            let q: Vec<i32> = row.iter().map(|&w| round_to_i8(w, scale[o])).collect();
            sums[o] = q.iter().sum::<i32>() as f32;
            for (p, quad) in q.chunks(4).enumerate() {
                let word = quad
                    .iter()
                    .enumerate()
                    .fold(0u32, |w, (k, &v)| w | (u32::from(v as i8 as u8) << (8 * k)));
                packed[word_at(quads, words, o, p)] = word;
            }
        }
        let floats = match kernel {
            // SAFETY: the AVX2 kernel is packed only on a CPU with F16C
            // (`kernel`; and where VNNI runs, for the tests).
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => unsafe { halves_of(weights, inputs, quads) },
            _ => Vec::new(),
        };
        let mut bias = bias.to_vec();
        bias.resize(count * PANEL, 0.0);
        Some(Linear {
            kernel,
            inputs,
            quads,
            outputs,
            panels: Lines::of(&packed),
            scale,
            sums,
            bias,
            floats,
        })
    }

    /// Whether the kernel takes column `o` in f32 (AVX2's last columns of
    /// each panel) rather than as int8 products.
    #[cfg(test)]
    fn in_floats(&self, o: usize) -> bool {
        o % PANEL >= self.kernel.words()
    }

    /// The weight of input `i` in f32 column `o`, as the kernel takes it
    /// (a half).
    #[cfg(all(test, target_arch = "x86_64"))]
    fn float_weight(&self, o: usize, i: usize) -> f32 {
        use std::arch::x86_64::*;
        let half = self.floats[float_at(self.quads, o, i)];
        // SAFETY: packed for the AVX2 kernel, on a CPU with F16C.
        unsafe { _mm_cvtss_f32(_mm_cvtph_ps(_mm_set1_epi16(half as i16))) }
    }

    /// The rounded int8 weight of input `i` in int8 column `o`.
    #[cfg(test)]
    fn int_weight(&self, o: usize, i: usize) -> f32 {
        let word = self.panels.words()[word_at(self.quads, self.kernel.words(), o, i / 4)];
        f32::from(word.to_le_bytes()[i % 4] as i8)
    }

    #[cfg(not(target_arch = "x86_64"))]
    unsafe fn panel(&self, _: &Rows, _: usize, _: Out) {
        unreachable!("packed only where AVX-512 VNNI or AVX2 runs")
    }

    #[cfg(target_arch = "x86_64")]
    unsafe fn panel(&self, input: &Rows, panel: usize, out: Out) {
        match self.kernel {
            Kernel::Amx => amx::panel(self, input, panel, out),
            Kernel::Vnni => self.panel_vnni(input, panel, out),
            Kernel::Avx2 => self.panel_avx2(input, panel, out),
        }
    }

    /// One panel's columns of every row, [`TILE_ROWS`] rows at a time.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512vnni")]
    unsafe fn panel_vnni(&self, input: &Rows, panel: usize, out: Out) {
        use std::arch::x86_64::*;
        let (xs, rows) = (input.bytes, input.count);
        let quads = self.quads;
        let w = self.panels.words().as_ptr().add(panel * quads * PANEL);
        let columns = self.columns(panel);
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
            // Every row of the tile stored, the padding's too (`out` holds
            // whole tiles until the panels are done), in loops of constant
            // counts with no exit: they keep `acc` in registers. Read by a
            // count known only at run time, `acc` lived in memory, zeroed
            // by a `memset` call every tile (5% of a pass's time).
            for (r, acc) in acc.iter().enumerate() {
                self.store_row(input, first + r, panel, acc, &columns, out);
            }
        }
    }

    /// Per group of 16 of `panel`'s columns: the weights' sums, scales and
    /// biases (whole panels, 0 past the outputs), and the mask of the lanes
    /// within the outputs (what [`Linear::store_row`] takes, read once a
    /// panel).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn columns(&self, panel: usize) -> Columns {
        use std::arch::x86_64::*;
        std::array::from_fn(|l| {
            let column = panel * PANEL + 16 * l;
            (
                _mm512_loadu_ps(self.sums.as_ptr().add(column)),
                _mm512_loadu_ps(self.scale.as_ptr().add(column)),
                _mm512_loadu_ps(self.bias.as_ptr().add(column)),
                panels::first_lanes(self.outputs.saturating_sub(column)),
            )
        })
    }

    /// One row's sums of one panel's columns scaled, shifted by the row's
    /// zero point and biased into `out` (the VNNI and AMX kernels' end).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn store_row(
        &self,
        input: &Rows,
        row: usize,
        panel: usize,
        acc: &[std::arch::x86_64::__m512i; LANES],
        columns: &Columns,
        out: Out,
    ) {
        use std::arch::x86_64::*;
        // Below `padded`: `steps` and `zeros` hold a value for each row of
        // every whole tile.
        let step = _mm512_set1_ps(f32::from_bits(*input.steps.get_unchecked(row)));
        let zero = _mm512_set1_ps(*input.zeros.get_unchecked(row) as f32);
        for (l, (acc, &(weights, scale, bias, mask))) in acc.iter().zip(columns).enumerate() {
            let sums = _mm512_fnmadd_ps(zero, weights, _mm512_cvtepi32_ps(*acc));
            let v = _mm512_fmadd_ps(sums, _mm512_mul_ps(step, scale), bias);
            let at = out.0.add(row * self.outputs + panel * PANEL + 16 * l);
            _mm512_mask_storeu_ps(at, mask, v);
        }
    }

    /// One panel's columns of every row on AVX2, a row at a time. The
    /// panel's first [`INT_COLUMNS`] (40) are int8 products: `vpmaddubsw` then
    /// `vpmaddwd`, both on the one vector pipe that multiplies integers on
    /// AMD's Zen 2, which caps them at 16 products a cycle (a probe: eight
    /// of either take eight cycles, mixed or not). Its last
    /// [`FLOAT_COLUMNS`] are f32 fused multiply-adds (their weights kept as
    /// halves and widened as read), which run beside them on another pipe
    /// (eight integer multiplies and eight FMAs take the eight cycles of
    /// the multiplies alone): 192 products in the 10 cycles of a quad's
    /// integer multiplies instead of 160. The f32 sums run in
    /// two chains, the quad's even inputs and its odd ones, so that an
    /// FMA's latency (five cycles) keeps pace. A row's 5 int and 2 f32
    /// sums leave registers for the weights, which the multiplies read from
    /// memory. (Two rows a tile, as the int8-only kernel had, spilled sums
    /// to the stack and ran slower than this.)
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn panel_avx2(&self, input: &Rows, panel: usize, out: Out) {
        use std::arch::x86_64::*;
        const INTS: usize = INT_COLUMNS / 8;
        let (quads, inputs) = (self.quads, self.inputs);
        let w = self
            .panels
            .words()
            .as_ptr()
            .add(panel * quads * INT_COLUMNS);
        let wf = self.floats.as_ptr().add(panel * quads * 4 * FLOAT_COLUMNS);
        let ones = _mm256_set1_epi16(1);
        // Whole quads of values; the last, part one is taken apart.
        let whole = inputs / 4;
        for row in 0..input.count {
            let x = input.bytes.as_ptr().add(row * quads);
            let v = input.values.as_ptr().add(row * inputs);
            let mut acc = [_mm256_setzero_si256(); INTS];
            // The f32 sums of the quad's even inputs and of its odd ones:
            // chains of two FMAs a quad.
            let mut accf = [_mm256_setzero_ps(); 2];
            // A quad's products: `values` of its four inputs in f32 (4 but
            // in a last, part quad).
            let mut quad = |p: usize, values: usize| {
                let wp = w.add(p * INT_COLUMNS);
                let xv = _mm256_set1_epi32(*x.add(p) as i32);
                for (l, acc) in acc.iter_mut().enumerate() {
                    let ws = _mm256_loadu_si256(wp.add(8 * l).cast());
                    // Each pair of weights is within 128 (`pair_scale_of`):
                    // no i16 sum saturates.
                    let pairs = _mm256_maddubs_epi16(xv, ws);
                    *acc = _mm256_add_epi32(*acc, _mm256_madd_epi16(pairs, ones));
                }
                let wq = wf.add(p * 4 * FLOAT_COLUMNS);
                for k in 0..values {
                    let xf = _mm256_set1_ps(*v.add(4 * p + k));
                    let ws = _mm256_cvtph_ps(_mm_loadu_si128(wq.add(k * FLOAT_COLUMNS).cast()));
                    accf[k % 2] = _mm256_fmadd_ps(xf, ws, accf[k % 2]);
                }
            };
            for p in 0..whole {
                quad(p, 4);
            }
            if whole < quads {
                quad(whole, inputs - 4 * whole);
            }
            let step = _mm256_set1_ps(f32::from_bits(input.steps[row]));
            let zero = _mm256_set1_ps(input.zeros[row] as f32);
            let ints = acc.iter().map(|acc| (_mm256_cvtepi32_ps(*acc), true));
            let floats = std::iter::once((_mm256_add_ps(accf[0], accf[1]), false));
            for (l, (sum, int8)) in ints.chain(floats).enumerate() {
                let column = panel * PANEL + 8 * l;
                if column >= self.outputs {
                    break;
                }
                let bias = _mm256_loadu_ps(self.bias.as_ptr().add(column));
                let v = if int8 {
                    let weights = _mm256_loadu_ps(self.sums.as_ptr().add(column));
                    let sums = _mm256_fnmadd_ps(zero, weights, sum);
                    let scale =
                        _mm256_mul_ps(step, _mm256_loadu_ps(self.scale.as_ptr().add(column)));
                    _mm256_fmadd_ps(sums, scale, bias)
                } else {
                    _mm256_add_ps(sum, bias)
                };
                let at = out.0.add(row * self.outputs + column);
                let n = (self.outputs - column).min(8);
                if n == 8 {
                    _mm256_storeu_ps(at, v);
                } else {
                    let mut part = [0.0f32; 8];
                    _mm256_storeu_ps(part.as_mut_ptr(), v);
                    std::ptr::copy_nonoverlapping(part.as_ptr(), at, n);
                }
            }
        }
    }
}

impl Dense for Linear {
    fn forward_into(&self, x: &[f32], out: &mut Vec<f32>, xs: &mut Vec<u32>) {
        // Rows padded to whole tiles (their results are not stored).
        let (rows, _) = panels::rows_of(x, self.inputs);
        let padded = rows.div_ceil(self.kernel.tile_rows()) * self.kernel.tile_rows();
        let words = padded * self.quads;
        // The bytes start on a cache line (AMX's tile loads take twice as
        // long across lines; rows of whole tiles are whole lines).
        xs.resize(words + 2 * padded + LINE_WORDS - 1, 0);
        let lead = xs.as_ptr().align_offset(4 * LINE_WORDS).min(LINE_WORDS - 1);
        let (bytes, rest) = xs[lead..].split_at_mut(words);
        let (steps, zeros) = rest.split_at_mut(padded);
        for (r, (row, dst)) in x
            .chunks_exact(self.inputs)
            .zip(bytes.chunks_exact_mut(self.quads))
            .enumerate()
        {
            let (step, zero) = match self.kernel {
                // SAFETY: the CPU ran AVX-512 VNNI when the layer was
                // packed (AMX's CPUs run it too); `dst` holds `row`'s quads.
                Kernel::Amx | Kernel::Vnni => unsafe { quantize(row, dst) },
                // SAFETY: the CPU ran AVX2 and FMA when the layer was
                // packed; `dst` holds `row`'s quads.
                Kernel::Avx2 => unsafe { quantize_avx2(row, dst) },
            };
            (steps[r], zeros[r]) = (step.to_bits(), zero as u32);
        }
        // The padding rows are scaled too, by 0 (not by whatever a pass
        // before left there).
        steps[rows..].fill(0);
        zeros[rows..].fill(0);
        // Whole tiles while the panels run (the VNNI and AMX kernels store
        // the padding rows too), the real rows after.
        out.resize(padded * self.outputs, 0.0);
        let dst = Out(out.as_mut_ptr());
        let rows_of = Rows {
            values: x,
            bytes,
            steps,
            zeros,
            count: rows,
        };
        panels::split(self.outputs.div_ceil(PANEL), |panel| {
            // SAFETY: as above; the tiles read within the rows' buffers and
            // the packed weights and write rows `< padded` of their own
            // panel's columns of `out`.
            unsafe { self.panel(&rows_of, panel, dst) }
        });
        out.truncate(rows * self.outputs);
    }
}

/// See [`Linear::columns`].
#[cfg(target_arch = "x86_64")]
type Columns = [(
    std::arch::x86_64::__m512,
    std::arch::x86_64::__m512,
    std::arch::x86_64::__m512,
    std::arch::x86_64::__mmask16,
); LANES];

/// A pass's input rows as bytes, with each row's step and zero point.
struct Rows<'a> {
    /// The rows as given (`count` of them, `inputs` values each).
    values: &'a [f32],
    bytes: &'a [u32],
    steps: &'a [u32],
    zeros: &'a [u32],
    count: usize,
}

/// `row` as bytes by its own step and zero point (as `affine_of` and
/// `to_byte` in the tests), four a word into `dst` (`row.len()` quartered, rounded up;
/// the last word's missing bytes are 0, against weights of 0), 64 values a
/// round (four registers of i32 packed down to bytes, one store), the rest
/// 16 at a time; returns the step and the zero point. A pass's rows come
/// from memory: the first loop, the loads of the row, is most of its time.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn quantize(row: &[f32], dst: &mut [u32]) -> (f32, i32) {
    use std::arch::x86_64::*;
    debug_assert_eq!(dst.len(), row.len().div_ceil(4));
    let (mut lo, mut hi) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    let sixteens = row.chunks_exact(16);
    let rest = sixteens.remainder();
    for chunk in sixteens {
        let v = _mm512_loadu_ps(chunk.as_ptr());
        lo = _mm512_min_ps(lo, v);
        hi = _mm512_max_ps(hi, v);
    }
    // The missing lanes load as 0, which `lo` and `hi` hold already.
    let v = _mm512_maskz_loadu_ps(panels::first_lanes(rest.len()), rest.as_ptr());
    lo = _mm512_min_ps(lo, v);
    hi = _mm512_max_ps(hi, v);
    let (step, zero) = affine(_mm512_reduce_min_ps(lo), _mm512_reduce_max_ps(hi));
    let inv = _mm512_set1_ps(1.0 / step);
    let (bottom, top, zero_point) = (
        _mm512_setzero_si512(),
        _mm512_set1_epi32(255),
        _mm512_set1_epi32(zero),
    );
    // Round to nearest, ties to even (the default rounding mode).
    let byte = |v: __m512| {
        let q = _mm512_add_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(v, inv)), zero_point);
        _mm512_min_epi32(_mm512_max_epi32(q, bottom), top)
    };
    if let Some(last) = dst.last_mut() {
        *last = 0;
    }
    // The packs leave 128-bit lane L holding quad L of each register in
    // turn; the words go back in order.
    let order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    let rounds = row.chunks_exact(64);
    let done = row.len() - rounds.remainder().len();
    for (c, chunk) in rounds.enumerate() {
        let q: [__m512i; 4] =
            std::array::from_fn(|k| byte(_mm512_loadu_ps(chunk.as_ptr().add(16 * k))));
        let bytes = _mm512_packus_epi16(
            _mm512_packs_epi32(q[0], q[1]),
            _mm512_packs_epi32(q[2], q[3]),
        );
        let words = _mm512_permutexvar_epi32(order, bytes);
        _mm512_storeu_si512(dst.as_mut_ptr().add(16 * c).cast(), words);
    }
    let bytes = dst.as_mut_ptr().cast::<i8>().add(done);
    for (c, chunk) in row[done..].chunks(16).enumerate() {
        let mask = panels::first_lanes(chunk.len());
        let q = byte(_mm512_maskz_loadu_ps(mask, chunk.as_ptr()));
        _mm512_mask_cvtepi32_storeu_epi8(bytes.add(16 * c), mask, q);
    }
    (step, zero)
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn quantize(_: &[f32], _: &mut [u32]) -> (f32, i32) {
    unreachable!("packed only where AVX-512 VNNI runs")
}

/// [`quantize`] in AVX2's registers of 8, 32 values a round (four
/// registers of i32 packed down to bytes), the rest one at a time.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn quantize_avx2(row: &[f32], dst: &mut [u32]) -> (f32, i32) {
    use std::arch::x86_64::*;
    debug_assert_eq!(dst.len(), row.len().div_ceil(4));
    let (mut lo, mut hi) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let eights = row.chunks_exact(8);
    let (mut lo1, mut hi1) = (0.0f32, 0.0f32);
    for &v in eights.remainder() {
        (lo1, hi1) = (lo1.min(v), hi1.max(v));
    }
    for chunk in eights {
        let v = _mm256_loadu_ps(chunk.as_ptr());
        lo = _mm256_min_ps(lo, v);
        hi = _mm256_max_ps(hi, v);
    }
    let (mut los, mut his) = ([0.0f32; 8], [0.0f32; 8]);
    _mm256_storeu_ps(los.as_mut_ptr(), lo);
    _mm256_storeu_ps(his.as_mut_ptr(), hi);
    let lo = los.iter().fold(lo1, |m, &v| m.min(v));
    let hi = his.iter().fold(hi1, |m, &v| m.max(v));
    let (step, zero) = affine(lo, hi);
    let inv = _mm256_set1_ps(1.0 / step);
    let (bottom, top, zero_point) = (
        _mm256_setzero_si256(),
        _mm256_set1_epi32(255),
        _mm256_set1_epi32(zero),
    );
    // Bytes 0–3 of 8 values from each 128-bit half, back in order.
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    let rounds = row.chunks_exact(32);
    let done = row.len() - rounds.remainder().len();
    for (c, chunk) in rounds.enumerate() {
        let q: [__m256i; 4] = std::array::from_fn(|k| {
            let v = _mm256_loadu_ps(chunk.as_ptr().add(8 * k));
            // Round to nearest, ties to even (the default rounding mode).
            let q = _mm256_add_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(v, inv)), zero_point);
            _mm256_min_epi32(_mm256_max_epi32(q, bottom), top)
        });
        let halves = _mm256_packus_epi16(
            _mm256_packs_epi32(q[0], q[1]),
            _mm256_packs_epi32(q[2], q[3]),
        );
        let bytes = _mm256_permutevar8x32_epi32(halves, order);
        _mm256_storeu_si256(dst.as_mut_ptr().add(8 * c).cast(), bytes);
    }
    // The rest, four a word (the last word's missing bytes 0).
    for (word, quad) in dst[done / 4..].iter_mut().zip(row[done..].chunks(4)) {
        *word = quad.iter().enumerate().fold(0u32, |w, (k, &v)| {
            w | ((to_byte(v, step, zero) as u32) << (8 * k))
        });
    }
    (step, zero)
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn quantize_avx2(_: &[f32], _: &mut [u32]) -> (f32, i32) {
    unreachable!("packed only where AVX2 and FMA run")
}

/// AMX: whether the CPU and Linux let this process use the tiles, and the
/// panel kernel on them. Rust's AMX intrinsics are not stable, so the
/// instructions are written out (`asm!`), on fixed tile registers.
#[cfg(target_arch = "x86_64")]
mod amx {
    use super::{
        Line, Linear, Rows, AMX_QUADS as QUADS, AMX_ROWS as TILE, LANES, LINE_WORDS, PANEL,
    };
    use crate::panels::Out;
    use std::arch::asm;

    /// Whether the CPU has AMX's tiles and int8 products (CPUID leaf 7:
    /// EDX bits 24 and 25) and Linux grants this process the tiles' state,
    /// which it hands out only to a process that asks
    /// (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`; asked once,
    /// as [`super::kernel`] keeps its answer).
    pub(super) fn usable() -> bool {
        // SAFETY: CPUID leaf 7 exists on every CPU with AVX-512, the only
        // caller's condition.
        #[allow(unused_unsafe)]
        let edx = unsafe { std::arch::x86_64::__cpuid_count(7, 0) }.edx;
        edx & (3 << 24) == 3 << 24 && granted()
    }

    #[cfg(target_os = "linux")]
    fn granted() -> bool {
        const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
        const XFEATURE_XTILEDATA: libc::c_long = 18;
        // SAFETY: the request only asks for a permission; it touches no
        // memory of ours.
        unsafe {
            libc::syscall(
                libc::SYS_arch_prctl,
                ARCH_REQ_XCOMP_PERM,
                XFEATURE_XTILEDATA,
            ) == 0
        }
    }

    #[cfg(not(target_os = "linux"))]
    fn granted() -> bool {
        false
    }

    /// The tiles' shapes (`ldtilecfg`'s 64 bytes, palette 1): tiles 0–2
    /// the sums of a panel's three groups of 16 columns, tile 3 the input's
    /// 16 rows of 16 quads, tiles 4–6 the weights of those quads for each
    /// group; every tile 16 rows of 64 bytes.
    #[repr(C, align(64))]
    struct Config {
        palette: u8,
        start_row: u8,
        reserved: [u8; 14],
        bytes: [u16; 16],
        rows: [u8; 16],
    }

    const CONFIG: Config = {
        let mut c = Config {
            palette: 1,
            start_row: 0,
            reserved: [0; 14],
            bytes: [0; 16],
            rows: [0; 16],
        };
        let mut t = 0;
        while t < 7 {
            c.bytes[t] = 64;
            c.rows[t] = TILE as u8;
            t += 1;
        }
        c
    };

    /// Quads of inputs a pass over the tiles of rows takes at most: a
    /// panel's weights for them (18 KiB) stay in the core's first cache
    /// while every tile of rows reads them (the 73 KiB of a layer of 1,536
    /// inputs came from the second for every tile).
    const BLOCK_QUADS: usize = 96;

    thread_local! {
        /// The sums kept between blocks, kept from pass to pass.
        static PARTIAL: std::cell::Cell<Vec<Line>> = const { std::cell::Cell::new(Vec::new()) };
    }

    /// The sums of one tile of rows and a panel's columns, as stored from
    /// the tiles.
    #[repr(C, align(64))]
    struct Sums([[i32; PANEL]; TILE]);

    /// One panel's columns of every row (padded to whole tiles), a tile of
    /// 16 rows at a time: per 16 quads of inputs, one tile of the rows'
    /// bytes and the panel's three tiles of weights, read as VNNI's packing
    /// lays them (a quad's words of the panel's 48 columns side by side: a
    /// tile's rows 192 bytes apart), and three `tdpbusd`; the inputs in
    /// blocks of [`BLOCK_QUADS`] quads.
    ///
    /// # Safety
    /// The CPU runs AMX-INT8 and AVX-512 and the process was granted the
    /// tiles ([`usable`]); the layer's inputs are whole tiles (a multiple
    /// of 64) and `input` holds whole tiles of rows.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn panel(layer: &Linear, input: &Rows, panel: usize, out: Out) {
        use std::arch::x86_64::*;
        let quads = layer.quads;
        debug_assert_eq!(quads % QUADS, 0);
        let padded = input.bytes.len() / quads;
        debug_assert_eq!(padded % TILE, 0);
        let w = layer.panels.words().as_ptr().add(panel * quads * PANEL);
        let mut sums = Sums([[0; PANEL]; TILE]);
        let columns = layer.columns(panel);
        // A layer of more inputs than a block takes them a block at a
        // time, each over every tile of rows, the sums kept between blocks
        // in `partial` (whole tiles of rows by the panel's columns).
        let blocks = quads.div_ceil(BLOCK_QUADS);
        let mut partial = Vec::new();
        if blocks > 1 {
            partial = PARTIAL.take();
            partial.resize(padded * PANEL / LINE_WORDS, Line([0; LINE_WORDS]));
        }
        asm!("ldtilecfg [{}]", in(reg) &CONFIG, options(nostack, readonly));
        for block in 0..blocks {
            let (from, to) = (block * BLOCK_QUADS, ((block + 1) * BLOCK_QUADS).min(quads));
            for first in (0..padded).step_by(TILE) {
                // (Unread with one block, when `partial` is empty.)
                let kept = partial
                    .as_mut_ptr()
                    .wrapping_add(first * PANEL / LINE_WORDS);
                if block == 0 {
                    asm!(
                        "tilezero tmm0",
                        "tilezero tmm1",
                        "tilezero tmm2",
                        options(nomem, nostack)
                    );
                } else {
                    asm!(
                        "tileloadd tmm0, [{s} + {ss}*1]",
                        "tileloadd tmm1, [{s} + {ss}*1 + 64]",
                        "tileloadd tmm2, [{s} + {ss}*1 + 128]",
                        s = in(reg) kept,
                        ss = in(reg) PANEL * 4,
                        options(nostack, readonly)
                    );
                }
                let x = input.bytes.as_ptr().add(first * quads);
                for p in (from..to).step_by(QUADS) {
                    asm!(
                        "tileloadd tmm3, [{x} + {xs}*1]",
                        "tileloadd tmm4, [{w} + {ws}*1]",
                        "tileloadd tmm5, [{w} + {ws}*1 + 64]",
                        "tileloadd tmm6, [{w} + {ws}*1 + 128]",
                        "tdpbusd tmm0, tmm3, tmm4",
                        "tdpbusd tmm1, tmm3, tmm5",
                        "tdpbusd tmm2, tmm3, tmm6",
                        x = in(reg) x.add(p),
                        xs = in(reg) quads * 4,
                        w = in(reg) w.add(p * PANEL),
                        ws = in(reg) PANEL * 4,
                        options(nostack, readonly)
                    );
                }
                let last = block + 1 == blocks;
                asm!(
                    "tilestored [{s} + {ss}*1], tmm0",
                    "tilestored [{s} + {ss}*1 + 64], tmm1",
                    "tilestored [{s} + {ss}*1 + 128], tmm2",
                    s = in(reg) if last { sums.0.as_mut_ptr().cast::<Line>() } else { kept },
                    ss = in(reg) PANEL * 4,
                    options(nostack)
                );
                if !last {
                    continue;
                }
                for (r, row) in sums.0.iter().enumerate() {
                    let acc: [__m512i; LANES] =
                        std::array::from_fn(|l| _mm512_load_si512(row.as_ptr().add(16 * l).cast()));
                    layer.store_row(input, first + r, panel, &acc, &columns, out);
                }
            }
        }
        asm!("tilerelease", options(nomem, nostack));
        if blocks > 1 {
            PARTIAL.set(partial);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::values;

    /// The kernels this CPU runs: AMX's CPUs run VNNI too, VNNI's AVX2.
    fn kernels() -> Vec<Kernel> {
        match kernel() {
            Some(Kernel::Amx) => vec![Kernel::Amx, Kernel::Vnni, Kernel::Avx2],
            Some(Kernel::Vnni) => vec![Kernel::Vnni, Kernel::Avx2],
            Some(Kernel::Avx2) => vec![Kernel::Avx2],
            None => Vec::new(),
        }
    }

    #[test]
    fn the_vector_rounding_is_the_scalar_one() {
        if !supported() {
            return assert!(Linear::new(&[1.0], &[0.0]).is_none());
        }
        for kernel in kernels() {
            for len in [1, 3, 4, 15, 16, 17, 33, 64, 385] {
                let row: Vec<f32> = values(len, len as u64).iter().map(|v| v * 7.0).collect();
                let mut got = vec![0u32; len.div_ceil(4)];
                let (step, zero) = match kernel {
                    // SAFETY: the CPU runs AVX-512 VNNI (`kernels()`).
                    Kernel::Amx | Kernel::Vnni => unsafe { quantize(&row, &mut got) },
                    // SAFETY: the CPU runs AVX2 and FMA (`kernels()`).
                    Kernel::Avx2 => unsafe { quantize_avx2(&row, &mut got) },
                };
                assert_eq!((step, zero), affine_of(&row), "{kernel:?}, {len} values");
                let mut want = vec![0u32; len.div_ceil(4)];
                for (i, &v) in row.iter().enumerate() {
                    want[i / 4] |= (to_byte(v, step, zero) as u32) << (8 * (i % 4));
                }
                assert_eq!(got, want, "{kernel:?}, {len} values");
            }
        }
    }

    /// AMX multiplies the same bytes by the same weights as VNNI, so a
    /// layer of whole tiles gives VNNI's results to the bit: part tiles
    /// of rows, a part panel, inputs of one tile and of many, one thread
    /// and two; a layer of other inputs runs on VNNI.
    #[test]
    fn amx_gives_vnnis_results() {
        let amx = kernels().contains(&Kernel::Amx);
        assert_eq!(amx, fastest() == Some(Kernel::Amx) && kernel() == fastest());
        if !amx {
            return;
        }
        let (mut xs, mut out) = (Vec::new(), Vec::new());
        for (rows, inputs, outputs) in
            [(1, 384, 384), (17, 64, 50), (40, 384, 1536), (3, 1536, 384)]
        {
            let x = values(rows * inputs, 7);
            let (w, b) = (values(outputs * inputs, 8), values(outputs, 9));
            let tiles = Linear::packed(Kernel::Amx, &w, &b).expect("whole rows");
            assert_eq!(tiles.kernel, Kernel::Amx);
            let vnni = Linear::packed(Kernel::Vnni, &w, &b)
                .expect("whole rows")
                .forward(&x);
            for threads in [1, 2] {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                pool.install(|| tiles.forward_into(&x, &mut out, &mut xs));
                assert_eq!(out, vnni, "{rows}×{inputs}→{outputs}, {threads} threads");
            }
        }
        let odd = Linear::packed(Kernel::Amx, &values(3 * 70, 1), &[0.0; 3]).expect("whole rows");
        assert_eq!(odd.kernel, Kernel::Vnni);
    }

    /// Odd sizes: a last quad with fewer than four values, a part panel, a
    /// part tile; a row of zeros; buffers kept from call to call.
    #[test]
    fn matches_the_f32_product_within_int8_rounding() {
        let mut xs = Vec::new();
        let mut out = Vec::new();
        assert_eq!(supported(), !kernels().is_empty());
        for kernel in kernels() {
            for (rows, inputs, outputs) in
                [(1, 384, 384), (13, 7, 50), (20, 385, 1536), (3, 1536, 17)]
            {
                let mut x = values(rows * inputs, 1);
                if rows > 1 {
                    x[..inputs].fill(0.0);
                }
                let (w, b) = (values(outputs * inputs, 2), values(outputs, 3));
                let layer = Linear::packed(kernel, &w, &b).expect("whole rows");
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
                            let sw = layer.scale[o];
                            let exact = b[o] + xr.iter().zip(wo).map(|(a, b)| a * b).sum::<f32>();
                            // Each value is off by at most half its step;
                            // AVX2's f32 columns take the rows as they are
                            // and the weights as halves, each within 2^-11
                            // of itself.
                            let bound: f32 = xr
                                .iter()
                                .zip(wo)
                                .map(|(a, b)| match layer.in_floats(o) {
                                    true => (a * b).abs() / 2048.0,
                                    false => {
                                        a.abs() * sw / 2.0 + b.abs() * sx / 2.0 + sx * sw / 4.0
                                    }
                                })
                                .sum();
                            let err = (out[r * outputs + o] - exact).abs();
                            assert!(
                                err <= bound + 1e-5,
                                "{kernel:?} row {r} col {o}: {err} > {bound}"
                            );
                        }
                    }
                    if rows > 1 {
                        assert!(out[..outputs].iter().zip(&b).all(|(y, b)| y == b), "zeros");
                    }
                }
            }
        }
    }

    /// The largest bytes against the largest weights of either sign: two
    /// products of 255 and 127 would saturate AVX2's i16 pair sums, so its
    /// packing keeps every pair of weights within 128, and the results are
    /// those of the rounded weights.
    #[test]
    fn the_largest_products_do_not_saturate() {
        let (rows, inputs, outputs) = (4, 64, 9);
        // Rows of one value, positive (every byte 255) or negative (every
        // byte 0, the zero point 255).
        let value = |r: usize| (0.5 + r as f32) * [1.0, -1.0][r % 2];
        let x: Vec<f32> = (0..rows * inputs).map(|i| value(i / inputs)).collect();
        // Columns of one value each, +1 or -1, and random ones.
        let mut w: Vec<f32> = (0..outputs * inputs)
            .map(|i| if (i / inputs) % 2 == 0 { 1.0 } else { -1.0 })
            .collect();
        w.extend(values(outputs * inputs, 5));
        let b = vec![0.0; 2 * outputs];
        for kernel in kernels() {
            let layer = Linear::packed(kernel, &w, &b).expect("whole rows");
            // The rounded weights, from the packing.
            let q = |o: usize, i: usize| layer.int_weight(o, i);
            if kernel == Kernel::Avx2 {
                for o in (0..2 * outputs).filter(|&o| !layer.in_floats(o)) {
                    for i in (0..inputs).step_by(2) {
                        let pair = q(o, i).abs() + q(o, i + 1).abs();
                        assert!(pair <= 128.0, "column {o}, inputs {i}–: {pair}");
                    }
                }
            }
            let got = layer.forward(&x);
            for r in 0..rows {
                for o in 0..2 * outputs {
                    // AVX2's f32 columns take the weights as halves.
                    let exact: f32 = (0..inputs)
                        .map(|i| match layer.in_floats(o) {
                            true => value(r) * layer.float_weight(o, i),
                            false => value(r) * q(o, i) * layer.scale[o],
                        })
                        .sum();
                    let err = (got[r * 2 * outputs + o] - exact).abs();
                    assert!(
                        err <= exact.abs() * 1e-5 + 1e-5,
                        "{kernel:?} row {r} col {o}: {} not {exact}",
                        got[r * 2 * outputs + o]
                    );
                }
            }
        }
    }
}
