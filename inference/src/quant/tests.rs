use super::*;
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};

/// Reproducible values in about [-scale, scale].
fn values(count: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..count)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

/// `rows` × `cols` random weights quantized by candle to `dtype`, as a `QMatrix` and
/// as candle's dequantized F32 values.
fn matrix(dtype: GgmlDType, rows: usize, cols: usize, seed: u64) -> (QMatrix, Vec<f32>) {
    let data = values(rows * cols, seed, 0.5);
    let tensor = Tensor::from_vec(data, (rows, cols), &Device::Cpu).unwrap();
    let q = QTensor::quantize(&tensor, dtype).unwrap();
    let dequantized: Vec<f32> = q
        .dequantize(&Device::Cpu)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    let floats = dequantized.clone();
    let matrix = QMatrix::new(dtype, rows, cols, q.data().unwrap(), || Ok(floats)).unwrap();
    (matrix, dequantized)
}

#[test]
fn f16_conversions_round_to_nearest_even_like_f16c() {
    let mut specials = vec![
        0.0f32,
        -0.0,
        1.0,
        -1.0,
        65504.0,
        65520.0,
        1e6,
        -1e6,
        6.1e-5,
        5.96e-8,
        2.98e-8,
        1e-9,
        0.1,
        2.71,
        f32::INFINITY,
        f32::NEG_INFINITY,
    ];
    specials.extend(values(20_000, 7, 70_000.0));
    specials.extend(values(20_000, 8, 1e-4));
    for value in specials {
        let bits = f32_to_f16(value);
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("f16c") {
            // SAFETY: F16C was just detected.
            let hardware = unsafe { f16c_round(value) };
            assert_eq!(bits, hardware, "{value}");
            // SAFETY: as above.
            assert_eq!(
                f16_to_f32(bits).to_bits(),
                unsafe { f16c_widen(bits) }.to_bits(),
                "{value}"
            );
        }
        let back = f16_to_f32(bits);
        if value.is_finite() && value.abs() < 65504.0 {
            assert!((back - value).abs() <= value.abs() / 1024.0 + 6e-8, "{value} -> {back}");
        }
    }
    assert!(f16_to_f32(f32_to_f16(f32::NAN)).is_nan());
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "f16c")]
unsafe fn f16c_round(value: f32) -> u16 {
    use std::arch::x86_64::*;
    (_mm_cvtsi128_si32(_mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm_set_ss(value))) & 0xFFFF) as u16
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "f16c")]
unsafe fn f16c_widen(bits: u16) -> f32 {
    use std::arch::x86_64::*;
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
}

#[test]
fn q8_1_quantization_follows_llama_cpp() {
    let x = values(64, 3, 2.0);
    let mut blocks = vec![Q8_1::default(); 2];
    quantize_q8_1(&x, &mut blocks);
    for (x, block) in x.chunks(QK).zip(&blocks) {
        let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
        assert_eq!(block.d, through_f16(amax / 127.0));
        assert_eq!(block.qs.iter().map(|q| q.unsigned_abs()).max(), Some(127));
        let sum: i32 = block.qs.iter().map(|&q| i32::from(q)).sum();
        assert_eq!(block.s, through_f16(amax / 127.0 * sum as f32));
        for (&v, &q) in x.iter().zip(&block.qs) {
            assert!((f32::from(q) * amax / 127.0 - v).abs() <= amax / 254.0 * 1.0001);
        }
    }
    // Ties go to even, as `_mm256_round_ps` rounds: 0.5 · 127 / 127 → 0, 1.5 → 2.
    let mut x = vec![0f32; QK];
    x[0] = 127.0;
    x[1] = 0.5;
    x[2] = 1.5;
    x[3] = -2.5;
    quantize_q8_1(&x, &mut blocks[..1]);
    assert_eq!(&blocks[0].qs[..4], &[127, 0, 2, -2]);
    quantize_q8_1(&[0.0; QK], &mut blocks[..1]);
    assert_eq!((blocks[0].d, blocks[0].s), (0.0, 0.0));
}

#[cfg(target_arch = "x86_64")]
#[test]
fn q4_1_avx2_equals_the_scalar_kernel() {
    assert!(has_avx2(), "this test needs a CPU with AVX2, FMA and F16C");
    for (cols, seed) in [(32, 1), (576, 2), (1536, 3), (4096, 4)] {
        let (matrix, _) = matrix(GgmlDType::Q4_1, 3, cols, seed);
        let Kind::Q4_1(raw) = &matrix.kind else {
            panic!("not Q4_1")
        };
        let x = values(cols, seed + 100, 3.0);
        let mut y = vec![Q8_1::default(); cols / QK];
        quantize_q8_1(&x, &mut y);
        let row = cols / QK * Q4_1_BYTES;
        for w in raw.chunks_exact(row) {
            let scalar = q4_1_dot_scalar(w, &y);
            // SAFETY: AVX2, FMA and F16C were detected above.
            let avx2 = unsafe { q4_1_dot_avx2(w, &y) };
            // The same integer sums; only the order of the F32 additions differs, so
            // they agree to a few ulps of the sum of the terms' magnitudes.
            let magnitude: f32 = w
                .chunks_exact(Q4_1_BYTES)
                .zip(&y)
                .map(|(block, y)| q4_1_dot_scalar(block, std::slice::from_ref(y)).abs() + 1e-30)
                .sum();
            assert!(
                (scalar - avx2).abs() <= magnitude * 1e-5,
                "{cols} columns: scalar {scalar}, AVX2 {avx2}"
            );
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn q8_0_avx2_equals_the_scalar_kernel_and_the_exact_product() {
    assert!(has_avx2(), "this test needs a CPU with AVX2, FMA and F16C");
    for (cols, seed) in [(32, 1), (576, 2), (1536, 3)] {
        let (matrix, reference) = matrix(GgmlDType::Q8_0, 3, cols, seed);
        let Kind::Q8_0(raw) = &matrix.kind else {
            panic!("not Q8_0")
        };
        let x = values(cols, seed + 100, 3.0);
        let mut y = vec![Q8_0::default(); cols / QK];
        quantize_q8_0(&x, &mut y);
        // Extreme weights (-128 · 127 products) must not saturate.
        let mut w_extreme = raw[..cols / QK * Q8_0_BYTES].to_vec();
        for block in w_extreme.chunks_exact_mut(Q8_0_BYTES) {
            block[2..].fill(0x80);
        }
        let row = cols / QK * Q8_0_BYTES;
        for (r, w) in raw.chunks_exact(row).chain([&w_extreme[..]]).enumerate() {
            let scalar = q8_0_dot_scalar(w, &y);
            // SAFETY: AVX2, FMA and F16C were detected above.
            let avx2 = unsafe { q8_0_dot_avx2(w, &y) };
            let mut exact = 0f64;
            let mut scale = 0f64;
            for (b, y) in y.iter().enumerate() {
                let block = &w[b * Q8_0_BYTES..(b + 1) * Q8_0_BYTES];
                let d = f64::from(f16_to_f32(u16::from_le_bytes([block[0], block[1]])));
                for j in 0..QK {
                    let product = d * f64::from(block[2 + j] as i8) * f64::from(y.d) * f64::from(y.qs[j]);
                    exact += product;
                    scale += product.abs();
                }
            }
            assert!(
                (f64::from(scalar) - exact).abs() <= scale * 1e-6,
                "{cols}: scalar {scalar} vs {exact}"
            );
            assert!(
                (f64::from(avx2) - exact).abs() <= scale * 1e-6,
                "{cols}: AVX2 {avx2} vs {exact}"
            );
            if r < 3 {
                let mut row = vec![0f32; cols];
                matrix.dequantize_row(r, &mut row);
                assert_eq!(row, reference[r * cols..(r + 1) * cols]);
            }
        }
    }
}

/// Every block type's product against candle's reference: its dequantized F32
/// weights times the F32 activations. The activations' quantization (to 8 bits per
/// block) bounds the difference.
#[test]
fn products_match_candles_dequantized_reference_for_every_type() {
    let (rows, cols, m) = (37, 512, 3);
    let x = values(m * cols, 11, 1.0);
    for dtype in [
        GgmlDType::F32,
        GgmlDType::F16,
        GgmlDType::BF16,
        GgmlDType::Q4_0,
        GgmlDType::Q4_1,
        GgmlDType::Q5_0,
        GgmlDType::Q5_1,
        GgmlDType::Q8_0,
        GgmlDType::Q2K,
        GgmlDType::Q3K,
        GgmlDType::Q4K,
        GgmlDType::Q5K,
        GgmlDType::Q6K,
    ] {
        let (matrix, reference) = matrix(dtype, rows, cols, 5);
        for threads in [1, 3] {
            let mut out = vec![0f32; m * rows];
            // Forced onto `threads` threads whatever the size, to test the split.
            matrix.matmul_on(&x, m, &mut out, threads, &mut Scratch::default());
            let mut row = vec![0f32; cols];
            for r in 0..rows {
                matrix.dequantize_row(r, &mut row);
                assert_eq!(row, reference[r * cols..(r + 1) * cols], "{dtype:?} row {r}");
                for t in 0..m {
                    let xs = &x[t * cols..(t + 1) * cols];
                    let expected: f32 = row.iter().zip(xs).map(|(a, b)| a * b).sum();
                    let scale: f32 = row.iter().zip(xs).map(|(a, b)| (a * b).abs()).sum();
                    let got = out[t * rows + r];
                    assert!(
                        (got - expected).abs() <= scale * 0.02 + 1e-4,
                        "{dtype:?}, {threads} threads, row {r}, input {t}: {got} vs {expected}"
                    );
                }
            }
        }
    }
}

/// Our Q4_1 products against (1) the exact dot product of the quantized operands
/// (candle's dequantized weights times the Q8_1 activations, in F64): equal up to
/// F32 rounding; and (2) candle's own scalar Q4_1 · Q8_1 kernel on its own Q8_1
/// blocks: the same blocks (asserted), the results apart by at most the F16 rounding
/// of each block's `s`, which candle rounds differently (`f16(Σq) · d`, where
/// llama.cpp and we round `d · Σq` once).
#[test]
fn q4_1_products_equal_the_exact_product_and_candles_kernel() {
    use candle_core::quantized::k_quants::BlockQ4_1;
    let (rows, cols) = (16, 576);
    let per_row = cols / QK;
    let data = values(rows * cols, 21, 0.5);
    let q = QTensor::quantize(
        &Tensor::from_vec(data, (rows, cols), &Device::Cpu).unwrap(),
        GgmlDType::Q4_1,
    )
    .unwrap();
    let raw = q.data().unwrap();
    let words: Vec<u64> = raw
        .chunks(8)
        .map(|c| {
            let mut le = [0u8; 8];
            le[..c.len()].copy_from_slice(c);
            u64::from_le_bytes(le)
        })
        .collect();
    let candle_blocks = blocks_of::<BlockQ4_1>(&words, raw.len());
    let matrix = QMatrix::new(GgmlDType::Q4_1, rows, cols, raw.clone(), || Err(String::new())).unwrap();
    let x = values(cols, 22, 1.0);
    let mut out = vec![0f32; rows];
    matrix.matmul(&x, 1, &mut out, 1, &mut Scratch::default());

    let mut ours_y = vec![Q8_1::default(); per_row];
    quantize_q8_1(&x, &mut ours_y);
    let mut candle_y = vec![BlockQ8_1::zeros(); per_row];
    BlockQ8_1::from_float(&x, &mut candle_y);
    for (ours, theirs) in ours_y.iter().zip(&candle_y) {
        let mut back = [0f32; QK];
        BlockQ8_1::to_float(std::slice::from_ref(theirs), &mut back);
        let expected: Vec<f32> = ours.qs.iter().map(|&q| f32::from(q) * ours.d).collect();
        assert_eq!(back.to_vec(), expected, "the same Q8_1 values");
    }
    let mut w = vec![0f32; cols];
    for r in 0..rows {
        matrix.dequantize_row(r, &mut w);
        let row = &raw[r * per_row * Q4_1_BYTES..(r + 1) * per_row * Q4_1_BYTES];
        let (mut exact, mut s_rounding, mut scale) = (0f64, 0f64, 0f64);
        for (b, y) in ours_y.iter().enumerate() {
            let m = f64::from(f16_to_f32(u16::from_le_bytes([row[b * 20 + 2], row[b * 20 + 3]])));
            let sum: f64 = y.qs.iter().map(|&q| f64::from(q)).sum();
            for j in 0..QK {
                let product = f64::from(w[b * QK + j]) * f64::from(y.d) * f64::from(y.qs[j]);
                exact += product;
                scale += product.abs();
            }
            // The exact product uses Σq · d; the kernel the stored F16 `s`.
            exact += m * (f64::from(y.s) - f64::from(y.d) * sum);
            s_rounding += m.abs() * f64::from(y.s).abs() / 1024.0;
        }
        let got = f64::from(out[r]);
        assert!(
            (got - exact).abs() <= scale * 1e-6,
            "row {r}: ours {got}, exact {exact}"
        );
        let candle = f64::from(BlockQ4_1::vec_dot_unopt(
            cols,
            &candle_blocks[r * per_row..(r + 1) * per_row],
            &candle_y,
        ));
        assert!(
            (got - candle).abs() <= s_rounding + scale * 1e-6,
            "row {r}: ours {got}, candle {candle}, apart by more than the rounding of s ({s_rounding})"
        );
    }
}

#[test]
fn small_products_stay_on_one_thread() {
    // A 576 × 576 decode product is far under a thread's worth; the 49152 × 576
    // output layer is worth two threads; a prompt of 39 tokens splits more.
    assert_eq!(threads_for(576 * 576, 2), 1);
    assert_eq!(threads_for(49152 * 576, 2), 2);
    assert_eq!(threads_for(39 * 1536 * 576, 16), 4);
    assert_eq!(threads_for(0, 0), 1);
}

impl QMatrix {
    /// `matmul` split on exactly `threads` threads.
    fn matmul_on(&self, x: &[f32], m: usize, out: &mut [f32], threads: usize, scratch: &mut Scratch) {
        FORCE_THREADS.with(|force| force.set(threads));
        self.matmul(x, m, out, threads, scratch);
        FORCE_THREADS.with(|force| force.set(0));
    }
}
