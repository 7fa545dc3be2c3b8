//! Sessions: conversations of a user with an agent, durable in sled and bound to a model
//! instance that can change under them.
//!
//! # Layout
//! - [`record`] (pure): the stored session and message, and the checks of what clients
//!   send.
//! - [`store`]: the [`SessionStore`] trait and [`SledSessions`] (one sled tree, a
//!   versioned layout).
//! - [`log`]: [`SessionLog`], the one writer, with group commit: a write is answered
//!   only once it is flushed, and many concurrent writes share a flush.
//! - [`limits`] (pure): what one request and one user may ask of the chat routes (size
//!   measured on the raw body, requests and streams in flight per user).
//! - [`service`]: [`Sessions`], what users do: create, send a turn (routed to the bound
//!   instance, placed again when it is gone), read, delete, migrate.

use std::collections::BTreeMap;

use skein_dsl::ir::{Agent, Backend, Endpoint};

use crate::base::unix_ms;

pub mod limits;
pub mod log;
pub mod record;
pub mod service;
pub mod store;

pub use limits::{Admission, ChatLimits, Flight, LimitError, Permit, RequestSize};
pub use log::{AppendOutcome, CreateKey, Created, LogConfig, LogError, SessionLog};
pub use record::{Binding, MessageRecord, NewMessage, Role, SessionRecord};
pub use service::{
    Migration, MoveTo, NewSession, Prompt, Reply, Sampling, SessionError, Sessions, SessionsConfig, Target, Turn,
};
pub use store::{SessionStore, SledSessions};

/// A fresh session of `owner` with the agent `helper` on a remote endpoint
/// (`http://127.0.0.1:1/v1`, model `m`): no run, binding, metadata or messages, created
/// now. For the crate's tests and the durable-write benchmarks, which store sessions
/// without a server.
#[doc(hidden)]
pub fn fixture(id: &str, owner: &str) -> SessionRecord {
    let now = unix_ms();
    SessionRecord {
        id: id.to_owned(),
        owner: owner.to_owned(),
        agent: "helper".to_owned(),
        run: None,
        definition: Agent {
            backend: Backend::Endpoint(Endpoint {
                url: "http://127.0.0.1:1/v1".to_owned(),
                model: "m".to_owned(),
                api_key_secret: None,
            }),
            system: None,
            temperature: None,
            max_tokens: None,
            tools: Vec::new(),
            max_turns: None,
            tool_choice: None,
        },
        binding: None,
        metadata: BTreeMap::new(),
        created_at: now,
        updated_at: now,
        messages: 0,
        migrations: 0,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn user(text: &str) -> NewMessage {
        NewMessage::new(Role::User, text)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn appends_are_ordered_durable_and_idempotent() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = Arc::new(SledSessions::open_dir(dir.path()).unwrap());
            let log = SessionLog::start(store, LogConfig::default()).unwrap();
            log.create(fixture("s1", "ada")).await.unwrap();
            assert!(matches!(
                log.create(fixture("s1", "ada")).await,
                Err(LogError::Exists(_))
            ));
            let first = log
                .append("s1", vec![user("a"), user("b")], Some("k1".into()))
                .await
                .unwrap();
            assert_eq!(first.messages.iter().map(|m| m.seq).collect::<Vec<_>>(), [0, 1]);
            assert!(!first.replayed);
            // The same key again: nothing written, the first answer again.
            let again = log
                .append("s1", vec![user("a"), user("b")], Some("k1".into()))
                .await
                .unwrap();
            assert!(again.replayed);
            assert_eq!(again.messages, first.messages);
            // Concurrent appends get distinct, gapless sequence numbers.
            let mut tasks = tokio::task::JoinSet::new();
            for i in 0..50 {
                let log = log.clone();
                tasks.spawn(async move {
                    log.append("s1", vec![user(&format!("m{i}"))], Some(format!("c{i}")))
                        .await
                });
            }
            while let Some(done) = tasks.join_next().await {
                done.unwrap().unwrap();
            }
            assert!(matches!(
                log.append("nope", vec![user("x")], None).await,
                Err(LogError::NotFound(_))
            ));
        }
        // Reopened (once the writer thread has let go of the database): everything
        // acknowledged is there, once, in order.
        let mut reopened = SledSessions::open_dir(dir.path());
        for _ in 0..100 {
            if reopened.is_ok() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            reopened = SledSessions::open_dir(dir.path());
        }
        let store = Arc::new(reopened.unwrap());
        let messages = store.messages("s1", 0, 1000).unwrap();
        assert_eq!(messages.len(), 52);
        assert!(messages.iter().enumerate().all(|(i, m)| m.seq == i as u64));
        assert_eq!(store.session("s1").unwrap().unwrap().messages, 52);
        let log = SessionLog::start(store.clone(), LogConfig { max_batch: 1 }).unwrap();
        let replay = log.append("s1", vec![user("x")], Some("c7".into())).await.unwrap();
        assert!(replay.replayed, "keys survive a restart");
        assert_eq!(replay.messages[0].content, "m7");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sessions_page_by_owner_and_delete_with_their_messages() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(SledSessions::open_dir(dir.path()).unwrap());
        let log = SessionLog::start(store.clone(), LogConfig::default()).unwrap();
        for (id, owner) in [("s1", "ada"), ("s2", "bob"), ("s3", "ada"), ("s4", "ada")] {
            log.create(fixture(id, owner)).await.unwrap();
            log.append(id, vec![user("hi")], Some("k".into())).await.unwrap();
        }
        let page = store.sessions(Some("ada"), None, 2).unwrap();
        assert_eq!(
            page.sessions.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(),
            ["s1", "s3"]
        );
        assert_eq!(page.next.as_deref(), Some("s3"));
        let rest = store.sessions(Some("ada"), page.next.as_deref(), 2).unwrap();
        assert_eq!(rest.sessions.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(), ["s4"]);
        assert_eq!(rest.next, None);
        assert_eq!(store.sessions(None, None, 10).unwrap().sessions.len(), 4);

        log.delete("s3").await.unwrap();
        assert!(store.session("s3").unwrap().is_none());
        assert!(store.messages("s3", 0, 10).unwrap().is_empty());
        assert!(store.idempotent("s3", "k").unwrap().is_none());
        assert_eq!(store.sessions(Some("ada"), None, 10).unwrap().sessions.len(), 2);
        assert!(matches!(log.delete("s3").await, Err(LogError::NotFound(_))));
        // The other sessions keep their messages.
        assert_eq!(store.messages("s4", 0, 10).unwrap().len(), 1);
        // The recent messages that fit a budget, oldest first; the last always.
        for text in ["0123456789", "abcdefghij", "klmnopqrst"] {
            log.append("s4", vec![user(text)], None).await.unwrap();
        }
        let recent = |budget| {
            store
                .recent("s4", budget)
                .unwrap()
                .iter()
                .map(|m| m.seq)
                .collect::<Vec<_>>()
        };
        // Each message costs its 10 bytes and the overhead of its role markers.
        let cost = 10 + store::MESSAGE_OVERHEAD_BYTES;
        assert_eq!(recent(2 * cost), [2, 3]);
        assert_eq!(recent(2 * cost - 1), [3]);
        assert_eq!(recent(1000), [0, 1, 2, 3]);
        assert_eq!(recent(0), [3]);
        assert!(store.recent("s3", 100).unwrap().is_empty());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_rebind_keeps_the_messages_and_counts_the_move() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(SledSessions::open_dir(dir.path()).unwrap());
        let log = SessionLog::start(store.clone(), LogConfig::default()).unwrap();
        log.create(fixture("s1", "ada")).await.unwrap();
        log.append("s1", vec![user("hi")], None).await.unwrap();
        let binding = Binding {
            instance: "i1".to_owned(),
            node: "rtx-1".to_owned(),
            gpus: vec![2],
            since: unix_ms(),
        };
        let moved = log.rebind("s1", Some(binding.clone()), true).await.unwrap();
        assert_eq!(moved.binding, Some(binding));
        assert_eq!(moved.migrations, 1);
        assert_eq!(moved.messages, 1);
        let after = log.append("s1", vec![user("again")], None).await.unwrap();
        assert_eq!(
            after.session.migrations, 1,
            "an append keeps the binding it did not change"
        );
        assert_eq!(after.messages[0].seq, 1);
    }

    #[test]
    fn a_newer_layout_is_refused_with_a_hint() {
        let dir = tempfile::tempdir().unwrap();
        let db = crate::store::Db::open(dir.path()).unwrap();
        db.raw()
            .open_tree("sessions")
            .unwrap()
            .insert("meta/layout", &[9u8])
            .unwrap();
        let error = SledSessions::open(&db).unwrap_err().to_string();
        assert!(error.contains("layout 9") && error.contains("upgrade skein"), "{error}");
    }
}
