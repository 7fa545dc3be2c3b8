//! A replica split across nodes, brought up and watched: its pieces start wave by wave
//! on their nodes (a Ray head, then the Ray workers that join it; or llama.cpp's RPC
//! servers), each wave once the previous one is ready; then the serving engine starts on
//! the first node with the pieces' addresses. From then on, a piece that fails, restarts
//! or loses its node fails the replica with the piece's reason: its serving engine and
//! pieces stop (the last started first), and its run places it again.
//!
//! The pieces are instances of their own ([`InstanceView::part_of`]), so each node's
//! agent supervises, measures and logs them as any engine; the replica lists them
//! ([`InstanceView::pieces`]) and stops them when it stops.
//!
//! [`InstanceView::part_of`]: crate::instances::InstanceView::part_of
//! [`InstanceView::pieces`]: crate::instances::InstanceView::pieces

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::base::Lifecycle;
use crate::graph::NodeId;
use crate::instances::{InstanceRequest, InstanceState, InstanceView, Instances};
use crate::run::launch::{PieceStart, SplitLaunch};

/// Starts `split` (whose replica `request` describes, its command a template) and
/// spawns the task that brings it up and watches it, on `lifecycle`'s tracker (it ends
/// at its next wait once the server stops). `node_id` maps a node name to its id.
pub fn start(
    lifecycle: &Lifecycle,
    instances: &Arc<Instances>,
    request: InstanceRequest,
    split: SplitLaunch,
    node_id: impl Fn(&str) -> NodeId + Send + 'static,
) {
    let names = split.piece_names();
    let variant = request.variant.clone();
    let mut request = request;
    request.held = split.serving_held();
    instances.record_split(request, names);
    let shutdown = lifecycle.shutdown.clone();
    let instances = Arc::clone(instances);
    lifecycle.tasks.spawn(async move {
        tokio::select! {
            () = shutdown.cancelled() => {}
            () = bring_up(instances, variant, split, node_id) => {}
        }
    });
}

/// How the pieces started so far stand.
enum Pieces {
    /// The replica was stopped.
    Gone,
    /// A piece failed: the replica's new state, why, and where to avoid.
    Broken(InstanceState, String, Option<(String, Vec<u32>)>),
    /// Some are not ready yet: what they do, and their download progress.
    Waiting(String, u64, u64),
    /// All are ready, with their addresses.
    Ready(BTreeMap<String, String>),
}

fn check(instances: &Instances, replica: &str, started: &[PieceStart]) -> Pieces {
    let Some(main) = instances.get(replica) else {
        return Pieces::Gone;
    };
    if main.state.is_gone() {
        return Pieces::Gone;
    }
    let mut ready = BTreeMap::new();
    let mut waiting = Vec::new();
    let (mut downloaded, mut total) = (0, 0);
    for piece in started {
        let Some(view) = instances.get(&piece.name) else {
            return Pieces::Broken(
                InstanceState::Failed,
                format!("piece {} ({} on {}) disappeared", piece.name, piece.role, piece.node),
                None,
            );
        };
        if let Some(broken) = broken(piece, &view) {
            return broken;
        }
        downloaded += view.downloaded;
        total += view.download_total;
        match (view.state, view.base_url) {
            (InstanceState::Ready, Some(address)) => {
                ready.insert(piece.name.clone(), address);
            }
            (state, _) => waiting.push(format!(
                "{} on {}: {}",
                piece.role,
                piece.node,
                if view.detail.is_empty() {
                    format!("{state:?}").to_lowercase()
                } else {
                    view.detail.clone()
                }
            )),
        }
    }
    if waiting.is_empty() {
        Pieces::Ready(ready)
    } else {
        Pieces::Waiting(
            format!("waiting for its pieces: {}", waiting.join("; ")),
            downloaded,
            total,
        )
    }
}

/// The failure a piece's state means for its replica, if any: lost with its node, or
/// failed (also while restarting or unhealthy: the distributed engine does not survive
/// a piece that went away, so the replica is placed again as a whole).
fn broken(piece: &PieceStart, view: &InstanceView) -> Option<Pieces> {
    let what = format!("piece {} ({} on {})", piece.name, piece.role, piece.node);
    match view.state {
        InstanceState::Lost => Some(Pieces::Broken(
            InstanceState::Lost,
            format!("{what} was lost: {}", view.detail),
            None,
        )),
        InstanceState::Failed | InstanceState::Restarting | InstanceState::Unhealthy | InstanceState::Stopped => {
            let state = format!("{:?}", view.state).to_lowercase();
            Some(Pieces::Broken(
                InstanceState::Failed,
                format!("{what} {state}: {}", view.detail),
                Some((piece.node.clone(), piece.start.gpus.clone())),
            ))
        }
        _ => None,
    }
}

async fn bring_up(instances: Arc<Instances>, variant: String, split: SplitLaunch, node_id: impl Fn(&str) -> NodeId) {
    let replica = split.instance.clone();
    let mut changes = instances.subscribe();
    let mut started: Vec<PieceStart> = Vec::new();
    let mut ready = BTreeMap::new();
    let broke = |state, detail: String, failed_on| {
        tracing::warn!(instance = %replica, %detail, "a split replica failed");
        instances.break_split(&replica, state, detail, failed_on);
    };
    for wave in 0..split.waves() {
        let pieces = match split.wave(wave, &ready) {
            Ok(pieces) => pieces,
            Err(error) => return broke(InstanceState::Failed, error.to_string(), None),
        };
        for piece in pieces {
            let request = InstanceRequest {
                node: node_id(&piece.node),
                node_name: piece.node.clone(),
                run: None,
                agents: Vec::new(),
                engine: piece.role.to_owned(),
                variant: variant.clone(),
                estimated_bytes: piece.held.iter().map(|h| h.1).sum(),
                held: piece.held.clone(),
                warm_key: String::new(),
                serves: None,
                clone_of: None,
                placement: None,
                part_of: Some(replica.clone()),
                start: piece.start.clone(),
            };
            if let Err(error) = instances.start(request) {
                tracing::warn!(instance = %piece.name, %error, "piece not delivered yet; it is sent when the node connects");
            }
            started.push(piece);
        }
        loop {
            match check(&instances, &replica, &started) {
                Pieces::Gone => return,
                Pieces::Broken(state, detail, failed_on) => return broke(state, detail, failed_on),
                Pieces::Ready(addresses) => {
                    ready = addresses;
                    break;
                }
                Pieces::Waiting(detail, downloaded, total) => instances.forming(&replica, detail, downloaded, total),
            }
            if changes.changed().await.is_err() {
                return;
            }
        }
    }
    let serving = match split.serving(&ready) {
        Ok(start) => start,
        Err(error) => return broke(InstanceState::Failed, error.to_string(), None),
    };
    tracing::info!(instance = %replica, pieces = started.len(), "pieces ready; starting the serving engine");
    if let Err(error) = instances.start_serving(serving) {
        tracing::warn!(instance = %replica, %error, "start not delivered yet; it is sent when the node connects");
    }
    // Watch the pieces for as long as the replica lives.
    loop {
        match check(&instances, &replica, &started) {
            Pieces::Gone => return,
            Pieces::Broken(state, detail, failed_on) => return broke(state, detail, failed_on),
            Pieces::Waiting(..) | Pieces::Ready(_) => {}
        }
        if changes.changed().await.is_err() {
            return;
        }
    }
}
