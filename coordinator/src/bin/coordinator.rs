//! `coordinator`: one replica of longhaul's Raft-replicated coordinator. See
//! `coordinator --help`; the body is `longhaul_coordinator::daemon`.

use std::process::ExitCode;

use clap::Parser;
use longhaul_coordinator::daemon::{Args, main as run};

fn main() -> ExitCode {
    run(Args::parse())
}
