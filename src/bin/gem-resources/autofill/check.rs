//! `autofill --manifest FILE --check`: a verdict for each resource, on
//! stdout and nothing else there: `ok      a`, `badsha  b: the url serves
//! sha256 b43f…, the manifest says 0000… (ADDRESS)`, `badsize`, `nofile`
//! (a 404 or 410), `failed` (any other reason); each address of a resource
//! with mirrors is compared with what the manifest declares.

use std::path::Path;
use std::process::ExitCode;

use gem_resources::error::ErrorCode;
use gem_resources::manifest::fill::Unfilled;
use gem_resources::service::autofill::short;
use gem_resources::{AttemptError, Error};
use serde::Serialize;
use serde_json::json;

use super::Read;
use crate::context::FAILED;

/// What one address served, against what the manifest declares.
#[derive(Debug, Clone, Serialize)]
struct Verdict {
    /// `ok`, `badsha`, `badsize`, `nofile` or `failed`.
    verdict: &'static str,
    /// `url`, `mirror 1`, …; absent when the failure is no address's.
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<String>,
    /// The address, as declared.
    #[serde(skip_serializing_if = "Option::is_none")]
    address: Option<String>,
    /// The stable code of what is wrong; absent when ok.
    #[serde(skip_serializing_if = "Option::is_none")]
    code: Option<ErrorCode>,
    /// What is wrong, for a person (without the address).
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<String>,
    /// What it served, when it served a whole file.
    #[serde(skip_serializing_if = "Option::is_none")]
    size: Option<u64>,
    /// Its SHA-256, when it served a whole file.
    #[serde(skip_serializing_if = "Option::is_none")]
    sha256: Option<String>,
}

impl Verdict {
    fn ok(&self) -> bool {
        self.verdict == "ok"
    }

    /// What `role` at `address` served (`size`, `sha256`), against `entry`.
    fn served(entry: &Unfilled, role: String, address: String, size: u64, sha256: String) -> Self {
        let declared = &entry.resource;
        let (verdict, code, message) = if size != declared.size {
            (
                "badsize",
                Some(ErrorCode::Size),
                Some(format!(
                    "{} serves {size} bytes (sha256 {}), the manifest says {} (sha256 {})",
                    subject(&role),
                    short(&sha256),
                    declared.size,
                    short(&declared.sha256)
                )),
            )
        } else if sha256 != declared.sha256 {
            (
                "badsha",
                Some(ErrorCode::Sha256),
                Some(format!(
                    "{} serves sha256 {}, the manifest says {}",
                    subject(&role),
                    short(&sha256),
                    short(&declared.sha256)
                )),
            )
        } else {
            ("ok", None, None)
        };
        Verdict {
            verdict,
            role: Some(role),
            address: Some(address),
            code,
            message,
            size: Some(size),
            sha256: Some(sha256),
        }
    }

    /// `role` at `address` failed with `code`, `problem` (an HTTP `status`).
    fn failed(
        role: String,
        address: String,
        code: ErrorCode,
        problem: &str,
        status: Option<u16>,
    ) -> Self {
        let nofile = matches!(status, Some(404 | 410));
        Verdict {
            verdict: if nofile { "nofile" } else { "failed" },
            message: Some(format!("{} answers {problem}", subject(&role))),
            role: Some(role),
            address: Some(address),
            code: Some(code),
            size: None,
            sha256: None,
        }
    }
}

/// `the url`, `mirror 1`: the subject of a verdict's sentence.
fn subject(role: &str) -> String {
    match role {
        "url" => "the url".to_string(),
        _ => role.to_string(),
    }
}

/// The name of the address at `index` of a resource's addresses.
fn role(index: usize) -> String {
    match index {
        0 => "url".to_string(),
        n => format!("mirror {n}"),
    }
}

/// Each address's verdict for one resource.
fn verdicts((entry, read, checked): &Read) -> Vec<Verdict> {
    if !checked.is_empty() {
        return checked
            .iter()
            .map(|a| match (a.size, &a.sha256, a.code) {
                (Some(size), Some(sha256), _) => Verdict::served(
                    entry,
                    a.role.clone(),
                    a.address.clone(),
                    size,
                    sha256.clone(),
                ),
                (_, _, code) => Verdict::failed(
                    a.role.clone(),
                    a.address.clone(),
                    code.unwrap_or(ErrorCode::Unavailable),
                    a.problem.as_deref().unwrap_or("nothing"),
                    a.status,
                ),
            })
            .collect();
    }
    // Only until an address answered (--url-only).
    let addresses: Vec<&url::Url> = entry.resource.addresses().collect();
    let role_of =
        |address: &url::Url| role(addresses.iter().position(|a| *a == address).unwrap_or(0));
    let attempt = |a: &gem_resources::Attempt| {
        let status = match &a.error {
            AttemptError::Http { status, .. } => Some(*status),
            _ => None,
        };
        Verdict::failed(
            role_of(&a.address),
            a.address.to_string(),
            a.code(),
            &a.error.to_string(),
            status,
        )
    };
    match read {
        Ok(filled) => vec![Verdict::served(
            entry,
            role_of(&filled.address),
            filled.address.to_string(),
            filled.transfer.size,
            filled.transfer.sha256.clone(),
        )],
        Err(Error::Attempt(a)) => vec![attempt(a)],
        Err(Error::Unavailable { attempts, .. }) => attempts.iter().map(attempt).collect(),
        Err(e) => vec![Verdict {
            verdict: "failed",
            role: None,
            address: None,
            code: Some(e.code()),
            message: Some(e.to_string()),
            size: None,
            sha256: None,
        }],
    }
}

/// Prints the verdicts; exit status 1 when any resource is not ok.
pub(super) fn report(path: &Path, reads: &[Read], json: bool) -> ExitCode {
    let all: Vec<(&Unfilled, Vec<Verdict>)> = reads.iter().map(|r| (&r.0, verdicts(r))).collect();
    let wrong = all
        .iter()
        .filter(|(_, v)| v.iter().any(|v| !v.ok()))
        .count();
    let values_wrong = all
        .iter()
        .any(|(_, v)| v.iter().any(|v| matches!(v.verdict, "badsha" | "badsize")));
    if json {
        let resources: Vec<serde_json::Value> = all
            .iter()
            .map(|(entry, verdicts)| {
                let first_wrong = verdicts.iter().find(|v| !v.ok());
                let mut doc = json!({
                    "id": entry.resource.id,
                    "ok": first_wrong.is_none(),
                    "verdict": first_wrong.map_or("ok", |v| v.verdict),
                    "declared": { "size": entry.resource.size, "sha256": entry.resource.sha256 },
                    "addresses": verdicts,
                });
                if let Some(v) = first_wrong {
                    doc["code"] = json!(v.code);
                    doc["message"] = json!(v.message);
                    doc["address"] = json!(v.address);
                }
                doc
            })
            .collect();
        crate::render::print_json(&json!({
            "ok": wrong == 0,
            "file": path,
            "resources": resources,
        }));
    } else {
        for (entry, verdicts) in &all {
            let id = crate::text::field(&entry.resource.id);
            if verdicts.iter().all(Verdict::ok) {
                crate::render::write_out(format_args!("{:<8}{id}", "ok"));
                continue;
            }
            for v in verdicts.iter().filter(|v| !v.ok()) {
                let message = v.message.as_deref().unwrap_or_default();
                let address = v.address.as_deref().map_or(String::new(), |a| {
                    format!(" ({})", crate::text::elide_query(a))
                });
                crate::render::write_out(format_args!("{:<8}{id}: {message}{address}", v.verdict));
            }
        }
        if values_wrong {
            let file = crate::platform::shell_word(&path.display().to_string());
            crate::errln!(
                "`gem-resources autofill --manifest {file} --all --write` writes the size and sha256 each url serves into the manifest"
            );
        }
        if wrong > 0 {
            crate::errln!("{wrong} of {} resource(s) wrong", all.len());
        }
    }
    if wrong == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(FAILED)
    }
}
