//! The HTTP clients of whole-file transfers (`transfer`), made once per [`HubClient`](super::HubClient)
//! with its configuration.

use std::time::Duration;

use reqwest::Client;
use reqwest::header::{AUTHORIZATION, HeaderMap, HeaderValue, USER_AGENT};

use super::config::HubConfig;

/// The two HTTP clients of whole-file transfers.
#[derive(Debug, Clone)]
pub(crate) struct Transfers {
    /// For `HEAD`: no redirects, so the hub's own headers are read even when it sends the
    /// bytes from elsewhere (a CDN).
    pub(super) head: Client,
    /// For `GET`: follows redirects to where the bytes are (reqwest drops the
    /// `Authorization` header when a redirect leaves the host).
    pub(super) get: Client,
    pub(super) auth: HeaderMap,
}

impl Transfers {
    /// The clients for `config`'s hub.
    pub(crate) fn new(config: &HubConfig) -> Result<Transfers, reqwest::Error> {
        let mut defaults = HeaderMap::new();
        defaults.insert(
            USER_AGENT,
            HeaderValue::from_static(concat!("skein/", env!("CARGO_PKG_VERSION"))),
        );
        let connect = config.request_timeout.min(Duration::from_secs(30));
        let head = Client::builder()
            .default_headers(defaults.clone())
            .connect_timeout(connect)
            .redirect(reqwest::redirect::Policy::none())
            .build()?;
        let get = Client::builder()
            .default_headers(defaults)
            .connect_timeout(connect)
            .build()?;
        let mut auth = HeaderMap::new();
        if let Some(token) = &config.token
            && let Ok(mut value) = HeaderValue::from_str(&format!("Bearer {}", token.expose()))
        {
            value.set_sensitive(true);
            auth.insert(AUTHORIZATION, value);
        }
        Ok(Transfers { head, get, auth })
    }
}
