//! Generates the gRPC code from `skein/agent/v1/agent.proto` with `protox` (a Rust
//! protobuf compiler), so building needs no system `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "skein/agent/v1/agent.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["."])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // Labels in key order, so that they serialize and compare the same everywhere.
        .btree_map(".skein.agent.v1.Inventory.labels")
        // Messages that carry an engine's key get a Debug that hides it (`redact.rs`).
        .skip_debug([".skein.agent.v1.StartInstance", ".skein.agent.v1.InstanceStatus"])
        .compile_fds(descriptors)?;
    Ok(())
}
