//! Users' secrets (the API keys of their endpoints), stored by Skein and encrypted at
//! rest.
//!
//! A workflow never holds a key and never reads the server's environment: it names a
//! secret (`api_key_secret: openai`), and the secret is looked up for the owner of the
//! run or session when the endpoint is called. Each user has their own names; an admin
//! may publish shared secrets, which workflows name explicitly (`shared/openai`), so a
//! user's secret can never stand in for another's, or for a shared one.
//!
//! Values are sealed with XChaCha20-Poly1305 under a 256-bit key of the server (a file
//! of the data directory, mode 0600, created on first start; a random key for a
//! database in memory), with a random nonce per write and the record's key (whose
//! secret it is) as associated data, so a sealed value moved to another user's slot
//! does not open. No route returns a value, and none is logged: values are
//! [`Secret`]s, whose `Debug` shows nothing.

use std::path::Path;

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};

use crate::auth::Principal;
use crate::base::{Secret, UnixMs, unix_ms};
use crate::store::{Db, StoreError, Tree, WriteBatch};

/// The prefix that names a shared secret in a workflow: `shared/NAME`.
pub const SHARED_PREFIX: &str = "shared/";

/// The longest value, in bytes.
pub const MAX_VALUE_BYTES: usize = 16 << 10;

/// The file of the data directory that holds the key.
pub const KEY_FILE: &str = "secrets.key";

/// Whose a secret is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// One user's.
    User(String),
    /// Published by the admin for every user.
    Shared,
}

impl Scope {
    fn key(&self, name: &str) -> String {
        match self {
            Scope::User(user) => format!("user/{user}/{name}"),
            Scope::Shared => format!("shared/{name}"),
        }
    }
}

/// What may be shown of a secret: its name and times, never its value.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct SecretInfo {
    /// Its name; a workflow writes `api_key_secret: NAME` (`shared/NAME` for a shared one).
    pub name: String,
    /// The user it belongs to; absent for a shared secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// Whether the admin published it for every user.
    pub shared: bool,
    /// When it was first set.
    pub created_at: UnixMs,
    /// When its value was last set.
    pub updated_at: UnixMs,
}

/// The stored form: the info, and the sealed value.
#[derive(serde::Serialize, serde::Deserialize)]
struct Sealed {
    info: SecretInfo,
    /// The nonce, hex.
    nonce: String,
    /// The value, sealed, hex.
    sealed: String,
}

/// Why a secret could not be set, found or opened.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// A name that cannot be used.
    #[error(
        "secret name `{0}` is not allowed: use 1 to 64 letters, digits, `-`, `_` or `.`, starting with a letter or digit"
    )]
    BadName(String),
    /// A value that cannot be used.
    #[error("the value of secret `{name}` {why}")]
    BadValue {
        /// The secret.
        name: String,
        /// What is wrong.
        why: String,
    },
    /// The secret is not set.
    #[error("{}", missing(.name, .user.as_deref()))]
    Missing {
        /// The name.
        name: String,
        /// Whose it would be (`None`: a shared one).
        user: Option<String>,
    },
    /// The stored value does not open with this server's key.
    #[error(
        "secret `{name}` cannot be decrypted with this server's key (was {KEY_FILE} of the data directory replaced?); help: set it again"
    )]
    Undecryptable {
        /// The name.
        name: String,
    },
    /// The key file cannot be read or made.
    #[error("cannot use the secrets key {path}: {reason}")]
    Key {
        /// The file.
        path: String,
        /// What went wrong.
        reason: String,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

fn missing(name: &str, user: Option<&str>) -> String {
    match user {
        Some(user) => format!("secret `{name}` is not set for user {user}; help: `skein secret set {name}` as {user}"),
        None => format!(
            "shared secret `{name}` is not set; help: the admin publishes it with `skein secret set --shared {name}`"
        ),
    }
}

/// Checks a secret's name (the same rule as the workflow language's).
pub fn check_name(name: &str) -> Result<(), SecretError> {
    if skein_dsl::ir::is_valid_secret_name(name) {
        Ok(())
    } else {
        Err(SecretError::BadName(name.chars().take(80).collect()))
    }
}

fn check_value(name: &str, value: &str) -> Result<(), SecretError> {
    let bad = |why: &str| SecretError::BadValue {
        name: name.to_owned(),
        why: why.to_owned(),
    };
    if value.is_empty() {
        return Err(bad(
            "is empty; help: give the key itself, e.g. `printf %s \"$KEY\" | skein secret set NAME`",
        ));
    }
    if value.len() > MAX_VALUE_BYTES {
        return Err(bad(&format!(
            "is {} bytes; at most {MAX_VALUE_BYTES} are kept",
            value.len()
        )));
    }
    if !value.bytes().all(|b| (b' '..=b'~').contains(&b)) || value.starts_with(' ') || value.ends_with(' ') {
        return Err(bad(
            "holds characters an HTTP header cannot carry (control characters, non-ASCII, or spaces at either end); help: an API key is printable ASCII",
        ));
    }
    Ok(())
}

/// The key values are sealed with.
#[derive(Clone)]
pub struct SecretsKey([u8; 32]);

impl std::fmt::Debug for SecretsKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretsKey(…)")
    }
}

fn random<const N: usize>() -> std::io::Result<[u8; N]> {
    use std::io::Read;
    let mut bytes = [0u8; N];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| text.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok()))
        .collect()
}

impl SecretsKey {
    /// A random key (a database in memory: nothing outlives the process anyway).
    ///
    /// Errors: random bytes cannot be read.
    pub fn random() -> Result<SecretsKey, SecretError> {
        random::<32>().map(SecretsKey).map_err(|e| SecretError::Key {
            path: "/dev/urandom".to_owned(),
            reason: e.to_string(),
        })
    }

    /// The key in `file` (64 hex digits), made (random, mode 0600) when absent.
    ///
    /// Errors: [`SecretError::Key`] when it cannot be read, made, or is not a key.
    pub fn load_or_create(file: &Path) -> Result<SecretsKey, SecretError> {
        let fail = |reason: String| SecretError::Key {
            path: file.display().to_string(),
            reason,
        };
        match std::fs::read_to_string(file) {
            Ok(text) => {
                let bytes = unhex(text.trim()).filter(|b| b.len() == 32).ok_or_else(|| {
                    fail("it does not hold 64 hex digits; help: restore it from a backup (without it, stored secrets cannot be read)".to_owned())
                })?;
                let mut key = [0u8; 32];
                key.copy_from_slice(&bytes);
                Ok(SecretsKey(key))
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                if let Some(dir) = file.parent() {
                    std::fs::create_dir_all(dir).map_err(|e| fail(e.to_string()))?;
                }
                let key = SecretsKey::random()?;
                crate::private::create_private(file, format!("{}\n", hex(&key.0)).as_bytes())
                    .map_err(|e| fail(e.to_string()))?;
                Ok(key)
            }
            Err(error) => Err(fail(error.to_string())),
        }
    }
}

/// The secrets, in the server's database.
#[derive(Clone)]
pub struct Secrets {
    tree: Tree<Sealed>,
    cipher: std::sync::Arc<XChaCha20Poly1305>,
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Secrets").finish_non_exhaustive()
    }
}

impl Secrets {
    /// The secrets of `db`, sealed with `key`.
    ///
    /// Errors: the store fails.
    pub fn open(db: &Db, key: &SecretsKey) -> Result<Secrets, StoreError> {
        Ok(Secrets {
            tree: db.tree("secrets")?,
            cipher: std::sync::Arc::new(XChaCha20Poly1305::new((&key.0).into())),
        })
    }

    /// Sets (or replaces) secret `name` of `scope` to `value`; returns what may be shown.
    ///
    /// Errors: [`SecretError::BadName`], [`SecretError::BadValue`], [`SecretError::Key`]
    /// (no random nonce), [`SecretError::Store`].
    pub async fn set(&self, scope: &Scope, name: &str, value: &str) -> Result<SecretInfo, SecretError> {
        check_name(name)?;
        check_value(name, value)?;
        let key = scope.key(name);
        let now = unix_ms();
        let created_at = self.tree.get(&key)?.map_or(now, |s| s.info.created_at);
        let info = SecretInfo {
            name: name.to_owned(),
            owner: match scope {
                Scope::User(user) => Some(user.clone()),
                Scope::Shared => None,
            },
            shared: *scope == Scope::Shared,
            created_at,
            updated_at: now,
        };
        let nonce = random::<24>().map_err(|e| SecretError::Key {
            path: "/dev/urandom".to_owned(),
            reason: e.to_string(),
        })?;
        let sealed = self
            .cipher
            .encrypt(
                XNonce::from_slice(&nonce),
                Payload {
                    msg: value.as_bytes(),
                    aad: key.as_bytes(),
                },
            )
            .map_err(|_| SecretError::Undecryptable { name: name.to_owned() })?;
        let record = Sealed {
            info: info.clone(),
            nonce: hex(&nonce),
            sealed: hex(&sealed),
        };
        self.tree.put(&key, &record).await?;
        Ok(info)
    }

    /// Removes secret `name` of `scope`; returns what it was.
    ///
    /// Errors: [`SecretError::Missing`], [`SecretError::Store`].
    pub async fn remove(&self, scope: &Scope, name: &str) -> Result<SecretInfo, SecretError> {
        check_name(name)?;
        let key = scope.key(name);
        let Some(record) = self.tree.get(&key)? else {
            return Err(SecretError::Missing {
                name: name.to_owned(),
                user: match scope {
                    Scope::User(user) => Some(user.clone()),
                    Scope::Shared => None,
                },
            });
        };
        let mut batch = WriteBatch::new();
        batch.remove(&self.tree, &key);
        self.tree.db().commit(batch).await?;
        Ok(record.info)
    }

    /// What `principal` may see, by store key (`shared/…` then `user/…`): the shared
    /// secrets and their own, or, for the admin, everyone's (never a value).
    ///
    /// Errors: the store fails.
    pub fn list(&self, principal: &Principal) -> Result<Vec<(String, SecretInfo)>, StoreError> {
        let mut listed = Vec::new();
        for record in self.tree.all()? {
            let visible = record.info.shared || record.info.owner.as_deref().is_some_and(|o| principal.may_see(o));
            if visible {
                let scope = match &record.info.owner {
                    Some(owner) => Scope::User(owner.clone()),
                    None => Scope::Shared,
                };
                listed.push((scope.key(&record.info.name), record.info));
            }
        }
        Ok(listed)
    }

    /// The value a workflow of `owner` means by `reference`: `NAME` is the owner's own
    /// secret, `shared/NAME` one the admin published.
    ///
    /// Errors: [`SecretError::BadName`], [`SecretError::Missing`],
    /// [`SecretError::Undecryptable`], [`SecretError::Store`].
    pub fn resolve(&self, owner: &str, reference: &str) -> Result<Secret, SecretError> {
        let (scope, name) = match reference.strip_prefix(SHARED_PREFIX) {
            Some(name) => (Scope::Shared, name),
            None => (Scope::User(owner.to_owned()), reference),
        };
        check_name(name)?;
        let key = scope.key(name);
        let Some(record) = self.tree.get(&key)? else {
            return Err(SecretError::Missing {
                name: name.to_owned(),
                user: match scope {
                    Scope::User(user) => Some(user),
                    Scope::Shared => None,
                },
            });
        };
        let undecryptable = || SecretError::Undecryptable { name: name.to_owned() };
        let nonce = unhex(&record.nonce)
            .filter(|n| n.len() == 24)
            .ok_or_else(undecryptable)?;
        let sealed = unhex(&record.sealed).ok_or_else(undecryptable)?;
        let value = self
            .cipher
            .decrypt(
                XNonce::from_slice(&nonce),
                Payload {
                    msg: &sealed,
                    aad: key.as_bytes(),
                },
            )
            .map_err(|_| undecryptable())?;
        let value = String::from_utf8(value).map_err(|_| undecryptable())?;
        Secret::new(value).ok_or_else(undecryptable)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(name: &str) -> Principal {
        Principal {
            user: name.to_owned(),
            admin: false,
        }
    }

    #[tokio::test]
    async fn each_user_resolves_only_their_own_names_and_shared_ones_explicitly() {
        let db = Db::temporary().unwrap();
        let secrets = Secrets::open(&db, &SecretsKey::random().unwrap()).unwrap();
        let alice = Scope::User("alice".to_owned());
        secrets.set(&alice, "openai", "sk-alice").await.unwrap();
        secrets.set(&Scope::Shared, "lab", "sk-lab").await.unwrap();
        assert_eq!(secrets.resolve("alice", "openai").unwrap().expose(), "sk-alice");
        let error = secrets.resolve("bob", "openai").unwrap_err().to_string();
        assert_eq!(
            error,
            "secret `openai` is not set for user bob; help: `skein secret set openai` as bob"
        );
        assert_eq!(secrets.resolve("bob", "shared/lab").unwrap().expose(), "sk-lab");
        // A user's secret named like a shared one does not stand in for it.
        assert!(secrets.resolve("bob", "lab").is_err());
        secrets
            .set(&Scope::User("bob".to_owned()), "lab", "sk-bob")
            .await
            .unwrap();
        assert_eq!(secrets.resolve("bob", "shared/lab").unwrap().expose(), "sk-lab");
        assert!(secrets.resolve("alice", "../bob/lab").is_err());
        assert!(secrets.resolve("alice", "shared/../user/bob/lab").is_err());

        let listed: Vec<String> = secrets
            .list(&user("alice"))
            .unwrap()
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        assert_eq!(listed, ["shared/lab", "user/alice/openai"]);
        let admin = Principal {
            user: "admin".to_owned(),
            admin: true,
        };
        assert_eq!(secrets.list(&admin).unwrap().len(), 3);

        let removed = secrets.remove(&alice, "openai").await.unwrap();
        assert_eq!(removed.name, "openai");
        assert!(secrets.resolve("alice", "openai").is_err());
        assert!(matches!(
            secrets.remove(&alice, "openai").await,
            Err(SecretError::Missing { .. })
        ));
    }

    #[tokio::test]
    async fn values_are_sealed_at_rest_and_bound_to_their_owner() {
        let dir = tempfile::tempdir().unwrap();
        let key_file = dir.path().join(KEY_FILE);
        let key = SecretsKey::load_or_create(&key_file).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&key_file).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let db = Db::open(&dir.path().join("db")).unwrap();
        let secrets = Secrets::open(&db, &key).unwrap();
        let value = "sk-plaintext-never-on-disk-0123456789";
        secrets
            .set(&Scope::User("alice".to_owned()), "openai", value)
            .await
            .unwrap();
        let raw: Vec<u8> = db
            .raw()
            .open_tree("secrets")
            .unwrap()
            .get("user/alice/openai")
            .unwrap()
            .unwrap()
            .to_vec();
        assert!(!String::from_utf8_lossy(&raw).contains(value));
        // Moved into bob's slot, it does not open.
        db.raw()
            .open_tree("secrets")
            .unwrap()
            .insert("user/bob/openai", raw)
            .unwrap();
        assert!(matches!(
            secrets.resolve("bob", "openai"),
            Err(SecretError::Undecryptable { .. })
        ));
        // Reopened with the same key file: still readable; with another key: not.
        drop(secrets);
        drop(db);
        let db = Db::open(&dir.path().join("db")).unwrap();
        let again = Secrets::open(&db, &SecretsKey::load_or_create(&key_file).unwrap()).unwrap();
        assert_eq!(again.resolve("alice", "openai").unwrap().expose(), value);
        let other = Secrets::open(&db, &SecretsKey::random().unwrap()).unwrap();
        assert!(matches!(
            other.resolve("alice", "openai"),
            Err(SecretError::Undecryptable { .. })
        ));
        assert!(format!("{:?}", again.resolve("alice", "openai").unwrap()).contains('…'));
    }

    #[tokio::test]
    async fn bad_names_and_values_are_refused_clearly() {
        let db = Db::temporary().unwrap();
        let secrets = Secrets::open(&db, &SecretsKey::random().unwrap()).unwrap();
        let alice = Scope::User("alice".to_owned());
        for name in ["", "a/b", "-x", "has space", &"x".repeat(65)] {
            let error = secrets.set(&alice, name, "v").await.unwrap_err();
            assert!(error.to_string().contains("is not allowed"), "{name}: {error}");
        }
        let error = secrets.set(&alice, "k", "line\nbreak").await.unwrap_err().to_string();
        assert!(error.contains("HTTP header"), "{error}");
        let error = secrets
            .set(&alice, "k", &"x".repeat(MAX_VALUE_BYTES + 1))
            .await
            .unwrap_err()
            .to_string();
        assert!(error.contains("at most"), "{error}");
    }
}
