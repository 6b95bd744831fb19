//! The `longhaul` operator CLI. See `longhaul --help`.

use std::process::ExitCode;

use clap::Parser;
use longhaul_coordinator::cli::{Cli, run};

fn main() -> ExitCode {
    let status = run(
        Cli::parse(),
        &mut std::io::stdout().lock(),
        &mut std::io::stderr().lock(),
    );
    ExitCode::from(status)
}
