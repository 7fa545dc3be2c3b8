//! Which parts of a run's record changed since it was read or last written. The store
//! keeps a run as its head (states, outputs, timestamps) and, under keys of their own,
//! each `for_each` item and each step's agent loop, so that a write carries what
//! changed and not the whole record: a fan-out of a thousand items or a long agent
//! loop costs the same per write as a step. Every rule of the record that changes an
//! item or a loop marks it here; the store drains the marks when it writes.

use std::collections::BTreeSet;

use super::RunRecord;

/// The parts of a run's record changed since it was read or last written. Not
/// serialized, and equal to any other: two records with the same contents are equal
/// whatever was written of them.
#[derive(Debug, Clone, Default)]
pub struct Changed {
    /// Steps whose items were all replaced (a list expanded, a new `repeat` pass).
    pub items_of: BTreeSet<String>,
    /// Single items, by step and index.
    pub items: BTreeSet<(String, u32)>,
    /// Steps whose own agent loop (`turns`) changed.
    pub turns_of: BTreeSet<String>,
}

impl PartialEq for Changed {
    fn eq(&self, _: &Changed) -> bool {
        true
    }
}

impl Changed {
    /// Whether nothing but the head changed.
    pub fn is_empty(&self) -> bool {
        self.items_of.is_empty() && self.items.is_empty() && self.turns_of.is_empty()
    }

    /// Adds `other`'s marks (a write that failed gives its marks back).
    pub fn merge(&mut self, other: Changed) {
        self.items_of.extend(other.items_of);
        self.items.extend(other.items);
        self.turns_of.extend(other.turns_of);
    }

    /// Step `id` changed whole: its items and its loop.
    pub(super) fn step(&mut self, id: &str) {
        self.items_of.insert(id.to_owned());
        self.turns_of.insert(id.to_owned());
    }
}

impl RunRecord {
    /// The parts changed since the record was read or last written, taken: the store
    /// writes them with the head.
    pub fn take_changed(&mut self) -> Changed {
        std::mem::take(&mut self.changed)
    }

    /// Gives back marks taken by [`take_changed`](Self::take_changed) for a write that
    /// failed.
    pub fn give_back_changed(&mut self, changed: Changed) {
        self.changed.merge(changed);
    }

    /// Marks every item and loop of every step as changed: a record read from an older
    /// store that kept them in the head, or one whose parts are to be written anew.
    pub fn mark_all_changed(&mut self) {
        for step in &self.steps {
            self.changed.step(&step.id);
        }
    }
}
