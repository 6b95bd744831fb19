//! The `longhaul` operator CLI.
//!
//! Each command family lives in its own module; this one holds the argument
//! definitions, file loading and the mapping of failures to exit codes
//! (0: success, 1: the command could not run, 2: the input is invalid).

pub mod certs;
pub mod emulate;
pub mod plan;
pub mod rehearse;
mod remote;
mod rounds;
pub mod simulate;
pub mod sync;
mod table;
pub mod topology;

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::{Args, Parser, Subcommand, ValueEnum};
use longhaul_core::config::violations_in;
use longhaul_core::{ConfigError, JobSpec, Scenario, Topology};

/// The topology used when `topology show` is given no file.
pub const DEFAULT_TOPOLOGY_NAME: &str = "two-campuses-80km (bundled)";
pub const DEFAULT_TOPOLOGY: &str = include_str!("../../../deploy/examples/two-campuses-80km.toml");

/// longhaul coordinates one training job across campuses tens to thousands of
/// kilometres apart.
///
/// Files are TOML; every error names the file, line, column and field.
/// Exit status: 0 on success, 1 when the command could not run, 2 when the
/// input is invalid or cannot be satisfied (a job that fits nowhere).
#[derive(Debug, Parser)]
#[command(name = "longhaul", version, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Validate and inspect topology files (sites, buildings, domains, WAN links).
    #[command(subcommand)]
    Topology(TopologyCommand),
    /// Validate job files (model shape, batch, constraints).
    #[command(subcommand)]
    Job(JobCommand),
    /// Validate rehearsal scenario files and the files they refer to.
    #[command(subcommand)]
    Scenario(ScenarioCommand),
    /// Place a job on a topology (no coordinator needed) and explain the plan.
    Plan(plan::PlanArgs),
    /// How a DiLoCo job's sites synchronise: plan it from files, or show a
    /// stored job's schedule.
    #[command(subcommand)]
    Sync(sync::SyncCommand),
    /// Compare what one training step costs as synchronous data parallelism
    /// across sites, as a cross-site pipeline and as DiLoCo (configured by the
    /// sync planner) over a sweep of WAN distance, rate, loss, parallel links,
    /// H or bits (no coordinator needed).
    Simulate(simulate::SimulateArgs),
    /// Query and manage a running coordinator cluster.
    #[command(subcommand)]
    Cluster(remote::ClusterCommand),
    /// Sites registered with a running coordinator.
    #[command(subcommand)]
    Sites(remote::SitesCommand),
    /// WAN links configured in a running coordinator, with measurements.
    #[command(subcommand)]
    Links(remote::LinksCommand),
    /// Jobs stored in a running coordinator.
    #[command(subcommand)]
    Jobs(remote::JobsCommand),
    /// Outer rounds of a job in a running coordinator.
    #[command(subcommand)]
    Rounds(rounds::RoundsCommand),
    /// Rehearse a distance scenario: real coordinator replicas and agents
    /// on this machine, behind emulated WAN links; the job placed, the fault
    /// timeline played, and a report of what happened.
    Rehearse(rehearse::RehearseArgs),
    /// Roles of the processes `rehearse` starts (not for direct use).
    #[command(subcommand, hide = true)]
    Internal(rehearse::InternalCommand),
    /// Run the network emulator for a scenario: loopback proxies behind
    /// emulated WAN links, and a control API. Runs until Ctrl-C.
    Emulate(emulate::EmulateArgs),
    /// Talk to a running `emulate`: list links, change, cut and heal them.
    #[command(subcommand)]
    Emulator(emulate::EmulatorCommand),
    /// Make the cluster's certificate authority and the certificates of
    /// replicas, operators and site agents, named as mTLS authorization
    /// expects.
    #[command(subcommand)]
    Certs(certs::CertsCommand),
}

#[derive(Debug, Subcommand)]
pub enum TopologyCommand {
    /// Check a topology file and print a one-line summary.
    Check(FileArgs),
    /// Print a topology as a tree with per-site totals, WAN RTT and BDP per
    /// link, and bisection bandwidth per level.
    Show(ShowArgs),
}

#[derive(Debug, Subcommand)]
pub enum JobCommand {
    /// Check a job file; with --topology, also check it against a topology.
    Check(JobCheckArgs),
}

#[derive(Debug, Subcommand)]
pub enum ScenarioCommand {
    /// Check a scenario file, its topology and job files, and their references.
    Check(FileArgs),
}

#[derive(Debug, Args)]
pub struct FileArgs {
    /// The file to read.
    pub file: PathBuf,
    #[arg(long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
}

#[derive(Debug, Args)]
pub struct ShowArgs {
    /// The topology file; the bundled two-campuses-80km example when omitted.
    pub file: Option<PathBuf>,
    #[arg(long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
}

#[derive(Debug, Args)]
pub struct JobCheckArgs {
    /// The job file to read.
    pub file: PathBuf,
    /// A topology file to check the job's constraints against.
    #[arg(long)]
    pub topology: Option<PathBuf>,
    #[arg(long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
}

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Readable text.
    Text,
    /// One JSON document on stdout, for machines.
    Json,
}

/// Why a command failed.
#[derive(Debug)]
pub enum Failure {
    /// The input is invalid (exit status 2).
    Invalid(ConfigError),
    /// The input is valid but asks for what cannot be done, such as a job
    /// that fits nowhere on the topology (exit status 2, as invalid input:
    /// only another input changes the answer).
    Unsatisfiable(anyhow::Error),
    /// The command could not run (exit status 1).
    Other(anyhow::Error),
}

impl From<ConfigError> for Failure {
    fn from(error: ConfigError) -> Self {
        Self::Invalid(error)
    }
}

impl From<anyhow::Error> for Failure {
    fn from(error: anyhow::Error) -> Self {
        Self::Other(error)
    }
}

impl From<std::io::Error> for Failure {
    fn from(error: std::io::Error) -> Self {
        Self::Other(anyhow::Error::new(error).context("cannot write output"))
    }
}

/// Runs a parsed command line, writing results to `out` and errors to `err`,
/// and returns the exit status (0, 1 or 2; see [`Cli`]).
pub fn run(cli: Cli, out: &mut dyn Write, err: &mut dyn Write) -> u8 {
    let result = match cli.command {
        Command::Topology(TopologyCommand::Check(args)) => topology::check(&args, out),
        Command::Topology(TopologyCommand::Show(args)) => topology::show(&args, out),
        Command::Job(JobCommand::Check(args)) => check_job(&args, out),
        Command::Scenario(ScenarioCommand::Check(args)) => check_scenario(&args, out),
        Command::Plan(args) => plan::plan(&args, out),
        Command::Sync(command) => sync::sync(command, out),
        Command::Simulate(args) => simulate::simulate(&args, out),
        Command::Cluster(command) => remote::cluster(command, out),
        Command::Sites(command) => remote::sites(command, out),
        Command::Links(command) => remote::links(command, out),
        Command::Jobs(command) => remote::jobs(command, out),
        Command::Rounds(command) => rounds::rounds(command, out),
        Command::Rehearse(args) => rehearse::rehearse(&args, out),
        Command::Internal(command) => rehearse::internal(command),
        Command::Emulate(args) => emulate::emulate(&args, out),
        Command::Emulator(command) => emulate::emulator(&command, out),
        Command::Certs(command) => certs::certs(&command, out),
    };
    // A failed write of the report itself (a closed pipe) has nowhere to go.
    match result {
        Ok(()) => 0,
        Err(Failure::Invalid(error)) => {
            let _ = writeln!(err, "{error}");
            2
        }
        Err(Failure::Unsatisfiable(error)) => {
            let _ = writeln!(err, "error: {error:#}");
            2
        }
        Err(Failure::Other(error)) => {
            let _ = writeln!(err, "error: {error:#}");
            1
        }
    }
}

/// Reads a file, reporting an unreadable one as an invalid input that names it.
pub fn read(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|error| {
        ConfigError::whole_file(
            &path.display().to_string(),
            format!("cannot read file: {error}"),
        )
    })
}

pub fn load_topology(path: &Path) -> Result<Topology, ConfigError> {
    Topology::from_toml(&path.display().to_string(), &read(path)?)
}

/// A scenario file and the topology it names (relative to the file),
/// checked against each other.
pub(crate) struct ScenarioFile {
    pub scenario: Scenario,
    pub topology: Topology,
    /// The scenario file's folder, against which its paths resolve.
    pub dir: PathBuf,
}

/// The one loader of scenario files (`scenario check`, `emulate`,
/// `rehearse`): the scenario, its topology, and the scenario's checks
/// against that topology, every error naming its file and line.
pub(crate) fn load_scenario(path: &Path) -> Result<ScenarioFile, Failure> {
    let name = path.display().to_string();
    let text = read(path)?;
    let scenario = Scenario::from_toml(&name, &text)?;
    let dir = path.parent().unwrap_or(Path::new(".")).to_path_buf();
    let topology = load_topology(&dir.join(&scenario.topology))?;
    let violations = scenario.violations_against(&topology);
    if !violations.is_empty() {
        return Err(violations_in(&name, &text, violations).into());
    }
    Ok(ScenarioFile {
        scenario,
        topology,
        dir,
    })
}

fn print_json(value: &impl serde::Serialize, out: &mut dyn Write) -> Result<(), Failure> {
    let text = serde_json::to_string_pretty(value).map_err(anyhow::Error::from)?;
    writeln!(out, "{text}")?;
    Ok(())
}

fn check_job(args: &JobCheckArgs, out: &mut dyn Write) -> Result<(), Failure> {
    let name = args.file.display().to_string();
    let text = read(&args.file)?;
    let job = JobSpec::from_toml(&name, &text)?;
    if let Some(topology_path) = &args.topology {
        let topology = load_topology(topology_path)?;
        let violations = job.violations_against(&topology);
        if !violations.is_empty() {
            return Err(violations_in(&name, &text, violations).into());
        }
    }
    match args.output {
        Output::Json => print_json(&job, out),
        Output::Text => {
            writeln!(
                out,
                "ok: {name}: job {:?}, {} parameters, {} layers, global batch {}, model state {}",
                job.name,
                table::thousands(job.model.parameters),
                job.model.layers,
                job.batch.global_batch,
                longhaul_core::units::human_bytes(job.model_state_bytes()),
            )?;
            Ok(())
        }
    }
}

fn check_scenario(args: &FileArgs, out: &mut dyn Write) -> Result<(), Failure> {
    let name = args.file.display().to_string();
    let ScenarioFile {
        scenario,
        topology,
        dir,
    } = load_scenario(&args.file)?;
    let job_path = dir.join(&scenario.job);
    let job_text = read(&job_path)?;
    let job_name = job_path.display().to_string();
    let job = JobSpec::from_toml(&job_name, &job_text)?;
    let violations = job.violations_against(&topology);
    if !violations.is_empty() {
        return Err(violations_in(&job_name, &job_text, violations).into());
    }
    match args.output {
        Output::Json => print_json(&scenario, out),
        Output::Text => {
            writeln!(
                out,
                "ok: {name}: scenario {:?} (seed {}), {} sites, job {:?}, {} timeline events over {}",
                scenario.name,
                scenario.seed,
                topology.sites.len(),
                job.name,
                scenario.timeline.len(),
                scenario.duration
            )?;
            Ok(())
        }
    }
}
