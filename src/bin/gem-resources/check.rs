//! `check`: what `install` would say of a manifest file, without the
//! network, every problem at once: the gem id `install FILE` registers it
//! under, the structure of `resources[]`, and each address rule that can
//! be applied to every url and mirror that reads as an address, whether
//! or not the rest of the manifest is valid.

use std::path::Path;
use std::process::ExitCode;

use gem_resources::manifest::{self, Resource};
use gem_resources::{Config, Error};
use serde_json::{json, Value};
use url::Url;

use crate::context::FAILED;
use crate::render::{self, print_json};

/// One problem of the manifest: where, what address (for an address
/// rule), its code, and what is wrong.
struct Finding {
    /// `manifest.resources[0].url`; `manifest` for the whole manifest.
    path: String,
    /// The address an address rule refused.
    address: Option<String>,
    /// `E_PERM_INVALID`, `E_RESOURCE_GEM_ID`, `E_RESOURCE_ADDRESS` or
    /// `E_RESOURCE_POLICY`.
    code: &'static str,
    /// What is wrong, and how to fix it where that is known.
    message: String,
}

/// Runs `check FILE`.
pub fn run(config: &Config, path: &Path, json: bool) -> anyhow::Result<ExitCode> {
    let bytes = crate::context::read_manifest_bytes(path)?;
    let value =
        manifest::parse_json(&bytes).map_err(|e| crate::context::in_file(e.into(), path))?;
    let file = path.display().to_string();
    let mut findings: Vec<Finding> = gem_id_problem(&value).into_iter().collect();
    let valid = match manifest::validate(&value) {
        Ok(valid) => Some(valid),
        Err(e) => {
            if let Error::Manifest(e) = crate::context::in_file(e.into(), path) {
                findings.extend(e.problems.into_iter().map(|p| Finding {
                    path: p.path,
                    address: None,
                    code: "E_PERM_INVALID",
                    message: p.message,
                }));
            }
            None
        }
    };
    findings.extend(refused_addresses(config, &addresses(&value)));
    // What the manifest may not mean as written: notes, not problems.
    let mut remarks: Vec<(String, String)> = manifest::remarks(&value)
        .into_iter()
        .map(|r| (r.path, r.message))
        .collect();
    // Said only of a manifest that is otherwise clean: beside its
    // problems, it would only add noise.
    if findings.is_empty() && value.get("id").is_none() {
        remarks.push((
            "manifest".to_string(),
            format!(
                "declares no gem id (\"id\"): `install {0}` refuses it; add one, or install it as `install GEM {0}`",
                crate::platform::shell_word(&file)
            ),
        ));
    }
    // On the terminal, notes follow only a manifest without problems: the
    // problems come first (the JSON document carries both).
    if !json && !crate::progress::quiet() && findings.is_empty() {
        for (place, message) in &remarks {
            crate::errln!("note: {}: {message}", crate::context::place(place, path));
        }
    }
    let notes = || -> Vec<Value> {
        remarks
            .iter()
            .map(|(place, message)| json!({ "file": file, "path": place, "message": message }))
            .collect()
    };
    if !findings.is_empty() {
        if json {
            let problems: Vec<Value> = findings
                .iter()
                .map(|f| {
                    let mut problem = json!({ "file": file, "path": f.path, "code": f.code, "message": f.message });
                    if let Some(address) = &f.address {
                        problem["address"] = json!(address);
                    }
                    problem
                })
                .collect();
            let mut doc = json!({
                "code": findings[0].code,
                "primary_cause": findings[0].code,
                "message": format!("{file}: {} problem(s) that install would refuse", findings.len()),
                "file": file,
                "problems": problems,
            });
            if !remarks.is_empty() {
                doc["notes"] = notes().into();
            }
            render::print_doc(doc, false);
        } else {
            for f in &findings {
                let place = crate::context::place(&f.path, path);
                match &f.address {
                    Some(address) => {
                        crate::errln!("{}: {place}: {address}: {}", f.code, f.message)
                    }
                    None => crate::errln!("{}: {place}: {}", f.code, f.message),
                }
            }
        }
        return Ok(ExitCode::from(FAILED));
    }
    let resources = valid.map(|m| m.resources).unwrap_or_default();
    if json {
        let mut doc = json!({
            "ok": true,
            "file": file,
            "resources": resources.iter().map(|r| json!({
                "id": r.id, "url": r.url.as_str(), "size": r.size, "sha256": r.sha256,
                "required": r.required, "mirrors": r.mirrors.iter().map(|m| m.as_str()).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
        });
        if !remarks.is_empty() {
            doc["notes"] = notes().into();
        }
        print_json(&doc);
    } else {
        crate::outln!("ok: {} resource(s)", resources.len());
        print_check_table(&resources);
    }
    Ok(ExitCode::SUCCESS)
}

/// The top-level `id`, by the rules `install` registers a gem under: a
/// value that is not a string or breaks a rule is a problem. (A missing
/// one is a note: `install GEM FILE` names the gem instead.)
fn gem_id_problem(value: &Value) -> Option<Finding> {
    let id = value.get("id")?;
    let problem = |message: String| Finding {
        path: "manifest.id".to_string(),
        address: None,
        code: "E_RESOURCE_GEM_ID",
        message,
    };
    match id.as_str() {
        Some(text) => gem_resources::registry::check_gem_id(text).err().map(|e| {
            problem(match e {
                Error::GemId { id, reason } => format!("{id:?} is not a gem id: {reason}"),
                other => other.to_string(),
            })
        }),
        None => Some(problem(
            "must be a string (the gem's id, as `install` registers it)".to_string(),
        )),
    }
}

/// Every url and mirror of the manifest that reads as an https address,
/// with its place: the address rules apply to them whatever else is wrong
/// with their entries.
fn addresses(value: &Value) -> Vec<(String, Url)> {
    let Some(entries) = value.get("resources").and_then(Value::as_array) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for (i, entry) in entries.iter().enumerate() {
        if let Some(url) = entry.get("url").and_then(Value::as_str) {
            if let Ok(url) = manifest::parse_https_url(url) {
                found.push((format!("manifest.resources[{i}].url"), url));
            }
        }
        let mirrors = entry.get("mirrors").and_then(Value::as_array);
        for (k, mirror) in mirrors.into_iter().flatten().enumerate() {
            if let Some(Ok(url)) = mirror.as_str().map(manifest::parse_https_url) {
                found.push((format!("manifest.resources[{i}].mirrors[{k}]"), url));
            }
        }
    }
    found
}

/// Every rule `check` can apply without the network to each address:
/// local names and IP literals in any spelling (refused on every user's
/// machine, whatever `[dev]` lets through here), and the configured
/// policy.
fn refused_addresses(config: &Config, addresses: &[(String, Url)]) -> Vec<Finding> {
    use gem_resources::net::guard::AddressGuard;
    let everyone = AddressGuard::new();
    let settings = config.net_settings().ok();
    let here = settings.as_ref().map(|s| {
        let names: Vec<String> = s.resolve.keys().cloned().collect();
        AddressGuard::with_exemptions(s.allow_addresses.clone(), names)
    });
    let policy = config.effective_policy().ok();
    let mut refused = Vec::new();
    for (path, url) in addresses {
        let Some(host) = url.host() else { continue };
        if let Err(blocked) = everyone.check_host(&host) {
            let exempt_here = here.as_ref().is_some_and(|g| g.check_host(&host).is_ok());
            let reason = &blocked.reason;
            let message = if exempt_here {
                format!("{} is a local or internal-network address ({reason}): allowed here only by [dev] settings; users' machines refuse it", blocked.address)
            } else {
                format!(
                    "{} is a local or internal-network address ({reason}): every machine refuses it",
                    blocked.address
                )
            };
            refused.push(Finding {
                path: path.clone(),
                address: Some(url.to_string()),
                message,
                code: "E_RESOURCE_ADDRESS",
            });
            continue;
        }
        let host_text = url.host_str().unwrap_or_default();
        if let Some(policy) = policy.as_ref().filter(|p| !p.permits(host_text)) {
            refused.push(Finding {
                path: path.clone(),
                address: Some(url.to_string()),
                message: format!(
                    "host {host_text} is not permitted by this machine's network policy ({} mode)",
                    policy.mode().as_str()
                ),
                code: "E_RESOURCE_POLICY",
            });
        }
    }
    refused
}

/// `check`'s table: id, size, when it downloads, address; columns aligned.
fn print_check_table(resources: &[Resource]) {
    let field = |t: &str| crate::text::field(t).into_owned();
    let id_width = resources
        .iter()
        .map(|r| field(&r.id).chars().count())
        .max()
        .unwrap_or(0);
    for r in resources {
        let mirrors = match r.mirrors.len() {
            0 => String::new(),
            n => format!(" (+{n} mirror{})", if n == 1 { "" } else { "s" }),
        };
        crate::outln!(
            "  {:<id_width$}  {:>10}  {:<12}  {}{mirrors}",
            field(&r.id),
            render::bytes(r.size),
            crate::report::when(r.required),
            r.url
        );
    }
}
