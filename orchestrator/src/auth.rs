//! Users and their API tokens.
//!
//! A token is 32 random bytes in hex, shown once when it is made; the store keeps only
//! its SHA-256 (tokens are random, so an unsalted hash cannot be guessed backwards).
//! Each token belongs to one user; the admin token (the server's `api-token` file) is
//! registered at every start, replacing an earlier admin token. Revoked tokens stay
//! listed, with when they were revoked.

use std::sync::Arc;

use crate::base::{Secret, UnixMs, sha256_hex, unix_ms};
use crate::idempotency::{Claim, IdempotencyKeys, Idempotent};
use crate::store::{Db, StoreError, Tree, WriteBatch};

/// The user the admin token belongs to.
pub const ADMIN: &str = "admin";

/// The id of the admin token.
const ADMIN_TOKEN_ID: &str = "t-admin";

/// Who made a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The user.
    pub user: String,
    /// Whether they see and manage everything.
    pub admin: bool,
}

impl Principal {
    /// Whether this principal may see what `owner` owns.
    pub fn may_see(&self, owner: &str) -> bool {
        self.admin || self.user == owner
    }
}

/// A stored token (never the token itself).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct TokenRecord {
    /// Its public id (`t-…`), for revoking it.
    pub id: String,
    /// The user it acts for.
    pub user: String,
    /// Whether it is the admin token.
    pub admin: bool,
    /// The SHA-256 of the token, hex.
    pub sha256: String,
    /// When it was made.
    pub created_at: UnixMs,
    /// When it was revoked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_at: Option<UnixMs>,
}

/// Why a token could not be made or revoked.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// A user name that cannot be used.
    #[error(
        "user name `{0}` is not allowed: use 1 to 64 lowercase letters, digits, `-`, `_` or `.`, starting with a letter or digit"
    )]
    BadUser(String),
    /// No such token.
    #[error("no token `{0}`; `skein tokens` lists them")]
    NotFound(String),
    /// The admin token is the server's own.
    #[error(
        "the admin token cannot be revoked; change it with `skein server --api-token` or by deleting the api-token file"
    )]
    Admin,
    /// Random bytes could not be read.
    #[error("cannot read random bytes for a token: {0}")]
    Random(#[source] std::io::Error),
    /// The idempotency key made a token before: its secret was shown then, only then.
    #[error(
        "the Idempotency-Key already made token `{0}`, whose secret was shown only once; help: if it was lost, revoke `{0}` (`skein token revoke {0}`) and create another with a new key"
    )]
    AlreadyCreated(String),
    /// The idempotency key was refused.
    #[error(transparent)]
    Key(crate::idempotency::KeyError),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<crate::idempotency::KeyError> for TokenError {
    fn from(e: crate::idempotency::KeyError) -> Self {
        match e {
            crate::idempotency::KeyError::Store(e) => TokenError::Store(e),
            other => TokenError::Key(other),
        }
    }
}

/// Checks a user name.
pub fn check_user(name: &str) -> Result<(), TokenError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(TokenError::BadUser(name.chars().take(80).collect()))
    }
}

/// The tokens, in the server's database (keyed by hash, so a request costs one read).
#[derive(Clone)]
pub struct Tokens {
    tree: Tree<TokenRecord>,
    /// The `Idempotency-Key`s of creates.
    keys: Arc<IdempotencyKeys>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokens").finish_non_exhaustive()
    }
}

impl Tokens {
    /// The tokens of `db`, with `admin` registered as the admin token.
    ///
    /// Errors: the store fails.
    pub fn open(db: &Db, admin: &Secret) -> Result<Tokens, StoreError> {
        let tokens = Tokens {
            tree: db.tree("tokens")?,
            keys: Arc::new(IdempotencyKeys::open(db, "token_keys")?),
        };
        let sha256 = sha256_hex(admin.expose());
        let current = tokens.tree.get(&sha256)?;
        if current.is_none_or(|t| !t.admin || t.revoked_at.is_some()) {
            // A different admin token than last time: the old one stops working.
            for old in tokens.tree.all()?.into_iter().filter(|t| t.admin) {
                tokens.tree.remove_blocking(&old.sha256)?;
            }
            tokens.tree.put_blocking(
                &sha256,
                &TokenRecord {
                    id: ADMIN_TOKEN_ID.to_owned(),
                    user: ADMIN.to_owned(),
                    admin: true,
                    sha256: sha256.clone(),
                    created_at: unix_ms(),
                    revoked_at: None,
                },
            )?;
        }
        Ok(tokens)
    }

    /// Who presents `token`, if it is a live token.
    pub fn authenticate(&self, token: &str) -> Option<Principal> {
        match self.tree.get(&sha256_hex(token)) {
            Ok(Some(record)) if record.revoked_at.is_none() => Some(Principal {
                user: record.user,
                admin: record.admin,
            }),
            Ok(_) => None,
            Err(error) => {
                tracing::error!(%error, "the token store failed");
                None
            }
        }
    }

    /// Makes a token for `user`: its record, and the token itself (shown only now).
    ///
    /// Errors: [`TokenError::BadUser`], [`TokenError::Random`], [`TokenError::Store`].
    pub async fn create(&self, user: &str) -> Result<(TokenRecord, Secret), TokenError> {
        self.create_keyed(user, ADMIN, None).await
    }

    /// [`Tokens::create`] by `caller`, once per idempotency key: a retry cannot make a
    /// second token, and cannot show the first one's secret again (only its hash is
    /// stored): it is refused, naming the token.
    ///
    /// Errors: as [`Tokens::create`], and [`TokenError::AlreadyCreated`],
    /// [`TokenError::Key`].
    pub async fn create_keyed(
        &self,
        user: &str,
        caller: &str,
        idempotent: Option<Idempotent<'_>>,
    ) -> Result<(TokenRecord, Secret), TokenError> {
        check_user(user)?;
        let pending = match idempotent {
            None => None,
            Some(idempotent) => match self.keys.claim(caller, idempotent)? {
                Claim::Replay(found) => return Err(TokenError::AlreadyCreated(found.created)),
                Claim::New(pending) => Some(pending),
            },
        };
        let secret = Secret::generate().map_err(TokenError::Random)?;
        let sha256 = sha256_hex(secret.expose());
        let record = TokenRecord {
            id: format!("t-{}", &sha256[..12]),
            user: user.to_owned(),
            admin: user == ADMIN,
            sha256: sha256.clone(),
            created_at: unix_ms(),
            revoked_at: None,
        };
        let mut batch = WriteBatch::new();
        batch.put(&self.tree, &sha256, &record);
        if let Some(pending) = &pending {
            pending.record(&mut batch, &record.id, record.created_at);
        }
        self.tree.db().commit(batch).await?;
        Ok((record, secret))
    }

    /// Every token, oldest first.
    ///
    /// Errors: the store fails.
    pub fn list(&self) -> Result<Vec<TokenRecord>, StoreError> {
        let mut all = self.tree.all()?;
        all.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        Ok(all)
    }

    /// Revokes the token `id`: it stops working at once.
    ///
    /// Errors: [`TokenError::NotFound`], [`TokenError::Admin`], [`TokenError::Store`].
    pub async fn revoke(&self, id: &str) -> Result<TokenRecord, TokenError> {
        let mut record = self
            .tree
            .all()?
            .into_iter()
            .find(|t| t.id == id)
            .ok_or_else(|| TokenError::NotFound(id.to_owned()))?;
        if record.admin && record.id == ADMIN_TOKEN_ID {
            return Err(TokenError::Admin);
        }
        if record.revoked_at.is_none() {
            record.revoked_at = Some(unix_ms());
            self.tree.put(&record.sha256, &record).await?;
        }
        Ok(record)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn tokens_are_stored_hashed_act_for_their_user_and_stop_when_revoked() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(dir.path()).unwrap();
        let admin = Secret::new("admin-secret").unwrap();
        let tokens = Tokens::open(&db, &admin).unwrap();
        assert_eq!(
            tokens.authenticate("admin-secret"),
            Some(Principal {
                user: ADMIN.into(),
                admin: true
            })
        );
        let (record, secret) = tokens.create("ada").await.unwrap();
        assert_ne!(record.sha256, secret.expose());
        assert!(!format!("{:?}", tokens.list().unwrap()).contains(secret.expose()));
        assert_eq!(tokens.authenticate(secret.expose()).unwrap().user, "ada");
        assert!(tokens.authenticate("guess").is_none());
        assert!(matches!(
            tokens.create("Ada Lovelace").await,
            Err(TokenError::BadUser(_))
        ));
        tokens.revoke(&record.id).await.unwrap();
        assert!(tokens.authenticate(secret.expose()).is_none());
        assert!(matches!(tokens.revoke("t-admin").await, Err(TokenError::Admin)));
        drop(tokens);
        // A new admin token replaces the old one; user tokens stay as they were.
        let tokens = Tokens::open(&db, &Secret::new("rotated").unwrap()).unwrap();
        assert!(tokens.authenticate("admin-secret").is_none());
        assert!(tokens.authenticate("rotated").unwrap().admin);
        assert_eq!(tokens.list().unwrap().len(), 2);
    }
}
