//! Telemetry models: pure functions of time that drive simulated GPUs.
//!
//! A [`Signal`] is evaluated with [`Signal::at`] at `t` seconds since the source
//! started. Nothing here reads a clock or a file: a replayed series is parsed from text
//! by [`Series::parse_csv`] (the fleet loader reads the file), so equal models give
//! equal values at equal times, and tests can drive any condition by choosing `t`.

use std::sync::Arc;

/// A metric's model in a fleet file: the card's idle value, or a signal.
#[derive(Debug, Clone, PartialEq)]
pub enum Model {
    /// The card's idle value (no load, baseline memory, idle power and temperature).
    Idle,
    /// A value that changes with time.
    Signal(Signal),
}

/// A value as a function of time. Levels are in the metric's unit (a fraction for
/// utilization, bytes for memory, °C, watts, MHz, a count, or a throttle bit set).
#[derive(Debug, Clone, PartialEq)]
pub enum Signal {
    /// Always the same value.
    Constant(f64),
    /// `from` until `start_s`, then a straight line to `to` over `over_s` seconds, then
    /// `to`.
    Ramp {
        /// Value before the ramp.
        from: f64,
        /// Value after the ramp.
        to: f64,
        /// When the ramp begins.
        start_s: f64,
        /// How long the ramp takes (positive).
        over_s: f64,
    },
    /// `high` for the first `duty` of every period, `low` for the rest; periods start
    /// at `t = 0`.
    Square {
        /// Value in the second part of each period.
        low: f64,
        /// Value in the first part of each period.
        high: f64,
        /// Length of one period (positive).
        period_s: f64,
        /// Fraction of the period spent at `high`, in `(0, 1)`.
        duty: f64,
    },
    /// `peak` from `at_s` for `duration_s` seconds, `base` before and after.
    Spike {
        /// Value outside the spike.
        base: f64,
        /// Value during the spike.
        peak: f64,
        /// When the spike begins.
        at_s: f64,
        /// How long it lasts (positive).
        duration_s: f64,
    },
    /// A recorded series (shared: many GPUs can replay one file).
    Replay(Arc<Series>),
}

impl Signal {
    /// The value at `t` seconds. Negative or non-finite `t` counts as 0.
    pub fn at(&self, t: f64) -> f64 {
        let t = if t.is_finite() { t.max(0.0) } else { 0.0 };
        match self {
            Signal::Constant(value) => *value,
            Signal::Ramp {
                from,
                to,
                start_s,
                over_s,
            } => {
                let progress = ((t - start_s) / over_s).clamp(0.0, 1.0);
                if progress.is_nan() {
                    return *to;
                }
                from + (to - from) * progress
            }
            Signal::Square {
                low,
                high,
                period_s,
                duty,
            } => {
                let phase = (t / period_s).fract();
                if phase < *duty { *high } else { *low }
            }
            Signal::Spike {
                base,
                peak,
                at_s,
                duration_s,
            } => {
                if t >= *at_s && t < at_s + duration_s {
                    *peak
                } else {
                    *base
                }
            }
            Signal::Replay(series) => series.at(t),
        }
    }

    /// Whether the signal only ever takes the values written in the file (no
    /// interpolation between two of them). Throttle bit sets need this.
    pub fn is_stepwise(&self) -> bool {
        match self {
            Signal::Constant(_) | Signal::Square { .. } | Signal::Spike { .. } => true,
            Signal::Ramp { .. } => false,
            Signal::Replay(series) => series.interpolation == Interpolation::Step,
        }
    }

    /// The same signal with every level passed through `f` (unit conversion).
    pub fn map_levels(self, f: impl Fn(f64) -> f64) -> Signal {
        match self {
            Signal::Constant(value) => Signal::Constant(f(value)),
            Signal::Ramp {
                from,
                to,
                start_s,
                over_s,
            } => Signal::Ramp {
                from: f(from),
                to: f(to),
                start_s,
                over_s,
            },
            Signal::Square {
                low,
                high,
                period_s,
                duty,
            } => Signal::Square {
                low: f(low),
                high: f(high),
                period_s,
                duty,
            },
            Signal::Spike {
                base,
                peak,
                at_s,
                duration_s,
            } => Signal::Spike {
                base: f(base),
                peak: f(peak),
                at_s,
                duration_s,
            },
            Signal::Replay(series) => {
                let mut series = Arc::unwrap_or_clone(series);
                for value in &mut series.values {
                    *value = f(*value);
                }
                Signal::Replay(Arc::new(series))
            }
        }
    }
}

/// How a replayed series fills the time between two rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interpolation {
    /// A straight line between the two rows.
    Linear,
    /// The earlier row's value until the next row (for bit sets and counters).
    Step,
}

/// What a replayed series does after its last row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterEnd {
    /// Keep the last value.
    Hold,
    /// Start again from the first row: the series repeats with a period equal to its
    /// last time.
    Loop,
}

/// A recorded series: strictly increasing times (seconds, the first at or after 0) and
/// one value per time.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    times: Vec<f64>,
    values: Vec<f64>,
    /// Filling between rows.
    pub interpolation: Interpolation,
    /// Behaviour after the last row.
    pub after_end: AfterEnd,
}

/// Why a CSV could not become a series: the 1-based line and what is wrong there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CsvError {
    /// 1-based line of the CSV text (1 for the header or an empty file).
    pub line: usize,
    /// What is wrong.
    pub message: String,
    /// How to fix it, when there is something to say.
    pub help: Option<String>,
}

/// Most rows a replayed CSV may have (a day at one row per second is 86 400).
pub const MAX_CSV_ROWS: usize = 1_000_000;

impl Series {
    /// Reads `column` of a CSV with a header row, against the time column
    /// `time_column` (seconds). Blank lines and lines starting with `#` are skipped;
    /// fields are separated by commas and may be double-quoted.
    pub fn parse_csv(
        text: &str,
        time_column: &str,
        column: &str,
        interpolation: Interpolation,
        after_end: AfterEnd,
    ) -> Result<Series, CsvError> {
        let mut lines = text
            .lines()
            .enumerate()
            .map(|(i, line)| (i + 1, line.trim()))
            .filter(|(_, line)| !line.is_empty() && !line.starts_with('#'));
        let Some((header_line, header)) = lines.next() else {
            return Err(CsvError {
                line: 1,
                message: "the CSV file is empty".to_owned(),
                help: Some(format!("start it with a header row such as `{time_column},{column}`")),
            });
        };
        let names: Vec<&str> = split_fields(header).collect();
        let find = |wanted: &str, role: &str| {
            names.iter().position(|name| *name == wanted).ok_or_else(|| CsvError {
                line: header_line,
                message: format!("the CSV has no {role} column `{wanted}`"),
                help: Some(column_help(wanted, &names)),
            })
        };
        let time_at = find(time_column, "time")?;
        let value_at = find(column, "value")?;

        let mut times = Vec::new();
        let mut values = Vec::new();
        for (line, row) in lines {
            if times.len() >= MAX_CSV_ROWS {
                return Err(CsvError {
                    line,
                    message: format!("the CSV has more than {MAX_CSV_ROWS} rows"),
                    help: Some("resample it to fewer rows (one per second is plenty)".to_owned()),
                });
            }
            let fields: Vec<&str> = split_fields(row).collect();
            let number = |at: usize, name: &str| -> Result<f64, CsvError> {
                let field = fields.get(at).copied().unwrap_or_default();
                match field.parse::<f64>() {
                    Ok(value) if value.is_finite() => Ok(value),
                    _ => Err(CsvError {
                        line,
                        message: format!("`{field}` in column `{name}` is not a number"),
                        help: None,
                    }),
                }
            };
            let time = number(time_at, time_column)?;
            let value = number(value_at, column)?;
            if time < 0.0 {
                return Err(CsvError {
                    line,
                    message: format!("time {time} is negative"),
                    help: Some("times are seconds since the node started, from 0".to_owned()),
                });
            }
            if let Some(previous) = times.last()
                && time <= *previous
            {
                return Err(CsvError {
                    line,
                    message: format!("time {time} does not come after the previous row's {previous}"),
                    help: Some("sort the rows by time and drop duplicate times".to_owned()),
                });
            }
            times.push(time);
            values.push(value);
        }
        if times.is_empty() {
            return Err(CsvError {
                line: header_line,
                message: "the CSV has a header but no rows".to_owned(),
                help: None,
            });
        }
        Ok(Series {
            times,
            values,
            interpolation,
            after_end,
        })
    }

    /// The value at `t` seconds: the first value before the first row, the last after
    /// the last row (or the series again from its start when it loops).
    pub fn at(&self, t: f64) -> f64 {
        let (Some(&first_t), Some(&last_t)) = (self.times.first(), self.times.last()) else {
            return 0.0;
        };
        let t = match self.after_end {
            AfterEnd::Loop if t > last_t && last_t > 0.0 => t % last_t,
            _ => t,
        };
        if t <= first_t {
            return self.values.first().copied().unwrap_or_default();
        }
        // The first row after `t`; 1..=len because t > first_t.
        let next = self.times.partition_point(|&time| time <= t);
        let (Some(&t1), Some(&v1)) = (self.times.get(next), self.values.get(next)) else {
            return self.values.last().copied().unwrap_or_default();
        };
        let previous = next.saturating_sub(1);
        let (t0, v0) = (
            self.times.get(previous).copied().unwrap_or(t1),
            self.values.get(previous).copied().unwrap_or(v1),
        );
        match self.interpolation {
            Interpolation::Step => v0,
            Interpolation::Linear => v0 + (v1 - v0) * (t - t0) / (t1 - t0),
        }
    }

    /// Number of rows.
    pub fn len(&self) -> usize {
        self.times.len()
    }

    /// Whether the series has no rows (never true for a parsed series).
    pub fn is_empty(&self) -> bool {
        self.times.is_empty()
    }
}

fn split_fields(line: &str) -> impl Iterator<Item = &str> {
    line.split(',').map(|field| field.trim().trim_matches('"').trim())
}

fn column_help(wanted: &str, names: &[&str]) -> String {
    let known = names.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ");
    match skein_text::closest(wanted, names.iter().copied()) {
        Some(close) => format!("did you mean `{close}`? The columns are {known}"),
        None => format!("the columns are {known}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linear_step_hold_and_loop() {
        let csv = "# recorded on rtx-1\ntime,util\n0,0\n10,1\n20,0.5\n";
        let linear = Series::parse_csv(csv, "time", "util", Interpolation::Linear, AfterEnd::Hold).unwrap();
        assert_eq!(linear.len(), 3);
        let at = |s: &Series, t: f64| s.at(t);
        assert_eq!(at(&linear, 0.0), 0.0);
        assert_eq!(at(&linear, 5.0), 0.5);
        assert_eq!(at(&linear, 10.0), 1.0);
        assert_eq!(at(&linear, 15.0), 0.75);
        assert_eq!(at(&linear, 500.0), 0.5);
        let step = Series::parse_csv(csv, "time", "util", Interpolation::Step, AfterEnd::Loop).unwrap();
        assert_eq!(at(&step, 5.0), 0.0);
        assert_eq!(at(&step, 12.0), 1.0);
        assert_eq!(at(&step, 25.0), 0.0); // 25 % 20 = 5
        assert_eq!(at(&step, 32.0), 1.0);
    }

    #[test]
    fn csv_errors_name_the_line() {
        let err =
            |text: &str| Series::parse_csv(text, "time", "util", Interpolation::Linear, AfterEnd::Hold).unwrap_err();
        assert_eq!(err("").message, "the CSV file is empty");
        let e = err("time,utl\n0,1\n");
        assert_eq!((e.line, e.message.as_str()), (1, "the CSV has no value column `util`"));
        assert_eq!(
            e.help.as_deref(),
            Some("did you mean `utl`? The columns are `time`, `utl`")
        );
        let e = err("time,util\n0,1\n0,2\n");
        assert_eq!(
            (e.line, e.message.as_str()),
            (3, "time 0 does not come after the previous row's 0")
        );
        let e = err("time,util\n0,x\n");
        assert_eq!(
            (e.line, e.message.as_str()),
            (2, "`x` in column `util` is not a number")
        );
        assert_eq!(err("time,util\n").message, "the CSV has a header but no rows");
    }

    #[test]
    fn shapes() {
        let ramp = Signal::Ramp {
            from: 0.0,
            to: 1.0,
            start_s: 10.0,
            over_s: 20.0,
        };
        assert_eq!(
            [ramp.at(0.0), ramp.at(10.0), ramp.at(20.0), ramp.at(40.0)],
            [0.0, 0.0, 0.5, 1.0]
        );
        let square = Signal::Square {
            low: 1.0,
            high: 2.0,
            period_s: 10.0,
            duty: 0.3,
        };
        assert_eq!(
            [square.at(0.0), square.at(2.9), square.at(3.0), square.at(10.5)],
            [2.0, 2.0, 1.0, 2.0]
        );
        let spike = Signal::Spike {
            base: 40.0,
            peak: 90.0,
            at_s: 60.0,
            duration_s: 10.0,
        };
        assert_eq!(
            [spike.at(59.9), spike.at(60.0), spike.at(69.9), spike.at(70.0)],
            [40.0, 90.0, 90.0, 40.0]
        );
        assert_eq!(Signal::Constant(3.0).at(f64::NAN), 3.0);
    }
}
