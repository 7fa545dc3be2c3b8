//! Loopback ports for tests.

use std::collections::HashSet;
use std::sync::{Mutex, PoisonError};

/// A TCP port free on loopback when asked (the system picks it with `bind(0)`; another
/// process may take it before the caller binds it). Never the same port twice in one
/// test process: a test that restarts a server on its port leaves the port free for a
/// moment, and a test beside it must not be handed that port then.
///
/// The agent picks its engines' ports its own way (`skein_agent::engine::free_port`,
/// below the ephemeral range); this one is for the servers, agents and fakes a test
/// starts.
pub fn free_port() -> u16 {
    static GIVEN: Mutex<Option<HashSet<u16>>> = Mutex::new(None);
    loop {
        let listener = std::net::TcpListener::bind(("127.0.0.1", 0)).expect("a free port on loopback");
        let port = listener.local_addr().expect("the port bound").port();
        let mut given = GIVEN.lock().unwrap_or_else(PoisonError::into_inner);
        if given.get_or_insert_with(HashSet::new).insert(port) {
            return port;
        }
    }
}
