//! Conditions over metrics that may have no data.
//!
//! A metric with no data (a GPU scope before its first sample, `gpu.*` of an agent
//! served by a remote endpoint, a latency with no answer in its window) is *absent*:
//! bound as `Value::AbsentNumber` or `Value::AbsentFlag` instead of a value. A comparison that
//! reads an absent value is *unknown*, and `&&`, `||` and `!` combine unknowns as in
//! Kleene's three-valued logic: `false && unknown` is false, `true || unknown` is true,
//! `!unknown` is unknown, and so is anything else an unknown decides. The condition's
//! value is [`Truth`]: a reflex fires only on `True` and lets go only on `False`.
//!
//! Rhai's `&&` and `||` take only booleans, so unknowns cannot flow through them as
//! values. Instead each comparison on an absent value is an *atom* (`gpu.util > 0.9`)
//! whose truth the evaluation chooses, and the condition is evaluated under every
//! assignment of the atoms it meets (short-circuits meet fewer): true under all of
//! them is `True`, false under all is `False`, otherwise `Unknown`. For and, or and not
//! over distinct comparisons this is exactly Kleene's logic; a condition that is true
//! whatever the absent values are (`x > 1 || !(x > 1)`) is `True`, as it should be.
//! Arithmetic on an absent value is absent (`gpu.temp - 10 > 70` is an atom too); any
//! other use of one (a function of it, a non-boolean result) makes the condition
//! `Unknown`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use rhai::{Engine, FLOAT, INT};

/// The value of a condition whose metrics may be absent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Truth {
    /// True whatever the absent metrics would read.
    True,
    /// False whatever the absent metrics would read.
    False,
    /// Decided by a metric with no data.
    Unknown,
}

impl Truth {
    /// `True` as `true`, the rest as `false`.
    pub fn holds(self) -> bool {
        self == Truth::True
    }
}

impl From<bool> for Truth {
    fn from(b: bool) -> Truth {
        if b { Truth::True } else { Truth::False }
    }
}

/// The most evaluations one condition gets over its atoms (2⁶: six distinct
/// comparisons on absent metrics); beyond, it is `Unknown`.
pub const MAX_EVALUATIONS: usize = 64;

/// The atoms of one condition's evaluations: the truth chosen for some, and those met
/// without one (taken as false in that evaluation).
#[derive(Debug, Default)]
pub(crate) struct Atoms {
    pub(crate) chosen: BTreeMap<String, bool>,
    pub(crate) met: Vec<String>,
}

impl Atoms {
    /// The truth of atom `key` in this evaluation.
    pub(crate) fn truth(&mut self, key: String) -> bool {
        if let Some(t) = self.chosen.get(&key) {
            return *t;
        }
        if !self.met.contains(&key) {
            self.met.push(key);
        }
        false
    }
}

/// An absent metric as Rhai sees it: its label (`gpu.util`, `(gpu.temp - 10)`) and,
/// while a condition is evaluated, the atoms of that evaluation.
#[derive(Debug, Clone)]
pub(crate) struct Absent {
    label: Arc<str>,
    flag: bool,
    atoms: Option<Arc<Mutex<Atoms>>>,
}

pub(crate) fn lock(atoms: &Mutex<Atoms>) -> std::sync::MutexGuard<'_, Atoms> {
    atoms.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Absent {
    /// The absent metric labelled `label`: a flag or a number, reading `atoms`.
    pub(crate) fn new(label: &str, flag: bool, atoms: Option<Arc<Mutex<Atoms>>>) -> Absent {
        Absent {
            label: Arc::from(label),
            flag,
            atoms,
        }
    }

    /// Whether this is a true-or-false metric.
    pub(crate) fn is_flag(&self) -> bool {
        self.flag
    }

    fn atom(&self, key: String) -> bool {
        match &self.atoms {
            Some(atoms) => lock(atoms).truth(key),
            None => false,
        }
    }

    fn derived(&self, label: String) -> Absent {
        Absent {
            label: Arc::from(label),
            flag: false,
            atoms: self.atoms.clone(),
        }
    }
}

/// The other side of a comparison, as an atom's key writes it.
fn show_float(x: FLOAT) -> String {
    format!("{x:?}")
}

/// The comparison operators and their mirror (`a < b` is `b > a`).
const COMPARISONS: [(&str, &str); 6] = [
    (">", "<"),
    (">=", "<="),
    ("<", ">"),
    ("<=", ">="),
    ("==", "=="),
    ("!=", "!="),
];

/// Registers the operators of absent values on `engine`.
pub(crate) fn register(engine: &mut Engine) {
    for (op, mirror) in COMPARISONS {
        engine.register_fn(op, move |a: Absent, b: FLOAT| {
            a.atom(format!("{} {op} {}", a.label, show_float(b)))
        });
        engine.register_fn(op, move |a: Absent, b: INT| {
            a.atom(format!("{} {op} {}", a.label, show_float(b as FLOAT)))
        });
        engine.register_fn(op, move |b: FLOAT, a: Absent| {
            a.atom(format!("{} {mirror} {}", a.label, show_float(b)))
        });
        engine.register_fn(op, move |b: INT, a: Absent| {
            a.atom(format!("{} {mirror} {}", a.label, show_float(b as FLOAT)))
        });
        engine.register_fn(op, move |a: Absent, b: Absent| {
            a.atom(format!("{} {op} {}", a.label, b.label))
        });
        engine.register_fn(op, move |a: Absent, b: bool| a.atom(format!("{} {op} {b}", a.label)));
        engine.register_fn(op, move |b: bool, a: Absent| {
            a.atom(format!("{} {mirror} {b}", a.label))
        });
    }
    for op in ["+", "-", "*", "/", "%"] {
        engine.register_fn(op, move |a: Absent, b: FLOAT| {
            a.derived(format!("({} {op} {})", a.label, show_float(b)))
        });
        engine.register_fn(op, move |a: Absent, b: INT| {
            a.derived(format!("({} {op} {})", a.label, show_float(b as FLOAT)))
        });
        engine.register_fn(op, move |b: FLOAT, a: Absent| {
            a.derived(format!("({} {op} {})", show_float(b), a.label))
        });
        engine.register_fn(op, move |b: INT, a: Absent| {
            a.derived(format!("({} {op} {})", show_float(b as FLOAT), a.label))
        });
        engine.register_fn(op, move |a: Absent, b: Absent| {
            a.derived(format!("({} {op} {})", a.label, b.label))
        });
    }
    engine.register_fn("-", |a: Absent| a.derived(format!("(-{})", a.label)));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::expr::{Context, Evaluator};
    use crate::value::{Bindings, Value};

    /// The truth of `condition` with `gpu.*` and `node.down` absent and the agent's
    /// queue at `queue`.
    fn truth(condition: &str, queue: f64) -> Truth {
        let ev = Evaluator::default();
        let compiled = ev.compile(condition, Context::Reflex).unwrap();
        let mut gpu: Vec<(&str, Value)> = ["util", "mem_used_frac", "temp", "power_frac", "ecc_rate"]
            .into_iter()
            .map(|metric| (metric, Value::AbsentNumber))
            .collect();
        gpu.push(("throttled", Value::AbsentFlag));
        let vars = Bindings::from([
            ("gpu".to_owned(), Value::map(gpu)),
            ("node".to_owned(), Value::map([("down", Value::AbsentFlag)])),
            (
                "agent".to_owned(),
                Value::map([
                    ("queue_depth", Value::Float(queue)),
                    ("latency_p95_ms", Value::AbsentNumber),
                ]),
            ),
        ]);
        ev.eval_truth(&compiled, &vars).unwrap()
    }

    #[test]
    fn a_comparison_on_an_absent_metric_is_unknown_and_so_is_its_negation() {
        assert_eq!(truth("gpu.util < 0.1", 0.0), Truth::Unknown);
        assert_eq!(truth("gpu.util > 0.9", 0.0), Truth::Unknown);
        assert_eq!(truth("!(gpu.util > 0.9)", 0.0), Truth::Unknown);
        assert_eq!(truth("gpu.util != 0.0", 0.0), Truth::Unknown);
        assert_eq!(truth("0.5 < gpu.temp", 0.0), Truth::Unknown);
        assert_eq!(truth("gpu.throttled", 0.0), Truth::Unknown);
        assert_eq!(truth("node.down", 0.0), Truth::Unknown);
        assert_eq!(truth("agent.latency_p95_ms > 500", 0.0), Truth::Unknown);
        // Arithmetic on an absent value is absent.
        assert_eq!(truth("gpu.temp - 10 > 70", 0.0), Truth::Unknown);
        assert_eq!(truth("-gpu.temp < 0", 0.0), Truth::Unknown);
    }

    #[test]
    fn and_or_not_follow_kleene_logic() {
        // A known side decides when it can.
        assert_eq!(truth("agent.queue_depth > 4 || gpu.util > 0.9", 5.0), Truth::True);
        assert_eq!(truth("gpu.util > 0.9 || agent.queue_depth > 4", 5.0), Truth::True);
        assert_eq!(truth("agent.queue_depth > 4 || gpu.util > 0.9", 1.0), Truth::Unknown);
        assert_eq!(truth("agent.queue_depth > 4 && gpu.util > 0.9", 1.0), Truth::False);
        assert_eq!(truth("gpu.util > 0.9 && agent.queue_depth > 4", 1.0), Truth::False);
        assert_eq!(truth("agent.queue_depth > 4 && gpu.util > 0.9", 5.0), Truth::Unknown);
        assert_eq!(truth("!(agent.queue_depth > 4 && gpu.util > 0.9)", 1.0), Truth::True);
        assert_eq!(truth("gpu.throttled && agent.queue_depth > 4", 1.0), Truth::False);
        assert_eq!(truth("gpu.throttled || agent.queue_depth > 4", 5.0), Truth::True);
        // Two unknowns of opposite sign stay unknown.
        assert_eq!(truth("gpu.util > 0.9 || !(gpu.temp > 50)", 0.0), Truth::Unknown);
        assert_eq!(truth("gpu.util > 0.9 || gpu.util < 0.2", 0.0), Truth::Unknown);
        // True whatever the value is.
        assert_eq!(truth("gpu.util > 0.9 || !(gpu.util > 0.9)", 0.0), Truth::True);
        assert_eq!(truth("gpu.util > 0.9 && !(gpu.util > 0.9)", 0.0), Truth::False);
    }

    #[test]
    fn present_values_evaluate_as_before_and_misuse_of_an_absent_one_is_unknown() {
        assert_eq!(truth("agent.queue_depth > 4", 5.0), Truth::True);
        assert_eq!(truth("agent.queue_depth > 4", 1.0), Truth::False);
        // Not a boolean, or a function of an absent value.
        assert_eq!(truth("gpu.util", 0.0), Truth::Unknown);
        assert_eq!(truth("abs(gpu.util) > 0.5", 0.0), Truth::Unknown);
        // Many distinct atoms: capped, unknown.
        let many = (0..10)
            .map(|i| format!("gpu.util > 0.{i}"))
            .collect::<Vec<_>>()
            .join(" || ");
        assert_eq!(truth(&many, 0.0), Truth::Unknown);
    }
}
