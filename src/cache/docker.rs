//! Credentials from a Docker `config.json` (`[cache] docker_config`), as
//! `docker login` leaves them: `auths.<host>` with `auth` (base64 of
//! `user:password`), or `username` and `password`, or `identitytoken` (a
//! refresh token for the registry's token service). The entry is found by
//! the registry's host (and port, when the address names one); `https://`
//! and a path in the key are ignored, as Docker does. Credentials kept by a
//! helper (`credsStore`, `credHelpers`) are not read: the error says so.
//!
//! Errors name the file and the host, never a value from the file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use base64::Engine;

use crate::cache::auth::Secret;
use crate::cache::oci::Registry;

/// What the file holds for the registry.
#[derive(Debug, Default)]
pub(crate) struct Found {
    /// A user name and password.
    pub(crate) login: Option<(String, Secret)>,
    /// A refresh token for the registry's token service.
    pub(crate) identity: Option<Secret>,
}

#[derive(serde::Deserialize)]
struct File {
    #[serde(default)]
    auths: BTreeMap<String, Entry>,
    #[serde(default, rename = "credsStore")]
    creds_store: Option<String>,
    #[serde(default, rename = "credHelpers")]
    cred_helpers: BTreeMap<String, String>,
}

#[derive(serde::Deserialize)]
struct Entry {
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
    #[serde(default)]
    identitytoken: Option<String>,
}

/// `$DOCKER_CONFIG/config.json`, else `~/.docker/config.json` (the home
/// folder from `HOME`, else `USERPROFILE`, as Docker on Windows).
pub(crate) fn default_path() -> Option<PathBuf> {
    let set = |name: &str| std::env::var_os(name).filter(|d| !d.is_empty());
    if let Some(dir) = set("DOCKER_CONFIG") {
        return Some(PathBuf::from(dir).join("config.json"));
    }
    let home = set("HOME").or_else(|| set("USERPROFILE"))?;
    Some(PathBuf::from(home).join(".docker").join("config.json"))
}

/// The key of `auths` without `https://`, a path or letter case.
fn normalise_key(key: &str) -> String {
    let key = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    key.split('/')
        .next()
        .unwrap_or_default()
        .to_ascii_lowercase()
}

/// The names Docker would file the registry under: `host:port` when the
/// address names a port, else `host` (and `host:443`).
fn keys(registry: &Registry) -> Vec<String> {
    let host = registry.host().to_ascii_lowercase();
    match registry.port() {
        Some(port) => vec![format!("{host}:{port}")],
        None => vec![host.clone(), format!("{host}:443")],
    }
}

/// Reads the credentials for `registry` from the file at `path`.
pub(crate) fn read(path: &Path, registry: &Registry) -> Result<Found, String> {
    let shown = path.display();
    let bytes = crate::manifest::read_regular_file(path, 1 << 20)
        .map_err(|e| format!("cache.docker_config: cannot read {shown}: {e}"))?;
    let file: File = serde_json::from_slice(&bytes).map_err(|_| {
        format!("cache.docker_config: {shown} is not a Docker config.json (JSON with `auths`)")
    })?;
    let wanted = keys(registry);
    let host = wanted[0].clone();
    let entry = file
        .auths
        .iter()
        .find(|(key, _)| wanted.contains(&normalise_key(key)))
        .map(|(_, entry)| entry);
    let Some(entry) = entry else {
        let helper = file
            .cred_helpers
            .iter()
            .find(|(key, _)| wanted.contains(&normalise_key(key)))
            .map(|(_, helper)| helper.clone())
            .or(file.creds_store);
        return Err(match helper {
            Some(helper) => format!(
                "cache.docker_config: {shown} leaves the credentials for {host} to docker-credential-{helper}, which this program does not run; give username and password_env instead"
            ),
            None => format!("cache.docker_config: {shown} has no credentials for {host}"),
        });
    };
    let mut found = Found::default();
    if let Some(auth) = entry.auth.as_deref().filter(|a| !a.is_empty()) {
        let bad = || {
            format!("cache.docker_config: the `auth` for {host} in {shown} is not base64 of user:password")
        };
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(auth.trim())
            .map_err(|_| bad())?;
        let text = String::from_utf8(decoded).map_err(|_| bad())?;
        let (user, password) = text.split_once(':').ok_or_else(bad)?;
        if !user.is_empty() && !password.is_empty() {
            found.login = Some((user.to_string(), Secret::new(password)));
        }
    } else if let (Some(user), Some(password)) = (&entry.username, &entry.password) {
        if !user.is_empty() && !password.is_empty() {
            found.login = Some((user.clone(), Secret::new(password)));
        }
    }
    found.identity = entry
        .identitytoken
        .as_deref()
        .filter(|t| !t.is_empty())
        .map(Secret::new);
    if found.login.is_none() && found.identity.is_none() {
        return Err(format!(
            "cache.docker_config: the entry for {host} in {shown} holds no user name and password or identity token"
        ));
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(text: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        std::fs::write(&path, text).unwrap();
        (dir, path)
    }

    #[test]
    fn entries_are_found_by_host_and_port_as_docker_files_them() {
        let with_port = Registry::parse("https://Registry.Corp.example:5000/team/cache").unwrap();
        let plain = Registry::parse("https://registry.corp.example/cache").unwrap();
        // base64("u:p-S3CRET")
        let (_d, path) = write(
            r#"{"auths":{"https://registry.corp.example:5000/v1/":{"auth":"dTpwLVMzQ1JFVA=="},
                         "registry.corp.example":{"username":"v","password":"q"}}}"#,
        );
        let found = read(&path, &with_port).unwrap();
        let (user, password) = found.login.unwrap();
        assert_eq!((user.as_str(), password.expose()), ("u", "p-S3CRET"));
        let found = read(&path, &plain).unwrap();
        assert_eq!(found.login.unwrap().0, "v");
        let other = Registry::parse("https://elsewhere.example/cache").unwrap();
        let e = read(&path, &other).unwrap_err();
        assert!(
            e.contains("has no credentials for elsewhere.example"),
            "{e}"
        );
    }

    #[test]
    fn identity_tokens_helpers_and_bad_files_are_said_without_values() {
        let r = Registry::parse("https://registry.corp.example/cache").unwrap();
        let (_d, path) =
            write(r#"{"auths":{"registry.corp.example":{"identitytoken":"tok-S3CRET"}}}"#);
        let found = read(&path, &r).unwrap();
        assert!(found.login.is_none());
        assert_eq!(found.identity.unwrap().expose(), "tok-S3CRET");
        let (_d, path) = write(r#"{"auths":{},"credHelpers":{"registry.corp.example":"ecr"}}"#);
        let e = read(&path, &r).unwrap_err();
        assert!(e.contains("docker-credential-ecr"), "{e}");
        let (_d, path) = write(r#"{"auths":{"registry.corp.example":{"auth":"!!S3CRET"}}}"#);
        let e = read(&path, &r).unwrap_err();
        assert!(e.contains("not base64") && !e.contains("S3CRET"), "{e}");
        let (_d, path) = write("S3CRET not json");
        let e = read(&path, &r).unwrap_err();
        assert!(!e.contains("S3CRET not"), "{e}");
    }
}
