//! Health rules: when a GPU is degraded. Pure functions of its facts and recent
//! samples. (A node is down when it stops reporting; see
//! [`HardwareGraph::sweep`](super::HardwareGraph::sweep).)

use std::collections::VecDeque;

use skein_proto::throttle;

use super::model::{GpuFacts, GpuSample, Health, HealthState};

/// The health of a GPU from its window of samples, oldest first:
///
/// - **degraded** while the latest sample shows thermal throttling (hardware or
///   software thermal slowdown) or power throttling (the power cap or the hardware
///   power brake): the GPU is slower than its peers, and hotter or at its limit;
/// - **degraded** when corrected ECC errors rose within the window (memory cells going
///   bad announce themselves this way), or any uncorrected error was counted in it;
/// - **ok** otherwise, and before the first sample.
pub fn gpu_health(_facts: &GpuFacts, window: &VecDeque<GpuSample>) -> Health {
    let Some(latest) = window.back() else {
        return Health::OK;
    };
    let mut reasons = Vec::new();
    if latest.throttle_reasons & throttle::THERMAL != 0 {
        let temperature = latest.temperature_c.map(|t| format!(" at {t} °C")).unwrap_or_default();
        reasons.push(format!("thermal throttling{temperature}"));
    }
    if latest.throttle_reasons & throttle::POWER != 0 {
        let power = latest
            .power_mw
            .map(|p| format!(" at {} W", p / 1000))
            .unwrap_or_default();
        reasons.push(format!("power throttling{power}"));
    }
    let first = window.front().unwrap_or(latest);
    if let (Some(old), Some(new)) = (first.ecc_corrected, latest.ecc_corrected)
        && new > old
    {
        reasons.push(format!(
            "{} corrected ECC errors in the last {} samples",
            new - old,
            window.len()
        ));
    }
    if let (Some(old), Some(new)) = (first.ecc_uncorrected, latest.ecc_uncorrected)
        && new > old
    {
        reasons.push(format!(
            "{} uncorrected ECC errors in the last {} samples",
            new - old,
            window.len()
        ));
    }
    if reasons.is_empty() {
        Health::OK
    } else {
        Health {
            state: HealthState::Degraded,
            reasons,
        }
    }
}
