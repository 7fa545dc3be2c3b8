//! `skein engine serve`: the built-in inference engine on one model, as the agent's
//! process supervisor starts it.

use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;

use anyhow::Context;
use skein_inference::{ApiKey, DeviceSpec, ServeConfig};

use crate::cli::engine::EngineServeArgs;
use crate::cli::{EXIT_FAILURE, EXIT_OK, EXIT_USAGE};
use crate::runtime::{init_logging, runtime};

/// `skein engine serve`: binds, prints the address, loads the model in the background
/// (`/health` answers 503 until it is loaded) and serves until interrupted; with a key
/// (`SKEIN_ENGINE_API_KEY`, as the agent gives it) only to requests that carry it. A model that
/// fails to load ends the process with exit code 1.
pub fn run_serve(args: &EngineServeArgs) -> anyhow::Result<ExitCode> {
    init_logging();
    let Ok(host) = args.host.parse::<IpAddr>() else {
        eprintln!("error: --host `{}` is not an IP address", args.host);
        return Ok(ExitCode::from(EXIT_USAGE));
    };
    let device = match args.device.parse::<DeviceSpec>() {
        Ok(device) => device,
        Err(message) => {
            eprintln!("error: --device: {message}");
            return Ok(ExitCode::from(EXIT_USAGE));
        }
    };
    if !args.model.exists() {
        eprintln!("error: --model `{}` does not exist", args.model.display());
        return Ok(ExitCode::from(EXIT_USAGE));
    }
    let api_key = match args.api_key.as_deref().map(ApiKey::new) {
        None => None,
        Some(Some(key)) => Some(key),
        Some(None) => {
            eprintln!(
                "error: --api-key (SKEIN_ENGINE_API_KEY) is empty, which would let anyone in; give a key or unset it"
            );
            return Ok(ExitCode::from(EXIT_USAGE));
        }
    };
    let keyed = api_key.is_some();
    let config = ServeConfig {
        model: args.model.clone(),
        served_name: args.name.clone(),
        listen: SocketAddr::new(host, args.port),
        seed: args.seed,
        device,
        api_key,
    };
    let runtime = runtime(None)?;
    runtime.block_on(async {
        let engine = skein_inference::serve(config)
            .await
            .context("cannot start the engine")?;
        eprintln!(
            "skein engine: serving `{}` on http://{} (OpenAI API at /v1{}; /health is 503 until the model is loaded)",
            args.name,
            engine.local_addr(),
            if keyed { ", with the API key" } else { "" }
        );
        tracing::info!(model = %args.model.display(), device = %device, "loading the model");
        tokio::select! {
            result = engine.wait() => match result {
                Ok(()) => Ok(ExitCode::from(EXIT_OK)),
                Err(error) => {
                    eprintln!("error: the model `{}` failed to load: {}", args.model.display(),
                        skein_model_registry::error_chain(&error));
                    Ok(ExitCode::from(EXIT_FAILURE))
                }
            },
            _ = tokio::signal::ctrl_c() => {
                eprintln!("skein engine: stopping");
                Ok(ExitCode::from(EXIT_OK))
            }
        }
    })
}
