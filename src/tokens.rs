//! `skein token create|revoke` and `skein tokens`: users' API tokens, through the
//! server's REST API with the admin token.

use std::process::ExitCode;

use anyhow::Context;
use serde::Deserialize;

use crate::cli::{EXIT_OK, ListArgs, OutputFormat, TokenCreateArgs, TokenRevokeArgs};
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
