//! Command-line arguments.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// Downloads, verifies and keeps the large files that gems declare.
#[derive(Debug, Parser)]
#[command(name = "gem-resources", version, about)]
pub struct Args {
    /// Configuration file (TOML). Default: <config dir>/gem-resources/config.toml when it exists.
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Store folder; overrides the configuration.
    #[arg(long, global = true, value_name = "DIR")]
    pub store: Option<PathBuf>,
    /// Machine-readable JSON output.
    #[arg(long, global = true)]
    pub json: bool,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Validate a manifest's resources (notochord.json or manifest.json).
    Check {
        /// The manifest file.
        manifest: PathBuf,
    },
    /// Say whether an address would be used (scheme, policy, local addresses), connecting to nothing.
    CheckUrl {
        /// The address.
        url: String,
    },
    /// Download a URL by the resource rules and print its size and SHA-256, keeping nothing.
    Autofill {
        /// The address.
        url: String,
    },
    /// Download a manifest's resources (all, or the named ones) into the store and print their paths.
    Fetch {
        /// The manifest file.
        manifest: PathBuf,
        /// Resource ids; all when none is given.
        ids: Vec<String>,
    },
    /// Register a gem's resources (install or upgrade); required ones then download.
    Install {
        /// The gem's id.
        gem: String,
        /// The gem's manifest.
        manifest: PathBuf,
        /// Return once registered, without waiting for the required downloads.
        #[arg(long)]
        no_wait: bool,
    },
    /// Remove a gem and the files no other gem declares.
    Uninstall {
        /// The gem's id.
        gem: String,
    },
    /// Print the local path of a gem's resource, downloading it first when missing.
    Path {
        /// The gem's id.
        gem: String,
        /// The resource's id.
        resource: String,
    },
    /// Show every installed gem's resources and their state.
    Status {
        /// Only this gem.
        gem: Option<String>,
    },
    /// Do what an app start does, in the foreground: clean up, then download missing required files.
    Sync,
    /// Re-hash every stored file; remove and report corrupted ones.
    Verify,
    /// Run the service: keep a gems folder's resources installed until SIGINT/SIGTERM.
    Serve {
        /// Folder with one sub-folder per installed gem, holding its notochord.json.
        #[arg(long, value_name = "DIR")]
        gems: PathBuf,
        /// Seconds between scans of the gems folder.
        #[arg(long, default_value_t = 2.0)]
        interval: f64,
    },
}
