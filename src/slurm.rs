//! Skein on Slurm: `skein slurm submit`, the batch script that starts one agent per node
//! of an allocation, and its submission. What `skein agent` does differently inside a
//! Slurm job is `crate::agent::slurm`'s; docs/deploy/slurm.md tells the whole story.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use skein_agent::engine::shell_word;
use skein_agent::slurm as job_env;

use crate::cli::EXIT_OK;
use crate::cli::slurm::SlurmSubmitArgs;

/// How long `sbatch`, `squeue` or `sacct` may take.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);

/// Everything the batch script says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Script {
    /// `#SBATCH --job-name`.
    pub job_name: String,
    /// Nodes, one agent on each.
    pub nodes: u32,
    /// GPUs per node; 0: none asked for.
    pub gpus_per_node: u32,
    /// `#SBATCH --partition`.
    pub partition: Option<String>,
    /// `#SBATCH --account`.
    pub account: Option<String>,
    /// `#SBATCH --time`, as given (checked by [`time_limit_seconds`]).
    pub time: Option<String>,
    /// Seconds before the end at which the agents get SIGUSR1.
    pub warn_seconds: u64,
    /// `#SBATCH --output`.
    pub output: String,
    /// More `#SBATCH` options, as given.
    pub extra: Vec<String>,
    /// The `skein` binary on the nodes.
    pub skein: PathBuf,
    /// The server's agent address.
    pub join: String,
    /// The join token's file on the nodes.
    pub token_file: PathBuf,
    /// More arguments for `skein agent`.
    pub agent_args: Vec<String>,
}

/// The batch script (pure). Values are checked by [`check`] first; words of the agent's
/// command line are shell-quoted.
pub fn script(s: &Script) -> String {
    let mut lines = vec![
        "#!/bin/bash".to_owned(),
        format!("# Skein agents: one per node of this allocation, joined to {}.", s.join),
        "# Made by `skein slurm submit` (docs/deploy/slurm.md).".to_owned(),
        format!("#SBATCH --job-name={}", s.job_name),
        format!("#SBATCH --nodes={}", s.nodes),
        "#SBATCH --ntasks-per-node=1".to_owned(),
    ];
    if s.gpus_per_node > 0 {
        lines.push(format!("#SBATCH --gpus-per-node={}", s.gpus_per_node));
    }
    for (option, value) in [("partition", &s.partition), ("account", &s.account), ("time", &s.time)] {
        if let Some(value) = value {
            lines.push(format!("#SBATCH --{option}={value}"));
        }
    }
    // No `B:`: Slurm signals the job's steps, so each agent gets SIGUSR1 itself.
    lines.push(format!("#SBATCH --signal=USR1@{}", s.warn_seconds));
    lines.push(format!("#SBATCH --output={}", s.output));
    for option in &s.extra {
        lines.push(format!("#SBATCH {option}"));
    }
    lines.extend([
        String::new(),
        "# Each agent registers only the GPUs Slurm gave this job on its node, labelled".to_owned(),
        "# slurm.job and slurm.end. SIGUSR1 (--signal, before the time limit) drains its node:".to_owned(),
        "# the orchestrator moves its instances elsewhere; SIGTERM (the time limit, scancel)".to_owned(),
        "# makes it leave the fleet cleanly and stop its engines. The join token is read".to_owned(),
        "# from a file only its owner can read, never put on a command line.".to_owned(),
        "set -eu".to_owned(),
    ]);
    let mut command: Vec<String> = vec![
        "exec".to_owned(),
        "srun".to_owned(),
        "--ntasks-per-node=1".to_owned(),
        "--kill-on-bad-exit=0".to_owned(),
        shell_word(&s.skein.to_string_lossy()),
        "agent".to_owned(),
        "--join".to_owned(),
        shell_word(&s.join),
        "--token-file".to_owned(),
        shell_word(&s.token_file.to_string_lossy()),
    ];
    command.extend(s.agent_args.iter().map(|a| shell_word(a)));
    lines.push(command.join(" "));
    let mut text = lines.join("\n");
    text.push('\n');
    text
}

/// Seconds of a `--time` limit; `None` for none.
fn time_limit_seconds(text: &str) -> Result<Option<u64>, String> {
    match job_env::parse_time(text) {
        Ok(Some(0)) | Err(_) => Err(format!(
            "--time `{text}` is not a Slurm time limit; write MINUTES, HOURS:MINUTES:SECONDS or DAYS-HOURS[:MINUTES[:SECONDS]] (e.g. 30, 8:00:00, 2-00)"
        )),
        Ok(limit) => Ok(limit),
    }
}

/// Checks what goes into `#SBATCH` lines (sbatch reads them itself: no quoting helps)
/// and the time limit against the warning. Errors say which option and how to fix it.
pub fn check(s: &Script) -> Result<(), String> {
    if s.nodes == 0 {
        return Err("--nodes must be at least 1".to_owned());
    }
    if !(s.join.starts_with("http://") || s.join.starts_with("https://")) {
        return Err(format!(
            "--join `{}` is not the server's agent address; write http://HOST:7879 (https:// with TLS), as the compute nodes reach it",
            s.join
        ));
    }
    let single_word = |option: &str, value: &str| {
        if value.is_empty() || value.chars().any(|c| c.is_whitespace() || c.is_control()) {
            Err(format!(
                "{option} `{value}` must be one word without spaces (it goes into an #SBATCH line)"
            ))
        } else {
            Ok(())
        }
    };
    single_word("--job-name", &s.job_name)?;
    single_word("--output", &s.output)?;
    for (option, value) in [
        ("--partition", &s.partition),
        ("--account", &s.account),
        ("--time", &s.time),
    ] {
        if let Some(value) = value {
            single_word(option, value)?;
        }
    }
    for option in &s.extra {
        if !option.starts_with('-') || option.chars().any(|c| c == '\n' || c == '\r') {
            return Err(format!(
                "--sbatch `{option}` is not an sbatch option on one line; write e.g. --sbatch=--constraint=a100"
            ));
        }
    }
    if s.warn_seconds == 0 {
        return Err("--warn-before must be at least 1s".to_owned());
    }
    if let Some(limit) = s.time.as_deref().map(time_limit_seconds).transpose()?.flatten()
        && s.warn_seconds >= limit
    {
        return Err(format!(
            "--warn-before {} s is not shorter than the time limit --time {} ({limit} s); shorten the warning or lengthen the job",
            s.warn_seconds,
            s.time.as_deref().unwrap_or_default()
        ));
    }
    Ok(())
}

/// `skein slurm submit`.
pub fn run_submit(args: &SlurmSubmitArgs) -> anyhow::Result<ExitCode> {
    let warn = humantime::parse_duration(&args.warn_before).with_context(|| {
        format!(
            "--warn-before `{}` is not a duration; write e.g. 5m or 300s",
            args.warn_before
        )
    })?;
    let token_file = match &args.token_file {
        Some(file) => file.clone(),
        None => crate::data_dir::data_dir(args.data_dir.as_deref())?.join("join-token"),
    };
    let token_file = check_token_file(&token_file, args.print)?;
    let skein = match &args.skein {
        Some(path) => path.clone(),
        None => std::env::current_exe().context("cannot find this skein binary; pass --skein PATH")?,
    };
    let spec = Script {
        job_name: args.job_name.clone(),
        nodes: args.nodes,
        gpus_per_node: args.gpus_per_node,
        partition: args.partition.clone(),
        account: args.account.clone(),
        time: args.time.clone(),
        warn_seconds: warn.as_secs().max(u64::from(warn.subsec_nanos() > 0)),
        output: args.output.clone(),
        extra: args.sbatch.clone(),
        skein,
        join: args.join.clone(),
        token_file,
        agent_args: args.agent_args.clone(),
    };
    check(&spec).map_err(anyhow::Error::msg)?;
    let text = script(&spec);
    if args.print {
        print!("{text}");
        return Ok(ExitCode::from(EXIT_OK));
    }
    let job = sbatch(&text)?;
    println!(
        "submitted Slurm job {job}: {} node(s), each joining {}",
        spec.nodes, spec.join
    );
    match job_state(&job) {
        Ok(state) => print!("{state}"),
        Err(error) => eprintln!("warning: cannot show the job's state: {error:#}"),
    }
    println!("The agents join when the job starts; follow it with `squeue -j {job}` and `skein nodes`.");
    Ok(ExitCode::from(EXIT_OK))
}

/// The token file as an absolute path (the job may start elsewhere), after checking
/// that it holds a token and that only its owner can read it. When only printing, a
/// file that is not here is a warning (it may exist where the script is submitted).
fn check_token_file(file: &Path, printing: bool) -> anyhow::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let absolute = std::path::absolute(file).with_context(|| format!("cannot resolve {}", file.display()))?;
    let metadata = match std::fs::metadata(&absolute) {
        Ok(metadata) => metadata,
        Err(error) if printing && error.kind() == std::io::ErrorKind::NotFound => {
            eprintln!(
                "warning: the token file {} is not on this machine; the script expects it on the compute nodes",
                absolute.display()
            );
            return Ok(absolute);
        }
        Err(error) => {
            return Err(error).with_context(|| {
                format!(
                    "cannot read the join token file {}; pass --token-file FILE (a copy of the server's <data dir>/join-token, mode 600, where the compute nodes can read it)",
                    absolute.display()
                )
            });
        }
    };
    let mode = metadata.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        bail!(
            "the join token file {} can be read by others (mode {mode:03o}); run `chmod 600 {}`",
            absolute.display(),
            absolute.display()
        );
    }
    let text = std::fs::read_to_string(&absolute)
        .with_context(|| format!("cannot read the join token file {}", absolute.display()))?;
    if text.trim().is_empty() {
        bail!("the join token file {} is empty", absolute.display());
    }
    Ok(absolute)
}

/// Output of a finished Slurm command, or why there is none.
fn run_command(program: &str, args: &[&str], stdin: Option<&str>) -> anyhow::Result<std::process::Output> {
    job_env::output(program, args, stdin, COMMAND_TIMEOUT).map_err(|error| match error {
        job_env::CommandError::Missing(_) => anyhow::anyhow!(
            "`{program}` is not installed here; run this on a Slurm login node, or pass --print and submit the script there"
        ),
        error => anyhow::Error::new(error),
    })
}

/// Submits `script` through `sbatch --parsable` (on its standard input); returns the
/// job id.
fn sbatch(script: &str) -> anyhow::Result<String> {
    let output = run_command("sbatch", &["--parsable"], Some(script))?;
    let stderr = String::from_utf8_lossy(&output.stderr).trim().to_owned();
    if !output.status.success() {
        bail!(
            "sbatch refused the job ({}): {stderr}; `skein slurm submit --print` shows the script it was given",
            output.status
        );
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    // `--parsable` prints `JOBID` or `JOBID;CLUSTER`.
    let job = stdout.trim().split(';').next().unwrap_or("").to_owned();
    if job.is_empty() || !job.bytes().all(|b| b.is_ascii_digit()) {
        bail!("sbatch answered `{}`, not a job id; stderr: {stderr}", stdout.trim());
    }
    Ok(job)
}

/// The job's state as `squeue` shows it, or `sacct` once it left the queue.
fn job_state(job: &str) -> anyhow::Result<String> {
    let output = run_command(
        "squeue",
        &["-j", job, "-o", "%.10i %.12P %.16j %.10T %.10M %.10l %.6D %R"],
        None,
    )?;
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    if output.status.success() && text.lines().count() > 1 {
        return Ok(text);
    }
    let output = run_command(
        "sacct",
        &["-X", "-j", job, "-o", "JobID,JobName,State,Elapsed,ExitCode"],
        None,
    )?;
    if !output.status.success() {
        bail!(
            "neither squeue nor sacct knows job {job}: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lab() -> Script {
        Script {
            job_name: "skein-agents".to_owned(),
            nodes: 2,
            gpus_per_node: 4,
            partition: Some("gpu".to_owned()),
            account: None,
            time: Some("8:00:00".to_owned()),
            warn_seconds: 300,
            output: "skein-agents-%j.out".to_owned(),
            extra: vec!["--constraint=a100".to_owned()],
            skein: PathBuf::from("/shared/bin/skein"),
            join: "http://head.lab:7879".to_owned(),
            token_file: PathBuf::from("/home/ada/.skein/join-token"),
            agent_args: vec!["--label".to_owned(), "zone=lab b".to_owned()],
        }
    }

    #[test]
    fn the_lab_script() {
        insta::assert_snapshot!(script(&lab()));
    }

    #[test]
    fn a_cpu_only_job_without_limit_or_partition() {
        let spec = Script {
            nodes: 1,
            gpus_per_node: 0,
            partition: None,
            time: None,
            extra: Vec::new(),
            agent_args: Vec::new(),
            skein: PathBuf::from("/opt/skein it's/skein"),
            ..lab()
        };
        insta::assert_snapshot!(script(&spec));
    }

    #[test]
    fn quoting_keeps_each_word_whole() {
        assert_eq!(shell_word("zone=lab-a"), "zone=lab-a");
        assert_eq!(shell_word("a b"), "'a b'");
        assert_eq!(shell_word("it's"), r"'it'\''s'");
        assert_eq!(shell_word("$(rm -rf /)"), "'$(rm -rf /)'");
        assert_eq!(shell_word(""), "''");
    }

    #[test]
    fn time_limits_are_slurms_times_and_not_zero() {
        assert_eq!(time_limit_seconds("8:00:00"), Ok(Some(28_800)));
        assert_eq!(time_limit_seconds("UNLIMITED"), Ok(None));
        assert!(time_limit_seconds("0").is_err());
        assert!(
            time_limit_seconds("8h")
                .unwrap_err()
                .starts_with("--time `8h` is not a Slurm time limit")
        );
    }

    #[test]
    fn bad_input_is_refused_with_the_option_named() {
        let refused = |spec: Script| check(&spec).unwrap_err();
        assert_eq!(check(&lab()), Ok(()));
        assert_eq!(refused(Script { nodes: 0, ..lab() }), "--nodes must be at least 1");
        assert!(
            refused(Script {
                partition: Some("gpu a100".to_owned()),
                ..lab()
            })
            .starts_with("--partition `gpu a100` must be one word")
        );
        assert!(
            refused(Script {
                join: "head:7879".to_owned(),
                ..lab()
            })
            .starts_with("--join `head:7879` is not")
        );
        assert!(
            refused(Script {
                time: Some("4".to_owned()),
                ..lab()
            })
            .starts_with("--warn-before 300 s is not shorter than the time limit --time 4 (240 s)")
        );
        assert!(
            refused(Script {
                time: Some("8h".to_owned()),
                ..lab()
            })
            .starts_with("--time `8h` is not a Slurm time limit")
        );
        assert!(
            refused(Script {
                extra: vec!["constraint=a100".to_owned()],
                ..lab()
            })
            .starts_with("--sbatch `constraint=a100` is not an sbatch option")
        );
    }
}
