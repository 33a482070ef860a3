//! One instance of an app that runs in several windows or processes on
//! one store: it joins the election of the store's service
//! (`Resources::open_or_follow`), so that exactly one instance runs the
//! service and the others use it, and another takes over when that one
//! quits or is killed.
//!
//! Run two or three with the same configuration file:
//!
//! ```text
//! cargo run --example app_instance -- config.toml [GEM ID]
//! ```
//!
//! Each says on its standard output `app: role service` or
//! `app: role client` each time its role changes, asks for one file when
//! given `GEM ID` (`app: path PATH` once it is there, or
//! `app: error CODE: MESSAGE`; a `path` waiting when the service goes is
//! sent again to the next one, which resumes the download), and quits
//! when its standard input closes (`app: left`). Quit or `kill -9` the
//! one that says `role service`, and watch another take over.

use std::io::Write;
use std::sync::Arc;

use gem_resources::api::Role;
use gem_resources::{Config, Resources};

/// One line on stdout, at once.
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "app: {line}");
    let _ = out.flush();
}

/// How a role is said; nothing while electing.
fn role_line(role: &Role) -> Option<&'static str> {
    match role {
        Role::Service(_) => Some("role service"),
        Role::Client(_) => Some("role client"),
        Role::Electing | Role::Left => None,
    }
}

/// The app: `args` are `CONFIG [GEM ID]`.
pub async fn run(args: &[String]) -> gem_resources::Result<()> {
    let Some(config) = args.first() else {
        return Err(gem_resources::Error::Usage(
            "usage: app_instance CONFIG [GEM ID]".into(),
        ));
    };
    let config = Config::load(std::path::Path::new(config))?;
    // The one call: the service here, or a client of the one that runs.
    let member = Arc::new(Resources::open_or_follow(&config).await?);
    let mut roles = member.roles();
    if let Some(line) = role_line(&roles.borrow_and_update()) {
        say(line);
    }
    tokio::spawn(async move {
        while roles.changed().await.is_ok() {
            if let Some(line) = role_line(&roles.borrow_and_update()) {
                say(line);
            }
        }
    });
    if let [_, gem, id] = args {
        let (member, gem, id) = (member.clone(), gem.clone(), id.clone());
        tokio::spawn(async move {
            match member.path(&gem, &id).await {
                Ok(path) => say(&format!("path {}", path.display())),
                Err(e) => say(&format!("error {}: {e}", e.code())),
            }
        });
    }
    // The app quits when its standard input closes.
    let _ = tokio::task::spawn_blocking(|| {
        let mut sink = Vec::new();
        let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
    })
    .await;
    member.leave().await;
    say("left");
    Ok(())
}

fn main() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .try_init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("app_instance: no runtime: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = runtime.block_on(run(&args)) {
        say(&format!("error {}: {e}", e.code()));
        std::process::exit(1);
    }
}
