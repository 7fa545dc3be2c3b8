//! `skein models inspect` and `skein models fit`: a model's variants from the hub's
//! metadata, and where each fits.

use std::fmt::Write as _;
use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use serde::Serialize;
use skein_model_registry::Bytes;
use skein_model_registry::catalog::{FitOptions, ModelInfo, SetFit, ShapeSource, VariantFit, fit_all};
use skein_model_registry::estimate::KvDtype;
use skein_model_registry::gpu::GpuSet;
use skein_model_registry::hub::{HubClient, HubClientBuilder, RepoId, TransferStats, VariantPin, VariantSource};

use crate::cli::common::OutputFormat;
use crate::cli::models::{FitArgs, HubArgs, InspectArgs, KvCacheType};
use crate::cli::{EXIT_FAILURE, EXIT_OK};

/// `REPO[@REVISION]`.
fn parse_target(target: &str) -> anyhow::Result<(RepoId, String)> {
    let (repo, revision) = match target.split_once('@') {
        Some((_, "")) => bail!("`{target}` ends with `@` but names no revision; write REPO@REVISION or just REPO"),
        Some((repo, revision)) => (repo, revision),
        None => (target, skein_model_registry::hub::DEFAULT_REVISION),
    };
    Ok((RepoId::parse(repo)?, revision.to_owned()))
}

fn client(hub: &HubArgs) -> anyhow::Result<HubClient> {
    let mut builder = HubClientBuilder::from_env().allow_pickle(hub.allow_pickle);
    if hub.offline {
        builder = builder.offline(true);
    }
    Ok(builder.build()?)
}

/// Reads the model, with a progress line on a terminal (bytes of metadata and headers
/// received so far), and a summary of what crossed the network.
fn inspect(hub: &HubArgs, target: &str) -> anyhow::Result<(ModelInfo, TransferStats)> {
    let (repo, revision) = parse_target(target)?;
    let client = client(hub)?;
    let pins = hub
        .variants
        .iter()
        .map(|pin| VariantPin::parse(pin).with_context(|| format!("in --variant {pin}")))
        .collect::<anyhow::Result<_>>()?;
    let options = skein_model_registry::hub::InspectOptions {
        derivatives: hub.derivatives,
        derivative_headers: hub.derivative_headers,
        pins,
    };
    let runtime = crate::runtime::runtime(Some(2))?;
    let progress = indicatif::ProgressBar::new_spinner();
    if !std::io::stderr().is_terminal() {
        progress.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    progress.set_style(
        indicatif::ProgressStyle::with_template("{spinner} {msg} [{elapsed}]")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
    );
    progress.set_message(format!("reading {repo} from the hub"));
    progress.enable_steady_tick(Duration::from_millis(120));
    let info = runtime.block_on(async {
        let ticker = {
            let client = client.clone();
            let progress = progress.clone();
            let repo = repo.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    let stats = client.stats();
                    progress.set_message(format!(
                        "reading {repo}: {} of metadata and headers, {} requests",
                        Bytes::new(stats.file_bytes),
                        stats.network_calls
                    ));
                }
            })
        };
        let info = client.inspect(&repo, &revision, &options).await;
        ticker.abort();
        info
    });
    progress.finish_and_clear();
    let info = info.with_context(|| format!("cannot inspect `{target}`"))?;
    Ok((info, client.stats()))
}

fn transfer_line(stats: &TransferStats) -> String {
    if stats.network_calls == 0 {
        "answered from the cache: no network request".to_owned()
    } else {
        format!(
            "read {} of metadata and headers in {} requests ({} range reads); no weights downloaded",
            Bytes::new(stats.file_bytes),
            stats.network_calls,
            stats.range_reads
        )
    }
}

/// `skein models inspect`.
pub fn run_inspect(args: &InspectArgs) -> anyhow::Result<ExitCode> {
    let (info, stats) = inspect(&args.hub, &args.model)?;
    match args.output {
        OutputFormat::Json => print_json(&InspectReport {
            model: model_json(&info)?,
            transfer: stats,
        })?,
        OutputFormat::Human => {
            print!("{}", render_inspect(&info));
            eprintln!("{}", transfer_line(&stats));
        }
    }
    Ok(ExitCode::from(EXIT_OK))
}

/// `skein models fit`. Exits 1 when no variant fits any set.
pub fn run_fit(args: &FitArgs) -> anyhow::Result<ExitCode> {
    let sets: Vec<GpuSet> = args
        .gpus
        .iter()
        .map(|spec| spec.parse::<GpuSet>().with_context(|| format!("in --gpu {spec}")))
        .collect::<anyhow::Result<_>>()?;
    if args.context == 0 {
        bail!("--context 0 leaves no room for a prompt; give the tokens per sequence, e.g. --context 8192");
    }
    if args.concurrency == 0 {
        bail!("--concurrency 0 serves nothing; give the sequences served at once, e.g. --concurrency 1");
    }
    let options = FitOptions {
        context: args.context,
        concurrency: args.concurrency,
        kv_dtype: args.kv_cache.into(),
    };
    let (info, stats) = inspect(&args.hub, &args.model)?;
    let fits = fit_all(&info, &sets, options);
    let any = fits.iter().any(VariantFit::fits_somewhere);
    match args.output {
        OutputFormat::Json => print_json(&FitJson {
            model: model_json(&info)?,
            gpu_sets: &sets,
            options,
            fits: &fits,
            transfer: stats,
        })?,
        OutputFormat::Human => {
            print!("{}", render_fit(&info, &sets, options, &fits, args.all));
            eprintln!("{}", transfer_line(&stats));
        }
    }
    Ok(ExitCode::from(if any { EXIT_OK } else { EXIT_FAILURE }))
}

#[derive(Serialize)]
struct InspectReport {
    /// [`model_json`].
    model: serde_json::Value,
    transfer: TransferStats,
}

#[derive(Serialize)]
struct FitJson<'a> {
    /// [`model_json`].
    model: serde_json::Value,
    gpu_sets: &'a [GpuSet],
    options: FitOptions,
    /// Best first.
    fits: &'a [VariantFit],
    transfer: TransferStats,
}

/// The model as the JSON outputs show it: [`ModelInfo`] with the parameter total the human
/// output prints (`shape.params.total`, each tensor counted once) beside the breakdown.
fn model_json(info: &ModelInfo) -> anyhow::Result<serde_json::Value> {
    let mut model = serde_json::to_value(info)?;
    let params = model
        .pointer_mut("/shape/params")
        .and_then(serde_json::Value::as_object_mut)
        .context("the model's JSON has no `shape.params` object to add the parameter total to")?;
    params.insert("total".to_owned(), serde_json::Value::from(info.shape.params.total()));
    Ok(model)
}

fn print_json(value: &impl Serialize) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer_pretty(&mut out, value)?;
    writeln!(out)?;
    Ok(())
}

impl From<KvCacheType> for KvDtype {
    fn from(kv: KvCacheType) -> KvDtype {
        match kv {
            KvCacheType::Auto => KvDtype::Auto,
            KvCacheType::F16 => KvDtype::F16,
            KvCacheType::Bf16 => KvDtype::Bf16,
            KvCacheType::Fp8 => KvDtype::Fp8,
            KvCacheType::Q8_0 => KvDtype::Q8_0,
            KvCacheType::Q4_0 => KvDtype::Q4_0,
        }
    }
}

/// Thousands separators: `8,030,261,248`.
fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn short_sha(info: &ModelInfo) -> &str {
    info.sha.as_str().get(..12).unwrap_or(info.sha.as_str())
}

/// The tables of `inspect` and `fit`: indented, two spaces apart.
const TABLE: crate::table::Style = crate::table::Style {
    indent: "  ",
    gap: 2,
    right_aligned: &[],
};

fn render_inspect(info: &ModelInfo) -> String {
    let mut out = String::new();
    let s = &info.shape;
    let source = match &info.shape_source {
        ShapeSource::ConfigJson => "config.json".to_owned(),
        ShapeSource::Gguf { file } => format!("GGUF metadata of {file}"),
    };
    let _ = writeln!(out, "{} @ {} ({})", info.repo, info.revision, short_sha(info));
    let _ = writeln!(out, "architecture  {} (shape from {source})", s.architecture);
    if let skein_model_registry::ModelTask::Embed { pooling } = info.task {
        let pooling = pooling.map_or("the engine's default", |p| p.name());
        let _ = writeln!(
            out,
            "task          embeddings (pooling: {pooling}); served on POST /v1/embeddings"
        );
    }
    let p = &s.params;
    let _ = writeln!(
        out,
        "parameters    {} (embedding {}, layers {}, output {}{})",
        grouped(p.total()),
        grouped(p.embeddings),
        grouped(p.attention + p.mlp + p.router + p.layer_norms),
        grouped(p.lm_head),
        p.vision_tower
            .map(|v| format!(", vision tower {}", grouped(v.total())))
            .unwrap_or_default()
    );
    let experts = s
        .moe
        .map(|m| format!(" · experts {} ({} per token)", m.num_experts, m.experts_per_token))
        .unwrap_or_default();
    let _ = writeln!(
        out,
        "layers        {} · hidden {} · heads {} · KV heads {} · head dim {} · MLP {} · vocab {}{experts}",
        s.layers, s.hidden, s.heads, s.kv_heads, s.head_dim, s.intermediate, s.vocab
    );
    let kv = s
        .kv_bytes_per_token(KvDtype::Bf16)
        .map(|b| format!("{b}/token at 16 bits"))
        .unwrap_or_else(|e| e.to_string());
    let window = s
        .sliding_window
        .map(|w| format!(" · sliding window {w}"))
        .unwrap_or_default();
    let _ = writeln!(
        out,
        "context       {} tokens{window} · KV cache {kv}",
        grouped(s.max_context)
    );
    let valid: Vec<String> = info
        .tp_degrees
        .iter()
        .filter(|d| d.is_valid())
        .map(|d| d.degree.to_string())
        .collect();
    let _ = writeln!(out, "tensor parallel  valid degrees {} (unquantized)", valid.join(", "));
    for degree in info.tp_degrees.iter().filter(|d| !d.is_valid()) {
        if let Some(why) = degree.invalid {
            let _ = writeln!(out, "                 not {}: {why}", degree.degree);
        }
    }

    let _ = writeln!(out, "\nvariants ({}, best precision first)", info.variants.len());
    let rows: Vec<Vec<String>> = info
        .variants
        .iter()
        .map(|v| {
            let q = &v.quantization;
            vec![
                v.id.clone(),
                q.format.to_string(),
                q.method.to_string(),
                format!("{:.2}", q.bits),
                q.group_size.map_or("-".to_owned(), |g| g.to_string()),
                v.size.to_string(),
                v.weights.loaded().map_or_else(|e| e.to_string(), |b| b.to_string()),
                if v.tp_degrees.is_empty() {
                    "layers".to_owned()
                } else {
                    v.tp_degrees.iter().map(u64::to_string).collect::<Vec<_>>().join(",")
                },
                match (v.source, v.exact()) {
                    (VariantSource::ThisRepo, true) => "this repo, headers",
                    (VariantSource::ThisRepo, false) => "this repo, computed",
                    (VariantSource::QuantizedDerivative, true) => "derivative, headers",
                    (VariantSource::QuantizedDerivative, false) => "derivative, computed",
                    (VariantSource::Pinned, true) => "pinned, headers",
                    (VariantSource::Pinned, false) => "pinned, computed",
                }
                .to_owned(),
            ]
        })
        .collect();
    out.push_str(&crate::table::render(
        &TABLE,
        &[
            "variant", "format", "method", "bits/w", "group", "on hub", "loaded", "TP", "source",
        ],
        &rows,
    ));
    if !info.skipped.is_empty() {
        let _ = writeln!(out, "\nskipped");
        for s in &info.skipped {
            let _ = writeln!(out, "  {}: {}", s.id, s.reason);
        }
    }
    for note in &info.notes {
        let _ = writeln!(out, "note: {note}");
    }
    out
}

fn render_fit(info: &ModelInfo, sets: &[GpuSet], options: FitOptions, fits: &[VariantFit], all: bool) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{} @ {} ({}) · context {} × {} sequence{} · KV cache {}",
        info.repo,
        info.revision,
        short_sha(info),
        options.context,
        options.concurrency,
        if options.concurrency == 1 { "" } else { "s" },
        options.kv_dtype
    );
    let sets_line: Vec<String> = sets
        .iter()
        .map(|s| {
            let memory: Vec<String> = s.gpus.iter().map(|g| g.memory.to_string()).collect();
            format!("{} ({})", s.label, memory.join(" + "))
        })
        .collect();
    let _ = writeln!(out, "GPU sets: {}\n", sets_line.join(", "));

    let mut header = vec!["#", "variant", "method", "engine"];
    header.extend(sets.iter().map(|s| s.label.as_str()));
    let any_fits = fits.iter().any(VariantFit::fits_somewhere);
    let shown: Vec<&VariantFit> = fits.iter().filter(|f| all || !any_fits || f.fits_somewhere()).collect();
    let rows: Vec<Vec<String>> = shown
        .iter()
        .enumerate()
        .map(|(rank, f)| {
            let v = &info.variants[f.variant];
            let mut row = vec![
                (rank + 1).to_string(),
                v.id.clone(),
                v.quantization.method.to_string(),
                skein_model_registry::catalog::fit::engine_for(v.format())
                    .map_or("-", |e| e.name())
                    .to_owned(),
            ];
            row.extend(f.sets.iter().map(cell));
            row
        })
        .collect();
    out.push_str(&crate::table::render(&TABLE, &header, &rows));
    let hidden = fits.len() - shown.len();
    if hidden > 0 {
        let plural = if hidden == 1 { "variant fits" } else { "variants fit" };
        let _ = writeln!(out, "  … and {hidden} {plural} no set (--all lists them)");
    }
    if !any_fits {
        let _ = writeln!(out, "\nno variant fits any set.");
    }

    // The breakdown of the best choice, and of each set's best variant.
    let mut explained: Vec<(usize, usize)> = Vec::new();
    for (set_index, _) in sets.iter().enumerate() {
        if let Some(f) = fits.iter().find(|f| f.sets[set_index].fits) {
            explained.push((f.variant, set_index));
        }
    }
    if explained.is_empty() {
        // Nothing fits: explain how close the best-precision variant came on each set.
        if let Some(f) = fits.first() {
            explained.extend((0..sets.len()).map(|s| (f.variant, s)));
        }
    }
    // (variant, the GPUs used by name, layout) already shown, and on which set.
    let mut shown_placements: Vec<(PlacementKey, &str)> = Vec::new();
    for (variant, set_index) in explained {
        let Some(f) = fits.iter().find(|f| f.variant == variant) else {
            continue;
        };
        let set_fit = &f.sets[set_index];
        let verdict = if set_fit.fits { "fits" } else { "does not fit" };
        if let Some(p) = &set_fit.placement {
            let names = p.gpus.iter().map(|&i| sets[set_index].gpus[i].name.as_str()).collect();
            let key = (variant, names, p.layout().to_string());
            if let Some((_, first)) = shown_placements.iter().find(|(k, _)| *k == key) {
                let _ = writeln!(out, "\n{} on {} — {verdict}, placed as on {first}", f.id, set_fit.set);
                continue;
            }
            shown_placements.push((key, set_fit.set.as_str()));
        }
        let _ = writeln!(out, "\n{} on {} — {verdict}", f.id, set_fit.set);
        match &set_fit.placement {
            Some(p) => {
                let gpus: Vec<String> = p
                    .gpus
                    .iter()
                    .map(|&i| format!("{} #{i}", sets[set_index].gpus[i].name))
                    .collect();
                let _ = writeln!(out, "GPUs: {}", gpus.join(", "));
                let _ = write!(out, "{}", p.estimate);
                let _ = write!(out, "{}", p.report);
            }
            None => {
                let _ = writeln!(out, "{}", set_fit.reason.as_deref().unwrap_or("no estimate"));
            }
        }
    }
    out
}

/// A placement as the reader sees it: the variant, the GPUs used by name, the layout.
type PlacementKey<'a> = (usize, Vec<&'a str>, String);

/// One table cell: `yes · TP 2 · 11.9 GiB/GPU`, `no · 1.8 GiB short`.
fn cell(fit: &SetFit) -> String {
    match &fit.placement {
        Some(p) if fit.fits => {
            let layout = p.layout();
            let shape = if layout.devices() == 1 {
                "1 GPU".to_owned()
            } else {
                layout.to_string()
            };
            format!("yes · {shape} · {}", p.max_need())
        }
        Some(p) => {
            let short = p.report.devices.iter().map(|d| d.short).max().unwrap_or(Bytes::ZERO);
            format!("no · {short} short")
        }
        None => "no · cannot run".to_owned(),
    }
}
