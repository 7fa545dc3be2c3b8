//! A turn of a session: its messages checked against the history they join (tool
//! results answer calls made before them), the request body within the history budget
//! (tool calls and results in OpenAI's form, the turn's `tools` and other fields), the
//! engine call, the reply stored with the turn, its tool calls with it (retried on a
//! smaller history when the context is exceeded).

use skein_dsl::ir::Agent;

use crate::auth::Principal;
use crate::engine_client::{self, Answer, CallError, Pieces, Route};
use crate::run::Pin;
use crate::session::limits::RequestSize;
use crate::session::record::{self, MessageRecord, NewMessage, Role};

use super::*;

impl Sessions {
    /// One turn: the messages are checked ([`record::check_turn`]) and stored, the agent
    /// answers with the whole history (as much as fits its context), the reply (with
    /// the tools it calls) is stored, then returned.
    ///
    /// Errors: [`SessionError`].
    pub async fn send(&self, principal: &Principal, id: &str, mut turn: Turn) -> Result<Reply, SessionError> {
        let found = self.get(principal, id)?;
        self.inner
            .config
            .limits
            .check(RequestSize::of_messages(&turn.messages))?;
        record::check_messages(&turn.messages)?;
        turn.sampling.check()?;
        if turn.messages.is_empty() {
            return Err(SessionError::Invalid(
                "no message to send; give `content` or `messages`".to_owned(),
            ));
        }
        if let Some(key) = &turn.idempotency_key {
            record::check_idempotency_key(key)?;
        }
        let gate = self.turn_lock(id);
        let _turn = gate.lock().await;
        let store = self.inner.log.store();
        if let Some(key) = &turn.idempotency_key
            && let Some(done) = store.idempotent(id, &reply_key(key))?
            && let Some(message) = store.messages(id, done.first, 1)?.pop()
        {
            let session = self.get(principal, id)?;
            return Ok(Reply {
                session,
                message,
                replayed: true,
            });
        }
        // The messages as they join the history (a retry's were stored the first time,
        // and are answered from there by the append).
        let stored_before = match &turn.idempotency_key {
            Some(key) => store.idempotent(id, key)?.is_some(),
            None => false,
        };
        if !stored_before {
            // Only tool results and assistant messages are checked against the history.
            let history = if turn
                .messages
                .iter()
                .any(|m| matches!(m.role, Role::Assistant | Role::Tool))
            {
                store.recent(id, history_budget(&found.definition, turn.sampling.max_tokens))?
            } else {
                Vec::new()
            };
            turn.messages = record::check_turn(&history, std::mem::take(&mut turn.messages))?;
        }
        let appended = self
            .inner
            .log
            .append(id, std::mem::take(&mut turn.messages), turn.idempotency_key.clone())
            .await?;
        let mut session = appended.session;
        if !turn.reply {
            let message = appended
                .messages
                .into_iter()
                .last()
                .ok_or_else(|| SessionError::Store("the messages were not stored".to_owned()))?;
            return Ok(Reply {
                session,
                message,
                replayed: appended.replayed,
            });
        }
        let (mut route, bound) = self.route(&session, &Pin::Anywhere).await?;
        session = bound.unwrap_or(session);
        self.note_run(&route, session.run.as_deref());
        let mut budget = self.turn_budget(&session.definition, turn.sampling.max_tokens, &route);
        let mut history = store.recent(id, budget)?;
        let mut body = self.request_body(&session.definition, &history, &turn);
        // The run's agent this session talks to: an endpoint's requests count under it.
        let serves = session.run.as_deref().map(|r| (r, session.agent.as_str()));
        let mut answer = self
            .call(
                &route,
                serves,
                Some(id),
                &principal.user,
                body.clone(),
                turn.tokens.as_ref(),
            )
            .await;
        if let Err(CallError::Unreachable(error)) = &answer
            && route.instance.is_some()
        {
            // The instance went away mid-turn: once more, elsewhere (a remote endpoint
            // has no elsewhere: its error is the answer).
            tracing::warn!(session = %id, %error, "the session's instance is unreachable; moving it");
            let avoid = match &session.binding {
                Some(b) => Pin::avoid(&b.node, &b.gpus),
                None => Pin::Anywhere,
            };
            (route, _) = self.route_fresh(&session, &avoid).await?;
            self.note_run(&route, session.run.as_deref());
            answer = self
                .call(
                    &route,
                    serves,
                    Some(id),
                    &principal.user,
                    body.clone(),
                    turn.tokens.as_ref(),
                )
                .await;
        }
        // Refused: most likely the history is longer in tokens than its bytes promised
        // (text of few bytes per token). Halve what is sent, a few times.
        let mut shrunk = 0;
        while let Err(CallError::Refused(error)) = &answer
            && shrunk < HISTORY_SHRINKS
            && history.len() > 1
        {
            tracing::info!(session = %id, %error, "the engine refused the turn; sending less history");
            shrunk += 1;
            let sent: usize = history
                .iter()
                .map(|m| m.text_bytes() + crate::session::store::MESSAGE_OVERHEAD_BYTES)
                .sum();
            budget = budget.min(sent) / 2;
            history = store.recent(id, budget)?;
            body = self.request_body(&session.definition, &history, &turn);
            answer = self
                .call(
                    &route,
                    serves,
                    Some(id),
                    &principal.user,
                    body.clone(),
                    turn.tokens.as_ref(),
                )
                .await;
        }
        let answer = answer.map_err(engine_error)?;
        let reply = NewMessage {
            instance: route.instance.clone(),
            usage: answer.usage,
            ..NewMessage::calling(answer.content, answer.tool_calls)
        };
        let stored = self
            .inner
            .log
            .append(id, vec![reply], turn.idempotency_key.as_deref().map(reply_key))
            .await?;
        let message = stored
            .messages
            .into_iter()
            .next()
            .ok_or_else(|| SessionError::Store("the reply was not stored".to_owned()))?;
        Ok(Reply {
            session: stored.session,
            message,
            replayed: false,
        })
    }

    /// Calls the engine of `route` (for `session`'s turn, sent by `user`), counted in
    /// the instance's serving figures, or, for a remote endpoint serving the agent of a
    /// run (`serves`: run and agent), in the agent's; the instance records `user` among
    /// its users (its logs may hold their prompt from now on).
    pub(super) async fn call<S: Pieces>(
        &self,
        route: &Route,
        serves: Option<(&str, &str)>,
        session: Option<&str>,
        user: &str,
        body: serde_json::Value,
        tokens: Option<&S>,
    ) -> Result<Answer, CallError> {
        let timeout = self.inner.config.reply_timeout;
        if let Some(instance) = &route.instance {
            self.inner.instances.used_by(instance, user);
        }
        let counted = crate::load::counted_under(route.instance.as_deref(), serves);
        let flight = counted.map(|key| self.inner.instances.load().begin(&key, session));
        let answer = match tokens {
            Some(tokens) => {
                engine_client::call_streaming(self.inner.executor.clients(), route, body, timeout, tokens).await
            }
            None => engine_client::call(self.inner.executor.clients(), route, body, timeout).await,
        };
        if let (Some(flight), Ok(answer)) = (flight, &answer) {
            flight.done(answer.usage.map_or(0, |u| u.completion_tokens));
        }
        if let Ok(answer) = &answer {
            // Counted for the caller, under the model served (and the run's agent).
            let model = crate::sharing::accounting::model_served(&self.inner.instances, route);
            let agent = serves.map_or("", |(_, agent)| agent);
            self.inner
                .executor
                .sharing()
                .record_api_call(user, &model, agent, answer.usage, crate::base::unix_ms());
        }
        if let (Some(instance), Ok(answer)) = (&route.instance, &answer)
            && let Some(rate) = answer.decode_tokens_per_s
        {
            self.inner.executor.record_speed(instance, rate);
        }
        answer
    }

    /// `run`'s agent sent a request to the instance of `route` (if it is one): the run
    /// is among the runs it served.
    pub(super) fn note_run(&self, route: &Route, run: Option<&str>) {
        if let (Some(instance), Some(run)) = (&route.instance, run) {
            self.inner.instances.served_run(instance, run);
        }
    }

    /// The bytes of history a turn on `route` may send: [`history_budget`], within the
    /// context the instance was planned with (a session on a model named alone may be
    /// served by an instance of a smaller context than the default).
    pub(super) fn turn_budget(&self, agent: &Agent, max_tokens: Option<u32>, route: &Route) -> usize {
        let budget = history_budget(agent, max_tokens);
        let planned = route
            .instance
            .as_deref()
            .and_then(|name| self.inner.instances.get(name))
            .and_then(|view| view.placement.as_ref().map(|p| p.context));
        match planned {
            Some(context) => {
                let reply = u64::from(max_tokens.or(agent.max_tokens).unwrap_or(0));
                let bytes = context.saturating_sub(reply).saturating_mul(BYTES_PER_TOKEN as u64);
                budget.min(usize::try_from(bytes).unwrap_or(usize::MAX))
            }
            None => budget,
        }
    }

    /// The chat request of a turn: the agent's system prompt, then `history` (the most
    /// recent messages that fit the model's context, [`history_budget`]) in OpenAI's
    /// form, tool calls and results among them ([`record::openai_history`]), with the
    /// turn's fields (`tools`, …) and sampling.
    pub(super) fn request_body(&self, agent: &Agent, history: &[MessageRecord], turn: &Turn) -> serde_json::Value {
        engine_body(
            agent.system.as_deref(),
            record::openai_history(history),
            turn.fields.clone(),
            &turn.sampling,
            agent,
        )
    }
}
