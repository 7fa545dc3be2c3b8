//! The API's OpenAPI 3.1 document, made from the routes' code, and the schema-only
//! types it names.

use axum::http::StatusCode;
use utoipa::OpenApi;

use super::error::{ErrorBody, ErrorDetail};
use super::{protected_routes, public_routes};

/// The API's OpenAPI 3.1 document, made from the routes' code: every route, its
/// parameters, bodies and answers.
pub fn openapi() -> utoipa::openapi::OpenApi {
    let mut document = protected_routes().into_openapi();
    let public = public_routes().into_openapi();
    let public_paths: Vec<String> = public.paths.paths.keys().cloned().collect();
    document.merge(public);
    nullable_cursors(&mut document);
    for (path, item) in document.paths.paths.iter_mut() {
        let public = public_paths.contains(path);
        for operation in operations(item) {
            if public {
                operation.security = Some(vec![utoipa::openapi::security::SecurityRequirement::default()]);
            } else {
                add_error(
                    operation,
                    StatusCode::UNAUTHORIZED,
                    "No token, or a wrong or revoked one.",
                );
            }
            add_error(
                operation,
                StatusCode::INTERNAL_SERVER_ERROR,
                "The server failed (its store).",
            );
        }
    }
    document
}

/// Marks the `next` of every page schema as nullable: the derive drops the null of an
/// `Option` of a generic parameter, and the last page says `"next": null`.
fn nullable_cursors(document: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::RefOr;
    use utoipa::openapi::schema::{Object, OneOfBuilder, Schema, Type};
    let Some(components) = document.components.as_mut() else {
        return;
    };
    for (name, schema) in components.schemas.iter_mut() {
        if !name.starts_with("Listed_") {
            continue;
        }
        if let RefOr::T(Schema::Object(page)) = schema
            && let Some(next) = page.properties.get_mut("next")
        {
            let cursor = std::mem::replace(next, RefOr::T(Schema::Object(Object::default())));
            *next = OneOfBuilder::new()
                .item(cursor)
                .item(Object::with_type(Type::Null))
                .description(Some("The cursor of the next page; null on the last"))
                .into();
        }
    }
}

/// The operations of a path.
fn operations(item: &mut utoipa::openapi::PathItem) -> impl Iterator<Item = &mut utoipa::openapi::path::Operation> {
    [
        item.get.as_mut(),
        item.post.as_mut(),
        item.put.as_mut(),
        item.patch.as_mut(),
        item.delete.as_mut(),
    ]
    .into_iter()
    .flatten()
}

/// Documents an error answer of `operation` unless its route already does.
fn add_error(operation: &mut utoipa::openapi::path::Operation, status: StatusCode, description: &str) {
    use utoipa::openapi::{ContentBuilder, Ref, ResponseBuilder};
    operation
        .responses
        .responses
        .entry(status.as_str().to_owned())
        .or_insert_with(|| {
            ResponseBuilder::new()
                .description(description)
                .content(
                    "application/json",
                    ContentBuilder::new()
                        .schema(Some(Ref::from_schema_name("ErrorBody")))
                        .build(),
                )
                .into()
        });
}

/// The document's frame: title, security scheme, tags.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "Skein API",
        description = "The orchestrator's REST API: the hardware graph, plans, runs, instances, sessions, users' tokens, OpenAI-compatible chat completions and Anthropic-compatible messages. Every route but /healthz and /v1/openapi.json needs `Authorization: Bearer <API token>`. Errors answer `{\"error\": {\"code\", \"message\"}}`; lists answer `{\"data\": [...], \"next\": cursor | null}`; times are RFC 3339."
    ),
    modifiers(&BearerScheme),
    security(("bearer" = [])),
    components(schemas(ErrorBody, ErrorDetail)),
    tags(
        (name = "graph", description = "Nodes, GPUs and their telemetry"),
        (name = "plans", description = "Placement plans of workflows on the live graph"),
        (name = "runs", description = "Submitted workflows and the model instances serving them"),
        (name = "sessions", description = "Durable conversations with an agent (docs/sessions.md)"),
        (name = "openai", description = "OpenAI-compatible routes for existing clients"),
        (name = "anthropic", description = "The Anthropic-compatible Messages route for existing clients (the token may come as `x-api-key`)"),
        (name = "tokens", description = "Users' API tokens (admin only)"),
        (name = "sharing", description = "Groups, their members, quotas and fair share (docs/sharing.md); changes are the admin's"),
        (name = "secrets", description = "Users' secrets, the keys of their endpoint agents (never shown again)"),
        (name = "join", description = "Join tokens and node identities: who may join the fleet as which node (admin only)"),
        (name = "reflexes", description = "What the workflows' reflexes did (docs/reflexes.md)"),
        (name = "server", description = "Health, metrics and this document"),
    )
)]
pub(super) struct ApiDoc;

/// The bearer-token security scheme.
struct BearerScheme;

impl utoipa::Modify for BearerScheme {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "An API token: the server's api-token file (admin), or one from `skein token create`",
                    ))
                    .build(),
            ),
        );
    }
}

/// One server-sent event as a client reads it: its name and its data line. Documents
/// the streams (which axum's `Sse` writes); the data of each route's events is
/// described with the route.
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
pub(crate) struct ServerSentEvent {
    /// The event's name (`message` when the stream gives none).
    event: String,
    /// Its data: JSON text, or `[DONE]` at the end of a chat completion stream.
    data: String,
}
