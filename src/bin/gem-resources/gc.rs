//! `gc [--dry-run]`: removes stored files and kept partial files that no
//! installed gem declares, keeping those a download holds.

use std::process::ExitCode;

use gem_resources::registry::Registry;
use gem_resources::store::gc::{self, GcReport, Kind, Undeclared};
use gem_resources::{Config, Store};
use serde_json::{json, Value};

use crate::render;

/// Why a listed file goes.
const UNDECLARED: &str = "not declared by any installed gem";
/// Why a listed file stays.
const HELD: &str = "a download holds it";

/// Runs `gc`. Works beside a running `serve` on the same store: both take
/// the store's locks.
pub async fn run(config: &Config, dry_run: bool, json: bool) -> anyhow::Result<ExitCode> {
    // Tidying a store that does not exist must not create one, nor pass
    // a mistyped folder for a tidy store.
    if !crate::context::store_exists(config) {
        return Err(crate::context::no_store(config).into());
    }
    let store = Store::open(&config.store_dir())?;
    let registry = Registry::new(&store);
    let report = gc::collect(&store, &registry, dry_run).await?;
    if json {
        render::print_doc(report_json(&report), true);
    } else {
        let empty = store.blobs().is_ok_and(|b| b.is_empty());
        print_text(&report, empty);
    }
    Ok(ExitCode::SUCCESS)
}

/// The report as JSON: `removed` (or `would_remove` in a dry run) and
/// `in_use` entries, with totals in bytes.
fn report_json(report: &GcReport) -> Value {
    let entries = |items: &[Undeclared]| -> Value { items.iter().map(entry_json).collect() };
    let key = if report.dry_run {
        "would_remove"
    } else {
        "removed"
    };
    let mut value = json!({
        "dry_run": report.dry_run,
        "in_use": entries(&report.in_use),
        "files": report.removed.len(),
        "bytes": report.removed_bytes(),
        "stored": report.removed_of(Kind::Stored),
        "partial": report.removed_of(Kind::Partial),
        "in_use_files": report.in_use.len(),
        "in_use_bytes": report.in_use_bytes(),
    });
    value[key] = entries(&report.removed);
    value
}

fn entry_json(item: &Undeclared) -> Value {
    json!({
        "path": item.path,
        "sha256": item.sha256,
        "bytes": item.bytes,
        "kind": item.kind,
        "name": item.name,
    })
}

/// The text report; `empty`: the store holds no file at all.
fn print_text(report: &GcReport, empty: bool) {
    let verb = if report.dry_run {
        "would remove"
    } else {
        "removed"
    };
    for item in &report.removed {
        crate::outln!("{verb}: {}", line(item, UNDECLARED));
    }
    for item in &report.in_use {
        crate::outln!("in use, kept: {}", line(item, HELD));
    }
    crate::outln!("{}", summary(report, empty));
}

/// `stored   3f2a9c1d0b7e  ocr-v3.onnx  1.2 GiB  (why)`.
fn line(item: &Undeclared, why: &str) -> String {
    let kind = match item.kind {
        Kind::Stored => "stored",
        Kind::Partial => "partial",
    };
    let name = if item.name.is_empty() {
        String::new()
    } else {
        format!("  {}", crate::text::field(&item.name))
    };
    format!(
        "{kind:<7}  {}{name}  {}  ({why})",
        item.sha256.get(..12).unwrap_or(&item.sha256),
        render::bytes(item.bytes)
    )
}

/// `removed 3 files, 1.2 GiB (2 stored, 1 partial); 1 in use, kept`.
fn summary(report: &GcReport, empty: bool) -> String {
    let verb = if report.dry_run {
        "would remove"
    } else {
        "removed"
    };
    if report.removed.is_empty() && report.in_use.is_empty() {
        let why = if empty {
            "the store holds no file"
        } else {
            "every file in the store is declared by an installed gem"
        };
        return format!("{verb} nothing: {why}");
    }
    let mut text = format!(
        "{verb} {}, {} ({} stored, {} partial)",
        render::file_count(report.removed.len()),
        render::bytes(report.removed_bytes()),
        report.removed_of(Kind::Stored),
        report.removed_of(Kind::Partial)
    );
    if !report.in_use.is_empty() {
        text.push_str(&format!("; {} in use, kept", report.in_use.len()));
    }
    text
}
