//! Skein agents as a real Slurm job: Debian's Slurm (slurmctld and slurmd 22.05, munge
//! for their authentication) on localhost with a configuration written here — one node
//! `skein-node` with four fake GPUs (GRES files that are links to character devices,
//! named `nvidia*` so that Slurm sets `CUDA_VISIBLE_DEVICES` as for NVIDIA cards) —
//! `skein server`, and `skein slurm submit` of a 2-GPU job whose agent presents the
//! simulated node `skein-node` (four RTX 4090s).
//!
//! Another job holds GPU 0 first, so Slurm gives the agents GPUs 1 and 2: the node must
//! register exactly those two, with the `slurm.job` and `slurm.end` labels. Then
//! `scancel --signal=USR1` (the `--signal` warning before the time limit) drains it,
//! and `scancel` makes it leave: the node is marked left (not down) within seconds.
//!
//! `tests/slurm/install.sh` installs Slurm and munge first when they are missing (as
//! root, or through `sudo -n`); without them the test fails saying what to install.
//! The daemons are this test's children, with their own ports, state, spool and log
//! directories in a temporary directory, and are stopped (their jobs cancelled first)
//! however the test ends.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::Value;
use skein_testkit::lab::{Killed, Lab};
use skein_testkit::net::free_port;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The Slurm node's name (the simulated node's too).
const NODE: &str = "skein-node";

/// Longest wait for Slurm (daemons up, a job running).
const SLURM_PATIENCE: Duration = Duration::from_secs(60);

/// A one-node Slurm cluster on localhost, owned by the test.
struct Slurm {
    dir: tempfile::TempDir,
    /// Who runs the daemons and the jobs.
    user: String,
    // Dropped in reverse order of start by `Drop` (jobs cancelled first).
    daemons: Vec<Killed>,
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// The output of a command that must succeed.
fn run(command: &mut Command) -> String {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    assert!(output.status.success(), "{command:?} failed: {}", text(&output));
    String::from_utf8_lossy(&output.stdout).into_owned()
}

impl Slurm {
    /// Writes the configuration and starts munged, slurmctld and slurmd; returns once
    /// the node is idle.
    fn start() -> Slurm {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_owned();
        let path = path.as_path();
        for sub in ["state", "spool", "log", "run", "dev"] {
            std::fs::create_dir_all(path.join(sub)).unwrap();
        }
        // Fake GPUs: Slurm only checks that GRES files are character or block devices.
        for (i, device) in ["/dev/null", "/dev/zero", "/dev/full", "/dev/urandom"]
            .iter()
            .enumerate()
        {
            std::os::unix::fs::symlink(device, path.join(format!("dev/nvidia{i}"))).unwrap();
        }
        let key = path.join("munge.key");
        let mut random = vec![0u8; 1024];
        std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom").unwrap(), &mut random).unwrap();
        std::fs::write(&key, &random).unwrap();
        std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o400)).unwrap();

        let host = run(Command::new("hostname").arg("-s")).trim().to_owned();
        let user = run(Command::new("id").arg("-un")).trim().to_owned();
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let p = path.display();
        let socket = path.join("run/munge.sock");
        let conf = format!(
            "ClusterName=skeintest\n\
             SlurmctldHost={host}(127.0.0.1)\n\
             SlurmUser={user}\n\
             SlurmdUser={user}\n\
             SlurmctldPort={ctld}\n\
             SlurmdPort={slurmd}\n\
             AuthType=auth/munge\n\
             AuthInfo=socket={socket}\n\
             CredType=cred/munge\n\
             StateSaveLocation={p}/state\n\
             SlurmdSpoolDir={p}/spool\n\
             SlurmctldPidFile={p}/run/slurmctld.pid\n\
             SlurmdPidFile={p}/run/slurmd.pid\n\
             SlurmctldLogFile={p}/log/slurmctld.log\n\
             SlurmdLogFile={p}/log/slurmd.log\n\
             ProctrackType=proctrack/linuxproc\n\
             TaskPlugin=task/none\n\
             JobAcctGatherType=jobacct_gather/none\n\
             AccountingStorageType=accounting_storage/none\n\
             JobCompType=jobcomp/none\n\
             SwitchType=switch/none\n\
             MpiDefault=none\n\
             SelectType=select/cons_tres\n\
             SelectTypeParameters=CR_Core\n\
             GresTypes=gpu\n\
             ReturnToService=2\n\
             KillWait=5\n\
             NodeName={NODE} NodeAddr=127.0.0.1 NodeHostname={host} CPUs={cpus} RealMemory=1000 Gres=gpu:4 State=UNKNOWN\n\
             PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n",
            socket = socket.display(),
            ctld = free_port(),
            slurmd = free_port(),
        );
        std::fs::write(path.join("slurm.conf"), conf).unwrap();
        std::fs::write(
            path.join("gres.conf"),
            format!("NodeName={NODE} Name=gpu File={p}/dev/nvidia[0-3]\n"),
        )
        .unwrap();
        // No device confinement (the fake files are not GPUs); on a cgroup v2 machine
        // without systemd, slurmd manages without it.
        std::fs::write(
            path.join("cgroup.conf"),
            "ConstrainDevices=no\nIgnoreSystemdOnFailure=yes\n",
        )
        .unwrap();

        let mut slurm = Slurm {
            dir,
            user,
            daemons: Vec::new(),
        };
        let log = |name: &str| std::fs::File::create(slurm.dir.path().join("log").join(name)).unwrap();
        let munged = Command::new("munged")
            .arg("--foreground")
            .arg("--force")
            .arg(format!("--key-file={}", key.display()))
            .arg(format!("--socket={}", socket.display()))
            .arg(format!("--pid-file={p}/run/munged.pid"))
            .arg(format!("--log-file={p}/log/munged.log"))
            .arg(format!("--seed-file={p}/run/munged.seed"))
            .stdout(Stdio::null())
            .stderr(log("munged.out"))
            .spawn()
            .expect("munged starts");
        slurm.daemons.push(Killed(munged));
        slurm.wait("munged's socket", || socket.exists());
        let conf = slurm.conf();
        let ctld = Command::new("slurmctld")
            .args(["-D", "-i", "-f"])
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(log("slurmctld.out"))
            .spawn()
            .expect("slurmctld starts");
        slurm.daemons.push(Killed(ctld));
        let slurmd = Command::new("slurmd")
            .args(["-D", "-N", NODE, "-f"])
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(log("slurmd.out"))
            .spawn()
            .expect("slurmd starts");
        slurm.daemons.push(Killed(slurmd));
        slurm.wait("the Slurm node to be idle", || {
            slurm
                .command("sinfo")
                .args(["-h", "-n", NODE, "-o", "%T"])
                .output()
                .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "idle")
        });
        slurm
    }

    fn conf(&self) -> PathBuf {
        self.dir.path().join("slurm.conf")
    }

    fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A Slurm client command of this cluster.
    fn command(&self, program: &str) -> Command {
        let mut command = Command::new(program);
        command.env("SLURM_CONF", self.conf());
        command
    }

    /// Waits for `done`, failing with the daemons' logs after [`SLURM_PATIENCE`].
    fn wait(&self, what: &str, done: impl Fn() -> bool) {
        let deadline = Instant::now() + SLURM_PATIENCE;
        while !done() {
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A job's state (`RUNNING`, `PENDING`, …), empty once it left the queue.
    fn state(&self, job: &str) -> String {
        let output = self.command("squeue").args(["-h", "-j", job, "-o", "%T"]).output();
        output.map_or_else(
            |_| String::new(),
            |o| String::from_utf8_lossy(&o.stdout).trim().to_owned(),
        )
    }

    /// The tail of every log of the cluster and of the jobs.
    fn logs(&self) -> String {
        let mut out = String::new();
        for dir in [self.dir().join("log"), self.dir().to_owned()] {
            let Ok(entries) = std::fs::read_dir(&dir) else { continue };
            let mut files: Vec<PathBuf> = entries
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.is_file() && (p.extension().is_some_and(|e| e == "log" || e == "out")))
                .collect();
            files.sort();
            for file in files {
                let text = std::fs::read_to_string(&file).unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                out.push_str(&format!("── {} ──\n", file.display()));
                for line in &lines[lines.len().saturating_sub(25)..] {
                    out.push_str(line);
                    out.push('\n');
                }
            }
        }
        out
    }
}

impl Drop for Slurm {
    fn drop(&mut self) {
        // Jobs first: their step daemons would outlive slurmd.
        let _ = self.command("scancel").args(["--user", &self.user]).output();
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            let queue = self.command("squeue").args(["-h", "-o", "%i"]).output();
            if queue.is_err() || queue.is_ok_and(|o| o.stdout.iter().all(u8::is_ascii_whitespace)) {
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        while let Some(mut daemon) = self.daemons.pop() {
            daemon.kill();
        }
    }
}

fn node(lab: &Lab) -> Value {
    lab.get_or_null("/v1/graph")["nodes"]
        .as_array()
        .and_then(|nodes| nodes.iter().find(|n| n["inventory"]["name"] == NODE).cloned())
        .unwrap_or(Value::Null)
}

fn unix_now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() as i64
}

#[test]
fn agents_in_a_slurm_job_register_its_gpus_and_leave_when_it_is_cancelled() {
    let started = Instant::now();
    let install = Command::new("bash")
        .arg(Path::new(ROOT).join("tests/slurm/install.sh"))
        .status()
        .expect("bash runs tests/slurm/install.sh");
    assert!(
        install.success(),
        "tests/slurm/install.sh failed: this test needs Debian's slurmctld, slurmd, slurm-client and munge \
         (apt-get install slurmctld slurmd slurm-client munge, as root)"
    );
    let slurm = Slurm::start();

    let lab = Lab::new(env!("CARGO_BIN_EXE_skein"));
    let _server = lab.server();
    let fleet = slurm.dir().join("fleet.yaml");
    std::fs::write(
        &fleet,
        format!("fleet: slurm-test\nnodes:\n  {NODE}:\n    gpus: {{ model: RTX4090-24GB, count: 4 }}\n"),
    )
    .unwrap();

    // Another job takes GPU 0, so the agents' job gets GPUs 1 and 2.
    let blocker = run(slurm.command("sbatch").args([
        "--parsable",
        "--gpus-per-node=1",
        "--output=/dev/null",
        "--wrap=sleep 600",
    ]))
    .trim()
    .to_owned();
    slurm.wait("the first job to run", || slurm.state(&blocker) == "RUNNING");

    let output = slurm.dir().join("agents-%j.out");
    let submitted = slurm
        .command(env!("CARGO_BIN_EXE_skein"))
        .args(["slurm", "submit", "--join", &lab.join_url(), "--data-dir"])
        .arg(lab.data_dir())
        .args(["--nodes", "1", "--gpus-per-node", "2", "--time", "10", "--output"])
        .arg(&output)
        .args(["--", "--simulate"])
        .arg(&fleet)
        .arg("--data-dir")
        .arg(slurm.dir().join("agent"))
        .output()
        .unwrap();
    let said = text(&submitted);
    assert!(submitted.status.success(), "skein slurm submit failed: {said}");
    let job = said
        .lines()
        .find_map(|line| line.strip_prefix("submitted Slurm job "))
        .and_then(|rest| rest.split(':').next())
        .unwrap_or_else(|| panic!("no job id in: {said}"))
        .to_owned();
    assert!(said.contains("JOBID"), "the job's state is shown: {said}");
    let job_log = slurm.dir().join(format!("agents-{job}.out"));

    // The agent joins with the job's two GPUs and its labels.
    let joined = lab.wait_for("the Slurm node to join", "/v1/graph", |_| {
        let node = node(&lab);
        node["connected"] == true && node["gpus"].as_array().is_some_and(|g| !g.is_empty())
    });
    let node_view = node(&lab);
    let gpus = node_view["gpus"].as_array().unwrap();
    assert_eq!(gpus.len(), 2, "only the job's GPUs: {joined:#}");
    assert_eq!(
        gpus.iter()
            .map(|g| g["facts"]["index"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        vec![0, 1]
    );
    let labels = &node_view["inventory"]["labels"];
    assert_eq!(labels["slurm.job"], job.as_str(), "{node_view:#}");
    let end: i64 = labels["slurm.end"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("a slurm.end label of Unix seconds: {node_view:#}"));
    // A 10-minute limit, from a job that started moments ago.
    let left = end - unix_now();
    assert!((480..=605).contains(&left), "slurm.end is {left} s away: {node_view:#}");
    let agent_log = std::fs::read_to_string(&job_log).unwrap_or_default();
    assert!(
        agent_log.contains(&format!("GPUs 1,2 (2 of 4) allocated by Slurm job {job}")),
        "the agent took Slurm's GPUs 1 and 2 of the four:\n{agent_log}"
    );
    let nodes = lab.cli(&["nodes"]);
    assert!(
        skein_testkit::lab::stdout(&nodes).contains(&format!("slurm.job={job}")),
        "{}",
        text(&nodes)
    );

    // The warning before the time limit drains the node.
    run(slurm.command("scancel").args(["--signal=USR1", &job]));
    lab.wait_for("the node to drain", "/v1/graph", |_| {
        node(&lab)["draining"]
            .as_str()
            .is_some_and(|d| d.contains(&format!("slurm job {job} ends soon")))
    });
    let drained = node(&lab);
    assert!(
        drained["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .all(|g| g["drained"].is_string()),
        "{drained:#}"
    );

    // The end: the node leaves cleanly (how soon is reported, not asserted).
    let cancelled = Instant::now();
    run(slurm.command("scancel").arg(&job));
    lab.wait_for("the node to leave", "/v1/graph", |_| {
        node(&lab)["health"]["state"] == "left"
    });
    eprintln!("the node left {:?} after scancel", cancelled.elapsed());
    let gone = node(&lab);
    assert_eq!(gone["connected"], false, "{gone:#}");
    assert!(
        gone["health"]["reasons"][0]
            .as_str()
            .is_some_and(|r| r.contains(&format!("slurm job {job} ended or was cancelled"))),
        "{gone:#}"
    );
    // Left is not down: past the three silent intervals that make a node down, it is
    // still left.
    std::thread::sleep(Duration::from_millis(1000));
    assert_eq!(node(&lab)["health"]["state"], "left");
    slurm.wait("the job to end", || slurm.state(&job).is_empty());
    let agent_log = std::fs::read_to_string(&job_log).unwrap_or_default();
    assert!(agent_log.contains("leaving the fleet"), "{agent_log}");
    eprintln!("the Slurm test took {:?}", started.elapsed());
}
