//! Subcommands of the resource service.

use std::process::ExitCode;

use gem_resources::Config;

use crate::cli::Command;

/// Runs a service subcommand.
pub async fn run(_config: &Config, command: Command, _json: bool) -> anyhow::Result<ExitCode> {
    anyhow::bail!("{command:?} is not available yet")
}
