//! Replicas split across nodes: recorded while their pieces start, served once they
//! are ready, broken when a piece fails.

use std::collections::BTreeSet;

use skein_proto::agent::v1::{self as pb};

use crate::base::lock;

use super::{
    Entry, InstanceError, InstanceRequest, InstanceState, Instances, engine_key, requested_view, start_message,
    stop_message,
};

impl Instances {
    /// Records a replica split across nodes whose pieces are about to start: it has no
    /// command of its own until they are ready ([`Instances::start_serving`]).
    pub(crate) fn record_split(&self, request: InstanceRequest, pieces: Vec<String>) {
        let name = request.start.instance.clone();
        let mut view = requested_view(&request);
        view.pieces = pieces;
        view.detail = "starting its pieces on the other nodes".to_owned();
        lock(&self.entries).insert(
            name,
            Entry {
                view,
                node: request.node,
                users: BTreeSet::new(),
                history_known: true,
                start: None,
                orphan_since: None,
                credit: 0.0,
                broken: false,
            },
        );
        self.bump();
    }

    /// A split replica's pieces are ready: its serving engine starts with `start`.
    /// Errors as [`Instances::start`]; an unknown name (stopped meanwhile) sends nothing.
    pub(crate) fn start_serving(&self, mut start: pb::StartInstance) -> Result<(), InstanceError> {
        let (node, node_name) = {
            let mut entries = lock(&self.entries);
            let Some(entry) = entries.get_mut(&start.instance) else {
                return Err(InstanceError::Unknown(start.instance.clone()));
            };
            let key = engine_key(&start, entry.view.engine_key.clone())?;
            start.engine_api_key = key.as_ref().map(|k| k.expose().to_owned()).unwrap_or_default();
            entry.view.engine_key = key;
            entry.start = Some(start.clone());
            entry.view.gpus = start.gpus.clone();
            entry.view.detail = "its pieces are ready; starting the engine".to_owned();
            (entry.node.clone(), entry.view.node_name.clone())
        };
        self.bump();
        self.send(&node, &node_name, start_message(start))
    }

    /// Shows how a split replica's pieces stand while they start: `detail`, and their
    /// download progress added up.
    pub(crate) fn forming(&self, name: &str, detail: String, downloaded: u64, total: u64) {
        let changed = match lock(&self.entries).get_mut(name) {
            Some(entry) if entry.start.is_none() && !entry.broken => {
                let view = &mut entry.view;
                let state = if total > downloaded {
                    InstanceState::Downloading
                } else {
                    InstanceState::Starting
                };
                let changed = view.detail != detail || view.downloaded != downloaded || view.state != state;
                view.state = state;
                view.detail = detail;
                view.downloaded = downloaded;
                view.download_total = total;
                changed
            }
            _ => false,
        };
        if changed {
            self.bump();
        }
    }

    /// A split replica failed through a piece: it takes `state` (failed, or lost with
    /// the piece's node) and `detail`, which its own engine's reports no longer change,
    /// and its serving engine and pieces stop. The entry stays, for its run to see.
    pub(crate) fn break_split(
        &self,
        name: &str,
        state: InstanceState,
        detail: String,
        failed_on: Option<(String, Vec<u32>)>,
    ) {
        let (entry_node, node_name, pieces, serving) = {
            let mut entries = lock(&self.entries);
            let Some(entry) = entries.get_mut(name) else { return };
            entry.broken = true;
            entry.view.state = state;
            entry.view.detail = detail;
            entry.view.base_url = None;
            entry.view.failed_on = failed_on;
            (
                entry.node.clone(),
                entry.view.node_name.clone(),
                entry.view.pieces.clone(),
                entry.start.is_some(),
            )
        };
        self.load.forget(name);
        self.bump();
        if serving {
            let _ = self.send(&entry_node, &node_name, stop_message(name));
        }
        for piece in pieces.iter().rev() {
            let _ = self.stop(piece);
        }
    }
}
