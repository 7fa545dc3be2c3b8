//! Usage accounting: what each user and group used, by model and agent, hour by hour
//! (docs/sharing.md, "Usage").
//!
//! - [`Counts`]: requests, tokens in and out, GPU memory × time (GiB-hours), GPUs × time
//!   (GPU-hours) and run time.
//! - [`Key`]: the hour, group, user, model and agent they are counted under; a record of
//!   the store's `usage_hours` tree per key.
//! - [`summarize`] (pure): sums records in a window by the [`Dimension`]s asked for;
//!   [`csv`] writes the rows as CSV.
//! - [`Ledger`]: counts added since the last write, written every
//!   [`super::USAGE_SAVE_INTERVAL`] (added to the stored record of their key), and the
//!   totals since the server started that `GET /metrics` exports.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::base::UnixMs;

/// Milliseconds in an hour: records are kept by the hour.
pub const HOUR_MS: i64 = 3_600_000;

/// The most label sets (group and user) `GET /metrics` exports; users beyond them are
/// summed under the user `_other` of the group `_other`, so a lab with many users keeps
/// its metrics' cardinality bounded.
pub const METRIC_SERIES: usize = 500;

/// Between a key's parts in the store: no name, repository or agent holds it.
const SEPARATOR: char = '\u{1f}';

/// What was used.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Counts {
    /// Model calls (an agent loop's each, a session's turns, the OpenAI and Anthropic
    /// routes' requests).
    pub requests: u64,
    /// Prompt tokens, as the engines counted them.
    pub tokens_in: u64,
    /// Generated tokens.
    pub tokens_out: u64,
    /// GPU memory reserved × time, GiB-hours.
    pub gib_hours: f64,
    /// GPUs held × time, GPU-hours (a GPU shared by several instances counts for each).
    pub gpu_hours: f64,
    /// Runs' time from start to end, seconds.
    pub run_seconds: f64,
}

impl Counts {
    /// Adds `other` to these.
    pub fn add(&mut self, other: &Counts) {
        self.requests += other.requests;
        self.tokens_in += other.tokens_in;
        self.tokens_out += other.tokens_out;
        self.gib_hours += other.gib_hours;
        self.gpu_hours += other.gpu_hours;
        self.run_seconds += other.run_seconds;
    }
}

/// What counts are kept under: an hour (since the epoch), a group, a user, a model (its
/// repository or an endpoint's model; empty for run time) and an agent (empty where
/// there is none, as for a model called by name).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key {
    /// Hours since the epoch.
    pub hour: i64,
    /// The group, as the user's was at the time.
    pub group: String,
    /// The user.
    pub user: String,
    /// The model.
    pub model: String,
    /// The agent.
    pub agent: String,
}

impl Key {
    /// The key of `at`'s hour.
    pub fn at(at: UnixMs, group: &str, user: &str, model: &str, agent: &str) -> Key {
        Key {
            hour: at.0.div_euclid(HOUR_MS),
            group: group.to_owned(),
            user: user.to_owned(),
            model: model.to_owned(),
            agent: agent.to_owned(),
        }
    }

    /// Its key in the store: the hour first (zero-padded), so records sort by time.
    pub fn stored(&self) -> String {
        let s = SEPARATOR;
        format!(
            "{}{s}{}{s}{}{s}{}{s}{}",
            hour_prefix(self.hour),
            self.group,
            self.user,
            self.model,
            self.agent
        )
    }

    /// The key stored as `text`, if it is one.
    pub fn parse(text: &str) -> Option<Key> {
        let mut parts = text.split(SEPARATOR);
        let hour = parts.next()?.parse().ok()?;
        let key = Key {
            hour,
            group: parts.next()?.to_owned(),
            user: parts.next()?.to_owned(),
            model: parts.next()?.to_owned(),
            agent: parts.next()?.to_owned(),
        };
        parts.next().is_none().then_some(key)
    }
}

/// The store key's start for `hour`: keys of later hours sort after it.
pub fn hour_prefix(hour: i64) -> String {
    format!("{:012}", hour.max(0))
}

/// What rows are summed by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Dimension {
    /// The group.
    Group,
    /// The user.
    User,
    /// The model.
    Model,
    /// The agent.
    Agent,
    /// The day (UTC) the usage fell in.
    Day,
    /// The hour the usage fell in.
    Hour,
}

impl Dimension {
    /// Every dimension, in the order rows show them.
    pub const ALL: [Dimension; 6] = [
        Dimension::Group,
        Dimension::User,
        Dimension::Model,
        Dimension::Agent,
        Dimension::Day,
        Dimension::Hour,
    ];

    /// Its name in queries and CSV headers.
    pub fn name(self) -> &'static str {
        match self {
            Dimension::Group => "group",
            Dimension::User => "user",
            Dimension::Model => "model",
            Dimension::Agent => "agent",
            Dimension::Day => "day",
            Dimension::Hour => "hour",
        }
    }

    /// Dimensions named in `text`, comma-separated (`user,model`), in [`Dimension::ALL`]'s
    /// order, each once.
    ///
    /// Errors: a name that is none of them, saying which are.
    pub fn parse_list(text: &str) -> Result<Vec<Dimension>, String> {
        let mut dimensions = Vec::new();
        for name in text.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let dimension = Dimension::ALL
                .into_iter()
                .find(|d| d.name() == name)
                .ok_or_else(|| {
                    format!("`by`: `{name}` is not a dimension; use any of group, user, model, agent, day, hour, comma-separated")
                })?;
            if !dimensions.contains(&dimension) {
                dimensions.push(dimension);
            }
        }
        dimensions.sort();
        Ok(dimensions)
    }
}

/// Which usage to sum, and by what.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Query {
    /// From this hour on (its hour counts whole).
    pub since: UnixMs,
    /// Before this time (the hour it falls in counts whole).
    pub until: UnixMs,
    /// Only this user's.
    pub user: Option<String>,
    /// Only this group's.
    pub group: Option<String>,
    /// Only this model's.
    pub model: Option<String>,
    /// Only this agent's.
    pub agent: Option<String>,
    /// What rows are summed by (none: one row, the total).
    pub by: Vec<Dimension>,
}

impl Query {
    /// Whether the record under `key` is in the query.
    pub fn takes(&self, key: &Key) -> bool {
        let hours = self.since.0.div_euclid(HOUR_MS)..=self.until.0.div_euclid(HOUR_MS);
        let is = |wanted: &Option<String>, value: &str| wanted.as_deref().is_none_or(|w| w == value);
        hours.contains(&key.hour)
            && is(&self.user, &key.user)
            && is(&self.group, &key.group)
            && is(&self.model, &key.model)
            && is(&self.agent, &key.agent)
    }
}

/// One row of a summary: the values of the query's dimensions, and the sums.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Row {
    /// The group (when summed by group).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// The user (when summed by user).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// The model (when summed by model; empty for run time).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The agent (when summed by agent; empty where there is none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// The day's start (when summed by day).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub day: Option<UnixMs>,
    /// The hour's start (when summed by hour).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub hour: Option<UnixMs>,
    /// The sums.
    #[serde(flatten)]
    pub counts: Counts,
}

/// Sums `records` that `query` takes by its dimensions: rows in the order of their
/// dimensions' values (the total alone when it has none; nothing when nothing was used).
pub fn summarize(records: impl IntoIterator<Item = (Key, Counts)>, query: &Query) -> Vec<Row> {
    let has = |d: Dimension| query.by.contains(&d);
    let mut sums: BTreeMap<RowKey, Counts> = BTreeMap::new();
    for (key, counts) in records {
        if !query.takes(&key) {
            continue;
        }
        let row = RowKey {
            group: has(Dimension::Group).then(|| key.group.clone()),
            user: has(Dimension::User).then(|| key.user.clone()),
            model: has(Dimension::Model).then(|| key.model.clone()),
            agent: has(Dimension::Agent).then(|| key.agent.clone()),
            day: has(Dimension::Day).then(|| key.hour.div_euclid(24) * 24 * HOUR_MS),
            hour: has(Dimension::Hour).then_some(key.hour * HOUR_MS),
        };
        sums.entry(row).or_default().add(&counts);
    }
    sums.into_iter()
        .map(|(key, counts)| Row {
            group: key.group,
            user: key.user,
            model: key.model,
            agent: key.agent,
            day: key.day.map(UnixMs),
            hour: key.hour.map(UnixMs),
            counts,
        })
        .collect()
}

/// A row's dimension values, ordered as rows are listed.
#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct RowKey {
    day: Option<i64>,
    hour: Option<i64>,
    group: Option<String>,
    user: Option<String>,
    model: Option<String>,
    agent: Option<String>,
}

/// `rows` as CSV (RFC 4180): a header of `by`'s dimensions and the counts, a line a row.
pub fn csv(rows: &[Row], by: &[Dimension]) -> String {
    let mut out = String::new();
    let counts = [
        "requests",
        "tokens_in",
        "tokens_out",
        "gib_hours",
        "gpu_hours",
        "run_seconds",
    ];
    let header: Vec<&str> = by.iter().map(|d| d.name()).chain(counts).collect();
    out.push_str(&header.join(","));
    out.push_str("\r\n");
    for row in rows {
        let mut fields: Vec<String> = by
            .iter()
            .map(|d| match d {
                Dimension::Group => field(row.group.as_deref()),
                Dimension::User => field(row.user.as_deref()),
                Dimension::Model => field(row.model.as_deref()),
                Dimension::Agent => field(row.agent.as_deref()),
                Dimension::Day => row.day.map(|t| t.to_string()).unwrap_or_default(),
                Dimension::Hour => row.hour.map(|t| t.to_string()).unwrap_or_default(),
            })
            .collect();
        let c = &row.counts;
        fields.extend([
            c.requests.to_string(),
            c.tokens_in.to_string(),
            c.tokens_out.to_string(),
            format!("{:.6}", c.gib_hours),
            format!("{:.6}", c.gpu_hours),
            format!("{:.3}", c.run_seconds),
        ]);
        let _ = write!(out, "{}\r\n", fields.join(","));
    }
    out
}

/// A CSV field: quoted when it holds a comma, a quote or a line break.
fn field(value: Option<&str>) -> String {
    let value = value.unwrap_or_default();
    if value.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", value.replace('"', "\"\""))
    } else {
        value.to_owned()
    }
}

/// Usage counted since the last write, and the totals since the server started.
#[derive(Debug, Default)]
pub struct Ledger {
    /// Added since the last write, by key.
    pending: HashMap<Key, Counts>,
    /// Since the server started, by (group, user): at most [`METRIC_SERIES`] of them.
    totals: BTreeMap<(String, String), Counts>,
}

/// The label set users beyond [`METRIC_SERIES`] are summed under.
const OTHER: &str = "_other";

impl Ledger {
    /// Adds `counts` under `key`.
    pub fn add(&mut self, key: Key, counts: &Counts) {
        let mut series = (key.group.clone(), key.user.clone());
        if !self.totals.contains_key(&series) && self.totals.len() >= METRIC_SERIES - 1 {
            series = (OTHER.to_owned(), OTHER.to_owned());
        }
        self.totals.entry(series).or_default().add(counts);
        self.pending.entry(key).or_default().add(counts);
    }

    /// Takes what was added since the last write.
    pub fn take(&mut self) -> HashMap<Key, Counts> {
        std::mem::take(&mut self.pending)
    }

    /// Puts back what could not be written.
    pub fn restore(&mut self, unwritten: HashMap<Key, Counts>) {
        for (key, counts) in unwritten {
            self.pending.entry(key).or_default().add(&counts);
        }
    }

    /// What was added since the last write (not in the store yet).
    pub fn pending(&self) -> impl Iterator<Item = (&Key, &Counts)> {
        self.pending.iter()
    }

    /// The totals since the server started, by (group, user).
    pub fn totals(&self) -> &BTreeMap<(String, String), Counts> {
        &self.totals
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(requests: u64, tokens_out: u64) -> Counts {
        Counts {
            requests,
            tokens_out,
            ..Counts::default()
        }
    }

    fn at(hour: i64) -> UnixMs {
        UnixMs(hour * HOUR_MS + 17)
    }

    #[test]
    fn a_stored_key_reads_back_and_sorts_by_hour() {
        let key = Key::at(at(493_000), "nlp", "ada", "Qwen/Qwen2.5-7B-Instruct", "writer");
        assert_eq!(Key::parse(&key.stored()), Some(key.clone()));
        let later = Key::at(at(493_001), "a", "a", "", "");
        assert!(later.stored() > key.stored());
        assert_eq!(Key::parse("12\u{1f}a\u{1f}b"), None);
        assert_eq!(Key::parse(&format!("{}\u{1f}extra", key.stored())), None);
    }

    #[test]
    fn rows_sum_the_window_by_the_dimensions_asked() {
        let records = vec![
            (Key::at(at(10), "nlp", "ada", "m1", "writer"), counts(2, 100)),
            (Key::at(at(10), "nlp", "bo", "m1", "writer"), counts(1, 10)),
            (Key::at(at(11), "nlp", "ada", "m2", ""), counts(3, 30)),
            (Key::at(at(12), "vision", "cy", "m1", "critic"), counts(5, 50)),
            // Outside the window.
            (Key::at(at(9), "nlp", "ada", "m1", "writer"), counts(7, 700)),
        ];
        let window = Query {
            since: at(10),
            until: at(12),
            ..Query::default()
        };
        let total = summarize(records.clone(), &window);
        assert_eq!(total.len(), 1);
        assert_eq!(total[0].counts, counts(11, 190));
        assert_eq!(total[0].user, None);

        let by_user = summarize(
            records.clone(),
            &Query {
                by: vec![Dimension::Group, Dimension::User],
                ..window.clone()
            },
        );
        let rows: Vec<(&str, &str, u64)> = by_user
            .iter()
            .map(|r| {
                (
                    r.group.as_deref().unwrap(),
                    r.user.as_deref().unwrap(),
                    r.counts.tokens_out,
                )
            })
            .collect();
        assert_eq!(rows, [("nlp", "ada", 130), ("nlp", "bo", 10), ("vision", "cy", 50)]);

        let ada_by_model_hour = summarize(
            records,
            &Query {
                user: Some("ada".to_owned()),
                by: vec![Dimension::Model, Dimension::Hour],
                ..window
            },
        );
        let rows: Vec<(i64, &str, u64)> = ada_by_model_hour
            .iter()
            .map(|r| (r.hour.unwrap().0, r.model.as_deref().unwrap(), r.counts.requests))
            .collect();
        assert_eq!(rows, [(10 * HOUR_MS, "m1", 2), (11 * HOUR_MS, "m2", 3)]);
    }

    #[test]
    fn days_start_at_midnight_utc() {
        let records = vec![
            (Key::at(at(24 * 3 + 1), "g", "u", "m", ""), counts(1, 0)),
            (Key::at(at(24 * 3 + 23), "g", "u", "m", ""), counts(1, 0)),
            (Key::at(at(24 * 4), "g", "u", "m", ""), counts(1, 0)),
        ];
        let rows = summarize(
            records,
            &Query {
                since: at(0),
                until: at(24 * 5),
                by: vec![Dimension::Day],
                ..Query::default()
            },
        );
        let days: Vec<(i64, u64)> = rows.iter().map(|r| (r.day.unwrap().0, r.counts.requests)).collect();
        assert_eq!(days, [(3 * 24 * HOUR_MS, 2), (4 * 24 * HOUR_MS, 1)]);
    }

    #[test]
    fn csv_quotes_what_needs_it() {
        let rows = vec![Row {
            group: None,
            user: Some("ada".to_owned()),
            model: Some("a,\"b\"".to_owned()),
            agent: None,
            day: None,
            hour: None,
            counts: Counts {
                requests: 2,
                tokens_in: 3,
                tokens_out: 4,
                gib_hours: 1.5,
                gpu_hours: 0.25,
                run_seconds: 60.0,
            },
        }];
        assert_eq!(
            csv(&rows, &[Dimension::User, Dimension::Model]),
            "user,model,requests,tokens_in,tokens_out,gib_hours,gpu_hours,run_seconds\r\nada,\"a,\"\"b\"\"\",2,3,4,1.500000,0.250000,60.000\r\n"
        );
    }

    #[test]
    fn dimensions_parse_in_order_and_unknown_ones_are_named() {
        assert_eq!(
            Dimension::parse_list("model, user,model"),
            Ok(vec![Dimension::User, Dimension::Model])
        );
        assert_eq!(Dimension::parse_list(""), Ok(vec![]));
        let error = Dimension::parse_list("user,team").unwrap_err();
        assert!(error.contains("`team` is not a dimension"), "{error}");
    }

    #[test]
    fn the_ledger_keeps_metric_series_bounded_and_puts_back_what_was_not_written() {
        let mut ledger = Ledger::default();
        for n in 0..METRIC_SERIES + 10 {
            ledger.add(Key::at(at(1), "g", &format!("u{n}"), "m", ""), &counts(1, 1));
        }
        assert_eq!(ledger.totals().len(), METRIC_SERIES);
        let other = &ledger.totals()[&(OTHER.to_owned(), OTHER.to_owned())];
        assert_eq!(other.requests, 11);
        let taken = ledger.take();
        assert_eq!(taken.len(), METRIC_SERIES + 10);
        assert_eq!(ledger.pending().count(), 0);
        ledger.add(Key::at(at(1), "g", "u0", "m", ""), &counts(1, 1));
        ledger.restore(taken);
        assert_eq!(ledger.pending().count(), METRIC_SERIES + 10);
        let u0 = ledger.pending().find(|(k, _)| k.user == "u0").unwrap().1;
        assert_eq!(u0.requests, 2);
    }
}
