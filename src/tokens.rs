//! `skein token create|revoke` and `skein tokens`: users' API tokens; `skein token join
//! create|list|revoke`: join tokens. Both through the server's REST API with the admin
//! token.

use std::process::ExitCode;

use anyhow::Context;
use serde::Deserialize;

use crate::cli::EXIT_OK;
use crate::cli::common::{ListArgs, OutputFormat};
use crate::cli::tokens::{JoinTokenCreateArgs, TokenCreateArgs, TokenRevokeArgs};
use crate::client::{ApiClient, refused_error};

#[derive(Deserialize)]
struct TokenRow {
    id: String,
    user: String,
    admin: bool,
    created_at: String,
    #[serde(default)]
    revoked_at: Option<String>,
}

/// `skein token create --user NAME`.
pub fn run_create(args: &TokenCreateArgs) -> anyhow::Result<ExitCode> {
    let client = ApiClient::new(&args.remote.server, &args.remote.client)?;
    let body = client
        .post("/v1/tokens", &serde_json::json!({ "user": args.user }))?
        .map_err(|r| refused_error(&r))?;
    if args.output == OutputFormat::Json {
        println!("{body}");
        return Ok(ExitCode::from(EXIT_OK));
    }
    #[derive(Deserialize)]
    struct Created {
        id: String,
        user: String,
        token: String,
    }
    let created: Created = serde_json::from_str(&body).context("the server's token is not what this skein expects")?;
    println!("{}", created.token);
    eprintln!(
        "token {} for user `{}`: shown only now, keep it. Use it as `--api-token TOKEN`, \
         SKEIN_API_TOKEN, or `Authorization: Bearer TOKEN`; `skein token revoke {}` ends it.",
        created.id, created.user, created.id
    );
    Ok(ExitCode::from(EXIT_OK))
}

/// `skein token revoke ID`.
pub fn run_revoke(args: &TokenRevokeArgs) -> anyhow::Result<ExitCode> {
    let client = ApiClient::new(&args.remote.server, &args.remote.client)?;
    let body = client.delete(&format!("/v1/tokens/{}", args.id))?;
    let row: TokenRow = serde_json::from_str(&body).context("the server's token is not what this skein expects")?;
    println!("revoked {} (user `{}`)", row.id, row.user);
    Ok(ExitCode::from(EXIT_OK))
}

/// `skein tokens`.
pub fn run_list(args: &ListArgs) -> anyhow::Result<ExitCode> {
    let client = ApiClient::new(&args.remote.server, &args.remote.client)?;
    let tokens = serde_json::Value::Array(client.all_pages("/v1/tokens", "after")?);
    if args.output == OutputFormat::Json {
        println!("{tokens}");
        return Ok(ExitCode::from(EXIT_OK));
    }
    let rows: Vec<TokenRow> =
        serde_json::from_value(tokens).context("the server's tokens are not what this skein expects")?;
    let rows: Vec<Vec<String>> = rows
        .into_iter()
        .map(|t| {
            let state = match (&t.revoked_at, t.admin) {
                (Some(at), _) => format!("revoked {at}"),
                (None, true) => "admin".to_owned(),
                (None, false) => "active".to_owned(),
            };
            vec![t.id, t.user, t.created_at, state]
        })
        .collect();
    let style = crate::table::Style {
        indent: "",
        gap: 3,
        right_aligned: &[],
    };
    print!(
        "{}",
        crate::table::render(&style, &["TOKEN", "USER", "CREATED", "STATE"], &rows)
    );
    Ok(ExitCode::from(EXIT_OK))
}

#[derive(Deserialize)]
struct JoinTokenRow {
    id: String,
    created_at: String,
    #[serde(default)]
    expires_at: Option<String>,
    #[serde(default)]
    node: Option<String>,
    #[serde(default)]
    name_prefix: Option<String>,
    #[serde(default)]
    revoked_at: Option<String>,
}

impl JoinTokenRow {
    fn scope(&self) -> String {
        match (&self.node, &self.name_prefix) {
            (Some(node), _) => format!("node {node}"),
            (None, Some(prefix)) => format!("{prefix}*"),
            (None, None) => "any".to_owned(),
        }
    }
}

/// `skein token join create [--expires 24h] [--node NAME | --name-prefix PREFIX]`.
pub fn run_join_create(args: &JoinTokenCreateArgs) -> anyhow::Result<ExitCode> {
    let client = ApiClient::new(&args.remote.server, &args.remote.client)?;
    let mut request = serde_json::Map::new();
    if let Some(expires) = args.expires {
        request.insert("expires_in_s".to_owned(), expires.as_secs().max(1).into());
    }
    if let Some(node) = &args.node {
        request.insert("node".to_owned(), node.clone().into());
    }
    if let Some(prefix) = &args.name_prefix {
        request.insert("name_prefix".to_owned(), prefix.clone().into());
    }
    let body = client
        .post("/v1/join-tokens", &serde_json::Value::Object(request))?
        .map_err(|r| refused_error(&r))?;
    if args.output == OutputFormat::Json {
        println!("{body}");
        return Ok(ExitCode::from(EXIT_OK));
    }
    #[derive(Deserialize)]
    struct Created {
        #[serde(flatten)]
        row: JoinTokenRow,
        token: String,
    }
    let created: Created =
        serde_json::from_str(&body).context("the server's join token is not what this skein expects")?;
    println!("{}", created.token);
    let until = created
        .row
        .expires_at
        .as_deref()
        .map_or_else(|| "until revoked".to_owned(), |at| format!("until {at}"));
    eprintln!(
        "join token {} (claims: {}; {until}): shown only now, keep it. Give it to agents as \
         --token-file FILE or SKEIN_JOIN_TOKEN; `skein token join revoke {}` ends it (joined nodes stay).",
        created.row.id,
        created.row.scope(),
        created.row.id
    );
    Ok(ExitCode::from(EXIT_OK))
}

/// `skein token join revoke ID`.
pub fn run_join_revoke(args: &TokenRevokeArgs) -> anyhow::Result<ExitCode> {
    let client = ApiClient::new(&args.remote.server, &args.remote.client)?;
    let body = client.delete(&format!("/v1/join-tokens/{}", crate::nodes::path_segment(&args.id)))?;
    let row: JoinTokenRow =
        serde_json::from_str(&body).context("the server's join token is not what this skein expects")?;
    println!(
        "revoked join token {}; nodes that joined with it keep their identity",
        row.id
    );
    Ok(ExitCode::from(EXIT_OK))
}

/// `skein token join list`.
pub fn run_join_list(args: &ListArgs) -> anyhow::Result<ExitCode> {
    let client = ApiClient::new(&args.remote.server, &args.remote.client)?;
    let tokens = serde_json::Value::Array(client.all_pages("/v1/join-tokens", "after")?);
    if args.output == OutputFormat::Json {
        println!("{tokens}");
        return Ok(ExitCode::from(EXIT_OK));
    }
    let rows: Vec<JoinTokenRow> =
        serde_json::from_value(tokens).context("the server's join tokens are not what this skein expects")?;
    let rows: Vec<Vec<String>> = rows
        .into_iter()
        .map(|t| {
            let state = match (&t.revoked_at, &t.expires_at) {
                (Some(at), _) => format!("revoked {at}"),
                (None, Some(at)) => format!("expires {at}"),
                (None, None) => "active".to_owned(),
            };
            let scope = t.scope();
            vec![t.id, scope, t.created_at, state]
        })
        .collect();
    let style = crate::table::Style {
        indent: "",
        gap: 3,
        right_aligned: &[],
    };
    print!(
        "{}",
        crate::table::render(&style, &["JOIN TOKEN", "CLAIMS", "CREATED", "STATE"], &rows)
    );
    Ok(ExitCode::from(EXIT_OK))
}
