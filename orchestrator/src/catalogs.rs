//! The hub edge in front of the planner: the catalog ([`ModelInfo`]) of every model a
//! workflow names, read once per model key, and every LoRA adapter its agents name
//! ([`AdapterInfo`], config and header only), read once per pin, concurrently.

use std::collections::BTreeMap;
use std::sync::Arc;

use skein_dsl::Workflow;
use skein_dsl::ir::ModelRequirement;
use skein_model_registry::adapter::AdapterInfo;
use skein_model_registry::catalog::ModelInfo;
use skein_model_registry::hub::{DEFAULT_REVISION, HubClient, InspectOptions, RepoId, VariantPin};

use crate::plan::demand;

/// A model that could not be read.
#[derive(Debug, thiserror::Error)]
#[error("cannot read model {key} (agents {}) from the hub", agents.join(", "))]
pub struct CatalogError {
    /// The model key.
    pub key: String,
    /// The agents that name it.
    pub agents: Vec<String>,
    /// Why.
    #[source]
    pub source: skein_model_registry::Error,
}

fn pins(requirement: &ModelRequirement) -> Result<Vec<VariantPin>, skein_model_registry::Error> {
    requirement
        .variants
        .iter()
        .map(|p| {
            Ok(VariantPin {
                repo: RepoId::parse(&p.repo)?,
                revision: p.revision.clone(),
                file: p.file.clone(),
            })
        })
        .collect()
}

/// What the planner reads of the hub for a workflow.
#[derive(Debug, Clone, Default)]
pub struct Catalogs {
    /// Each model's catalog, by [`demand::model_key`].
    pub models: Arc<BTreeMap<String, ModelInfo>>,
    /// Each adapter, by [`demand::pin_key`].
    pub adapters: Arc<BTreeMap<String, AdapterInfo>>,
}

/// The catalog of every model `workflow` places, by [`demand::model_key`], and every
/// adapter its agents name; `options` sets how many derivatives to read (its pins are
/// replaced by each model's own).
pub async fn inspect_workflow(
    client: &HubClient,
    workflow: &Workflow,
    options: &InspectOptions,
) -> Result<Catalogs, CatalogError> {
    let instances = demand::instances(workflow);
    let (models, adapters) = futures::future::join(
        inspect_models(client, &instances, options),
        inspect_adapters(client, &instances),
    )
    .await;
    Ok(Catalogs {
        models: Arc::new(models?),
        adapters: Arc::new(adapters?),
    })
}

/// Every adapter the agents of `instances` name, by [`demand::pin_key`].
async fn inspect_adapters(
    client: &HubClient,
    instances: &[demand::Instance],
) -> Result<BTreeMap<String, AdapterInfo>, CatalogError> {
    let mut seen: BTreeMap<String, (skein_dsl::ir::VariantPin, Vec<String>)> = BTreeMap::new();
    for adapter in instances.iter().flat_map(|i| &i.adapters) {
        seen.entry(adapter.key.clone())
            .or_insert_with(|| (adapter.pin.clone(), Vec::new()))
            .1
            .extend(adapter.agents.iter().cloned());
    }
    let reads = seen.into_iter().map(|(key, (pin, agents))| async move {
        let fail = |source| CatalogError {
            key: format!("adapter {key}"),
            agents: agents.clone(),
            source,
        };
        let repo = RepoId::parse(&pin.repo).map_err(fail)?;
        let revision = pin.revision.as_deref().unwrap_or(DEFAULT_REVISION);
        let info = client
            .inspect_adapter_file(&repo, revision, pin.file.as_deref())
            .await
            .map_err(fail)?;
        Ok::<_, CatalogError>((key, info))
    });
    futures::future::join_all(reads).await.into_iter().collect()
}

/// The catalog of every model of `instances`, by [`demand::model_key`].
async fn inspect_models(
    client: &HubClient,
    instances: &[demand::Instance],
    options: &InspectOptions,
) -> Result<BTreeMap<String, ModelInfo>, CatalogError> {
    let mut seen = BTreeMap::new();
    for instance in instances {
        seen.entry(instance.key.clone())
            .or_insert_with(|| (instance.requirement.clone(), Vec::new()))
            .1
            .extend(instance.agents.iter().cloned());
    }
    let reads = seen.into_iter().map(|(key, (requirement, agents))| async move {
        let fail = |source| CatalogError {
            key: key.clone(),
            agents: agents.clone(),
            source,
        };
        let repo = RepoId::parse(&requirement.repo).map_err(fail)?;
        let revision = requirement
            .revision
            .clone()
            .unwrap_or_else(|| DEFAULT_REVISION.to_owned());
        let options = InspectOptions {
            pins: pins(&requirement).map_err(fail)?,
            ..options.clone()
        };
        let info = client.inspect(&repo, &revision, &options).await.map_err(fail)?;
        Ok::<_, CatalogError>((key, info))
    });
    futures::future::join_all(reads).await.into_iter().collect()
}
