//! The `longhaul` operator CLI. See `longhaul --help`.

use std::process::ExitCode;

use clap::Parser;
use longhaul_cli::{Cli, run};

fn main() -> ExitCode {
    // stderr is not locked for the whole run: `emulate` logs to it from
    // other threads, which would wait for the lock forever.
    let status = run(
        Cli::parse(),
        &mut std::io::stdout().lock(),
        &mut std::io::stderr(),
    );
    ExitCode::from(status)
}
