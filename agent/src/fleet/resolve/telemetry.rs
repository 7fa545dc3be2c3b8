//! The `telemetry` of a fleet file: each metric's model checked and converted to base
//! units.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_saphyr::Spanned;

use super::values::{celsius, parse_size, percent, watts, whole_in};
use super::{MIB, Resolver, at};
use crate::fleet::diag::Diagnostic;
use crate::fleet::schema::{RawModel, RawScalar, RawTelemetry};
use crate::gpu::ThrottleReasons;
use crate::sim::GpuTelemetry;
use crate::telemetry::{AfterEnd, Interpolation, Model, Series, Signal};

/// A metric of [`GpuTelemetry`], with its unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Metric {
    Utilization,
    MemoryUtilization,
    MemoryUsed,
    ForeignMemory,
    Temperature,
    Power,
    SmClock,
    EccCorrected,
    EccUncorrected,
    Throttle,
}

const METRICS: [Metric; 10] = [
    Metric::Utilization,
    Metric::MemoryUtilization,
    Metric::MemoryUsed,
    Metric::ForeignMemory,
    Metric::Temperature,
    Metric::Power,
    Metric::SmClock,
    Metric::EccCorrected,
    Metric::EccUncorrected,
    Metric::Throttle,
];

impl Metric {
    fn name(self) -> &'static str {
        match self {
            Metric::Utilization => "utilization",
            Metric::MemoryUtilization => "memory_utilization",
            Metric::MemoryUsed => "memory_used",
            Metric::ForeignMemory => "foreign_memory",
            Metric::Temperature => "temperature",
            Metric::Power => "power",
            Metric::SmClock => "sm_clock",
            Metric::EccCorrected => "ecc_corrected",
            Metric::EccUncorrected => "ecc_uncorrected",
            Metric::Throttle => "throttle",
        }
    }

    fn raw(self, telemetry: &RawTelemetry) -> Option<&Spanned<RawModel>> {
        match self {
            Metric::Utilization => telemetry.utilization.as_ref(),
            Metric::MemoryUtilization => telemetry.memory_utilization.as_ref(),
            Metric::MemoryUsed => telemetry.memory_used.as_ref(),
            Metric::ForeignMemory => telemetry.foreign_memory.as_ref(),
            Metric::Temperature => telemetry.temperature.as_ref(),
            Metric::Power => telemetry.power.as_ref(),
            Metric::SmClock => telemetry.sm_clock.as_ref(),
            Metric::EccCorrected => telemetry.ecc_corrected.as_ref(),
            Metric::EccUncorrected => telemetry.ecc_uncorrected.as_ref(),
            Metric::Throttle => telemetry.throttle.as_ref(),
        }
    }

    fn slot(self, telemetry: &mut GpuTelemetry) -> &mut Option<Model> {
        match self {
            Metric::Utilization => &mut telemetry.utilization,
            Metric::MemoryUtilization => &mut telemetry.memory_utilization,
            Metric::MemoryUsed => &mut telemetry.memory_used,
            Metric::ForeignMemory => &mut telemetry.foreign_memory,
            Metric::Temperature => &mut telemetry.temperature,
            Metric::Power => &mut telemetry.power,
            Metric::SmClock => &mut telemetry.sm_clock,
            Metric::EccCorrected => &mut telemetry.ecc_corrected,
            Metric::EccUncorrected => &mut telemetry.ecc_uncorrected,
            Metric::Throttle => &mut telemetry.throttle,
        }
    }

    /// How values of this metric may be written, for help texts.
    fn unit_help(self) -> &'static str {
        match self {
            Metric::Utilization | Metric::MemoryUtilization => {
                "a fraction between 0 and 1 (`0.9`) or a percentage (`\"90%\"`)"
            }
            Metric::MemoryUsed | Metric::ForeignMemory => {
                "a size (`20GiB`, `512MiB`), a share of the GPU's memory (`\"50%\"`) or a number of MiB"
            }
            Metric::Temperature => "degrees Celsius between -40 and 150 (`85`)",
            Metric::Power => "watts (`300` or `300W`)",
            Metric::SmClock => "MHz (`1410`)",
            Metric::EccCorrected | Metric::EccUncorrected => "an error count (`0`, `12`)",
            Metric::Throttle => {
                "a throttle reason (`hw_thermal_slowdown`), a list of them, `none`, or NVML's bit set as a number"
            }
        }
    }

    /// A plain number of this metric in base units (what CSV columns hold).
    fn number_in_base_units(self, n: f64) -> f64 {
        match self {
            Metric::MemoryUsed | Metric::ForeignMemory => n * MIB,
            _ => n,
        }
    }
}

impl Resolver<'_, '_> {
    /// The `per_gpu` overrides by GPU index, checked against the node's GPU count.
    pub(super) fn per_gpu<'t>(&mut self, telemetry: &'t RawTelemetry, count: u32) -> BTreeMap<u32, &'t RawTelemetry> {
        let mut out = BTreeMap::new();
        let Some(per_gpu) = &telemetry.per_gpu else {
            return out;
        };
        for (key, value) in &per_gpu.value.0 {
            let index = whole_in(&key.value, 0, u64::from(u32::MAX)).map(|i| i as u32);
            match index {
                Some(i) if i < count => {
                    if let Some(nested) = &value.value.per_gpu {
                        self.error(at(nested), "`per_gpu` cannot be nested inside `per_gpu`", None);
                    }
                    out.insert(i, &value.value);
                }
                Some(i) => {
                    let help = match count {
                        0 => "the node has no GPUs".to_owned(),
                        n => format!("the node's GPUs are numbered 0 to {}", n - 1),
                    };
                    self.error(
                        at(key),
                        format!("`per_gpu` names GPU {i}, which does not exist"),
                        Some(help),
                    );
                }
                None => {
                    self.error(
                        at(key),
                        format!("`per_gpu` keys are GPU indices, found {}", key.value.shown()),
                        Some("write `per_gpu: { 2: { temperature: 90 } }`".to_owned()),
                    );
                }
            }
        }
        out
    }

    pub(super) fn gpu_telemetry(
        &mut self,
        node: Option<&RawTelemetry>,
        own: Option<&RawTelemetry>,
        total: f64,
    ) -> GpuTelemetry {
        let mut out = GpuTelemetry::default();
        for metric in METRICS {
            let raw = own
                .and_then(|t| metric.raw(t))
                .or_else(|| node.and_then(|t| metric.raw(t)));
            if let Some(raw) = raw {
                *metric.slot(&mut out) = self.model(metric, raw, total);
            }
        }
        out
    }

    /// A key a model needs: reported at the model, with an example, when missing.
    fn required<'v, T>(&mut self, value: Option<&'v T>, key: &str, model: &str, model_at: (u64, u64)) -> Option<&'v T> {
        if value.is_none() {
            let example = match model {
                "ramp" => "`ramp: { from: 0.1, to: 0.9, over: 60s }` (`start` is optional)",
                "square" => "`square: { low: 0.05, high: 0.9, period: 30s }` (`duty` is optional)",
                "spike" => "`spike: { base: 45, peak: 92, at: 60s, duration: 10s }`",
                _ => {
                    "`replay: { csv: traces/util.csv, column: util }` (`time_column`, `scale` and `loop` are optional)"
                }
            };
            self.error(
                model_at,
                format!("`{model}` needs `{key}`"),
                Some(format!("write {example}")),
            );
        }
        value
    }

    fn model(&mut self, metric: Metric, raw: &Spanned<RawModel>, total: f64) -> Option<Model> {
        let model_at = at(raw);
        let signal = match &raw.value {
            RawModel::Idle => return Some(Model::Idle),
            RawModel::Value(value) => Signal::Constant(self.level(metric, value, model_at, total)?),
            RawModel::Constant(value) => Signal::Constant(self.level(metric, &value.value, at(value), total)?),
            RawModel::Ramp(ramp) => {
                if metric == Metric::Throttle {
                    self.error(
                        model_at,
                        "`throttle` is a set of reasons and cannot ramp",
                        Some("use `square`, `spike` or `replay` to switch reasons on and off".to_owned()),
                    );
                    return None;
                }
                let from = self.required(ramp.from.as_ref(), "from", "ramp", model_at);
                let to = self.required(ramp.to.as_ref(), "to", "ramp", model_at);
                let over = self.required(ramp.over.as_ref(), "over", "ramp", model_at);
                let from = from.and_then(|v| self.level(metric, &v.value, at(v), total));
                let to = to.and_then(|v| self.level(metric, &v.value, at(v), total));
                let over = over.and_then(|v| self.duration(v, "`over`", true));
                let start = ramp
                    .start
                    .as_ref()
                    .map_or(Some(0.0), |s| self.duration(s, "`start`", false));
                Signal::Ramp {
                    from: from?,
                    to: to?,
                    start_s: start?,
                    over_s: over?,
                }
            }
            RawModel::Square(square) => {
                let low = self.required(square.low.as_ref(), "low", "square", model_at);
                let high = self.required(square.high.as_ref(), "high", "square", model_at);
                let period = self.required(square.period.as_ref(), "period", "square", model_at);
                let low = low.and_then(|v| self.level(metric, &v.value, at(v), total));
                let high = high.and_then(|v| self.level(metric, &v.value, at(v), total));
                let period = period.and_then(|v| self.duration(v, "`period`", true));
                let duty = match &square.duty {
                    None => Some(0.5),
                    Some(duty) => match duty.value {
                        RawScalar::Number(d) if d > 0.0 && d < 1.0 => Some(d),
                        ref other => {
                            self.error(
                                at(duty),
                                format!(
                                    "`duty` must be a fraction between 0 and 1 (exclusive), found {}",
                                    other.shown()
                                ),
                                Some("`duty: 0.25` spends the first quarter of each period at `high`".to_owned()),
                            );
                            None
                        }
                    },
                };
                Signal::Square {
                    low: low?,
                    high: high?,
                    period_s: period?,
                    duty: duty?,
                }
            }
            RawModel::Spike(spike) => {
                let base = self.required(spike.base.as_ref(), "base", "spike", model_at);
                let peak = self.required(spike.peak.as_ref(), "peak", "spike", model_at);
                let at_s = self.required(spike.at.as_ref(), "at", "spike", model_at);
                let duration = self.required(spike.duration.as_ref(), "duration", "spike", model_at);
                let base = base.and_then(|v| self.level(metric, &v.value, at(v), total));
                let peak = peak.and_then(|v| self.level(metric, &v.value, at(v), total));
                let at_s = at_s.and_then(|v| self.duration(v, "`at`", false));
                let duration = duration.and_then(|v| self.duration(v, "`duration`", true));
                Signal::Spike {
                    base: base?,
                    peak: peak?,
                    at_s: at_s?,
                    duration_s: duration?,
                }
            }
            RawModel::Replay(replay) => {
                let csv = self.required(replay.csv.as_ref(), "csv", "replay", model_at);
                let column = self.required(replay.column.as_ref(), "column", "replay", model_at);
                let scale = match &replay.scale {
                    None => Some(1.0),
                    Some(scale) => match scale.value {
                        RawScalar::Number(s) if s.is_finite() => Some(s),
                        ref other => {
                            self.error(
                                at(scale),
                                format!("`scale` must be a number, found {}", other.shown()),
                                None,
                            );
                            None
                        }
                    },
                };
                let interpolation = if metric == Metric::Throttle {
                    Interpolation::Step
                } else {
                    Interpolation::Linear
                };
                let after_end = match &replay.repeat {
                    Some(repeat) if repeat.value => AfterEnd::Loop,
                    _ => AfterEnd::Hold,
                };
                let time_column = replay.time_column.as_ref().map_or("time", |c| c.value.as_str());
                let series = self.replay(csv?, column?, time_column, interpolation, after_end)?;
                let scale = scale?;
                Signal::Replay(Arc::new(series)).map_levels(|v| metric.number_in_base_units(v * scale))
            }
        };
        Some(Model::Signal(signal))
    }

    fn replay(
        &mut self,
        csv: &Spanned<String>,
        column: &Spanned<String>,
        time_column: &str,
        interpolation: Interpolation,
        after_end: AfterEnd,
    ) -> Option<Series> {
        let path = self.dir.join(&csv.value);
        let text = match self.csv_texts.get(&path) {
            Some(text) => text.clone()?,
            None => {
                let text = match (self.read)(&path) {
                    Ok(text) => Some(Arc::<str>::from(text)),
                    Err(error) => {
                        self.error(
                            at(csv),
                            format!("cannot read `{}`: {error}", csv.value),
                            Some("the path is relative to the fleet file's directory".to_owned()),
                        );
                        None
                    }
                };
                self.csv_texts.insert(path.clone(), text.clone());
                text?
            }
        };
        match Series::parse_csv(&text, time_column, &column.value, interpolation, after_end) {
            Ok(series) => Some(series),
            Err(problem) => {
                // A missing column is the fleet file's mistake; the rest are the CSV's.
                let mut diagnostic = if problem.message.contains("value column") {
                    Diagnostic::at(self.file, self.text, at(column), problem.message)
                } else {
                    let file = path.display().to_string();
                    Diagnostic::at(&file, &text, (problem.line as u64, 1), problem.message)
                };
                diagnostic.help = problem.help;
                self.diagnostics.push(diagnostic);
                None
            }
        }
    }

    fn duration(&mut self, raw: &Spanned<RawScalar>, what: &str, positive: bool) -> Option<f64> {
        let help = "write a number with a unit: `500ms`, `30s`, `5m`, `1h`";
        let seconds = match &raw.value {
            RawScalar::Text(text) => match humantime::parse_duration(text.trim()) {
                Ok(duration) => duration.as_secs_f64(),
                Err(error) => {
                    self.error(
                        at(raw),
                        format!("{what}: `{text}` is not a duration ({error})"),
                        Some(help.to_owned()),
                    );
                    return None;
                }
            },
            RawScalar::Number(n) => {
                self.error(
                    at(raw),
                    format!("{what}: a duration needs a unit"),
                    Some(format!("write `{n}s` for {n} seconds")),
                );
                return None;
            }
            other => {
                self.error(
                    at(raw),
                    format!("{what} must be a duration, found {}", other.shown()),
                    Some(help.to_owned()),
                );
                return None;
            }
        };
        if positive && seconds <= 0.0 {
            self.error(
                at(raw),
                format!("{what} must be longer than zero"),
                Some(help.to_owned()),
            );
            return None;
        }
        Some(seconds)
    }

    /// A value of `metric` in base units (fraction, bytes, °C, W, MHz, count, bit set).
    fn level(&mut self, metric: Metric, raw: &RawScalar, position: (u64, u64), total: f64) -> Option<f64> {
        let value = match metric {
            Metric::Utilization | Metric::MemoryUtilization => match raw {
                RawScalar::Number(n) if (0.0..=1.0).contains(n) => Some(*n),
                RawScalar::Number(n) if *n > 1.0 && *n <= 100.0 => {
                    self.error(
                        position,
                        format!("{} {n} is not a fraction between 0 and 1", metric.name()),
                        Some(format!("write `{}` or `\"{n}%\"`", n / 100.0)),
                    );
                    return None;
                }
                RawScalar::Text(text) => percent(text),
                _ => None,
            },
            Metric::MemoryUsed | Metric::ForeignMemory => match raw {
                RawScalar::Text(text) => match percent(text) {
                    Some(share) => Some(share * total),
                    None => parse_size(text),
                },
                RawScalar::Number(n) if *n >= 0.0 => Some(n * MIB),
                _ => None,
            },
            Metric::Temperature => celsius(raw),
            Metric::Power => watts(raw).filter(|w| *w >= 0.0),
            Metric::SmClock | Metric::EccCorrected | Metric::EccUncorrected => match raw {
                RawScalar::Number(n) if *n >= 0.0 && n.is_finite() => Some(*n),
                _ => None,
            },
            Metric::Throttle => return self.throttle(raw, position),
        };
        if value.is_none() {
            self.error(
                position,
                format!("{} cannot be {}", metric.name(), raw.shown()),
                Some(format!("{} is {}", metric.name(), metric.unit_help())),
            );
        }
        value
    }

    fn throttle(&mut self, raw: &RawScalar, position: (u64, u64)) -> Option<f64> {
        let mut unknown = None;
        let mut reason = |item: &RawScalar| -> Option<u64> {
            match item {
                RawScalar::Number(n) if n.fract() == 0.0 && *n >= 0.0 && *n < 9.0e15 => Some(*n as u64),
                RawScalar::Text(name) if name == "none" => Some(0),
                RawScalar::Text(name) => match ThrottleReasons::from_name(name.trim()) {
                    Some(reason) => Some(reason.bits()),
                    None => {
                        unknown = Some(name.clone());
                        None
                    }
                },
                _ => None,
            }
        };
        let bits = match raw {
            RawScalar::List(items) => items.iter().map(&mut reason).try_fold(0u64, |bits, b| Some(bits | b?)),
            item => reason(item),
        };
        if bits.is_none() {
            let known = ThrottleReasons::all_names().collect::<Vec<_>>().join(", ");
            let (message, help) = match unknown {
                Some(name) => (
                    format!("unknown throttle reason `{name}`"),
                    match skein_text::closest(&name, ThrottleReasons::all_names()) {
                        Some(close) => format!("did you mean `{close}`? Reasons: {known}"),
                        None => format!("reasons: {known}"),
                    },
                ),
                None => (
                    format!("throttle cannot be {}", raw.shown()),
                    format!("throttle is {}", Metric::Throttle.unit_help()),
                ),
            };
            self.error(position, message, Some(help));
        }
        bits.map(|b| b as f64)
    }

    pub(super) fn size(&mut self, raw: &RawScalar) -> Option<f64> {
        match raw {
            RawScalar::Number(n) if *n >= 0.0 => Some(n * MIB),
            RawScalar::Text(text) => parse_size(text),
            _ => None,
        }
    }
}
