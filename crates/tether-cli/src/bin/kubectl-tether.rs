//! `kubectl-tether`: the same command as `tether`, found by kubectl as the plugin behind
//! `kubectl tether ...`.

use std::process::ExitCode;

fn main() -> ExitCode {
    tether_cli::run_as("kubectl tether", std::env::args_os())
}
