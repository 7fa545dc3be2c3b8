//! Loopback ports for tests.

/// A TCP port free on loopback when asked (the system picks it with `bind(0)`; another
/// process may take it before the caller binds it).
///
/// The agent picks its engines' ports its own way (`skein_agent::engine::free_port`,
/// below the ephemeral range); this one is for the servers, agents and fakes a test
/// starts.
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind(("127.0.0.1", 0)).expect("a free port on loopback");
    listener.local_addr().expect("the port bound").port()
}
