//! Node labels: `KEY=VALUE` pairs an operator gives a node (`zone=lab-a`), carried in
//! `Inventory.labels`, and the rules both sides check them by — the agent before it
//! registers, the orchestrator when it receives them.
//!
//! The rules are those of Kubernetes labels, a little simplified: a key is 1 to
//! [`MAX_KEY_CHARS`] characters, a value 1 to [`MAX_VALUE_CHARS`], both of ASCII
//! letters, digits, `.`, `_`, `-` and `/`, beginning and ending with a letter or a
//! digit (`zone`, `topology.kubernetes.io/zone`, `lab-a`); a node has at most
//! [`MAX_LABELS`]. Keys and values are compared exactly (case matters).

use std::collections::BTreeMap;
use std::fmt;

/// Longest label key, in characters (a DNS subdomain's limit).
pub const MAX_KEY_CHARS: usize = 253;
/// Longest label value, in characters (a DNS label's limit).
pub const MAX_VALUE_CHARS: usize = 63;
/// Most labels one node may carry.
pub const MAX_LABELS: usize = 64;

/// Longest part of a key or value quoted in a message: an agent could send anything.
const SHOWN_CHARS: usize = 80;

/// What a label is wrong about. [`Display`](fmt::Display) gives the problem and how to
/// fix it; [`problem`](LabelError::problem) and [`help`](LabelError::help) give them
/// apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LabelError {
    /// `KEY=VALUE` written without `=`.
    NotKeyValue {
        /// What was written.
        text: String,
    },
    /// The key is empty.
    EmptyKey {
        /// The label's value.
        value: String,
    },
    /// The value is empty.
    EmptyValue {
        /// The label's key.
        key: String,
    },
    /// A key or value longer than its limit.
    TooLong {
        /// The label's key.
        key: String,
        /// The value, when it is the value that is too long.
        value: Option<String>,
        /// Its length in characters.
        chars: usize,
    },
    /// A character outside letters, digits, `.`, `_`, `-` and `/`.
    BadCharacter {
        /// The label's key.
        key: String,
        /// The value, when the character is in the value.
        value: Option<String>,
        /// The character.
        found: char,
    },
    /// A key or value that begins or ends with `.`, `_`, `-` or `/`.
    BadEdge {
        /// The label's key.
        key: String,
        /// The value, when it is the value.
        value: Option<String>,
    },
    /// The same key given twice with different values.
    Duplicate {
        /// The key.
        key: String,
        /// The first value.
        first: String,
        /// The second.
        second: String,
    },
    /// More than [`MAX_LABELS`] labels.
    TooMany {
        /// How many were given.
        count: usize,
    },
}

/// `text` for a message: control characters escaped, cut after [`SHOWN_CHARS`].
fn shown(text: &str) -> String {
    let mut out: String = text.chars().take(SHOWN_CHARS).flat_map(char::escape_debug).collect();
    if text.chars().nth(SHOWN_CHARS).is_some() {
        out.push('…');
    }
    out
}

impl LabelError {
    /// What is wrong.
    pub fn problem(&self) -> String {
        match self {
            LabelError::NotKeyValue { text } => format!("`{}` is not a label", shown(text)),
            LabelError::EmptyKey { value } => format!("label `={}` has no key", shown(value)),
            LabelError::EmptyValue { key } => format!("label `{}` has an empty value", shown(key)),
            LabelError::TooLong {
                key,
                value: None,
                chars,
            } => format!(
                "label key `{}` is {chars} characters long; a key has at most {MAX_KEY_CHARS}",
                shown(key)
            ),
            LabelError::TooLong {
                key,
                value: Some(_),
                chars,
            } => format!(
                "the value of label `{}` is {chars} characters long; a value has at most {MAX_VALUE_CHARS}",
                shown(key)
            ),
            LabelError::BadCharacter {
                key,
                value: None,
                found,
            } => {
                format!("label key `{}` contains {found:?}", shown(key))
            }
            LabelError::BadCharacter {
                key,
                value: Some(value),
                found,
            } => format!(
                "the value `{}` of label `{}` contains {found:?}",
                shown(value),
                shown(key)
            ),
            LabelError::BadEdge { key, value: None } => {
                format!("label key `{}` begins or ends with a symbol", shown(key))
            }
            LabelError::BadEdge {
                key,
                value: Some(value),
            } => format!(
                "the value `{}` of label `{}` begins or ends with a symbol",
                shown(value),
                shown(key)
            ),
            LabelError::Duplicate { key, first, second } => format!(
                "label `{}` is given twice, as `{}` and as `{}`",
                shown(key),
                shown(first),
                shown(second)
            ),
            LabelError::TooMany { count } => {
                format!("{count} labels; a node carries at most {MAX_LABELS}")
            }
        }
    }

    /// Whether the problem is in the label's value (rather than its key, or the labels
    /// as a whole), for pointing at it.
    pub fn in_value(&self) -> bool {
        matches!(
            self,
            LabelError::EmptyValue { .. }
                | LabelError::TooLong { value: Some(_), .. }
                | LabelError::BadCharacter { value: Some(_), .. }
                | LabelError::BadEdge { value: Some(_), .. }
        )
    }

    /// How to fix it.
    pub fn help(&self) -> String {
        match self {
            LabelError::NotKeyValue { .. } => "write KEY=VALUE, such as `zone=lab-a`".to_owned(),
            LabelError::EmptyKey { value } if value.is_empty() => "write KEY=VALUE, such as `zone=lab-a`".to_owned(),
            LabelError::EmptyKey { value } => format!("write KEY=VALUE, such as `zone={}`", shown(value)),
            LabelError::EmptyValue { .. } => "give it a value (such as `lab-a`), or leave the label out".to_owned(),
            LabelError::TooLong { .. } => "shorten it".to_owned(),
            LabelError::BadCharacter { .. } => "use only ASCII letters, digits, `.`, `_`, `-` and `/`".to_owned(),
            LabelError::BadEdge { .. } => "begin and end it with a letter or a digit".to_owned(),
            LabelError::Duplicate { .. } => "give each key once".to_owned(),
            LabelError::TooMany { .. } => "leave some out".to_owned(),
        }
    }
}

impl fmt::Display for LabelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.problem(), self.help())
    }
}

impl std::error::Error for LabelError {}

fn allowed(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '/')
}

/// Checks one key or value (`value` is `Some` for a value, with the label's key).
fn check_text(key: &str, value: Option<&str>, max: usize) -> Result<(), LabelError> {
    let text = value.unwrap_or(key);
    let owned_value = || value.map(str::to_owned);
    if let Some(found) = text.chars().find(|&c| !allowed(c)) {
        return Err(LabelError::BadCharacter {
            key: key.to_owned(),
            value: owned_value(),
            found,
        });
    }
    // Only ASCII from here: bytes are characters.
    let edge_ok = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    if !edge_ok(text.chars().next()) || !edge_ok(text.chars().next_back()) {
        return Err(LabelError::BadEdge {
            key: key.to_owned(),
            value: owned_value(),
        });
    }
    if text.len() > max {
        return Err(LabelError::TooLong {
            key: key.to_owned(),
            value: owned_value(),
            chars: text.len(),
        });
    }
    Ok(())
}

/// Checks one label: its key, then its value.
pub fn check(key: &str, value: &str) -> Result<(), LabelError> {
    if key.is_empty() {
        return Err(LabelError::EmptyKey {
            value: value.to_owned(),
        });
    }
    check_text(key, None, MAX_KEY_CHARS)?;
    if value.is_empty() {
        return Err(LabelError::EmptyValue { key: key.to_owned() });
    }
    check_text(key, Some(value), MAX_VALUE_CHARS)
}

/// Checks a node's labels: each of them, and how many there are.
pub fn check_all(labels: &BTreeMap<String, String>) -> Result<(), LabelError> {
    if labels.len() > MAX_LABELS {
        return Err(LabelError::TooMany { count: labels.len() });
    }
    labels.iter().try_for_each(|(key, value)| check(key, value))
}

/// One label as written on a command line: `KEY=VALUE` (split at the first `=`,
/// surrounding spaces ignored), checked.
pub fn parse(text: &str) -> Result<(String, String), LabelError> {
    let text = text.trim();
    let Some((key, value)) = text.split_once('=') else {
        return Err(LabelError::NotKeyValue { text: text.to_owned() });
    };
    check(key, value)?;
    Ok((key.to_owned(), value.to_owned()))
}

/// Labels from pairs in order (each already checked by [`parse`]): a key given twice
/// with different values is refused; given twice alike, it counts once.
pub fn collect(pairs: impl IntoIterator<Item = (String, String)>) -> Result<BTreeMap<String, String>, LabelError> {
    let mut labels: BTreeMap<String, String> = BTreeMap::new();
    for (key, value) in pairs {
        match labels.get(&key) {
            Some(first) if *first != value => {
                return Err(LabelError::Duplicate {
                    first: first.clone(),
                    key,
                    second: value,
                });
            }
            _ => {
                labels.insert(key, value);
            }
        }
    }
    if labels.len() > MAX_LABELS {
        return Err(LabelError::TooMany { count: labels.len() });
    }
    Ok(labels)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn good_labels_parse() {
        assert_eq!(parse("zone=lab-a"), Ok(("zone".to_owned(), "lab-a".to_owned())));
        assert_eq!(
            parse(" topology.kubernetes.io/zone=eu-west-1a "),
            Ok(("topology.kubernetes.io/zone".to_owned(), "eu-west-1a".to_owned()))
        );
        // Split at the first `=`: a value cannot hold one, so this is refused for it.
        assert!(matches!(
            parse("a=b=c"),
            Err(LabelError::BadCharacter { found: '=', .. })
        ));
        assert_eq!(parse("Rack_2=R.12"), Ok(("Rack_2".to_owned(), "R.12".to_owned())));
        assert_eq!(parse("x=1"), Ok(("x".to_owned(), "1".to_owned())));
        let longest_value = "v".repeat(MAX_VALUE_CHARS);
        assert!(check("k", &longest_value).is_ok());
        assert!(check(&"k".repeat(MAX_KEY_CHARS), "v").is_ok());
    }

    #[test]
    fn bad_labels_say_what_is_wrong_and_how_to_fix_it() {
        let message = |text: &str| parse(text).unwrap_err().to_string();
        let charset = "use only ASCII letters, digits, `.`, `_`, `-` and `/`";
        let edges = "begin and end it with a letter or a digit";
        assert_eq!(
            message("zone"),
            "`zone` is not a label: write KEY=VALUE, such as `zone=lab-a`"
        );
        assert_eq!(
            message("=lab-a"),
            "label `=lab-a` has no key: write KEY=VALUE, such as `zone=lab-a`"
        );
        assert_eq!(
            message("="),
            "label `=` has no key: write KEY=VALUE, such as `zone=lab-a`"
        );
        assert_eq!(
            message("zone="),
            "label `zone` has an empty value: give it a value (such as `lab-a`), or leave the label out"
        );
        assert_eq!(
            message("zone=lab a"),
            format!("the value `lab a` of label `zone` contains ' ': {charset}")
        );
        assert_eq!(message("zöne=a"), format!("label key `zöne` contains 'ö': {charset}"));
        assert_eq!(
            message("-zone=a"),
            format!("label key `-zone` begins or ends with a symbol: {edges}")
        );
        assert_eq!(
            message("zone=lab-"),
            format!("the value `lab-` of label `zone` begins or ends with a symbol: {edges}")
        );
        assert_eq!(
            message(&format!("zone={}", "a".repeat(64))),
            "the value of label `zone` is 64 characters long; a value has at most 63: shorten it"
        );
        assert_eq!(
            message(&format!("{}=a", "k".repeat(254))),
            format!(
                "label key `{}…` is 254 characters long; a key has at most 253: shorten it",
                "k".repeat(80)
            )
        );
        // Control characters are shown escaped, never printed.
        assert_eq!(
            check("zone", "a\nb").unwrap_err().problem(),
            "the value `a\\nb` of label `zone` contains '\\n'"
        );
        // Which part is wrong, for pointing at it.
        assert!(check("zone", "a b").unwrap_err().in_value());
        assert!(check("zone", "").unwrap_err().in_value());
        assert!(!check("zo ne", "a").unwrap_err().in_value());
    }

    #[test]
    fn collecting_refuses_a_key_given_twice_differently_and_too_many() {
        let pair = |k: &str, v: &str| (k.to_owned(), v.to_owned());
        let labels = collect([pair("zone", "a"), pair("rack", "r1"), pair("zone", "a")]).unwrap();
        assert_eq!(labels.len(), 2);
        let error = collect([pair("zone", "a"), pair("zone", "b")]).unwrap_err();
        assert_eq!(
            error.to_string(),
            "label `zone` is given twice, as `a` and as `b`: give each key once"
        );
        let many = (0..=MAX_LABELS).map(|i| pair(&format!("k{i}"), "v"));
        assert_eq!(collect(many).unwrap_err(), LabelError::TooMany { count: 65 });

        let mut map = BTreeMap::new();
        map.insert("zone".to_owned(), "lab-a".to_owned());
        assert!(check_all(&map).is_ok());
        map.insert(String::new(), "x".to_owned());
        assert_eq!(
            check_all(&map).unwrap_err(),
            LabelError::EmptyKey { value: "x".to_owned() }
        );
    }
}
