//! Where workflows may send requests: the admin's policy over the URLs of endpoint
//! agents, checked when a workflow is submitted and again at every connection.
//!
//! A workflow names the URL of its endpoints, so without a policy any user could make
//! the server call its own loopback services, the cloud's metadata service or anything
//! else on its network, with the server's network position. The policy is a list of
//! rules the admin gives ([`EgressRules`]: `--endpoint-allow`, `--endpoint-deny`) over
//! host names and address blocks, and built-in refusals of what no workflow needs by
//! default: loopback, link-local (`169.254.0.0/16`, where cloud metadata answers, and
//! `fe80::/10`), unspecified, multicast and broadcast addresses, and every address of
//! the server itself (its listeners and its interfaces).
//!
//! # How an address is decided
//! The most specific rule that matches decides: a host-name rule (`api.example.org`,
//! `*.example.org`) beats any address block, a longer prefix beats a shorter one, and
//! at equal specificity `deny` wins. When no rule matches, the built-in refusals
//! apply, and everything else is allowed. So `--endpoint-allow 127.0.0.1` lets
//! workflows reach loopback, and `--endpoint-deny 0.0.0.0/0,::/0 --endpoint-allow
//! api.example.org` allows one host and nothing else.
//!
//! # Where it is enforced
//! - At submit ([`EgressPolicy::check_url`]): a URL whose host is an address (in any
//!   spelling the URL standard reads, e.g. `2130706433` is `127.0.0.1`), `localhost`,
//!   or a name a rule matches is decided there, and a refused one is a diagnostic at
//!   the `url` of the workflow.
//! - At connect ([`EgressPolicy::client`]): the client that calls endpoints resolves
//!   names itself ([`GuardedResolver`]), keeps only the addresses the policy allows and
//!   connects to those alone, so a name that resolves elsewhere later (DNS rebinding)
//!   reaches nothing refused. It follows no redirects and uses no proxy (a proxy would
//!   resolve the name itself, past the check).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;

/// One rule of the policy: a host name, or a block of addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rule {
    /// A host name, exactly (lowercase, without a trailing dot).
    Host(String),
    /// Every name under a domain (`*.example.org`), not the domain itself.
    Domain(String),
    /// A block of addresses (a single address is a `/32` or `/128`).
    Net(IpNet),
}

/// Why a rule could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "`{0}` is not a host name, address or address block; write e.g. `api.example.org`, `*.example.org`, `10.0.0.0/8`, `192.168.1.7` or `fd00::/8`"
)]
pub struct BadRule(pub String);

impl std::str::FromStr for Rule {
    type Err = BadRule;

    fn from_str(text: &str) -> Result<Rule, BadRule> {
        let bad = || BadRule(text.to_owned());
        let trimmed = text.trim();
        let bare = trimmed
            .strip_prefix('[')
            .and_then(|t| t.strip_suffix(']'))
            .unwrap_or(trimmed);
        if let Ok(net) = bare.parse::<IpNet>() {
            return Ok(Rule::Net(net.trunc()));
        }
        if let Ok(ip) = bare.parse::<IpAddr>() {
            return Ok(Rule::Net(IpNet::from(ip)));
        }
        let name = trimmed.trim_end_matches('.').to_ascii_lowercase();
        let (domain, name) = match name.strip_prefix("*.") {
            Some(rest) => (true, rest.to_owned()),
            None => (false, name),
        };
        let label_ok = |label: &str| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                && !label.starts_with('-')
                && !label.ends_with('-')
        };
        if name.is_empty() || name.len() > 253 || !name.split('.').all(label_ok) {
            return Err(bad());
        }
        Ok(if domain { Rule::Domain(name) } else { Rule::Host(name) })
    }
}

impl std::fmt::Display for Rule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Rule::Host(name) => f.write_str(name),
            Rule::Domain(name) => write!(f, "*.{name}"),
            Rule::Net(net) => write!(f, "{net}"),
        }
    }
}

impl Rule {
    /// How specific the rule is when it matches (`None`: it does not): host names beat
    /// every block, a longer prefix beats a shorter one.
    fn matches(&self, host: Option<&str>, ip: IpAddr) -> Option<u32> {
        match self {
            Rule::Host(name) => host.filter(|h| *h == name).map(|_| 1000),
            Rule::Domain(domain) => host
                .and_then(|h| h.strip_suffix(domain.as_str()))
                .filter(|prefix| prefix.ends_with('.') && prefix.len() > 1)
                .map(|_| 500 + domain.len() as u32),
            Rule::Net(net) => net.contains(&ip).then(|| u32::from(net.prefix_len())),
        }
    }
}

/// The admin's rules, as given (`--endpoint-allow`, `--endpoint-deny`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EgressRules {
    /// Hosts and blocks workflows may reach, past the built-in refusals.
    pub allow: Vec<Rule>,
    /// Hosts and blocks workflows may not reach.
    pub deny: Vec<Rule>,
}

/// Why a URL or an address is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EgressError {
    /// The URL cannot be called at all.
    #[error("`{url}` is not an http(s) URL with a host: {reason}")]
    BadUrl {
        /// The URL.
        url: String,
        /// What is wrong.
        reason: String,
    },
    /// The policy refuses where the URL leads.
    #[error(
        "endpoint `{host}` is not allowed: {why}; help: endpoints may not reach the server itself or its local network services unless the admin allows them (`skein server --endpoint-allow {suggest}`)"
    )]
    Refused {
        /// The host of the URL.
        host: String,
        /// Why (the address and the rule or built-in refusal).
        why: String,
        /// The rule that would allow it.
        suggest: String,
    },
    /// The host has no address at all.
    #[error("endpoint `{host}` has no address: {reason}")]
    Unresolved {
        /// The host.
        host: String,
        /// The resolver's answer.
        reason: String,
    },
}

/// The policy: the admin's rules and the server's own addresses.
#[derive(Debug, Clone, Default)]
pub struct EgressPolicy {
    rules: EgressRules,
    own: Vec<IpAddr>,
}

/// The address an IPv6 address stands for when it carries an IPv4 one (mapped
/// `::ffff:a.b.c.d`, the old compatible `::a.b.c.d`, NAT64 `64:ff9b::a.b.c.d`), else
/// the address itself.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return IpAddr::V4(v4);
            }
            let s = v6.segments();
            let embedded = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
            let compatible = s[..6] == [0; 6] && !v6.is_loopback() && !v6.is_unspecified();
            let nat64 = s[..6] == [0x64, 0xff9b, 0, 0, 0, 0];
            if compatible || nat64 { IpAddr::V4(embedded) } else { ip }
        }
    }
}

/// What no workflow may reach unless a rule allows it, and why (`None`: nothing).
fn built_in_refusal(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => {
            if v4.is_loopback() {
                Some("a loopback address")
            } else if v4.is_link_local() {
                Some("a link-local address (cloud metadata services answer there)")
            } else if v4.is_unspecified() || v4.octets()[0] == 0 {
                Some("an unspecified address (it reaches this machine)")
            } else if v4.is_multicast() || v4.is_broadcast() {
                Some("a multicast or broadcast address")
            } else {
                None
            }
        }
        IpAddr::V6(v6) => {
            if v6.is_loopback() {
                Some("a loopback address")
            } else if v6.is_unicast_link_local() {
                Some("a link-local address")
            } else if v6.is_unspecified() {
                Some("an unspecified address (it reaches this machine)")
            } else if v6.is_multicast() {
                Some("a multicast address")
            } else {
                None
            }
        }
    }
}

impl EgressPolicy {
    /// The policy of `rules`, refusing `own` (the server's addresses) by default too.
    pub fn new(rules: EgressRules, own: Vec<IpAddr>) -> EgressPolicy {
        let mut own: Vec<IpAddr> = own.into_iter().map(canonical).collect();
        own.sort();
        own.dedup();
        EgressPolicy { rules, own }
    }

    /// The rules.
    pub fn rules(&self) -> &EgressRules {
        &self.rules
    }

    /// Whether `ip`, reached as `host` (a name, when the URL named one), is allowed;
    /// the error says why not.
    pub fn check_ip(&self, host: Option<&str>, ip: IpAddr) -> Result<(), EgressError> {
        let ip = canonical(ip);
        let shown = host.map_or_else(|| ip.to_string(), str::to_owned);
        let mut best: Option<(u32, bool, &Rule)> = None;
        let rules = (self.rules.allow.iter().map(|r| (r, true))).chain(self.rules.deny.iter().map(|r| (r, false)));
        for (rule, allow) in rules {
            if let Some(specificity) = rule.matches(host, ip) {
                let better = match best {
                    None => true,
                    // At equal specificity, deny wins.
                    Some((s, a, _)) => specificity > s || (specificity == s && a && !allow),
                };
                if better {
                    best = Some((specificity, allow, rule));
                }
            }
        }
        let refused = |why: String| EgressError::Refused {
            host: shown.clone(),
            why,
            suggest: host.map_or_else(|| ip.to_string(), str::to_owned),
        };
        match best {
            Some((_, true, _)) => Ok(()),
            Some((_, false, rule)) => Err(refused(format!("{ip} is denied by the rule `{rule}`"))),
            None => {
                if let Some(why) = built_in_refusal(ip) {
                    return Err(refused(format!("{ip} is {why}")));
                }
                if self.own.contains(&ip) {
                    return Err(refused(format!("{ip} is an address of this server")));
                }
                Ok(())
            }
        }
    }

    /// The check at submit: the URL must be http(s) with a host, and when the host is an
    /// address, `localhost`, or a name a rule matches, the policy must allow it. Other
    /// names are checked when they are resolved, at every connection.
    pub fn check_url(&self, url: &str) -> Result<(), EgressError> {
        let parsed = reqwest::Url::parse(url).map_err(|e| EgressError::BadUrl {
            url: url.to_owned(),
            reason: e.to_string(),
        })?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(EgressError::BadUrl {
                url: url.to_owned(),
                reason: format!("the scheme is `{}`", parsed.scheme()),
            });
        }
        // The URL standard writes every spelling of an address (`2130706433`, `0x7f.1`,
        // `[::ffff:7f00:1]`) in its usual form here.
        let Some(host) = parsed.host_str() else {
            return Err(EgressError::BadUrl {
                url: url.to_owned(),
                reason: "it has no host".to_owned(),
            });
        };
        let bare = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
        if let Ok(ip) = bare.parse::<IpAddr>() {
            return self.check_ip(None, ip);
        }
        let name = bare.trim_end_matches('.').to_ascii_lowercase();
        if name == "localhost" || name.ends_with(".localhost") {
            // RFC 6761: these names are loopback, whatever a resolver says.
            return self.check_ip(Some(&name), IpAddr::V4(Ipv4Addr::LOCALHOST));
        }
        // A host rule decides for every address of the name (no block rule can beat
        // it), so it is decided now; other names at every connection.
        self.check_host_rules(&name)
    }

    /// The decision of the host rules that match `name` (the most specific; deny at a tie).
    fn check_host_rules(&self, name: &str) -> Result<(), EgressError> {
        let probe = IpAddr::V6(Ipv6Addr::UNSPECIFIED);
        let mut best: Option<(u32, bool, &Rule)> = None;
        let rules = (self.rules.allow.iter().map(|r| (r, true))).chain(self.rules.deny.iter().map(|r| (r, false)));
        for (rule, allow) in rules.filter(|(r, _)| !matches!(r, Rule::Net(_))) {
            if let Some(s) = rule.matches(Some(name), probe) {
                let better = best.is_none_or(|(b, a, _)| s > b || (s == b && a && !allow));
                if better {
                    best = Some((s, allow, rule));
                }
            }
        }
        match best {
            Some((_, false, rule)) => Err(EgressError::Refused {
                host: name.to_owned(),
                why: format!("it is denied by the rule `{rule}`"),
                suggest: name.to_owned(),
            }),
            _ => Ok(()),
        }
    }

    /// An HTTP client for endpoints under this policy: names resolved by a
    /// [`GuardedResolver`], no redirects, no proxy.
    pub fn client(self: &Arc<Self>, connect_timeout: Duration) -> reqwest::Client {
        reqwest::Client::builder()
            .connect_timeout(connect_timeout)
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .dns_resolver(Arc::new(GuardedResolver {
                policy: Arc::clone(self),
            }))
            .build()
            .unwrap_or_default()
    }
}

/// The server's own addresses: those of its listeners (every interface's when one
/// listens on the unspecified address) and of every interface of the machine.
pub fn own_addresses(listeners: &[SocketAddr]) -> Vec<IpAddr> {
    let mut own: Vec<IpAddr> = listeners.iter().map(SocketAddr::ip).collect();
    match if_addrs::get_if_addrs() {
        Ok(interfaces) => own.extend(interfaces.iter().map(if_addrs::Interface::ip)),
        Err(error) => {
            tracing::warn!(%error, "cannot list this machine's addresses; endpoints are checked against the listeners' only")
        }
    }
    own
}

/// The resolver of the endpoint client: resolves a name, keeps the addresses the policy
/// allows and answers only those, so the connection goes to a checked address.
#[derive(Debug)]
pub struct GuardedResolver {
    policy: Arc<EgressPolicy>,
}

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let policy = Arc::clone(&self.policy);
        let host = name.as_str().trim_end_matches('.').to_ascii_lowercase();
        Box::pin(async move {
            let found: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0))
                .await
                .map_err(|e| EgressError::Unresolved {
                    host: host.clone(),
                    reason: e.to_string(),
                })?
                .collect();
            let mut refusal = None;
            let allowed: Vec<SocketAddr> = found
                .into_iter()
                .filter(|addr| match policy.check_ip(Some(&host), addr.ip()) {
                    Ok(()) => true,
                    Err(error) => {
                        refusal.get_or_insert(error);
                        false
                    }
                })
                .collect();
            if allowed.is_empty() {
                let error = refusal.unwrap_or(EgressError::Unresolved {
                    host,
                    reason: "the resolver gave none".to_owned(),
                });
                return Err(Box::new(error) as Box<dyn std::error::Error + Send + Sync>);
            }
            Ok(Box::new(allowed.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// The policy's refusal in the causes of `error`, if that is why it failed.
pub fn refusal_in<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a EgressError> {
    let mut cause = Some(error);
    while let Some(e) = cause {
        if let Some(refusal) = e.downcast_ref::<EgressError>() {
            return Some(refusal);
        }
        cause = e.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(allow: &[&str], deny: &[&str], own: &[&str]) -> EgressPolicy {
        let rules = |list: &[&str]| list.iter().map(|r| r.parse::<Rule>().unwrap()).collect();
        EgressPolicy::new(
            EgressRules {
                allow: rules(allow),
                deny: rules(deny),
            },
            own.iter().map(|a| a.parse().unwrap()).collect(),
        )
    }

    fn refused(policy: &EgressPolicy, url: &str) -> String {
        match policy.check_url(url) {
            Err(e) => e.to_string(),
            Ok(()) => panic!("{url} was allowed"),
        }
    }

    #[test]
    fn the_defaults_refuse_loopback_link_local_unspecified_and_own_addresses() {
        let p = policy(&[], &[], &["10.1.2.3"]);
        for url in [
            "http://127.0.0.1:8080/v1",
            "http://127.9.9.9/",
            "http://[::1]:8000/v1",
            "http://[::ffff:127.0.0.1]/v1",
            "http://[::ffff:7f00:1]/v1",
            "http://[64:ff9b::7f00:1]/v1",
            "http://169.254.169.254/latest/meta-data",
            "http://[fe80::1]/",
            "http://0.0.0.0:7878/",
            "http://[::]:7878/",
            "http://2130706433/",
            "http://0x7f.1/",
            "http://localhost:7878/",
            "http://api.localhost/",
            "http://10.1.2.3:9000/v1",
            "http://[::ffff:10.1.2.3]/v1",
        ] {
            let error = refused(&p, url);
            assert!(error.contains("is not allowed"), "{url}: {error}");
            assert!(error.contains("--endpoint-allow"), "{url}: {error}");
        }
        assert!(refused(&p, "http://169.254.169.254/").contains("link-local"));
        assert!(refused(&p, "http://10.1.2.3/").contains("an address of this server"));
        // Elsewhere is allowed by default; names are checked at connect time.
        for url in [
            "https://10.1.2.4/v1",
            "https://[2001:db8::1]/v1",
            "https://api.example.org/v1",
        ] {
            assert_eq!(p.check_url(url), Ok(()), "{url}");
        }
        assert!(p.check_url("ftp://example.org/").is_err());
        assert!(p.check_url("not a url").is_err());
    }

    #[test]
    fn the_most_specific_rule_decides_and_deny_wins_a_tie() {
        let p = policy(
            &["127.0.0.1", "10.0.0.0/8", "*.lab.example"],
            &["10.9.0.0/16", "bad.lab.example", "0.0.0.0/0"],
            &[],
        );
        assert_eq!(p.check_url("http://127.0.0.1:9/"), Ok(()));
        assert!(p.check_url("http://127.0.0.2:9/").is_err(), "only .1 is allowed");
        assert_eq!(p.check_ip(None, "10.1.0.1".parse().unwrap()), Ok(()));
        let error = p.check_ip(None, "10.9.0.1".parse().unwrap()).unwrap_err().to_string();
        assert!(error.contains("denied by the rule `10.9.0.0/16`"), "{error}");
        // 0.0.0.0/0 denies the rest of IPv4.
        assert!(p.check_ip(None, "8.8.8.8".parse().unwrap()).is_err());
        // A host rule beats every block, both ways.
        assert_eq!(p.check_ip(Some("a.lab.example"), "8.8.8.8".parse().unwrap()), Ok(()));
        assert!(p.check_url("http://bad.lab.example/").is_err());
        assert!(
            p.check_ip(Some("bad.lab.example"), "10.1.0.1".parse().unwrap())
                .is_err()
        );
        // The domain rule is for names under it, not itself.
        assert!(p.check_ip(Some("lab.example"), "8.8.8.8".parse().unwrap()).is_err());
        let tie = policy(&["10.0.0.0/8"], &["10.0.0.0/8"], &[]);
        assert!(tie.check_ip(None, "10.0.0.1".parse().unwrap()).is_err());
    }

    #[test]
    fn an_allowed_block_lets_in_its_addresses_even_the_built_in_refusals() {
        let p = policy(&["127.0.0.0/8", "::1", "169.254.0.0/16"], &[], &["127.0.0.1"]);
        assert_eq!(p.check_url("http://127.0.0.1:9/v1"), Ok(()));
        assert_eq!(p.check_url("http://[::ffff:127.0.0.1]:9/v1"), Ok(()));
        assert_eq!(p.check_url("http://[::1]:9/v1"), Ok(()));
        assert_eq!(p.check_url("http://localhost:9/v1"), Ok(()));
        assert_eq!(p.check_url("http://169.254.169.254/"), Ok(()));
        assert!(p.check_url("http://[fe80::1]/").is_err());
    }

    #[test]
    fn rules_are_read_with_a_clear_error() {
        assert_eq!("10.0.0.0/8".parse(), Ok(Rule::Net("10.0.0.0/8".parse().unwrap())));
        assert_eq!("10.0.0.7/8".parse(), Ok(Rule::Net("10.0.0.0/8".parse().unwrap())));
        assert_eq!("[::1]".parse(), Ok(Rule::Net("::1/128".parse().unwrap())));
        assert_eq!("API.Example.org.".parse(), Ok(Rule::Host("api.example.org".to_owned())));
        assert_eq!("*.example.org".parse(), Ok(Rule::Domain("example.org".to_owned())));
        for bad in ["", "http://x", "a b", "10.0.0.0/33", "-x.org", "*."] {
            let error = bad.parse::<Rule>().unwrap_err().to_string();
            assert!(error.contains("is not a host name"), "{bad}: {error}");
        }
    }

    #[tokio::test]
    async fn a_name_that_resolves_to_loopback_is_refused_at_connect_time() {
        use reqwest::dns::Resolve;
        let p = Arc::new(policy(&[], &[], &[]));
        // `localhost` resolves to loopback here; a name is not judged by its spelling
        // at connect time, only by its addresses.
        let resolver = GuardedResolver { policy: Arc::clone(&p) };
        let error = match resolver.resolve("localhost".parse().unwrap()).await {
            Err(e) => e,
            Ok(addrs) => panic!("resolved to {:?}", addrs.collect::<Vec<_>>()),
        };
        let refusal = refusal_in(error.as_ref()).expect("the policy's refusal");
        assert!(refusal.to_string().contains("loopback"), "{refusal}");
        // Allowed by a host rule: the addresses come back.
        let allowed = Arc::new(policy(&["localhost"], &[], &[]));
        let resolver = GuardedResolver { policy: allowed };
        let addrs: Vec<SocketAddr> = resolver.resolve("localhost".parse().unwrap()).await.unwrap().collect();
        assert!(addrs.iter().all(|a| a.ip().is_loopback()), "{addrs:?}");
        assert!(!addrs.is_empty());
        // And the client refuses before anything is sent.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let client = p.client(Duration::from_secs(5));
        let error = client
            .get(format!("http://localhost:{port}/"))
            .send()
            .await
            .unwrap_err();
        assert!(refusal_in(&error).is_some(), "{error:?}");
        listener.set_nonblocking(true).unwrap();
        assert!(listener.accept().is_err(), "a connection reached the listener");
    }
}
