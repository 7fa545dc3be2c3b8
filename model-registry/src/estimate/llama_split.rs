//! Where llama.cpp puts each layer, and the `--tensor-split` and `-ngl` that make it put
//! exactly the layers a plan sized.
//!
//! llama.cpp numbers `n_layer + 1` slots: the repeating layers `0..n_layer`, then the
//! output layer as slot `n_layer` (the input embedding always stays on the CPU).
//! `llama_model::load_tensors` (src/llama-model.cpp, llama.cpp as pinned in
//! tests/engines/llama-cpp.sh) offloads the last `ngl` slots: the first GPU slot is
//! `i_gpu_start = max(n_layer + 1 − ngl, 0)` and there are
//! `act_gpu_layers = min(ngl, n_layer + 1)` of them, so `-ngl N` puts the *last* N−1
//! repeating layers and the output on the GPUs, never the first ones. It turns
//! `--tensor-split` into cumulative fractions (`splits[i] = Σ_{j≤i} t_j / Σ t`, in
//! `f32`) and gives GPU slot `il` to the first device whose cumulative fraction exceeds
//! `(il − i_gpu_start) / act_gpu_layers` (`std::upper_bound`). Devices are numbered
//! RPC servers first (in `--rpc` order), then the local GPUs.
//!
//! Passing per-device layer counts as the split is off by one at both ends: the output
//! slot makes `n_layer + 1` slots, so `[8, 8, 8, 8]` on 32 layers gives 9/8/8/7 and the
//! output on the last. [`tensor_split`] instead puts every boundary half a slot inside
//! the interval llama.cpp's comparison needs, so that `f32` rounding cannot move it.

use crate::Error;

/// The device (index into the split) of every slot llama.cpp places, as
/// `load_tensors` computes it: `None` for a slot on the CPU; slot `n_layer` is the
/// output layer. `split` is the `--tensor-split` as given (all zero or empty: one
/// device, or llama.cpp's own split by free memory, which this does not model).
pub fn llama_cpp_devices(n_layer: u64, n_gpu_layers: u64, split: &[f32]) -> Vec<Option<usize>> {
    let slots = n_layer + 1;
    let i_gpu_start = slots.saturating_sub(n_gpu_layers);
    let act_gpu_layers = n_gpu_layers.min(slots);
    let mut cumulative: Vec<f32> = Vec::with_capacity(split.len().max(1));
    let mut sum = 0.0f32;
    for &s in split {
        sum += s;
        cumulative.push(sum);
    }
    if split.is_empty() || sum == 0.0 {
        cumulative = vec![1.0];
    } else {
        for c in &mut cumulative {
            *c /= sum;
        }
    }
    (0..slots)
        .map(|il| {
            if il < i_gpu_start || il - i_gpu_start >= act_gpu_layers {
                return None;
            }
            // `float(il - i_gpu_start)/act_gpu_layers` in llama.cpp: an f32 divided by an
            // int converted to f32.
            let x = (il - i_gpu_start) as f32 / act_gpu_layers as f32;
            let device = cumulative.partition_point(|&c| c <= x);
            Some(device.min(cumulative.len() - 1))
        })
        .collect()
}

/// The `--tensor-split` that makes llama.cpp give device `d` exactly `layers[d]` of the
/// offloaded repeating layers, in order, and the output layer to the last device.
/// `layers` lists the devices in llama.cpp's order (RPC servers first); the offloaded
/// layers are the last `Σ layers` of the model, with `-ngl Σ layers + 1`.
///
/// Device `d` must get the slots `[S_d, S_{d+1})` of the `A = Σ layers + 1` offloaded
/// slots (`S` the running sum, the last device's count one more for the output), which
/// llama.cpp does when each cumulative fraction `c_d` satisfies
/// `(S_{d+1} − 1) / A < c_d ≤ S_{d+1} / A`. Taking `c_d = (S_{d+1} − ½) / A` keeps half
/// a slot from either bound; doubled to integers, the split is `2·S_1 − 1`, then
/// `2·layers[d]` for the middle devices, and `2·(layers[last] + 1) + 1` for the last
/// (its slots with the output's, and the half slot the boundary before it gave away).
///
/// Errors: [`Error::InvalidEstimateRequest`] for fewer than two devices or a device but
/// the last with no layer (llama.cpp cannot be told to skip a device in the middle).
pub fn tensor_split(layers: &[u64]) -> Result<Vec<u64>, Error> {
    let invalid = |expected| Error::InvalidEstimateRequest {
        field: "tensor split",
        found: format!("{layers:?}"),
        expected,
    };
    let Some((&last, rest)) = layers.split_last() else {
        return Err(invalid("at least two devices"));
    };
    if rest.is_empty() {
        return Err(invalid("at least two devices"));
    }
    if rest.contains(&0) {
        return Err(invalid("at least one layer on every device but the last"));
    }
    let mut split = Vec::with_capacity(layers.len());
    for (d, &n) in rest.iter().enumerate() {
        split.push(if d == 0 { 2 * n - 1 } else { 2 * n });
    }
    split.push(2 * last + 3);
    Ok(split)
}

/// Layers and output per device as llama.cpp places them: for each device, the count
/// of repeating layers, and whether it holds the output layer. For checks and
/// explanations.
pub fn llama_cpp_counts(n_layer: u64, n_gpu_layers: u64, split: &[f32]) -> Vec<(u64, bool)> {
    let mut counts = vec![(0u64, false); split.len().max(1)];
    for (slot, device) in llama_cpp_devices(n_layer, n_gpu_layers, split).into_iter().enumerate() {
        if let Some(d) = device {
            if slot as u64 == n_layer {
                counts[d].1 = true;
            } else {
                counts[d].0 += 1;
            }
        }
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn floats(split: &[u64]) -> Vec<f32> {
        split.iter().map(|&s| s as f32).collect()
    }

    #[test]
    fn layer_counts_as_the_split_are_off_by_one_at_both_ends() {
        // What Skein passed before: the plan's counts. llama.cpp gives the first GPU one
        // more and the last one fewer (plus the output).
        let placed = llama_cpp_counts(32, 999, &[8.0, 8.0, 8.0, 8.0]);
        assert_eq!(placed, vec![(9, false), (8, false), (8, false), (7, true)]);
        // The computed split places exactly the plan's layers.
        let split = tensor_split(&[8, 8, 8, 8]).unwrap();
        assert_eq!(split, vec![15, 16, 16, 19]);
        let placed = llama_cpp_counts(32, 999, &floats(&split));
        assert_eq!(placed, vec![(8, false), (8, false), (8, false), (8, true)]);
    }

    #[test]
    fn ngl_offloads_the_last_layers_and_the_output() {
        let devices = llama_cpp_devices(10, 4, &[]);
        let on_gpu: Vec<usize> = (0..devices.len()).filter(|&i| devices[i].is_some()).collect();
        // Slots 7, 8, 9 (the last three repeating layers) and 10 (the output).
        assert_eq!(on_gpu, vec![7, 8, 9, 10]);
        assert_eq!(llama_cpp_devices(10, 0, &[]), vec![None; 11]);
        // -ngl beyond the model's depth offloads every slot.
        assert!(llama_cpp_devices(10, 999, &[]).iter().all(Option::is_some));
    }

    #[test]
    fn every_split_is_placed_exactly_whatever_the_depth_and_offload() {
        // Exhaustive over small shapes, and over deep models with uneven counts: the
        // f32 arithmetic of llama.cpp must give each device its count, in order.
        let mut cases: Vec<(u64, Vec<u64>)> = Vec::new();
        for a in 1..=12u64 {
            for b in 0..=12u64 {
                for c in 0..=6u64 {
                    cases.push((a + b + c + 3, vec![a, b.max(1), c]));
                    cases.push((a + b, vec![a, b]));
                }
            }
        }
        for n_layer in [80u64, 126, 500, 4000] {
            for parts in [2usize, 3, 5, 8] {
                let base = n_layer / parts as u64;
                let mut counts: Vec<u64> = (0..parts as u64).map(|i| base - (i % 3)).collect();
                counts[0] += 1;
                cases.push((n_layer, counts));
            }
        }
        for (n_layer, counts) in cases {
            let offloaded: u64 = counts.iter().sum();
            if offloaded > n_layer {
                continue;
            }
            let split = tensor_split(&counts).unwrap();
            let placed = llama_cpp_counts(n_layer, offloaded + 1, &floats(&split));
            let want: Vec<(u64, bool)> = counts
                .iter()
                .enumerate()
                .map(|(d, &n)| (n, d + 1 == counts.len()))
                .collect();
            assert_eq!(placed, want, "{n_layer} layers, counts {counts:?}, split {split:?}");
            // The CPU keeps the first layers.
            let devices = llama_cpp_devices(n_layer, offloaded + 1, &floats(&split));
            let first_gpu = devices.iter().position(Option::is_some).unwrap() as u64;
            assert_eq!(first_gpu, n_layer - offloaded);
        }
    }

    #[test]
    fn splits_llama_cpp_cannot_take_are_refused() {
        assert!(tensor_split(&[]).is_err());
        assert!(tensor_split(&[32]).is_err());
        assert!(tensor_split(&[0, 32]).is_err());
        assert!(tensor_split(&[16, 0, 16]).is_err());
        assert_eq!(tensor_split(&[31, 0]).unwrap(), vec![61, 3]);
    }
}
