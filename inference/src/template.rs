//! The chat template: the Jinja template of `tokenizer_config.json`, rendered with
//! minijinja as `transformers` renders it (blocks trimmed, Python string methods,
//! `raise_exception`, `strftime_now`), with `bos_token`, `eos_token` and
//! `add_generation_prompt`.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use minijinja::value::Kwargs;
use minijinja::{Environment, ErrorKind, context};
use serde::Serialize;
use serde_json::Value;

use crate::Error;

const TEMPLATE_NAME: &str = "chat_template";

/// One message of a conversation, as the template sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TemplateMessage {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The text.
    pub content: String,
    /// An assistant message's tool calls, in OpenAI's shape
    /// (`{"id", "type": "function", "function": {"name", "arguments"}}`) but with the
    /// arguments as a JSON object, which the templates write with `tojson`. Absent
    /// (not `null`) for a message without calls, as `transformers` sees it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<Value>>,
    /// The call a `tool` message answers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl TemplateMessage {
    /// A message with text only.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> TemplateMessage {
        TemplateMessage {
            role: role.into(),
            content: content.into(),
            tool_calls: None,
            tool_call_id: None,
        }
    }
}

/// A compiled chat template and the special tokens it may refer to.
pub struct ChatTemplate {
    env: Environment<'static>,
    path: PathBuf,
    source: String,
    /// The beginning-of-sequence token's text (may be empty).
    pub bos_token: String,
    /// The end-of-sequence token's text (may be empty).
    pub eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// A special token's text: a string, or an object with `content` (older configs).
pub(crate) fn token_text(config: &Value, key: &str) -> Option<String> {
    match config.get(key)? {
        Value::String(text) => Some(text.clone()),
        Value::Object(object) => object.get("content").and_then(Value::as_str).map(str::to_owned),
        _ => None,
    }
}

impl ChatTemplate {
    /// Compiles the template of a parsed `tokenizer_config.json` at `path`. A list of
    /// named templates yields the one named `default` (else the first).
    ///
    /// Errors: [`Error::ChatTemplateMissing`] without a template,
    /// [`Error::ChatTemplate`] when it does not compile.
    pub fn from_tokenizer_config(path: &Path, config: &Value) -> Result<ChatTemplate, Error> {
        let missing = || Error::ChatTemplateMissing {
            path: path.to_path_buf(),
        };
        let source = match config.get("chat_template").ok_or_else(missing)? {
            Value::String(source) => source.clone(),
            Value::Array(named) => {
                let source_of = |entry: &Value| entry.get("template").and_then(Value::as_str).map(str::to_owned);
                named
                    .iter()
                    .find(|entry| entry.get("name").and_then(Value::as_str) == Some("default"))
                    .and_then(source_of)
                    .or_else(|| named.first().and_then(source_of))
                    .ok_or_else(missing)?
            }
            _ => return Err(missing()),
        };
        ChatTemplate::from_source(
            path,
            source,
            token_text(config, "bos_token").unwrap_or_default(),
            token_text(config, "eos_token").unwrap_or_default(),
        )
    }

    /// Compiles the template `source`, read from `path` (a `tokenizer_config.json`, or
    /// a GGUF file's `tokenizer.chat_template`), with the special tokens' texts.
    ///
    /// Errors: [`Error::ChatTemplate`] when it does not compile.
    pub fn from_source(
        path: &Path,
        source: String,
        bos_token: String,
        eos_token: String,
    ) -> Result<ChatTemplate, Error> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |message: String| -> Result<String, minijinja::Error> {
                Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
            },
        );
        env.add_function("strftime_now", |format: String| strftime(&format, SystemTime::now()));
        env.add_filter("tojson", tojson);
        env.add_template_owned(TEMPLATE_NAME, source.clone())
            .map_err(|source| Error::ChatTemplate {
                path: path.to_path_buf(),
                source,
            })?;
        Ok(ChatTemplate {
            env,
            path: path.to_path_buf(),
            source,
            bos_token,
            eos_token,
        })
    }

    /// Renders `messages`, ending with the assistant's turn opened when
    /// `add_generation_prompt` is set.
    ///
    /// Errors: [`Error::ChatTemplate`] when rendering fails (an unexpected role order
    /// that the template refuses with `raise_exception`, among others).
    pub fn render(&self, messages: &[TemplateMessage], add_generation_prompt: bool) -> Result<String, Error> {
        self.render_with_tools(messages, &[], add_generation_prompt)
    }

    /// The template's source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders `messages` offering `tools` (OpenAI's `{"type": "function", "function":
    /// {…}}` definitions, the `tools` variable of Hugging Face templates; `none` when
    /// there are none, as `transformers` passes it).
    ///
    /// Errors: as [`ChatTemplate::render`].
    pub fn render_with_tools(
        &self,
        messages: &[TemplateMessage],
        tools: &[Value],
        add_generation_prompt: bool,
    ) -> Result<String, Error> {
        let error = |source| Error::ChatTemplate {
            path: self.path.clone(),
            source,
        };
        let template = self.env.get_template(TEMPLATE_NAME).map_err(error)?;
        template
            .render(context! {
                messages => messages,
                tools => (!tools.is_empty()).then_some(tools),
                bos_token => &self.bos_token,
                eos_token => &self.eos_token,
                add_generation_prompt => add_generation_prompt,
            })
            .map_err(error)
    }
}

/// The `tojson` filter of `transformers`' chat templates: Python's `json.dumps` with
/// `ensure_ascii`, `indent`, `separators` and `sort_keys` (default: no escaping of
/// non-ASCII or HTML characters, `", "` and `": "` between items and keys), not
/// minijinja's own (compact and HTML-escaped), so that tools and arguments reach the
/// model as it was trained to see them.
fn tojson(value: minijinja::Value, kwargs: Kwargs) -> Result<String, minijinja::Error> {
    let ensure_ascii = kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false);
    let indent = kwargs.get::<Option<usize>>("indent")?;
    let sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    let separators = kwargs.get::<Option<Vec<String>>>("separators")?;
    kwargs.assert_all_used()?;
    let (item, key) = match separators.as_deref() {
        Some([item, key]) => (item.clone(), key.clone()),
        Some(_) => {
            return Err(minijinja::Error::new(
                ErrorKind::InvalidOperation,
                "tojson: separators must be a pair",
            ));
        }
        None if indent.is_some() => (",".to_owned(), ": ".to_owned()),
        None => (", ".to_owned(), ": ".to_owned()),
    };
    let json = serde_json::to_value(&value)
        .map_err(|e| minijinja::Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let style = JsonStyle {
        ensure_ascii,
        indent,
        sort_keys,
        item,
        key,
    };
    let mut out = String::new();
    style.write(&json, 0, &mut out);
    Ok(out)
}

/// How Python's `json.dumps` was asked to write.
struct JsonStyle {
    ensure_ascii: bool,
    indent: Option<usize>,
    sort_keys: bool,
    item: String,
    key: String,
}

impl JsonStyle {
    fn write(&self, value: &Value, depth: usize, out: &mut String) {
        match value {
            Value::Null => out.push_str("null"),
            Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Value::Number(n) => out.push_str(&python_number(n)),
            Value::String(text) => self.string(text, out),
            Value::Array(items) if items.is_empty() => out.push_str("[]"),
            Value::Array(items) => {
                out.push('[');
                for (index, item) in items.iter().enumerate() {
                    self.separate(index, depth + 1, out);
                    self.write(item, depth + 1, out);
                }
                self.close(depth, out);
                out.push(']');
            }
            Value::Object(map) if map.is_empty() => out.push_str("{}"),
            Value::Object(map) => {
                let mut entries: Vec<(&String, &Value)> = map.iter().collect();
                if self.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(b.0));
                }
                out.push('{');
                for (index, (name, item)) in entries.into_iter().enumerate() {
                    self.separate(index, depth + 1, out);
                    self.string(name, out);
                    out.push_str(&self.key);
                    self.write(item, depth + 1, out);
                }
                self.close(depth, out);
                out.push('}');
            }
        }
    }

    /// Before item `index` of a container at `depth`: the item separator after the
    /// first, and a new line with indentation when indenting.
    fn separate(&self, index: usize, depth: usize, out: &mut String) {
        if index > 0 {
            out.push_str(&self.item);
        }
        if let Some(indent) = self.indent {
            out.push('\n');
            out.push_str(&" ".repeat(indent * depth));
        }
    }

    fn close(&self, depth: usize, out: &mut String) {
        if let Some(indent) = self.indent {
            out.push('\n');
            out.push_str(&" ".repeat(indent * depth));
        }
    }

    fn string(&self, text: &str, out: &mut String) {
        out.push('"');
        for c in text.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                c if u32::from(c) < 0x20 || (self.ensure_ascii && !c.is_ascii()) => {
                    let mut units = [0u16; 2];
                    for unit in c.encode_utf16(&mut units) {
                        out.push_str(&format!("\\u{unit:04x}"));
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
}

/// A number as Python's `json.dumps` writes it: integers as they are, floats by
/// `repr` (`1.0`, not `1`).
fn python_number(number: &serde_json::Number) -> String {
    match number.as_f64() {
        Some(float) if number.is_f64() && float.is_finite() && float.fract() == 0.0 && float.abs() < 1e16 => {
            format!("{float:.1}")
        }
        _ => number.to_string(),
    }
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = [
    "Sunday",
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
];

/// The calendar date of a day counted from 1970-01-01 (proleptic Gregorian):
/// `(year, month 1..=12, day 1..=31)`.
fn civil_date(days: i64) -> (i64, usize, i64) {
    // Counted in 400-year eras from 0000-03-01, so that the leap day ends a year.
    let days = days + 719_468;
    let era = days.div_euclid(146_097);
    let day_of_era = days.rem_euclid(146_097);
    let year_of_era = (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, usize::try_from(month).unwrap_or(1), day)
}

/// `strftime_now(format)` of `transformers`' chat templates (Python's
/// `datetime.now().strftime(format)`), for `now` in UTC: the C locale's directives
/// `%a %A %b %B %d %e %H %I %j %m %M %p %S %y %Y %%`; any other is written as it
/// stands. (Python takes the local time zone; a server in UTC renders the same.)
fn strftime(format: &str, now: SystemTime) -> String {
    let seconds = match now.duration_since(UNIX_EPOCH) {
        Ok(since) => i64::try_from(since.as_secs()).unwrap_or(i64::MAX),
        Err(before) => -i64::try_from(before.duration().as_secs()).unwrap_or(i64::MAX),
    };
    let days = seconds.div_euclid(86_400);
    let second_of_day = seconds.rem_euclid(86_400);
    let (year, month, day) = civil_date(days);
    let (hour, minute, second) = (second_of_day / 3_600, second_of_day / 60 % 60, second_of_day % 60);
    let month_name = MONTHS.get(month.saturating_sub(1)).copied().unwrap_or_default();
    // 1970-01-01 was a Thursday.
    let weekday = WEEKDAYS
        .get(usize::try_from((days + 4).rem_euclid(7)).unwrap_or(0))
        .copied()
        .unwrap_or_default();
    let day_of_year = days - days_before_year(year) + 1;
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let Some(directive) = chars.next() else {
            out.push('%');
            break;
        };
        let text = match directive {
            'a' => weekday.chars().take(3).collect(),
            'A' => weekday.to_owned(),
            'b' => month_name.chars().take(3).collect(),
            'B' => month_name.to_owned(),
            'd' => format!("{day:02}"),
            'e' => format!("{day:2}"),
            'H' => format!("{hour:02}"),
            'I' => format!("{:02}", (hour + 11) % 12 + 1),
            'j' => format!("{day_of_year:03}"),
            'm' => format!("{month:02}"),
            'M' => format!("{minute:02}"),
            'p' => (if hour < 12 { "AM" } else { "PM" }).to_owned(),
            'S' => format!("{second:02}"),
            'y' => format!("{:02}", year.rem_euclid(100)),
            'Y' => format!("{year}"),
            '%' => "%".to_owned(),
            other => format!("%{other}"),
        };
        out.push_str(&text);
    }
    out
}

/// Days from 1970-01-01 to January 1st of `year`.
fn days_before_year(year: i64) -> i64 {
    let before = year - 1;
    let leap_days = |y: i64| y.div_euclid(4) - y.div_euclid(100) + y.div_euclid(400);
    365 * (year - 1970) + leap_days(before) - leap_days(1969)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn at(seconds: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(seconds)
    }

    fn dumps(value: serde_json::Value, kwargs: &[(&str, minijinja::Value)]) -> String {
        let kwargs = Kwargs::from_iter(kwargs.iter().map(|(k, v)| (*k, v.clone())));
        tojson(minijinja::Value::from_serialize(&value), kwargs).unwrap()
    }

    #[test]
    fn tojson_writes_as_pythons_json_dumps() {
        // `json.dumps(v, ensure_ascii=False)` and friends gave the expected texts.
        let value = serde_json::json!({"b": [1, 2.0, "x<y>&'\"\n"], "a": {"é": null, "t": true}, "e": [], "o": {}});
        assert_eq!(
            dumps(value.clone(), &[]),
            r#"{"b": [1, 2.0, "x<y>&'\"\n"], "a": {"é": null, "t": true}, "e": [], "o": {}}"#
        );
        assert_eq!(
            dumps(
                value.clone(),
                &[("sort_keys", true.into()), ("ensure_ascii", true.into())]
            ),
            r#"{"a": {"t": true, "\u00e9": null}, "b": [1, 2.0, "x<y>&'\"\n"], "e": [], "o": {}}"#
        );
        assert_eq!(
            dumps(
                serde_json::json!({"a": [1, {"b": 2}], "c": []}),
                &[("indent", 2.into())]
            ),
            "{\n  \"a\": [\n    1,\n    {\n      \"b\": 2\n    }\n  ],\n  \"c\": []\n}"
        );
        let compact = minijinja::Value::from_serialize([",", ":"]);
        assert_eq!(
            dumps(serde_json::json!({"a": [1, 2]}), &[("separators", compact)]),
            r#"{"a":[1,2]}"#
        );
    }

    #[test]
    fn strftime_writes_dates_as_python_does() {
        // `datetime.fromtimestamp(t, timezone.utc).strftime(...)` gave the expected texts.
        let format = "%d %b %Y|%a %A %B %e %H:%M:%S %I %p %j %m %y %%|%Q";
        assert_eq!(
            strftime(format, at(0)),
            "01 Jan 1970|Thu Thursday January  1 00:00:00 12 AM 001 01 70 %|%Q"
        );
        // 2024-02-29 (a leap day) 23:59:59 UTC.
        assert_eq!(
            strftime(format, at(1_709_251_199)),
            "29 Feb 2024|Thu Thursday February 29 23:59:59 11 PM 060 02 24 %|%Q"
        );
        // 2000-12-31 12:00:00 UTC: day 366 of a leap century year.
        assert_eq!(
            strftime(format, at(978_264_000)),
            "31 Dec 2000|Sun Sunday December 31 12:00:00 12 PM 366 12 00 %|%Q"
        );
        // 2100-03-01: 2100 is no leap year.
        assert_eq!(strftime("%Y-%m-%d %j %a", at(4_107_542_400)), "2100-03-01 060 Mon");
    }
}
