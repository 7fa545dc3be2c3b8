//! The REST client of the commands that talk to a running server (`skein nodes`,
//! `submit`, `runs`, `run`, `instances`): the address, the token, and errors that say
//! what the server said.

use std::time::Duration;

use anyhow::{Context, bail};
use skein_orchestrator::agents::Secret;

use crate::cli::common::ApiClientArgs;

/// A server's REST API with a token.
pub struct ApiClient {
    base: String,
    token: Secret,
    http: reqwest::Client,
    runtime: tokio::runtime::Runtime,
    /// How long to keep trying a server that refuses connections (one just started).
    patience: Duration,
}

/// An answer that was not a success, kept whole for commands that handle some codes.
pub struct Refused {
    /// The status.
    pub status: reqwest::StatusCode,
    /// `Retry-After`, seconds.
    pub retry_after: Option<u64>,
    /// The error message of the body (or the body).
    pub message: String,
}

impl ApiClient {
    /// A client of `server` with the token of `args` (flag, `SKEIN_API_TOKEN`, or the
    /// data directory of a server on this machine).
    pub fn new(server: &str, args: &ApiClientArgs) -> anyhow::Result<ApiClient> {
        let token = api_token(args)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("cannot start the async runtime")?;
        let http = reqwest::Client::builder().connect_timeout(Duration::from_secs(10));
        let http = trusting(http, server, args)?
            .build()
            .context("cannot build an HTTP client")?;
        Ok(ApiClient {
            base: server.trim_end_matches('/').to_owned(),
            token,
            http,
            runtime,
            patience: Duration::ZERO,
        })
    }

    /// [`ApiClient::new`] for a server that may be starting (`skein up & skein submit
    /// …`): waits up to `patience` for its token file to appear, and keeps trying while
    /// it refuses connections.
    pub fn patient(server: &str, args: &ApiClientArgs, patience: Duration) -> anyhow::Result<ApiClient> {
        let started = std::time::Instant::now();
        let mut told = false;
        loop {
            match ApiClient::new(server, args) {
                Err(_) if started.elapsed() < patience && args.api_token.is_none() => {
                    if !told {
                        eprintln!("waiting for the Skein server at {server} to write its token …");
                        told = true;
                    }
                    std::thread::sleep(Duration::from_millis(500));
                }
                Err(error) => return Err(error),
                Ok(mut client) => {
                    client.patience = patience.saturating_sub(started.elapsed());
                    return Ok(client);
                }
            }
        }
    }

    fn unreachable(&self) -> String {
        format!(
            "cannot reach the Skein server at {}; is `skein server` or `skein up` running?",
            self.base
        )
    }

    /// `GET path`: the body of a success, else an error with the server's message.
    pub fn get(&self, path: &str) -> anyhow::Result<String> {
        let request = self
            .http
            .get(format!("{}{path}", self.base))
            .timeout(Duration::from_secs(30));
        self.send(request)?.map_err(|r| refused_error(&r))
    }

    /// Every item of a paged list (`{"data": [...], "next": cursor | null}`), following
    /// `next` as the query parameter `cursor` (`after` or `from`) from `path`.
    pub fn all_pages(&self, path: &str, cursor: &str) -> anyhow::Result<Vec<serde_json::Value>> {
        let mut items = Vec::new();
        let mut next: Option<String> = None;
        loop {
            let separator = if path.contains('?') { '&' } else { '?' };
            let page_path = match &next {
                Some(at) => format!("{path}{separator}limit=1000&{cursor}={at}"),
                None => format!("{path}{separator}limit=1000"),
            };
            let body = self.get(&page_path)?;
            let mut page: serde_json::Value = serde_json::from_str(&body)
                .with_context(|| format!("the server's answer to GET {page_path} is not JSON"))?;
            match page.get_mut("data").map(serde_json::Value::take) {
                Some(serde_json::Value::Array(data)) => items.extend(data),
                _ => bail!(
                    "the server's answer to GET {page_path} is not a page of a list; is it a Skein server of this version?"
                ),
            }
            next = match page.get("next") {
                Some(serde_json::Value::String(at)) => Some(at.clone()),
                Some(serde_json::Value::Number(at)) => Some(at.to_string()),
                _ => None,
            };
            if next.is_none() {
                return Ok(items);
            }
        }
    }

    /// `POST path` with a JSON body: the body of a success, or the refusal.
    pub fn post(&self, path: &str, body: &serde_json::Value) -> anyhow::Result<Result<String, Refused>> {
        let request = self
            .http
            .post(format!("{}{path}", self.base))
            .json(body)
            .timeout(Duration::from_secs(60));
        self.send(request)
    }

    /// `PUT path` with a JSON body: the body of a success, else an error with the
    /// server's message.
    pub fn put(&self, path: &str, body: &serde_json::Value) -> anyhow::Result<String> {
        let request = self
            .http
            .put(format!("{}{path}", self.base))
            .json(body)
            .timeout(Duration::from_secs(30));
        self.send(request)?.map_err(|r| refused_error(&r))
    }

    /// `DELETE path`: the body of a success, else an error with the server's message.
    pub fn delete(&self, path: &str) -> anyhow::Result<String> {
        let request = self
            .http
            .delete(format!("{}{path}", self.base))
            .timeout(Duration::from_secs(30));
        self.send(request)?.map_err(|r| refused_error(&r))
    }

    fn send(&self, request: reqwest::RequestBuilder) -> anyhow::Result<Result<String, Refused>> {
        let request = request.bearer_auth(self.token.expose());
        self.runtime.block_on(async {
            let started = std::time::Instant::now();
            let mut told = false;
            let response = loop {
                let attempt = request.try_clone().context("the request cannot be sent")?;
                match attempt.send().await {
                    Err(error) if error.is_connect() && started.elapsed() < self.patience => {
                        if !told {
                            eprintln!("waiting for the Skein server at {} …", self.base);
                            told = true;
                        }
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                    other => break other.with_context(|| self.unreachable())?,
                }
            };
            let status = response.status();
            let retry_after = response
                .headers()
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse().ok());
            let body = response.text().await.context("the server's answer was cut off")?;
            if status.is_success() {
                return Ok(Ok(body));
            }
            let message = server_message(&body);
            Ok(Err(Refused {
                status,
                retry_after,
                message,
            }))
        })
    }

    /// Follows `GET path` as server-sent events, calling `on_event(name, data)` for each
    /// until it returns false or the stream ends.
    pub fn follow(&self, path: &str, on_event: impl FnMut(&str, &str) -> bool) -> anyhow::Result<()> {
        let request = self.http.get(format!("{}{path}", self.base));
        self.events(request, on_event)
    }

    /// `POST path` with a JSON body, its answer read as server-sent events (a streamed
    /// reply), calling `on_event(name, data)` as [`ApiClient::follow`] does; a refusal
    /// is an error with the server's message.
    pub fn post_events(
        &self,
        path: &str,
        body: &serde_json::Value,
        on_event: impl FnMut(&str, &str) -> bool,
    ) -> anyhow::Result<()> {
        let request = self.http.post(format!("{}{path}", self.base)).json(body);
        self.events(request, on_event)
    }

    fn events(
        &self,
        request: reqwest::RequestBuilder,
        mut on_event: impl FnMut(&str, &str) -> bool,
    ) -> anyhow::Result<()> {
        let request = request.bearer_auth(self.token.expose());
        self.runtime.block_on(async {
            let mut response = request.send().await.with_context(|| self.unreachable())?;
            if !response.status().is_success() {
                let status = response.status();
                let body = response.text().await.unwrap_or_default();
                bail!("the server answered {status}: {}", server_message(&body));
            }
            let mut buffer = String::new();
            while let Some(chunk) = response.chunk().await.context("the event stream broke")? {
                buffer.push_str(&String::from_utf8_lossy(&chunk));
                while let Some(end) = buffer.find("\n\n") {
                    let block: String = buffer.drain(..end + 2).collect();
                    let (mut name, mut data) = (String::from("message"), String::new());
                    for line in block.lines() {
                        if let Some(value) = line.strip_prefix("event:") {
                            value.trim().clone_into(&mut name);
                        } else if let Some(value) = line.strip_prefix("data:") {
                            if !data.is_empty() {
                                data.push('\n');
                            }
                            data.push_str(value.strip_prefix(' ').unwrap_or(value));
                        }
                    }
                    if !data.is_empty() && !on_event(&name, &data) {
                        return Ok(());
                    }
                }
            }
            Ok(())
        })
    }
}

/// Whom an `https://` client trusts: the certificate pinned by `--server-fingerprint`;
/// the CA of `--ca`; for a server on loopback, the certificate a server on this machine
/// made in its data directory (`skein up` and `skein server` on one machine need no
/// flag); else the system's roots.
fn trusting(
    builder: reqwest::ClientBuilder,
    server: &str,
    args: &ApiClientArgs,
) -> anyhow::Result<reqwest::ClientBuilder> {
    if !server.starts_with("https://") {
        return Ok(builder);
    }
    if let Some(path) = &args.tls_ca {
        let pem = std::fs::read(path).with_context(|| format!("cannot read the CA certificate {}", path.display()))?;
        let ca = reqwest::Certificate::from_pem(&pem)
            .with_context(|| format!("{} is not a PEM certificate", path.display()))?;
        return Ok(builder.add_root_certificate(ca));
    }
    let pin = match &args.server_fingerprint {
        Some(text) => Some(text.parse().context("--server-fingerprint")?),
        None if is_loopback_url(server) => local_certificate(args.data_dir.as_deref())?,
        None => None,
    };
    match pin {
        Some(pin) => {
            let tls = skein_proto::tls::pinned_client_config(pin, &[b"http/1.1"])
                .context("cannot set up TLS for the pinned certificate")?;
            Ok(builder.use_preconfigured_tls(tls))
        }
        None => Ok(builder),
    }
}

/// Whether a URL's host is this machine's loopback (`localhost`, `127.x.y.z`, `[::1]`).
pub fn is_loopback_url(url: &str) -> bool {
    let authority = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = authority.split(['/', '?']).next().unwrap_or(authority);
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(v6),
        None => authority.rsplit_once(':').map_or(authority, |(host, _)| host),
    };
    host.eq_ignore_ascii_case("localhost") || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The fingerprint of the certificate a server on this machine made
/// (`<data dir>/tls/cert.pem`), if there is one.
pub fn local_certificate(data_dir: Option<&std::path::Path>) -> anyhow::Result<Option<skein_proto::tls::Fingerprint>> {
    let Ok(dir) = crate::data_dir::data_dir(data_dir) else {
        return Ok(None);
    };
    let cert = dir.join("tls").join("cert.pem");
    if !cert.exists() {
        return Ok(None);
    }
    Ok(Some(skein_orchestrator::transport::tls::fingerprint(&cert)?))
}

/// What the server said in an error body (`{"error": {"message"}}`, or an older
/// `{"error": "…"}`), else the body itself.
fn server_message(body: &str) -> String {
    serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| {
            let error = v.get("error")?;
            error
                .get("message")
                .or(Some(error))
                .and_then(|m| m.as_str())
                .map(str::to_owned)
        })
        .unwrap_or_else(|| body.trim().to_owned())
}

/// The error of a refused request.
pub fn refused_error(refused: &Refused) -> anyhow::Error {
    anyhow::anyhow!("the server answered {}: {}", refused.status, refused.message)
}

/// The REST API token: the flag (or SKEIN_API_TOKEN), else the api-token file of a
/// server on this machine.
pub fn api_token(args: &ApiClientArgs) -> anyhow::Result<Secret> {
    if let Some(token) = args.api_token.as_deref().and_then(Secret::new) {
        return Ok(token);
    }
    let file = crate::data_dir::data_dir(args.data_dir.as_deref())?.join("api-token");
    let text = std::fs::read_to_string(&file).with_context(|| {
        format!(
            "no API token: pass --api-token, set SKEIN_API_TOKEN, or run on the server's machine (reads {})",
            file.display()
        )
    })?;
    Secret::new(text).with_context(|| format!("{} is empty", file.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_urls_are_told_from_others() {
        for url in [
            "https://127.0.0.1:7878",
            "https://localhost:7878/",
            "https://[::1]:7878",
            "https://127.1.2.3",
        ] {
            assert!(is_loopback_url(url), "{url}");
        }
        for url in [
            "https://10.0.0.1:7878",
            "https://skein-server:7878",
            "https://[2001:db8::1]:7878",
            "https://localhost.example",
        ] {
            assert!(!is_loopback_url(url), "{url}");
        }
    }
}
