//! Who may join the fleet, and as which node: join tokens and node identities.
//!
//! - **Join tokens** let an agent claim a node name it has never used. The server's
//!   configured join token (`--join-token`, `SKEIN_JOIN_TOKEN`, the `join-token` file) is
//!   the *bootstrap* token: it never expires and is changed by changing the
//!   configuration. The admin makes more (`skein token join create`): each stored only
//!   as its SHA-256, optionally expiring, optionally good for one node name or a name
//!   prefix only, and revocable. Revoked tokens stay listed, with when.
//! - **Node identities**: each node has a credential, 32 random bytes its agent makes
//!   once and keeps in its state directory. The first registration of a name (with a
//!   valid join token) claims the name for that credential; the store keeps its SHA-256,
//!   durably. From then on the credential, not the join token, authenticates the node:
//!   its registrations and its stream must present it, a revoked or expired join token
//!   does not matter any more, and another agent claiming the name is refused and
//!   changes nothing, until an admin frees the name ([`Join::forget`]).
//!
//! The credential is made by the agent rather than issued by the orchestrator so that a
//! lost answer cannot lock a node out: the agent saves its credential before it first
//! sends it, and a retried registration presents the same one.
//!
//! Checking a known node costs one SHA-256 and one hash-map lookup; claiming a name, one
//! write, group-committed with the others of the moment (thousands of agents joining at
//! once share flushes).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::base::{Secret, UnixMs, lock, sha256_hex, unix_ms};
use crate::store::{Db, StoreError, Tree};

/// The id under which the bootstrap token appears (it is never stored).
pub const BOOTSTRAP_TOKEN_ID: &str = "bootstrap";

/// Length of a node credential in hex characters (32 bytes).
pub const CREDENTIAL_HEX_CHARS: usize = 64;

/// Longest name prefix or node name a join token may be limited to.
const MAX_SCOPE_CHARS: usize = 253;

/// Longest time a join token may be accepted for: ten years (longer is "until revoked",
/// which is what leaving the expiry out gives).
pub const MAX_EXPIRY_S: u64 = 10 * 365 * 24 * 60 * 60;

/// A stored join token (never the token itself).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct JoinTokenRecord {
    /// Its public id (`j-…`), for revoking it.
    pub id: String,
    /// The SHA-256 of the token, hex.
    pub sha256: String,
    /// Who made it.
    pub created_by: String,
    /// When it was made.
    pub created_at: UnixMs,
    /// When it stops being accepted; none: never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<UnixMs>,
    /// The one node name it may claim; none: any (within `name_prefix`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The prefix every name it claims must have; none: any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name_prefix: Option<String>,
    /// When it was revoked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_at: Option<UnixMs>,
}

/// What a new join token may do.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JoinTokenSpec {
    /// How long it is accepted; none: until revoked.
    pub expires_in: Option<Duration>,
    /// The one node name it may claim.
    pub node: Option<String>,
    /// The prefix of the names it may claim.
    pub name_prefix: Option<String>,
}

/// A node's stored identity (never its credential).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct NodeIdentity {
    /// The node name.
    pub name: String,
    /// The SHA-256 of the node's credential, hex.
    pub sha256: String,
    /// When the name was claimed.
    pub joined_at: UnixMs,
    /// The join token it was claimed with (`bootstrap` or `j-…`).
    pub join_token: String,
}

/// Why an agent may not join as a node, or a token could not be made or revoked.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    /// No join token, and the name is not claimed by this agent.
    #[error(
        "no join token: start the agent with --token (or --token-file) and the join token `skein server` printed, or one from `skein token join create`"
    )]
    MissingToken,
    /// A join token that is no token of this server.
    #[error(
        "wrong join token: use the join token `skein server` printed (or the one in its data directory), or one from `skein token join create`"
    )]
    WrongToken,
    /// A revoked join token.
    #[error("join token `{id}` was revoked at {at}; help: ask the admin for another (`skein token join create`)")]
    Revoked {
        /// The token.
        id: String,
        /// When.
        at: UnixMs,
    },
    /// An expired join token.
    #[error(
        "join token `{id}` expired at {at}; help: ask the admin for another (`skein token join create --expires 24h`)"
    )]
    Expired {
        /// The token.
        id: String,
        /// When.
        at: UnixMs,
    },
    /// A join token limited to other names.
    #[error("join token `{id}` may not claim node name `{name}`: it is good only for {scope}")]
    OutOfScope {
        /// The token.
        id: String,
        /// The name asked for.
        name: String,
        /// What it is good for, in words.
        scope: String,
    },
    /// The name belongs to another node credential.
    #[error(
        "node name `{name}` is taken: another agent joined under it (at {joined_at}) and this agent does not hold its node credential, so nothing was changed; help: if this machine is that node, restore its state directory (the credential file); if the name should go to this agent, an admin frees it with `skein node reset {name}` (keeps the node) or `skein node rm {name}` (DELETE /v1/nodes/{name})"
    )]
    NameTaken {
        /// The name.
        name: String,
        /// When it was claimed.
        joined_at: UnixMs,
    },
    /// A stream for a node whose name has no identity (reset by an admin).
    #[error("node `{0}` has no identity (an admin reset it): the agent must register again")]
    NotClaimed(String),
    /// The agent sent no node credential.
    #[error(
        "the agent sent no node credential: this orchestrator needs one (agents of this version send it); help: upgrade the agent"
    )]
    MissingCredential,
    /// A node credential of the wrong form.
    #[error("the node credential is not {CREDENTIAL_HEX_CHARS} lowercase hex characters")]
    BadCredential,
    /// A join token request that cannot be honoured.
    #[error("{0}")]
    BadSpec(String),
    /// No such join token, or no such node identity.
    #[error("no join token `{0}`; `skein token join list` lists them")]
    NotFound(String),
    /// The bootstrap token is the server's own.
    #[error(
        "the bootstrap join token cannot be revoked here; change it with `skein server --join-token`, SKEIN_JOIN_TOKEN or by deleting the join-token file, and restart"
    )]
    Bootstrap,
    /// Random bytes could not be read.
    #[error("cannot read random bytes for a join token: {0}")]
    Random(#[source] std::io::Error),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// How a registration was admitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// The node presented the credential its name is claimed for.
    Known,
    /// The name was free and is now claimed, with this join token (`bootstrap` or an id).
    Claimed {
        /// The join token's id.
        token: String,
    },
}

/// Join tokens and node identities, in the server's database. Cheap to clone.
#[derive(Clone)]
pub struct Join {
    inner: Arc<Inner>,
}

struct Inner {
    bootstrap: Secret,
    tokens: Tree<JoinTokenRecord>,
    identities: Tree<NodeIdentity>,
    /// Every claimed name's credential hash and claim time: what every check reads, so
    /// a registration never waits for the disk unless it claims a name.
    claimed: Mutex<HashMap<String, Claim>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Claim {
    sha256: [u8; 32],
    joined_at: UnixMs,
}

impl std::fmt::Debug for Join {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Join").finish_non_exhaustive()
    }
}

fn digest(credential: &str) -> [u8; 32] {
    Sha256::digest(credential.as_bytes()).into()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn from_hex(text: &str) -> Option<[u8; 32]> {
    if text.len() != CREDENTIAL_HEX_CHARS {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// Equality in time independent of where the hashes differ.
fn same(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Checks a credential's form.
fn check_credential(credential: &str) -> Result<(), JoinError> {
    if credential.is_empty() {
        return Err(JoinError::MissingCredential);
    }
    let ok = credential.len() == CREDENTIAL_HEX_CHARS
        && credential
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if ok { Ok(()) } else { Err(JoinError::BadCredential) }
}

impl JoinTokenRecord {
    /// What names it may claim, in words.
    fn scope(&self) -> String {
        match (&self.node, &self.name_prefix) {
            (Some(node), _) => format!("node `{node}`"),
            (None, Some(prefix)) => format!("names beginning with `{prefix}`"),
            (None, None) => "any node name".to_owned(),
        }
    }

    fn allows(&self, name: &str) -> bool {
        self.node.as_deref().is_none_or(|node| node == name)
            && self
                .name_prefix
                .as_deref()
                .is_none_or(|prefix| name.starts_with(prefix))
    }
}

impl Join {
    /// The join tokens and identities of `db`, with `bootstrap` as the server's own join
    /// token. Reads every identity (at start, before serving).
    ///
    /// Errors: the store fails.
    pub fn open(db: &Db, bootstrap: Secret) -> Result<Join, StoreError> {
        let identities: Tree<NodeIdentity> = db.tree("node_identities")?;
        let mut claimed = HashMap::new();
        for identity in identities.all()? {
            match from_hex(&identity.sha256) {
                Some(sha256) => {
                    claimed.insert(
                        identity.name.clone(),
                        Claim {
                            sha256,
                            joined_at: identity.joined_at,
                        },
                    );
                }
                None => tracing::error!(node = %identity.name, "a stored node identity is damaged; the name is free"),
            }
        }
        Ok(Join {
            inner: Arc::new(Inner {
                bootstrap,
                tokens: db.tree("join_tokens")?,
                identities,
                claimed: Mutex::new(claimed),
            }),
        })
    }

    /// A join for tests and tools: `bootstrap` only, in a temporary database.
    ///
    /// Errors: the store fails.
    pub fn temporary(bootstrap: Secret) -> Result<Join, StoreError> {
        Join::open(&Db::temporary()?, bootstrap)
    }

    fn claimed(&self) -> std::sync::MutexGuard<'_, HashMap<String, Claim>> {
        // Every change is one insert or remove: a poisoned map is still consistent.
        lock(&self.inner.claimed)
    }

    /// Whether `credential` is the one `name` is claimed for: `Some(true)` yes,
    /// `Some(false)` claimed for another, `None` unclaimed.
    fn matches(&self, name: &str, sha256: &[u8; 32]) -> Option<bool> {
        self.claimed().get(name).map(|claim| same(&claim.sha256, sha256))
    }

    fn taken(&self, name: &str) -> JoinError {
        let joined_at = self.claimed().get(name).map_or(UnixMs(0), |claim| claim.joined_at);
        JoinError::NameTaken {
            name: name.to_owned(),
            joined_at,
        }
    }

    /// Which join token `presented` is, if it may claim `name` now.
    ///
    /// Errors: [`JoinError::MissingToken`], [`JoinError::WrongToken`],
    /// [`JoinError::Revoked`], [`JoinError::Expired`], [`JoinError::OutOfScope`],
    /// [`JoinError::Store`].
    pub fn check_token(&self, presented: Option<&str>, name: &str) -> Result<String, JoinError> {
        let presented = presented.map(str::trim).filter(|t| !t.is_empty());
        let Some(presented) = presented else {
            return Err(JoinError::MissingToken);
        };
        if self.inner.bootstrap.matches(presented) {
            return Ok(BOOTSTRAP_TOKEN_ID.to_owned());
        }
        let Some(record) = self.inner.tokens.get(&sha256_hex(presented))? else {
            return Err(JoinError::WrongToken);
        };
        if let Some(at) = record.revoked_at {
            return Err(JoinError::Revoked { id: record.id, at });
        }
        if let Some(at) = record.expires_at
            && unix_ms() >= at
        {
            return Err(JoinError::Expired { id: record.id, at });
        }
        if !record.allows(name) {
            return Err(JoinError::OutOfScope {
                scope: record.scope(),
                id: record.id,
                name: name.to_owned(),
            });
        }
        Ok(record.id)
    }

    /// Admits a registration of `name` by an agent holding `credential` and presenting
    /// the join token `token`: a claimed name needs its credential (and no token); a
    /// free name needs a valid join token, and is then claimed for `credential`,
    /// durably, before this returns. A refused registration changes nothing.
    ///
    /// Errors: [`JoinError::NameTaken`], [`JoinError::MissingCredential`],
    /// [`JoinError::BadCredential`], those of [`Join::check_token`], and
    /// [`JoinError::Store`] when the claim could not be stored (the name stays free).
    pub async fn admit(&self, name: &str, token: Option<&str>, credential: &str) -> Result<Admission, JoinError> {
        check_credential(credential)?;
        let sha256 = digest(credential);
        match self.matches(name, &sha256) {
            Some(true) => return Ok(Admission::Known),
            Some(false) => return Err(self.taken(name)),
            None => {}
        }
        let token = self.check_token(token, name)?;
        let identity = NodeIdentity {
            name: name.to_owned(),
            sha256: hex(&sha256),
            joined_at: unix_ms(),
            join_token: token.clone(),
        };
        let claim = Claim {
            sha256,
            joined_at: identity.joined_at,
        };
        {
            let mut claimed = self.claimed();
            match claimed.get(name) {
                // Another registration claimed it meanwhile.
                Some(other) if same(&other.sha256, &sha256) => return Ok(Admission::Known),
                Some(_) => {
                    drop(claimed);
                    return Err(self.taken(name));
                }
                None => {
                    claimed.insert(name.to_owned(), claim.clone());
                }
            }
        }
        if let Err(error) = self.inner.identities.put(name, &identity).await {
            let mut claimed = self.claimed();
            if claimed.get(name) == Some(&claim) {
                claimed.remove(name);
            }
            return Err(error.into());
        }
        Ok(Admission::Claimed { token })
    }

    /// Checks that the stream of node `name` is opened by the holder of its credential.
    ///
    /// Errors: [`JoinError::MissingCredential`], [`JoinError::BadCredential`],
    /// [`JoinError::NameTaken`] (another credential), [`JoinError::NotClaimed`].
    pub fn check_session(&self, name: &str, credential: &str) -> Result<(), JoinError> {
        check_credential(credential)?;
        match self.matches(name, &digest(credential)) {
            Some(true) => Ok(()),
            Some(false) => Err(self.taken(name)),
            None => Err(JoinError::NotClaimed(name.to_owned())),
        }
    }

    /// Forgets the identity of `name`: the next agent to register the name with a valid
    /// join token claims it. Returns whether there was one.
    ///
    /// Errors: the store fails (the identity is then kept).
    pub async fn forget(&self, name: &str) -> Result<bool, StoreError> {
        if self.claimed().get(name).is_none() {
            return Ok(false);
        }
        let mut batch = crate::store::WriteBatch::new();
        batch.remove(&self.inner.identities, name);
        self.inner.identities.db().commit(batch).await?;
        Ok(self.claimed().remove(name).is_some())
    }

    /// The stored identity of `name`.
    ///
    /// Errors: the store fails.
    pub fn identity(&self, name: &str) -> Result<Option<NodeIdentity>, StoreError> {
        self.inner.identities.get(name)
    }

    /// Makes a join token by `created_by`: its record, and the token (shown only now).
    ///
    /// Errors: [`JoinError::BadSpec`], [`JoinError::Random`], [`JoinError::Store`].
    pub async fn create_token(
        &self,
        created_by: &str,
        spec: JoinTokenSpec,
    ) -> Result<(JoinTokenRecord, Secret), JoinError> {
        let scope_ok = |text: &str| {
            !text.is_empty()
                && text.len() <= MAX_SCOPE_CHARS
                && !text.chars().any(|c| c.is_control() || c.is_whitespace())
        };
        if let Some(node) = &spec.node
            && !scope_ok(node)
        {
            return Err(JoinError::BadSpec(format!(
                "node `{}` is not a node name: give 1 to {MAX_SCOPE_CHARS} characters without spaces",
                node.escape_debug()
            )));
        }
        if let Some(prefix) = &spec.name_prefix
            && !scope_ok(prefix)
        {
            return Err(JoinError::BadSpec(format!(
                "name prefix `{}` is not usable: give 1 to {MAX_SCOPE_CHARS} characters without spaces",
                prefix.escape_debug()
            )));
        }
        if spec.node.is_some() && spec.name_prefix.is_some() {
            return Err(JoinError::BadSpec(
                "give a node name or a name prefix, not both".to_owned(),
            ));
        }
        if spec.expires_in == Some(Duration::ZERO) {
            return Err(JoinError::BadSpec(
                "an expiry of zero would make a token that never works; give a duration such as 24h".to_owned(),
            ));
        }
        if let Some(expires_in) = spec.expires_in
            && expires_in.as_secs() > MAX_EXPIRY_S
        {
            return Err(JoinError::BadSpec(format!(
                "an expiry of {} s is longer than ten years ({MAX_EXPIRY_S} s); leave it out for a token that lasts until it is revoked",
                expires_in.as_secs()
            )));
        }
        let secret = Secret::generate().map_err(JoinError::Random)?;
        let sha256 = sha256_hex(secret.expose());
        let created_at = unix_ms();
        let record = JoinTokenRecord {
            id: format!("j-{}", &sha256[..12]),
            sha256: sha256.clone(),
            created_by: created_by.to_owned(),
            created_at,
            expires_at: spec.expires_in.map(|d| created_at.plus(d)),
            node: spec.node,
            name_prefix: spec.name_prefix,
            revoked_at: None,
        };
        self.inner.tokens.put(&sha256, &record).await?;
        Ok((record, secret))
    }

    /// Every join token made with [`Join::create_token`], oldest first (the bootstrap
    /// token is not among them).
    ///
    /// Errors: the store fails.
    pub fn tokens(&self) -> Result<Vec<JoinTokenRecord>, StoreError> {
        let mut all = self.inner.tokens.all()?;
        all.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        Ok(all)
    }

    /// Revokes join token `id`: it claims no name from now on. Nodes that joined with
    /// it keep their identity.
    ///
    /// Errors: [`JoinError::NotFound`], [`JoinError::Bootstrap`], [`JoinError::Store`].
    pub async fn revoke_token(&self, id: &str) -> Result<JoinTokenRecord, JoinError> {
        if id == BOOTSTRAP_TOKEN_ID {
            return Err(JoinError::Bootstrap);
        }
        let mut record = self
            .inner
            .tokens
            .all()?
            .into_iter()
            .find(|t| t.id == id)
            .ok_or_else(|| JoinError::NotFound(id.chars().take(80).collect()))?;
        if record.revoked_at.is_none() {
            record.revoked_at = Some(unix_ms());
            self.inner.tokens.put(&record.sha256, &record).await?;
        }
        Ok(record)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOOT: &str = "bootstrap-token";

    fn credential(n: u8) -> String {
        hex(&[n; 32])
    }

    #[tokio::test]
    async fn a_claimed_name_needs_its_credential_and_no_token_afterwards() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(dir.path()).unwrap();
        let join = Join::open(&db, Secret::new(BOOT).unwrap()).unwrap();
        assert!(matches!(
            join.admit("rtx-1", None, &credential(1)).await,
            Err(JoinError::MissingToken)
        ));
        assert_eq!(
            join.admit("rtx-1", Some(BOOT), &credential(1)).await.unwrap(),
            Admission::Claimed {
                token: BOOTSTRAP_TOKEN_ID.to_owned()
            }
        );
        // The same credential again: no token needed (it may be gone by then).
        assert_eq!(
            join.admit("rtx-1", None, &credential(1)).await.unwrap(),
            Admission::Known
        );
        let taken = join.admit("rtx-1", Some(BOOT), &credential(2)).await.unwrap_err();
        assert!(matches!(taken, JoinError::NameTaken { .. }), "{taken}");
        assert!(taken.to_string().contains("skein node reset rtx-1"), "{taken}");
        join.check_session("rtx-1", &credential(1)).unwrap();
        assert!(join.check_session("rtx-1", &credential(2)).is_err());
        assert!(matches!(
            join.admit("rtx-1", Some(BOOT), "short").await,
            Err(JoinError::BadCredential)
        ));

        // Durable: a restarted server knows the claim.
        drop(join);
        drop(db);
        let db = Db::open(dir.path()).unwrap();
        let join = Join::open(&db, Secret::new(BOOT).unwrap()).unwrap();
        assert!(join.admit("rtx-1", Some(BOOT), &credential(2)).await.is_err());
        assert!(join.forget("rtx-1").await.unwrap());
        assert!(!join.forget("rtx-1").await.unwrap());
        assert!(matches!(
            join.admit("rtx-1", Some(BOOT), &credential(2)).await.unwrap(),
            Admission::Claimed { .. }
        ));
    }

    #[tokio::test]
    async fn join_tokens_expire_are_revoked_and_keep_to_their_scope() {
        let join = Join::temporary(Secret::new(BOOT).unwrap()).unwrap();
        for expires_in in [Duration::ZERO, Duration::from_secs(u64::MAX)] {
            let spec = JoinTokenSpec {
                expires_in: Some(expires_in),
                ..JoinTokenSpec::default()
            };
            assert!(matches!(
                join.create_token("admin", spec).await,
                Err(JoinError::BadSpec(_))
            ));
        }
        let (record, secret) = join
            .create_token(
                "admin",
                JoinTokenSpec {
                    name_prefix: Some("lab-".to_owned()),
                    ..JoinTokenSpec::default()
                },
            )
            .await
            .unwrap();
        assert_ne!(record.sha256, secret.expose());
        let token = Some(secret.expose());
        assert!(matches!(
            join.admit("other-1", token, &credential(1)).await,
            Err(JoinError::OutOfScope { .. })
        ));
        join.admit("lab-1", token, &credential(1)).await.unwrap();
        join.revoke_token(&record.id).await.unwrap();
        let revoked = join.admit("lab-2", token, &credential(2)).await.unwrap_err();
        assert!(matches!(revoked, JoinError::Revoked { .. }), "{revoked}");
        // The node that joined with it keeps its identity.
        assert_eq!(
            join.admit("lab-1", token, &credential(1)).await.unwrap(),
            Admission::Known
        );

        let (_, short) = join
            .create_token(
                "admin",
                JoinTokenSpec {
                    expires_in: Some(Duration::from_millis(1)),
                    ..JoinTokenSpec::default()
                },
            )
            .await
            .unwrap();
        std::thread::sleep(Duration::from_millis(5));
        let expired = join
            .admit("lab-3", Some(short.expose()), &credential(3))
            .await
            .unwrap_err();
        assert!(matches!(expired, JoinError::Expired { .. }), "{expired}");
        assert!(matches!(
            join.revoke_token(BOOTSTRAP_TOKEN_ID).await,
            Err(JoinError::Bootstrap)
        ));
        assert_eq!(join.tokens().unwrap().len(), 2);
    }
}
