//! Command-line arguments.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use gem_resources::config::parse_rate;

/// `--limit-rate`: a rate as [`parse_rate`] reads it, or `0` for no cap
/// (as curl and wget read it).
fn parse_limit_rate(text: &str) -> Result<u64, String> {
    if text.trim().parse::<f64>().is_ok_and(|n| n == 0.0) {
        return Ok(0);
    }
    parse_rate(text)
}

/// What the top-level `--help` adds under the options.
const AFTER_HELP: &str = "\
Exit status:
  0    success
  1    the operation failed, or the configuration is wrong (the error code is
       printed: E_RESOURCE_..., E_PERM_INVALID)
  2    usage error (wrong arguments)
  130  interrupted (Ctrl-C); what was kept is printed

Environment:
  RUST_LOG   log filter on stderr (default: warn; serve: info; -v info, -vv debug,
             -q error), e.g. RUST_LOG=debug for the full chain of a network failure
  NO_COLOR   set to anything: no colour in log lines (there is none when stderr
             is not a terminal either)

Files:
  configuration  --config FILE, else <config dir>/gem-resources/config.toml when it
                 exists (Linux: ~/.config/gem-resources/config.toml)
  store          --store DIR, else the configuration's `store`, else
                 <data dir>/gem-resources (Linux: ~/.local/share/gem-resources)

First steps:
  gem-resources check notochord.json
  gem-resources install my-gem notochord.json
  gem-resources status";

/// What `serve --help` adds under the options.
const SERVE_HELP: &str = "\
Each sub-folder of the gems folder is one installed gem, named by its id; its
manifest is notochord.json, or manifest.json when there is no notochord.json.
The folder is scanned every --interval seconds: a new or changed manifest is
installed (upgraded), a removed folder uninstalled; an invalid manifest is
reported and the gem keeps its installed version. Every gem records who
installed it (`status` shows it): the scans uninstall only gems they installed
from this folder, never one installed through the local API, the command line
or another folder. A folder that holds no manifest at all (a wrong path, an
unmounted disk) uninstalls nothing: it is said once, and the scans wait.

Without --gems, nothing is scanned: the service keeps what is installed through
its local API and the command line (an app that installs only through the API).

The configuration file is read again on SIGHUP, and when it changes (once it
has stopped changing).

An app that starts `serve` names itself with --parent-pid (its process id) and
may give it a pipe as standard input with --exit-with-stdin: `serve` then stops
when the app ends, even when it is killed, as it does on SIGTERM (downloads
stop, their bytes are kept for the next run, exit status 0), saying why.

Example:
  gem-resources serve --gems ~/.notochord/gems
  gem-resources serve --json --parent-pid 4242 --exit-with-stdin";

/// What `autofill --help` adds under the options.
const AUTOFILL_HELP: &str = "\
Every address is read by the same rules as a download: https only, no local
addresses, your network policy, at most 5 redirects, transient failures
retried ([network] retries), then the mirrors in order. A value the resource
already has must match what was read.

With --manifest, the resources that lack size or sha256 are read (every one
with --all) and the manifest is printed with the values filled in, its keys
and layout kept; --write writes it back instead. With --all each replaced
value is listed old → new (`Updating b: size 5 → 7`). Without --all, a
declared value that differs from what was read is a problem, named with the
command that replaces it (exit status 1). A resource that cannot be read is
named with its reason, the others are still filled (exit status 1). The url
and every mirror of each resource are read in full: the values come from the
first that answers, and each address is reported (`mirror 2: HTTP status
404`, `mirror 1: SHA-256 differs from the url's`; exit status 1 when one
disagrees). --url-only reads only until an address answers.

--check reads every resource and keeps nothing: one verdict per resource on
stdout (ok, badsha, badsize, nofile, failed), exit status 1 unless all are ok.

Example:
  gem-resources autofill https://cdn.example.com/models/ocr-v3.onnx
  gem-resources autofill --manifest notochord.json --write
  gem-resources autofill --manifest notochord.json --check";

/// What `gc --help` adds under the options.
const GC_HELP: &str = "\
A file is declared when an installed gem names its SHA-256 (required or on
first use, present or partial). `fetch` by hand, for instance, leaves files
no gem declares. A file that a download holds, in this or another process
(`serve`, `fetch`, an app), is kept and reported as in use.

Example:
  gem-resources gc --dry-run
  gem-resources gc";

/// Downloads, verifies and keeps the large files that gems declare.
#[derive(Debug, Parser)]
#[command(
    name = "gem-resources",
    version,
    about,
    after_long_help = AFTER_HELP,
    after_help = "Exit status, RUST_LOG, NO_COLOR and the default locations: see --help.",
    disable_help_subcommand = true
)]
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
    /// Say more: `-v` logs what is done (info), `-vv` everything (debug).
    #[arg(short, long, global = true, action = clap::ArgAction::Count, conflicts_with = "quiet")]
    pub verbose: u8,
    /// Say only errors: no progress bars or lines, no warnings.
    #[arg(short, long, global = true)]
    pub quiet: bool,
    /// Work in this process even when a service listens on the store
    /// (by default `path`, `status`, `install`, `uninstall`, `sync` and
    /// `autofill` go through its local API).
    #[arg(long, global = true)]
    pub no_service: bool,
    /// Bandwidth cap for this command, in bytes per second, with k, M or G
    /// for KiB, MiB or GiB (e.g. 500k, 2M); 0 for none; overrides
    /// `network.max_bytes_per_sec`.
    #[arg(long, global = true, value_name = "RATE", value_parser = parse_limit_rate)]
    pub limit_rate: Option<u64>,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// What `cache --help` adds.
const CACHE_HELP: &str = "The registry is the configuration's [cache] section (docs/cache.md).\n\nExit status: 0 when the check passes (reach, read, and write when push = true) or every file was pushed; 1 otherwise, or when no cache is configured.\n\nExample:\n  gem-resources cache check\n  gem-resources cache push";

/// `cache` subcommands.
#[derive(Debug, Clone, Copy, Subcommand)]
pub enum CacheAction {
    /// Say whether the configuration reaches the registry, can read from it and can write to it, with the reason when not.
    Check,
    /// Upload every stored file the registry does not have.
    Push,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Validate a manifest's resources (notochord.json or manifest.json).
    #[command(after_long_help = "Example:\n  gem-resources check notochord.json")]
    Check {
        /// The manifest file.
        manifest: PathBuf,
    },
    /// Say whether an address would be used (scheme, policy, local addresses), connecting to nothing.
    #[command(
        after_long_help = "Example:\n  gem-resources check-url https://cdn.example.com/models/ocr-v3.onnx"
    )]
    CheckUrl {
        /// The address.
        url: String,
    },
    /// Size and SHA-256 of a URL, or fill them in a manifest, by the download rules (nothing is kept).
    #[command(after_long_help = AUTOFILL_HELP)]
    Autofill {
        /// The address (or --manifest FILE).
        #[arg(required_unless_present = "manifest", conflicts_with = "manifest")]
        url: Option<String>,
        /// Fill `size` and `sha256` of this manifest's resources that lack either, and print it.
        #[arg(long, value_name = "FILE")]
        manifest: Option<PathBuf>,
        /// With --manifest: every resource, replacing the values it has.
        #[arg(long, requires = "manifest")]
        all: bool,
        /// With --manifest: write the filled manifest back to FILE (atomically) instead of printing it.
        #[arg(long, requires = "manifest")]
        write: bool,
        /// With --manifest: read each resource only until an address answers, without checking the mirrors.
        #[arg(long, requires = "manifest")]
        url_only: bool,
        /// With --manifest: read every resource by the download rules and compare, keeping and writing nothing; exit 1 when a declared size or sha256 differs from what an address serves.
        #[arg(long, requires = "manifest", conflicts_with_all = ["write", "all"])]
        check: bool,
    },
    /// Download a manifest's resources (all, or the named ones) into the store and print their paths.
    #[command(after_long_help = "Example:\n  gem-resources fetch notochord.json ocr-model")]
    Fetch {
        /// The manifest file.
        manifest: PathBuf,
        /// Resource ids; all when none is given.
        ids: Vec<String>,
    },
    /// Register a gem's resources (install or upgrade); required ones then download.
    #[command(
        after_long_help = "The gem id is the manifest's `id` when none is given; a gem id given that differs from the manifest's is refused unless --as says it is meant.\n\nExample:\n  gem-resources install my-gem/notochord.json\n  gem-resources install my-gem my-gem/notochord.json\n  gem-resources install --as my-fork my-gem/notochord.json"
    )]
    Install {
        /// The gem's id, then its manifest; or the manifest alone, whose
        /// `id` is then the gem's.
        #[arg(num_args = 1..=2, required = true, value_name = "[GEM] MANIFEST")]
        args: Vec<PathBuf>,
        /// Install under this gem id, whatever the manifest declares.
        #[arg(long = "as", value_name = "GEM")]
        as_gem: Option<String>,
        /// Return once registered, without waiting for the required downloads.
        #[arg(long)]
        no_wait: bool,
        /// Take the gem over from whoever keeps it (`serve`'s gems folder,
        /// a client of the local API, a program): it becomes the command
        /// line's. Without it, someone else's gem stays theirs: the same
        /// manifest as theirs changes nothing, another is refused.
        #[arg(long)]
        take_over: bool,
    },
    /// Remove a gem and the files no other gem declares.
    #[command(after_long_help = "Example:\n  gem-resources uninstall my-gem")]
    Uninstall {
        /// The gem's id.
        gem: String,
    },
    /// Print the local path of a gem's resource, downloading it first when missing.
    #[command(after_long_help = "Example:\n  gem-resources path my-gem ocr-model")]
    Path {
        /// The gem's id.
        gem: String,
        /// The resource's id.
        resource: String,
    },
    /// Show every installed gem's resources and their state.
    #[command(after_long_help = "Example:\n  gem-resources status my-gem")]
    Status {
        /// Only this gem.
        gem: Option<String>,
    },
    /// Do what an app start does, in the foreground: clean up, then download missing required files.
    #[command(after_long_help = "Example:\n  gem-resources sync")]
    Sync,
    /// Store files you already have: each one matching a declared resource (size and SHA-256) is copied in.
    #[command(
        after_long_help = "No network is used; the files are only read.\n\nExit status: 0 when every file was imported or already present, 1 when one matches no declared resource.\n\nExample:\n  gem-resources import ~/Downloads/ocr-v3.onnx"
    )]
    Import {
        /// The files.
        #[arg(required = true, value_name = "FILE")]
        files: Vec<PathBuf>,
    },
    /// Re-hash every stored file; remove and report corrupted ones.
    #[command(
        after_long_help = "Example:\n  gem-resources verify\n  gem-resources verify --repair   # and download what it removed again"
    )]
    Verify {
        /// Download each removed file that an installed gem declares again,
        /// from that gem's addresses, and verify it.
        #[arg(long)]
        repair: bool,
    },
    /// Remove stored files and kept partial files that no installed gem declares.
    #[command(after_long_help = GC_HELP)]
    Gc {
        /// Say what would be removed, and remove nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Run the service: the store's local API, and a gems folder's resources kept installed, until SIGINT/SIGTERM.
    #[command(after_long_help = SERVE_HELP)]
    Serve {
        /// Folder with one sub-folder per installed gem, holding its
        /// notochord.json. Without it, only what is installed through the
        /// local API and the command line is kept (nothing is scanned).
        #[arg(long, value_name = "DIR")]
        gems: Option<PathBuf>,
        /// Seconds between scans of the gems folder.
        #[arg(long, default_value_t = 2.0)]
        interval: f64,
        /// Stop, as on SIGTERM, within a second of process PID ending (the
        /// app that started it); refuse to start when it is not running.
        #[arg(long, value_name = "PID")]
        parent_pid: Option<u32>,
        /// Stop, as on SIGTERM, when standard input reaches its end (the
        /// app that started it closed the pipe, or ended).
        #[arg(long)]
        exit_with_stdin: bool,
    },
    /// Check the `[cache]` registry, or fill it from the store.
    #[command(after_long_help = CACHE_HELP)]
    Cache {
        /// What to do with it.
        #[command(subcommand)]
        action: CacheAction,
    },
    /// Print a shell's completion script (bash, zsh, fish, powershell, elvish).
    #[command(
        after_long_help = "Example:\n  gem-resources completions bash > ~/.local/share/bash-completion/completions/gem-resources\n  gem-resources completions zsh > ~/.zfunc/_gem-resources"
    )]
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff), for `man`.
    #[command(
        after_long_help = "Example:\n  gem-resources man > ~/.local/share/man/man1/gem-resources.1"
    )]
    Man,
    /// Print the help of the program or of a subcommand.
    #[command(after_long_help = "Example:\n  gem-resources help install")]
    Help {
        /// The subcommand.
        command: Option<String>,
    },
}
