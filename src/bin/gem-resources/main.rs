//! `gem-resources`: the command-line shell over the library.
//!
//! It parses arguments, loads the configuration, calls the library and
//! renders the outcome (text, or JSON with `--json`). Exit status: 0 on
//! success, 1 when the operation failed (error codes are printed), 2 for
//! usage errors.

// No function longer than one screen (clippy.toml sets 120 lines).
#![warn(clippy::too_many_lines)]

mod autofill;
mod cache;
mod check;
mod cli;
mod commands;
mod context;
mod gc;
mod import;
mod interrupt;
mod manual;
mod platform;
mod progress;
mod reload;
mod remote;
mod render;
mod report;
mod serve;
mod service_commands;
mod text;
mod watch;

use std::process::ExitCode;

use clap::{CommandFactory, Parser};

/// A command line clap refuses: with `--json`, one JSON document on stdout
/// (`E_RESOURCE_USAGE`, the first line of clap's message) and exit status
/// 2; else clap's own text and status (help and version print as asked).
fn usage_error(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    let wants_json = std::env::args_os()
        .skip(1)
        .take_while(|a| a != "--")
        .any(|a| a == "--json");
    let help = matches!(
        e.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    );
    if !wants_json || help {
        e.exit();
    }
    // Clap's first paragraph ("error: …" and the arguments it names).
    let text = e.to_string();
    let paragraph: Vec<&str> = text
        .lines()
        .skip_while(|l| l.trim().is_empty())
        .take_while(|l| !l.trim().is_empty())
        .map(str::trim)
        .collect();
    let first = paragraph.join(" ");
    let message = match first.strip_prefix("error: ") {
        Some(rest) => rest.to_string(),
        None if first.is_empty() => "the command line is not valid".to_string(),
        None => first,
    };
    render::print_doc(
        serde_json::json!({
            "code": "E_RESOURCE_USAGE",
            "primary_cause": "E_RESOURCE_USAGE",
            "message": format!("{message} (see `gem-resources help`)"),
        }),
        false,
    );
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let args = match cli::Args::try_parse() {
        Ok(args) => args,
        Err(e) => return usage_error(e),
    };
    match &args.command {
        cli::Command::Help { command } => return help(command.as_deref()),
        cli::Command::Completions { shell } => return completions(*shell),
        cli::Command::Man => return man(),
        _ => {}
    }
    interrupt::set_json(args.json);
    // The long-running service says what it does; one-shot commands only
    // warn, so their output stays clean.
    let default_log = match (args.quiet, args.verbose, &args.command) {
        (true, _, _) => "error",
        (_, 0, cli::Command::Serve { .. }) => "info",
        (_, 0, _) => "warn",
        (_, 1, _) => "info",
        _ => "debug",
    };
    progress::set_quiet(args.quiet);
    let plain = args.verbose == 0 && !matches!(args.command, cli::Command::Serve { .. });
    render::init_logging(default_log, plain);
    platform::keep_freed_memory();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(network_threads())
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            crate::errln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let code = runtime.block_on(commands::run(args));
    // Every download was stopped by now; don't let a stray helper thread
    // hold the exit.
    runtime.shutdown_timeout(std::time::Duration::from_secs(2));
    code
}

/// Threads for the runtime, which runs the network side of transfers
/// (sockets, TLS): half the cores, 1 to 4. Each transfer hashes and writes on
/// a blocking thread it holds throughout, and file-system work runs on the
/// other blocking threads, so those cores are theirs. On 2 cores, one network thread makes a 1 GiB
/// download about 10% faster than two (fewer hand-offs between threads).
fn network_threads() -> usize {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    (cores / 2).clamp(1, 4)
}

/// `help [COMMAND]`: the long help of the program or of one subcommand.
fn help(command: Option<&str>) -> ExitCode {
    let mut cli = cli::Args::command();
    // Gives subcommands their full names and the global options.
    cli.build();
    let shown = match command {
        None => cli.print_long_help(),
        Some(name) => match cli.find_subcommand_mut(name) {
            Some(sub) => sub.print_long_help(),
            None => {
                crate::errln!("error: no subcommand {name:?}; see `gem-resources --help`");
                return ExitCode::from(2);
            }
        },
    };
    // A closed stdout is not an error.
    let _ = shown;
    ExitCode::SUCCESS
}

/// `completions SHELL`: the shell's completion script on stdout.
fn completions(shell: clap_complete::Shell) -> ExitCode {
    manual::print(&manual::completions(shell));
    ExitCode::SUCCESS
}

/// `man`: the manual page (roff) on stdout.
fn man() -> ExitCode {
    match manual::page() {
        Ok(page) => {
            manual::print(&page);
            ExitCode::SUCCESS
        }
        Err(e) => {
            crate::errln!("error: cannot write the manual page: {e}");
            ExitCode::from(1)
        }
    }
}
