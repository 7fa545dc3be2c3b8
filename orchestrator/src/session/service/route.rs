//! Where a session is served: its binding followed or placed afresh, migrations to
//! another instance, and the sessions bound to given instances.

use std::time::Instant;

use skein_dsl::ir::Backend;

use crate::auth::Principal;
use crate::engine_client::Route;
use crate::instances::InstanceState;
use crate::run::Pin;
use crate::session::record::SessionRecord;

use super::*;

impl Sessions {
    /// Moves a session to another instance: started (or found) first while the session
    /// keeps serving, then the binding switches in one durable write.
    ///
    /// Errors: [`SessionError`].
    pub async fn migrate(&self, principal: &Principal, id: &str, to: MoveTo) -> Result<Migration, SessionError> {
        let session = self.get(principal, id)?;
        if matches!(session.definition.backend, Backend::Endpoint(_)) {
            return Err(SessionError::Invalid(format!(
                "session `{id}` talks to a remote endpoint; it runs on no GPU of this fleet"
            )));
        }
        let pin = match (&to, &session.binding) {
            (MoveTo::Node(node), _) => Pin::Node { node: node.clone() },
            (MoveTo::Gpu { node, gpu }, _) => Pin::Gpu {
                node: node.clone(),
                gpu: *gpu,
            },
            (MoveTo::Auto, Some(b)) => Pin::avoid(&b.node, &b.gpus),
            (MoveTo::Auto | MoveTo::Instance(_), None) => Pin::Anywhere,
            (MoveTo::Instance(_), Some(b)) => Pin::avoid(&b.node, &b.gpus),
        };
        let view = match &to {
            MoveTo::Instance(name) => self
                .inner
                .instances
                .get(name)
                .filter(|v| v.state == InstanceState::Ready && v.base_url.is_some())
                .ok_or_else(|| SessionError::Unavailable(format!("instance {name} is not ready")))?,
            _ => self
                .inner
                .executor
                .provide(
                    &session.agent,
                    &session.definition,
                    &pin,
                    context_wanted(session.run.as_deref()),
                )
                .await
                .map_err(provide_error)?,
        };
        let asked = Instant::now();
        let gate = self.turn_lock(id);
        let _turn = gate.lock().await;
        let waited = asked.elapsed();
        let switch = Instant::now();
        let from = self.get(principal, id)?.binding;
        let to = binding_of(&view);
        let session = self.inner.log.rebind(id, Some(to.clone()), true).await?;
        let downtime = switch.elapsed();
        tracing::info!(session = %id, from = ?from.as_ref().map(|b| &b.instance), to = %to.instance, ?downtime, "session moved");
        Ok(Migration {
            session,
            from,
            to,
            downtime,
            waited,
        })
    }

    /// Where the session's requests go now: its bound instance while it serves, else
    /// one provided (within `pin`) and bound. Returns the route and, when the binding
    /// changed, the session after the change.
    pub(super) async fn route(
        &self,
        session: &SessionRecord,
        pin: &Pin,
    ) -> Result<(Route, Option<SessionRecord>), SessionError> {
        if let Backend::Endpoint(endpoint) = &session.definition.backend {
            return Ok((self.endpoint_route(&session.owner, endpoint)?, None));
        }
        if let Some(binding) = &session.binding
            && let Some(view) = self.inner.instances.touch(&binding.instance)
            && view.state == InstanceState::Ready
            && view.base_url.is_some()
        {
            return Ok((instance_route(view, &session.definition)?, None));
        }
        self.route_fresh(session, pin).await
    }

    /// A newly provided instance for the session (within `pin`), bound durably.
    pub(super) async fn route_fresh(
        &self,
        session: &SessionRecord,
        pin: &Pin,
    ) -> Result<(Route, Option<SessionRecord>), SessionError> {
        let view = self
            .inner
            .executor
            .provide(
                &session.agent,
                &session.definition,
                pin,
                context_wanted(session.run.as_deref()),
            )
            .await
            .map_err(provide_error)?;
        let route = instance_route(view.clone(), &session.definition)?;
        let updated = self
            .inner
            .log
            .rebind(&session.id, Some(binding_of(&view)), false)
            .await?;
        Ok((route, Some(updated)))
    }

    /// The route to a remote endpoint, with `owner`'s secret as its key.
    pub(super) fn endpoint_route(
        &self,
        owner: &str,
        endpoint: &skein_dsl::ir::Endpoint,
    ) -> Result<Route, SessionError> {
        self.inner
            .executor
            .clients()
            .endpoint_route(owner, endpoint)
            .map_err(engine_error)
    }

    /// Every session bound to one of `instances` (of any user), oldest first.
    ///
    /// Errors: the store failed.
    pub fn bound_to(&self, instances: &[String]) -> Result<Vec<SessionRecord>, SessionError> {
        let store = self.inner.log.store();
        let mut bound = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let page = store.sessions(None, after.as_deref(), MAX_PAGE)?;
            bound.extend(
                page.sessions
                    .into_iter()
                    .filter(|s| s.binding.as_ref().is_some_and(|b| instances.contains(&b.instance))),
            );
            match page.next {
                Some(next) => after = Some(next),
                None => return Ok(bound),
            }
        }
    }
}
