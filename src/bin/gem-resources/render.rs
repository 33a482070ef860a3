//! Rendering: text for people, JSON for scripts, logs on stderr.

use gem_resources::error::Attempt;
use gem_resources::Error;
use serde_json::{json, Value};

/// Logs go to stderr, filtered by `RUST_LOG` (default: warnings).
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// One attempt as JSON.
pub fn attempt_json(a: &Attempt) -> Value {
    json!({
        "address": a.address.as_str(),
        "hop": a.hop.as_ref().map(|h| h.as_str()),
        "code": a.code(),
        "reason": a.error.to_string(),
    })
}

/// An error as JSON: code, message and, where there are any, the attempts.
pub fn error_json(e: &Error) -> Value {
    let mut value = json!({ "code": e.code(), "message": e.to_string() });
    match e {
        Error::Unavailable { resource, attempts } => {
            value["resource"] = json!(resource);
            value["attempts"] = attempts.iter().map(attempt_json).collect();
        }
        Error::Attempt(a) => {
            value["attempts"] = json!([attempt_json(a)]);
        }
        Error::Manifest(m) => {
            value["problems"] = m
                .problems
                .iter()
                .map(|p| json!({ "path": p.path, "message": p.message }))
                .collect();
        }
        _ => {}
    }
    value
}

/// Prints a JSON value on stdout, one line.
pub fn print_json(value: &Value) {
    println!("{value}");
}

/// Human-readable byte count.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}
