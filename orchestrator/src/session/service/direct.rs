//! Requests without a session, to a run's agent or a model named alone: one chat
//! completion ([`Sessions::complete_prompt`]) and one embedding request
//! ([`Sessions::embed`]).

use skein_proto::openai::{EmbeddingList, EmbeddingUsage};

use crate::engine_client::{self, Usage};

use super::*;

/// Where a request without a session goes.
struct Targeted {
    /// The agent's name (the model's, for a model named alone).
    agent: String,
    /// Its definition.
    definition: Agent,
    /// Its run, for a run's agent.
    run: Option<String>,
    /// The instance it is served by, when an instance serves it (not a remote endpoint).
    view: Option<InstanceView>,
}

impl Targeted {
    /// Whether the instance serving it runs an embedding model.
    fn embeds(&self) -> bool {
        self.view
            .as_ref()
            .and_then(|v| v.placement.as_ref())
            .is_some_and(|p| p.task.is_embed())
    }
}

impl Sessions {
    /// What `target` is, and the instance that serves it: the run's instance of the
    /// agent, else one provided for it (placed when none serves it); none for a remote
    /// endpoint.
    async fn target(&self, principal: &Principal, target: &Target) -> Result<Targeted, SessionError> {
        let (agent, definition, run) = match target {
            Target::RunAgent { run, agent } => {
                let definition = self.run_agent(principal, run, agent)?;
                (agent.clone(), definition, Some(run.clone()))
            }
            Target::Model(model) => (model.clone(), model_agent(model)?, None),
        };
        let view = match (
            &definition.backend,
            run.as_ref().and_then(|r| self.run_instance(r, &agent)),
        ) {
            (Backend::Endpoint(_), _) => None,
            (_, Some(view)) => Some(view),
            (_, None) => Some(
                self.inner
                    .executor
                    .provide(&agent, &definition, &Pin::Anywhere, context_wanted(run.as_deref()))
                    .await
                    .map_err(provide_error)?,
            ),
        };
        Ok(Targeted {
            agent,
            definition,
            run,
            view,
        })
    }

    /// The route of `targeted`: its instance's (its adapter selected), or its remote
    /// endpoint's with the key of the run's owner.
    fn targeted_route(&self, principal: &Principal, targeted: &Targeted) -> Result<Route, SessionError> {
        let Some(view) = &targeted.view else {
            let Backend::Endpoint(endpoint) = &targeted.definition.backend else {
                return Err(SessionError::Unavailable(format!(
                    "no instance serves `{}`",
                    targeted.agent
                )));
            };
            // An endpoint's key is the secret of the run's owner.
            let owner = match &targeted.run {
                Some(run) => match self.inner.executor.get(run)? {
                    Some(record) => record.owner,
                    None => principal.user.clone(),
                },
                None => principal.user.clone(),
            };
            return self.endpoint_route(&owner, endpoint);
        };
        Route::for_agent(view, Some(&targeted.definition))
            .map_err(SessionError::Unavailable)?
            .ok_or_else(|| SessionError::Unavailable(format!("instance {} has no address yet", view.name)))
    }

    /// One completion without a session: the prompt's messages, in OpenAI's form (tool
    /// calls and tool results among them), go as given (after the agent's system prompt
    /// when they have none) with its fields (`tools`, `tool_choice`, …) to the run's
    /// instance of the agent, or to an instance provided for the model. The caller has
    /// bounded its size (the chat limits, on the raw body).
    ///
    /// Errors: [`SessionError`]; [`SessionError::Invalid`] for an embedding model.
    pub async fn complete_prompt<S: Pieces>(
        &self,
        principal: &Principal,
        target: &Target,
        prompt: Prompt,
        sampling: Sampling,
        tokens: Option<&S>,
    ) -> Result<Answer, SessionError> {
        sampling.check()?;
        let targeted = self.target(principal, target).await?;
        if let Some(view) = &targeted.view {
            chat_only(view)?;
        }
        let route = self.targeted_route(principal, &targeted)?;
        let Targeted {
            agent, definition, run, ..
        } = targeted;
        self.note_run(&route, run.as_deref());
        let has_system = prompt.messages.iter().any(|m| m["role"] == "system");
        let system = if has_system { None } else { definition.system.as_deref() };
        let body = engine_body(system, prompt.messages, prompt.fields, &sampling, &definition);
        let serves = run.as_deref().map(|r| (r, agent.as_str()));
        self.call(&route, serves, None, &principal.user, body, tokens)
            .await
            .map_err(engine_error)
    }

    /// Embeddings of `inputs` vectors: `body` (OpenAI's request without `model`: its
    /// `input`, `encoding_format`, `dimensions`) goes to the run's instance of the agent,
    /// or to an instance provided for the model, started in pooling mode for an
    /// embedding model; a remote endpoint takes it as given. The answer has one vector
    /// per input, in order, under the name the request used; its tokens count for the
    /// caller like a completion's prompt. The caller has bounded the body's size.
    ///
    /// Errors: [`SessionError::Invalid`] for a model that generates (its instance serves
    /// no embeddings) or an engine that refused the request; [`SessionError::Engine`]
    /// for an answer without one vector per input; as a completion's otherwise.
    pub async fn embed(
        &self,
        principal: &Principal,
        target: &Target,
        body: serde_json::Value,
        inputs: usize,
    ) -> Result<EmbeddingList, SessionError> {
        let targeted = self.target(principal, target).await?;
        if let Some(view) = &targeted.view
            && !targeted.embeds()
        {
            let model = view
                .placement
                .as_ref()
                .map_or(view.variant.as_str(), |p| p.model.as_str());
            return Err(SessionError::Invalid(format!(
                "`{}` is served by {model}, which generates text and serves no embeddings; name an embedding model \
                 (a sentence-transformers repository, a bare `…Model` class, or a GGUF file with a pooling type)",
                targeted.agent
            )));
        }
        let route = self.targeted_route(principal, &targeted)?;
        self.note_run(&route, targeted.run.as_deref());
        let serves = targeted.run.as_deref().map(|r| (r, targeted.agent.as_str()));
        if let Some(instance) = &route.instance {
            self.inner.instances.used_by(instance, &principal.user);
        }
        let counted = crate::load::counted_under(route.instance.as_deref(), serves);
        let flight = counted.map(|key| self.inner.instances.load().begin(&key, None));
        let answer = engine_client::embed(
            self.inner.executor.clients(),
            &route,
            body,
            self.inner.config.reply_timeout,
        )
        .await
        .map_err(engine_error)?;
        if let Some(flight) = flight {
            flight.done(0);
        }
        let usage = Usage {
            prompt_tokens: answer.usage.prompt_tokens,
            completion_tokens: 0,
        };
        // Counted for the caller, under the model served (and the run's agent).
        let model = crate::sharing::accounting::model_served(&self.inner.instances, &route);
        self.inner.executor.sharing().record_api_call(
            &principal.user,
            &model,
            serves.map_or("", |(_, agent)| agent),
            Some(usage),
            crate::base::unix_ms(),
        );
        let mut data = answer.data;
        data.sort_by_key(|e| e.index);
        if data.len() != inputs || data.iter().enumerate().any(|(i, e)| e.index != i) {
            return Err(SessionError::Engine(format!(
                "the engine answered {} vectors for {inputs} inputs",
                data.len()
            )));
        }
        Ok(EmbeddingList {
            object: "list".to_owned(),
            data,
            model: String::new(),
            usage: EmbeddingUsage {
                prompt_tokens: usage.prompt_tokens,
                total_tokens: usage.prompt_tokens,
            },
        })
    }
}
