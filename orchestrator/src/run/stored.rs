//! Runs as the store keeps them: each run's head (its state, its steps' states and
//! outputs, the workflow and inputs) under its id in `runs`, and beside it, under keys
//! of their own, each `for_each` item (`run_items`, `RUN/STEP/INDEX`) and each step's
//! agent loop (`run_turns`, `RUN/STEP`). A write carries the head and the parts the
//! record marked changed ([`Changed`]), so a fan-out's thousandth item or a loop's
//! fiftieth call costs what its own part costs, not the whole record. Reading puts the
//! parts back: callers see whole [`RunRecord`]s.
//!
//! A head written by an older store, with its items and loops inline, reads as it is
//! and is marked wholly changed, so its next write moves them to their own keys.

use std::collections::BTreeMap;

use super::record::{Changed, ItemRecord, RunRecord, Turn};
use crate::store::{Db, StoreError, Tree, WriteBatch};

/// The runs of a database, head and parts.
#[derive(Clone)]
pub struct RunStore {
    heads: Tree<RunRecord>,
    items: Tree<ItemRecord>,
    turns: Tree<Vec<Turn>>,
}

impl RunStore {
    /// The runs of `db`.
    ///
    /// Errors: the trees cannot be opened.
    pub fn open(db: &Db) -> Result<RunStore, StoreError> {
        Ok(RunStore {
            heads: db.tree("runs")?,
            items: db.tree("run_items")?,
            turns: db.tree("run_turns")?,
        })
    }

    /// The database it is in.
    pub fn db(&self) -> &Db {
        self.heads.db()
    }

    /// Run `id`, whole.
    pub fn get(&self, id: &str) -> Result<Option<RunRecord>, StoreError> {
        self.heads.get(id)?.map(|head| self.whole(head)).transpose()
    }

    /// Every run, whole, oldest first (run ids are time-ordered).
    pub fn all(&self) -> Result<Vec<RunRecord>, StoreError> {
        self.heads.all()?.into_iter().map(|head| self.whole(head)).collect()
    }

    /// Every run's head, oldest first: its state and steps, without their `for_each`
    /// items and agent loops (for lists, which show neither; one read per run).
    pub fn heads(&self) -> Result<Vec<RunRecord>, StoreError> {
        self.heads.all()
    }

    /// Writes `run`'s head and its changed parts; returns once they are on disk. The
    /// marks are taken, and given back if the write fails.
    ///
    /// Errors: see [`Db::commit`].
    pub async fn put(&self, run: &mut RunRecord) -> Result<(), StoreError> {
        let mut batch = WriteBatch::new();
        let changed = self.add(&mut batch, run)?;
        let written = self.db().commit(batch).await;
        if written.is_err() {
            run.give_back_changed(changed);
        }
        written
    }

    /// [`put`](Self::put) from synchronous code (see [`Db::commit_blocking`]).
    pub fn put_blocking(&self, run: &mut RunRecord) -> Result<(), StoreError> {
        let mut batch = WriteBatch::new();
        let changed = self.add(&mut batch, run)?;
        let written = self.db().commit_blocking(batch);
        if written.is_err() {
            run.give_back_changed(changed);
        }
        written
    }

    /// Adds `run`'s head and changed parts to `batch` (a write of several trees);
    /// returns the marks taken, for the caller to give back if the batch is not
    /// written.
    ///
    /// Errors: the store cannot be read (a step whose items were replaced has its old
    /// ones removed).
    pub fn add(&self, batch: &mut WriteBatch, run: &mut RunRecord) -> Result<Changed, StoreError> {
        let changed = run.take_changed();
        let id = run.id.clone();
        let step_of = |step: &str| run.steps.iter().find(|s| s.id == step);
        for step in &changed.items_of {
            for old in self.items.prefixed(&format!("{id}/{step}/")) {
                batch.remove(&self.items, &old?.0);
            }
            for item in step_of(step).map(|s| s.items.as_slice()).unwrap_or_default() {
                batch.put(&self.items, &item_key(&id, step, item.index), item);
            }
        }
        for (step, index) in changed.items.iter().filter(|(s, _)| !changed.items_of.contains(s)) {
            let key = item_key(&id, step, *index);
            match step_of(step).and_then(|s| s.items.get(*index as usize)) {
                Some(item) => batch.put(&self.items, &key, item),
                None => batch.remove(&self.items, &key),
            };
        }
        for step in &changed.turns_of {
            let key = format!("{id}/{step}");
            match step_of(step).map(|s| &s.turns).filter(|t| !t.is_empty()) {
                Some(turns) => batch.put(&self.turns, &key, turns),
                None => batch.remove(&self.turns, &key),
            };
        }
        // The head without the parts: taken out while it is encoded, then put back.
        let parts: Vec<(Vec<ItemRecord>, Vec<Turn>)> = run
            .steps
            .iter_mut()
            .map(|s| (std::mem::take(&mut s.items), std::mem::take(&mut s.turns)))
            .collect();
        batch.put(&self.heads, &id, run);
        for (step, (items, turns)) in run.steps.iter_mut().zip(parts) {
            step.items = items;
            step.turns = turns;
        }
        Ok(changed)
    }

    /// `head` with its parts put back.
    fn whole(&self, mut head: RunRecord) -> Result<RunRecord, StoreError> {
        let mut items: BTreeMap<String, Vec<ItemRecord>> = BTreeMap::new();
        for part in self.items.prefixed(&format!("{}/", head.id)) {
            let (key, item) = part?;
            if let Some(step) = step_of_key(&head.id, &key) {
                items.entry(step.to_owned()).or_default().push(item);
            }
        }
        let mut turns: BTreeMap<String, Vec<Turn>> = BTreeMap::new();
        for part in self.turns.prefixed(&format!("{}/", head.id)) {
            let (key, loop_turns) = part?;
            if let Some(step) = key.strip_prefix(&format!("{}/", head.id)) {
                turns.insert(step.to_owned(), loop_turns);
            }
        }
        let mut inline = false;
        for step in &mut head.steps {
            inline |= !step.items.is_empty() || !step.turns.is_empty();
            if let Some(found) = items.remove(&step.id) {
                step.items = found;
            }
            if let Some(found) = turns.remove(&step.id) {
                step.turns = found;
            }
        }
        if inline {
            head.mark_all_changed();
        }
        Ok(head)
    }
}

/// The key of item `index` of `step` of run `run`: the index zero-padded, so that keys
/// sort in list order (a list has at most `MAX_ITEMS`, 10 000, items).
fn item_key(run: &str, step: &str, index: u32) -> String {
    format!("{run}/{step}/{index:05}")
}

/// The step of an item key of run `run`.
fn step_of_key<'k>(run: &str, key: &'k str) -> Option<&'k str> {
    key.strip_prefix(run)?
        .strip_prefix('/')?
        .rsplit_once('/')
        .map(|(step, _)| step)
}
