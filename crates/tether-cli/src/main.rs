//! `tether`: the command users run to install Tether and peer clusters.

use std::process::ExitCode;

fn main() -> ExitCode {
    tether_cli::run(std::env::args_os())
}
