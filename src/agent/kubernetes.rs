//! What an agent learns from the Kubernetes pod it runs in.
//!
//! The agent DaemonSet (`deploy/kubernetes/base/agent/`) passes the pod's name and
//! namespace through the downward API as `SKEIN_POD_NAME` and `SKEIN_POD_NAMESPACE`
//! (`--pod-name`, `--pod-namespace`); the node carries them as the labels
//! [`POD_LABEL`] and [`NAMESPACE_LABEL`], so the graph and `skein nodes` say which pod
//! each node is. These are Skein's node labels, not Kubernetes objects' labels. A value
//! the label rules refuse (a pod name over 63 characters, which Kubernetes allows) is
//! left out with a warning: the agent still joins, only without that label.

use std::collections::BTreeMap;

use crate::cli::agent::PodArgs;

/// The label holding the agent's pod name.
pub const POD_LABEL: &str = "kubernetes.io/pod";
/// The label holding the agent's pod namespace.
pub const NAMESPACE_LABEL: &str = "kubernetes.io/namespace";

/// A node's `labels` (its fleet file's) with those of the pod its agent runs in added;
/// the command line's `--label`s are added over both later.
pub fn with_pod_labels(mut labels: BTreeMap<String, String>, pod: &PodArgs) -> BTreeMap<String, String> {
    labels.extend(pod_labels(pod));
    labels
}

/// The node labels of the pod an agent runs in: none outside Kubernetes.
fn pod_labels(pod: &PodArgs) -> BTreeMap<String, String> {
    [(POD_LABEL, &pod.pod_name), (NAMESPACE_LABEL, &pod.pod_namespace)]
        .into_iter()
        .filter_map(|(key, value)| {
            let value = value.as_deref().map(str::trim).filter(|v| !v.is_empty())?;
            match skein_proto::labels::check(key, value) {
                Ok(()) => Some((key.to_owned(), value.to_owned())),
                Err(error) => {
                    tracing::warn!(%error, "the node is not labelled with its pod's {key}");
                    None
                }
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: Option<&str>, namespace: Option<&str>) -> PodArgs {
        PodArgs {
            pod_name: name.map(str::to_owned),
            pod_namespace: namespace.map(str::to_owned),
        }
    }

    #[test]
    fn a_pods_name_and_namespace_become_labels() {
        let labels = pod_labels(&pod(Some("skein-agent-x7k2p"), Some("skein")));
        assert_eq!(
            labels,
            BTreeMap::from([
                (NAMESPACE_LABEL.to_owned(), "skein".to_owned()),
                (POD_LABEL.to_owned(), "skein-agent-x7k2p".to_owned()),
            ])
        );
    }

    #[test]
    fn outside_a_pod_there_are_none() {
        assert!(pod_labels(&pod(None, None)).is_empty());
        assert!(pod_labels(&pod(Some(""), Some("  "))).is_empty());
    }

    #[test]
    fn a_name_the_label_rules_refuse_is_left_out() {
        let long = format!("skein-agent-{}", "a".repeat(60));
        let labels = pod_labels(&pod(Some(&long), Some("skein")));
        assert_eq!(
            labels,
            BTreeMap::from([(NAMESPACE_LABEL.to_owned(), "skein".to_owned())])
        );
    }
}
