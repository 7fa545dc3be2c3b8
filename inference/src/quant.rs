//! Matrix products over GGUF weights for the built-in engine's CPU path: the weights stay
//! in the file's own blocks (never requantized), the activations are quantized once per
//! product to the block type llama.cpp pairs with each weight type, and the rows are
//! split across threads only when a product is large enough to pay for it.
//!
//! Q4_1 weights (the SmolLM2 file the tests run) have a kernel of our own: the
//! activation goes to Q8_1 as llama.cpp's `quantize_row_q8_1` does (round half to even,
//! `s = d · Σq` rounded once to F16), and each block's dot product is an integer sum of
//! 32 products, AVX2 + FMA + F16C where the CPU has them (detected at run time) and the
//! scalar loop otherwise. The other block types use candle's own dot products (AVX2
//! where candle has them) on candle's block types, driven by the same loop and threads;
//! F32, F16 and BF16 weights are widened to F32 at load, as candle's `QMatMul` does.

use std::borrow::Cow;

use candle_core::quantized::GgmlDType;
use candle_core::quantized::k_quants::{
    BlockQ2K, BlockQ3K, BlockQ4_0, BlockQ4K, BlockQ5_0, BlockQ5_1, BlockQ5K, BlockQ6K, BlockQ8_1, BlockQ8K, GgmlType,
};

/// Elements per Q4_1 / Q8_1 block.
const QK: usize = 32;
/// Bytes of one Q4_1 block: F16 scale, F16 minimum, 16 bytes of nibbles.
const Q4_1_BYTES: usize = 20;
/// Bytes of one Q8_0 block: F16 scale, 32 signed bytes.
const Q8_0_BYTES: usize = 34;

/// Multiply-adds a thread must have before a product is split across threads: below
/// this, starting and joining a thread (tens of microseconds) costs more than the work
/// it takes over. About half a millisecond of one core's work with the Q4_1 kernel.
pub(crate) const MIN_WORK_PER_THREAD: usize = 8 << 20;

/// Why a tensor cannot be used as a matrix.
#[derive(Debug, thiserror::Error)]
pub(crate) enum QuantError {
    #[error("{what}")]
    Shape { what: String },
}

/// A weight matrix of `rows` × `cols` (a linear layer's output × input features), stored
/// as the GGUF file stores it.
pub(crate) struct QMatrix {
    rows: usize,
    cols: usize,
    kind: Kind,
}

enum Kind {
    /// Raw Q4_1 blocks, row after row.
    Q4_1(Vec<u8>),
    /// Raw Q8_0 blocks, row after row.
    Q8_0(Vec<u8>),
    /// F32 values, row after row (F32, F16 and BF16 files).
    F32(Vec<f32>),
    /// Any other block type, kept in 8-byte-aligned storage so it can be viewed as
    /// candle's block structs.
    Blocks {
        dtype: GgmlDType,
        words: Vec<u64>,
        bytes: usize,
    },
}

impl std::fmt::Debug for QMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QMatrix")
            .field("rows", &self.rows)
            .field("cols", &self.cols)
            .field("dtype", &self.dtype())
            .finish()
    }
}

/// An activation row quantized for Q4_1 weights: llama.cpp's `block_q8_1`, with its two
/// F16 values already widened (exactly) to F32.
#[derive(Debug, Clone, Copy, Default)]
#[repr(C)]
pub(crate) struct Q8_1 {
    d: f32,
    s: f32,
    qs: [i8; QK],
}

/// An activation row quantized for Q8_0 weights: llama.cpp's `block_q8_0`, its F16
/// scale widened to F32.
#[derive(Debug, Clone, Copy, Default)]
#[repr(C)]
pub(crate) struct Q8_0 {
    d: f32,
    qs: [i8; QK],
}

/// Scratch reused between products, so a decoded token allocates nothing here.
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    q8_1: Vec<Q8_1>,
    q8_0: Vec<Q8_0>,
    words: Vec<u64>,
}

impl QMatrix {
    /// A matrix of `rows` × `cols` from a GGUF tensor's raw bytes in `dtype`; float types
    /// come as already-widened F32 values through `floats`.
    pub(crate) fn new(
        dtype: GgmlDType,
        rows: usize,
        cols: usize,
        raw: Cow<'_, [u8]>,
        floats: impl FnOnce() -> Result<Vec<f32>, String>,
    ) -> Result<QMatrix, QuantError> {
        let shape = |what: String| QuantError::Shape { what };
        let kind = match dtype {
            GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16 => {
                let values = floats().map_err(shape)?;
                if values.len() != rows * cols {
                    return Err(shape(format!("{} values for a {rows}×{cols} matrix", values.len())));
                }
                Kind::F32(values)
            }
            _ => {
                let block = dtype.block_size();
                if !cols.is_multiple_of(block) {
                    return Err(shape(format!(
                        "{cols} columns are not whole {dtype:?} blocks of {block}"
                    )));
                }
                let bytes = rows * cols / block * dtype.type_size();
                if raw.len() != bytes {
                    return Err(shape(format!(
                        "{} bytes for a {rows}×{cols} {dtype:?} matrix of {bytes} bytes",
                        raw.len()
                    )));
                }
                if dtype == GgmlDType::Q4_1 {
                    Kind::Q4_1(raw.into_owned())
                } else if dtype == GgmlDType::Q8_0 {
                    Kind::Q8_0(raw.into_owned())
                } else {
                    let mut words = vec![0u64; bytes.div_ceil(8)];
                    for (word, chunk) in words.iter_mut().zip(raw.chunks(8)) {
                        let mut le = [0u8; 8];
                        le[..chunk.len()].copy_from_slice(chunk);
                        *word = u64::from_le_bytes(le);
                    }
                    Kind::Blocks { dtype, words, bytes }
                }
            }
        };
        Ok(QMatrix { rows, cols, kind })
    }

    pub(crate) fn rows(&self) -> usize {
        self.rows
    }

    pub(crate) fn cols(&self) -> usize {
        self.cols
    }

    /// The weights' type as stored here (F32 for the widened float types).
    pub(crate) fn dtype(&self) -> GgmlDType {
        match &self.kind {
            Kind::Q4_1(_) => GgmlDType::Q4_1,
            Kind::Q8_0(_) => GgmlDType::Q8_0,
            Kind::F32(_) => GgmlDType::F32,
            Kind::Blocks { dtype, .. } => *dtype,
        }
    }

    /// Row `row` as F32 values into `out` (`cols` long): an embedding lookup.
    pub(crate) fn dequantize_row(&self, row: usize, out: &mut [f32]) {
        let cols = self.cols;
        match &self.kind {
            Kind::Q4_1(raw) => {
                let blocks = cols / QK;
                let bytes = &raw[row * blocks * Q4_1_BYTES..(row + 1) * blocks * Q4_1_BYTES];
                for (block, out) in bytes.chunks_exact(Q4_1_BYTES).zip(out.chunks_exact_mut(QK)) {
                    let d = f16_to_f32(u16::from_le_bytes([block[0], block[1]]));
                    let m = f16_to_f32(u16::from_le_bytes([block[2], block[3]]));
                    for (j, &q) in block[4..].iter().enumerate() {
                        out[j] = f32::from(q & 0x0F) * d + m;
                        out[j + QK / 2] = f32::from(q >> 4) * d + m;
                    }
                }
            }
            Kind::Q8_0(raw) => {
                let blocks = cols / QK;
                let bytes = &raw[row * blocks * Q8_0_BYTES..(row + 1) * blocks * Q8_0_BYTES];
                for (block, out) in bytes.chunks_exact(Q8_0_BYTES).zip(out.chunks_exact_mut(QK)) {
                    let d = f16_to_f32(u16::from_le_bytes([block[0], block[1]]));
                    for (out, &q) in out.iter_mut().zip(&block[2..]) {
                        *out = f32::from(q as i8) * d;
                    }
                }
            }
            Kind::F32(values) => out.copy_from_slice(&values[row * cols..(row + 1) * cols]),
            Kind::Blocks { dtype, words, bytes } => {
                macro_rules! dequantize {
                    ($t:ty) => {{
                        let blocks = blocks_of::<$t>(words, *bytes);
                        let per_row = cols / <$t>::BLCK_SIZE;
                        <$t>::to_float(&blocks[row * per_row..(row + 1) * per_row], out)
                    }};
                }
                for_block_type!(*dtype, dequantize)
            }
        }
    }

    /// `out` (`m` × `rows`, row-major) = `x` (`m` × `cols`, row-major) · selfᵀ, on up to
    /// `threads` threads.
    pub(crate) fn matmul(&self, x: &[f32], m: usize, out: &mut [f32], threads: usize, scratch: &mut Scratch) {
        debug_assert_eq!(x.len(), m * self.cols);
        debug_assert_eq!(out.len(), m * self.rows);
        match &self.kind {
            Kind::Q4_1(raw) => {
                let blocks = self.cols / QK;
                scratch.q8_1.resize(m * blocks, Q8_1::default());
                for (x, y) in x.chunks_exact(self.cols).zip(scratch.q8_1.chunks_exact_mut(blocks)) {
                    quantize_q8_1(x, y);
                }
                let kernel = q4_1_kernel();
                let ys: &[Q8_1] = &scratch.q8_1;
                self.split(m, out, threads, |rows, outs| {
                    for (i, row) in rows.enumerate() {
                        let w = &raw[row * blocks * Q4_1_BYTES..(row + 1) * blocks * Q4_1_BYTES];
                        for (t, out) in outs.iter_mut().enumerate() {
                            out[i] = kernel(w, &ys[t * blocks..(t + 1) * blocks]);
                        }
                    }
                });
            }
            Kind::Q8_0(raw) => {
                let blocks = self.cols / QK;
                scratch.q8_0.resize(m * blocks, Q8_0::default());
                for (x, y) in x.chunks_exact(self.cols).zip(scratch.q8_0.chunks_exact_mut(blocks)) {
                    quantize_q8_0(x, y);
                }
                let kernel = q8_0_kernel();
                let ys: &[Q8_0] = &scratch.q8_0;
                self.split(m, out, threads, |rows, outs| {
                    for (i, row) in rows.enumerate() {
                        let w = &raw[row * blocks * Q8_0_BYTES..(row + 1) * blocks * Q8_0_BYTES];
                        for (t, out) in outs.iter_mut().enumerate() {
                            out[i] = kernel(w, &ys[t * blocks..(t + 1) * blocks]);
                        }
                    }
                });
            }
            Kind::F32(values) => {
                let cols = self.cols;
                self.split(m, out, threads, |rows, outs| {
                    for (i, row) in rows.enumerate() {
                        let w = &values[row * cols..(row + 1) * cols];
                        for (t, out) in outs.iter_mut().enumerate() {
                            out[i] = dot_f32(w, &x[t * cols..(t + 1) * cols]);
                        }
                    }
                });
            }
            Kind::Blocks { dtype, words, bytes } => {
                macro_rules! product {
                    ($t:ty) => {
                        self.candle_matmul::<$t>(blocks_of::<$t>(words, *bytes), x, m, out, threads, scratch)
                    };
                }
                for_block_type!(*dtype, product)
            }
        }
    }

    /// The product with candle's block type `T` and its dot product.
    fn candle_matmul<T: GgmlType>(
        &self,
        weights: &[T],
        x: &[f32],
        m: usize,
        out: &mut [f32],
        threads: usize,
        scratch: &mut Scratch,
    ) {
        let per_row = self.cols / T::BLCK_SIZE;
        let ys = typed_scratch::<T::VecDotType>(&mut scratch.words, m * per_row);
        for (x, y) in x.chunks_exact(self.cols).zip(ys.chunks_exact_mut(per_row)) {
            T::VecDotType::from_float(x, y);
        }
        let ys: &[T::VecDotType] = ys;
        let cols = self.cols;
        self.split(m, out, threads, |rows, outs| {
            for (i, row) in rows.enumerate() {
                let w = &weights[row * per_row..(row + 1) * per_row];
                for (t, out) in outs.iter_mut().enumerate() {
                    out[i] = T::vec_dot(cols, w, &ys[t * per_row..(t + 1) * per_row]);
                }
            }
        });
    }

    /// Runs `work(rows, outs)` over the weight rows, on one thread or, when the product is
    /// large enough ([`MIN_WORK_PER_THREAD`]), on contiguous ranges of rows in parallel:
    /// `outs[t]` is the part of output row `t` that belongs to `rows`.
    fn split<F>(&self, m: usize, out: &mut [f32], threads: usize, work: F)
    where
        F: Fn(std::ops::Range<usize>, &mut [&mut [f32]]) + Sync,
    {
        let n = self.rows;
        let parts = threads_for(m * n * self.cols, threads).min(n.max(1));
        #[cfg(test)]
        let parts = match FORCE_THREADS.with(std::cell::Cell::get) {
            0 => parts,
            forced => forced.min(n.max(1)),
        };
        if parts <= 1 {
            let mut outs: Vec<&mut [f32]> = out.chunks_exact_mut(n).collect();
            work(0..n, &mut outs);
            return;
        }
        let chunk = n.div_ceil(parts);
        let mut per_part: Vec<Vec<&mut [f32]>> = (0..parts).map(|_| Vec::with_capacity(m)).collect();
        for row in out.chunks_exact_mut(n) {
            for (part, piece) in per_part.iter_mut().zip(row.chunks_mut(chunk)) {
                part.push(piece);
            }
        }
        let work = &work;
        std::thread::scope(|scope| {
            let mut parts = per_part.into_iter().enumerate();
            let first = parts.next();
            for (index, mut outs) in parts {
                let start = index * chunk;
                scope.spawn(move || work(start..(start + chunk).min(n), &mut outs));
            }
            if let Some((_, mut outs)) = first {
                work(0..chunk.min(n), &mut outs);
            }
        });
    }
}

/// How many threads a product of `work` multiply-adds gets: one per
/// [`MIN_WORK_PER_THREAD`], at most `threads`, at least one.
pub(crate) fn threads_for(work: usize, threads: usize) -> usize {
    (work / MIN_WORK_PER_THREAD).clamp(1, threads.max(1))
}

/// Calls `$body!(BlockType)` for the block type `$dtype` names (not Q4_1 nor the float
/// types, which have storage of their own).
macro_rules! for_block_type {
    ($dtype:expr, $body:ident) => {
        match $dtype {
            GgmlDType::Q4_0 => $body!(BlockQ4_0),
            GgmlDType::Q5_0 => $body!(BlockQ5_0),
            GgmlDType::Q5_1 => $body!(BlockQ5_1),
            GgmlDType::Q8_1 => $body!(BlockQ8_1),
            GgmlDType::Q2K => $body!(BlockQ2K),
            GgmlDType::Q3K => $body!(BlockQ3K),
            GgmlDType::Q4K => $body!(BlockQ4K),
            GgmlDType::Q5K => $body!(BlockQ5K),
            GgmlDType::Q6K => $body!(BlockQ6K),
            GgmlDType::Q8K => $body!(BlockQ8K),
            // Never stored as `Kind::Blocks` (see `QMatrix::new`).
            GgmlDType::Q4_1 | GgmlDType::Q8_0 | GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16 => {}
        }
    };
}
use for_block_type;

/// The first `bytes` of `words` as blocks of `T`.
fn blocks_of<T: GgmlType>(words: &[u64], bytes: usize) -> &[T] {
    let size = std::mem::size_of::<T>();
    debug_assert!(std::mem::align_of::<T>() <= std::mem::align_of::<u64>());
    debug_assert!(bytes <= words.len() * 8 && bytes.is_multiple_of(size));
    // SAFETY: candle's block types are `#[repr(C)]` structs of integers and F16 values
    // laid out exactly as ggml writes them (candle reads GGUF files the same way), so
    // every bit pattern is a valid value; `words` is 8-byte aligned, which covers their
    // alignment (at most 4), and holds at least `bytes` bytes (`QMatrix::new` sized it),
    // a whole number of blocks.
    unsafe { std::slice::from_raw_parts(words.as_ptr().cast::<T>(), bytes / size) }
}

/// `len` values of `T` in `words`, grown as needed; their contents are whatever was there.
fn typed_scratch<T: GgmlType>(words: &mut Vec<u64>, len: usize) -> &mut [T] {
    let bytes = len * std::mem::size_of::<T>();
    if words.len() * 8 < bytes {
        words.resize(bytes.div_ceil(8), 0);
    }
    debug_assert!(std::mem::align_of::<T>() <= std::mem::align_of::<u64>());
    // SAFETY: as in `blocks_of`: activation block types (Q8_0, Q8_1, Q8K) are
    // `#[repr(C)]` integers and F16/F32 values valid for any bits, `words` is 8-byte
    // aligned and at least `bytes` long, and the slice borrows `words` mutably.
    unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<T>(), len) }
}

/// A dot product of F32 rows in eight independent sums (vectorized by the compiler).
fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let mut sums = [0f32; 8];
    let chunks = a.len() / 8 * 8;
    for (a, b) in a[..chunks].chunks_exact(8).zip(b[..chunks].chunks_exact(8)) {
        for i in 0..8 {
            sums[i] += a[i] * b[i];
        }
    }
    let mut sum: f32 = sums.iter().sum();
    for (a, b) in a[chunks..].iter().zip(&b[chunks..]) {
        sum += a * b;
    }
    sum
}

/// An F16 bit pattern as F32 (exact).
pub(crate) fn f16_to_f32(bits: u16) -> f32 {
    let sign = u32::from(bits >> 15) << 31;
    let exponent = u32::from((bits >> 10) & 0x1F);
    let mantissa = u32::from(bits & 0x3FF);
    let magnitude = match (exponent, mantissa) {
        (0, 0) => 0,
        // Subnormal: mantissa · 2⁻²⁴, exact in F32.
        (0, _) => return sign_factor(bits) * (mantissa as f32) * f32::powi(2.0, -24),
        (0x1F, 0) => 0xFF << 23,
        (0x1F, _) => (0xFF << 23) | (mantissa << 13) | (1 << 22),
        _ => ((exponent + 127 - 15) << 23) | (mantissa << 13),
    };
    f32::from_bits(sign | magnitude)
}

fn sign_factor(bits: u16) -> f32 {
    if bits >> 15 == 1 { -1.0 } else { 1.0 }
}

/// The F16 nearest to `value` (ties to even), as its bit pattern: what F16C's
/// `vcvtps2ph` with round-to-nearest gives.
pub(crate) fn f32_to_f16(value: f32) -> u16 {
    let bits = value.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exponent = ((bits >> 23) & 0xFF) as i32;
    let mantissa = bits & 0x7F_FFFF;
    if exponent == 0xFF {
        // Infinity stays infinity; NaN stays a (quiet) NaN.
        return sign
            | 0x7C00
            | if mantissa != 0 {
                0x200 | (mantissa >> 13) as u16
            } else {
                0
            };
    }
    let unbiased = exponent - 127;
    if unbiased > 15 {
        return sign | 0x7C00;
    }
    if unbiased >= -14 {
        // Normal in F16: keep 10 of the 23 mantissa bits, rounding the other 13.
        let half = ((unbiased + 15) as u32) << 10 | (mantissa >> 13);
        let rest = mantissa & 0x1FFF;
        let round = rest > 0x1000 || (rest == 0x1000 && half & 1 == 1);
        // A carry out of the mantissa raises the exponent, up to infinity: still right.
        return sign | (half + u32::from(round)) as u16;
    }
    if unbiased < -25 {
        return sign;
    }
    // Subnormal in F16: value = m · 2⁻²⁴ with the implicit bit made explicit.
    let full = mantissa | 0x80_0000;
    let shift = (-14 - unbiased + 13) as u32;
    let half = full >> shift;
    let rest = full & ((1 << shift) - 1);
    let midpoint = 1 << (shift - 1);
    let round = rest > midpoint || (rest == midpoint && half & 1 == 1);
    sign | (half + u32::from(round)) as u16
}

/// F32 rounded to F16 and back.
fn through_f16(value: f32) -> f32 {
    f16_to_f32(f32_to_f16(value))
}

/// `x` (a whole number of blocks) as Q8_1 blocks: llama.cpp's `quantize_row_q8_1`
/// (`d = amax / 127`, `q = round(x · 127 / amax)` with ties to even as its AVX2 code
/// rounds, `s = d · Σq`), the F16 fields rounded as ggml stores them.
pub(crate) fn quantize_q8_1(x: &[f32], out: &mut [Q8_1]) {
    for (x, block) in x.chunks_exact(QK).zip(out.iter_mut()) {
        let amax = x.iter().fold(0f32, |max, v| max.max(v.abs()));
        let d = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let mut sum = 0i32;
        for (q, &v) in block.qs.iter_mut().zip(x) {
            *q = (v * id).round_ties_even() as i8;
            sum += i32::from(*q);
        }
        block.d = through_f16(d);
        block.s = through_f16(d * sum as f32);
    }
}

/// `x` (a whole number of blocks) as Q8_0 blocks: llama.cpp's `quantize_row_q8_0`, as
/// [`quantize_q8_1`] without the sum.
pub(crate) fn quantize_q8_0(x: &[f32], out: &mut [Q8_0]) {
    for (x, block) in x.chunks_exact(QK).zip(out.iter_mut()) {
        let amax = x.iter().fold(0f32, |max, v| max.max(v.abs()));
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        for (q, &v) in block.qs.iter_mut().zip(x) {
            *q = (v * id).round_ties_even() as i8;
        }
        block.d = through_f16(amax / 127.0);
    }
}

/// One Q8_0 weight row (raw blocks) · one Q8_0 activation row.
type Q8_0Kernel = fn(&[u8], &[Q8_0]) -> f32;

/// The fastest Q8_0 dot product this CPU runs.
fn q8_0_kernel() -> Q8_0Kernel {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        return q8_0_dot_avx2_entry;
    }
    q8_0_dot_scalar
}

/// The portable Q8_0 · Q8_0 dot product: per block, the integer sum of the 32 products
/// times both scales.
pub(crate) fn q8_0_dot_scalar(w: &[u8], y: &[Q8_0]) -> f32 {
    let mut sum = 0f32;
    for (block, y) in w.chunks_exact(Q8_0_BYTES).zip(y) {
        let d = f16_to_f32(u16::from_le_bytes([block[0], block[1]]));
        let sumi: i32 = block[2..]
            .iter()
            .zip(&y.qs)
            .map(|(&q, &p)| i32::from(q as i8) * i32::from(p))
            .sum();
        sum += sumi as f32 * (d * y.d);
    }
    sum
}

#[cfg(target_arch = "x86_64")]
fn q8_0_dot_avx2_entry(w: &[u8], y: &[Q8_0]) -> f32 {
    // SAFETY: only returned by `q8_0_kernel` after `has_avx2` found AVX2, FMA and F16C.
    unsafe { q8_0_dot_avx2(w, y) }
}

/// [`q8_0_dot_scalar`] with AVX2: signed bytes times signed bytes through `vpmaddubsw`
/// (the weights' absolute values, the activations given the weights' signs: at most
/// 2 · 128 · 127, no saturation), summed in fours and accumulated with FMA.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_0_dot_avx2(w: &[u8], y: &[Q8_0]) -> f32 {
    use std::arch::x86_64::*;
    let blocks = (w.len() / Q8_0_BYTES).min(y.len());
    let ones = _mm256_set1_epi16(1);
    let mut acc = _mm256_setzero_ps();
    for (block, y) in w.chunks_exact(Q8_0_BYTES).take(blocks).zip(y) {
        let d = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(u16::from_le_bytes([
            block[0], block[1],
        ])))));
        // SAFETY: `block` is 34 bytes, so bytes 2..34 are 32 readable bytes; `y.qs` is
        // 32 readable bytes. Both loads are unaligned loads.
        let (xs, ys) = unsafe {
            (
                _mm256_loadu_si256(block.as_ptr().add(2).cast()),
                _mm256_loadu_si256(y.qs.as_ptr().cast()),
            )
        };
        let pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(xs, xs), _mm256_sign_epi8(ys, xs));
        let quads = _mm256_madd_epi16(ones, pairs);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d * y.d), _mm256_cvtepi32_ps(quads), acc);
    }
    hsum(acc)
}

/// The sum of the eight lanes, in ggml's order.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn hsum(acc: std::arch::x86_64::__m256) -> f32 {
    use std::arch::x86_64::*;
    let sum4 = _mm_add_ps(_mm256_extractf128_ps(acc, 1), _mm256_castps256_ps128(acc));
    let sum2 = _mm_add_ps(sum4, _mm_movehl_ps(sum4, sum4));
    let sum1 = _mm_add_ss(sum2, _mm_movehdup_ps(sum2));
    _mm_cvtss_f32(sum1)
}

/// One Q4_1 weight row (raw blocks) · one Q8_1 activation row.
type Q4_1Kernel = fn(&[u8], &[Q8_1]) -> f32;

/// The fastest Q4_1 dot product this CPU runs.
fn q4_1_kernel() -> Q4_1Kernel {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        return q4_1_dot_avx2_entry;
    }
    q4_1_dot_scalar
}

#[cfg(target_arch = "x86_64")]
fn has_avx2() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| {
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")
    })
}

/// The portable Q4_1 · Q8_1 dot product: per block, the integer sum of the 32 products
/// scaled by both scales, plus the weights' minimum times the activations' sum.
pub(crate) fn q4_1_dot_scalar(w: &[u8], y: &[Q8_1]) -> f32 {
    let mut sum = 0f32;
    for (block, y) in w.chunks_exact(Q4_1_BYTES).zip(y) {
        let d = f16_to_f32(u16::from_le_bytes([block[0], block[1]]));
        let m = f16_to_f32(u16::from_le_bytes([block[2], block[3]]));
        let mut sumi = 0i32;
        for (j, &q) in block[4..].iter().enumerate() {
            sumi += i32::from(q & 0x0F) * i32::from(y.qs[j]) + i32::from(q >> 4) * i32::from(y.qs[j + QK / 2]);
        }
        sum += sumi as f32 * (d * y.d) + m * y.s;
    }
    sum
}

#[cfg(target_arch = "x86_64")]
fn q4_1_dot_avx2_entry(w: &[u8], y: &[Q8_1]) -> f32 {
    // SAFETY: only returned by `q4_1_kernel` after `has_avx2` found AVX2, FMA and F16C.
    unsafe { q4_1_dot_avx2(w, y) }
}

/// [`q4_1_dot_scalar`] with AVX2: per block, the 32 nibbles widened to bytes, multiplied
/// by the Q8_1 bytes and summed in pairs (`vpmaddubsw`: at most 2 · 15 · 127, no
/// saturation), then in fours (`vpmaddwd`), converted to F32 and accumulated with FMA.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_1_dot_avx2(w: &[u8], y: &[Q8_1]) -> f32 {
    use std::arch::x86_64::*;
    let blocks = (w.len() / Q4_1_BYTES).min(y.len());
    let low = _mm_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    let mut acc = _mm256_setzero_ps();
    let mut minimums = 0f32;
    for (block, y) in w.chunks_exact(Q4_1_BYTES).take(blocks).zip(y) {
        // The scale and the minimum, two F16 values, widened together.
        let scales = _mm_cvtph_ps(_mm_cvtsi32_si128(i32::from_le_bytes([
            block[0], block[1], block[2], block[3],
        ])));
        let d = _mm_cvtss_f32(scales);
        let m = _mm_cvtss_f32(_mm_movehdup_ps(scales));
        minimums += m * y.s;
        // SAFETY: `block` is 20 bytes, so bytes 4..20 are 16 readable bytes; `y.qs` is
        // 32 readable bytes. Both loads are unaligned loads.
        let (packed, ys) = unsafe {
            (
                _mm_loadu_si128(block.as_ptr().add(4).cast()),
                _mm256_loadu_si256(y.qs.as_ptr().cast()),
            )
        };
        let lo = _mm_and_si128(packed, low);
        let hi = _mm_and_si128(_mm_srli_epi16(packed, 4), low);
        let xs = _mm256_set_m128i(hi, lo);
        let pairs = _mm256_maddubs_epi16(xs, ys);
        let quads = _mm256_madd_epi16(pairs, ones);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(quads), _mm256_set1_ps(d * y.d), acc);
    }
    hsum(acc) + minimums
}

#[cfg(test)]
mod tests;

#[cfg(test)]
thread_local! {
    /// Tests force a thread count here, whatever the product's size (0: the rule).
    static FORCE_THREADS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}
