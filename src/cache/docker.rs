//! Credentials from a Docker `config.json` (`[cache] docker_config`), as
//! `docker login` leaves them, looked for as Docker does for the
//! registry's host (and port, when the address names one):
//! 1. `credHelpers.<host>` names a credential helper (an empty name there
//!    sends the host to `auths`);
//! 2. else `credsStore` names one (Docker Desktop always sets it);
//! 3. else `auths.<host>` holds `auth` (base64 of `user:password`), or
//!    `username` and `password`, or `identitytoken` (a refresh token for
//!    the registry's token service).
//!
//! A helper is run only when the registry asks for credentials (see
//! `helper`); an `auths` entry of a host a helper answers for is not read,
//! as Docker does not read it. `https://` and a path in a key are ignored,
//! as Docker does.
//!
//! Errors name the file and the host, never a value from the file.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use base64::Engine;

use crate::cache::auth::{Credentials, Secret};
use crate::cache::helper::{self, Helper};
use crate::cache::oci::Registry;

/// Where the file sends the registry's credentials.
#[derive(Debug)]
pub(crate) enum Source {
    /// The credentials written in the file.
    File(Credentials),
    /// A credential helper keeps them.
    Helper(Helper),
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
/// folder from `HOME`, else `USERPROFILE`, as Docker on Windows), the
/// variables read with `var` (the process's environment, but for tests).
pub(crate) fn default_path(var: &dyn Fn(&str) -> Option<OsString>) -> Option<PathBuf> {
    let set = |name: &str| var(name).filter(|d| !d.is_empty());
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

/// Reads where the file at `path` keeps the credentials for `registry`.
pub(crate) fn read(path: &Path, registry: &Registry) -> Result<Source, String> {
    let shown = path.display();
    let bytes = crate::manifest::read_regular_file(path, 1 << 20)
        .map_err(|e| format!("cache.docker_config: cannot read {shown}: {e}"))?;
    let file: File = serde_json::from_slice(&bytes).map_err(|_| {
        format!("cache.docker_config: {shown} is not a Docker config.json (JSON with `auths`)")
    })?;
    let wanted = keys(registry);
    let host = wanted[0].clone();
    let ours = |key: &String| wanted.contains(&normalise_key(key));
    // Docker's order: the host's own helper, else the one for every host.
    let helper = match file.cred_helpers.iter().find(|(key, _)| ours(key)) {
        Some((_, name)) => Some((name.clone(), "credHelpers")),
        None => file.creds_store.map(|name| (name, "credsStore")),
    };
    if let Some((name, key)) = helper.filter(|(name, _)| !name.is_empty()) {
        if !helper::valid_name(&name) {
            return Err(format!(
                "cache.docker_config: {key} in {shown} names the credential helper {:?}, which is not a plain name (letters, digits, '.', '_' and '-', run as docker-credential-<name> from PATH)",
                crate::error::shorten_to(&name, 80)
            ));
        }
        return Ok(Source::Helper(Helper {
            name,
            server: host,
            named_in: format!("{key} in {shown}"),
        }));
    }
    let entry = file.auths.iter().find(|(key, _)| ours(key)).map(|(_, e)| e);
    let Some(entry) = entry else {
        return Err(format!(
            "cache.docker_config: {shown} has no credentials for {host}"
        ));
    };
    let mut found = Credentials::default();
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
    Ok(Source::File(found))
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

    /// The credentials written in the file.
    fn in_file(path: &Path, registry: &Registry) -> Credentials {
        match read(path, registry).unwrap() {
            Source::File(found) => found,
            Source::Helper(h) => panic!("a helper: {h:?}"),
        }
    }

    /// The helper the file names.
    fn helper_of(path: &Path, registry: &Registry) -> Helper {
        match read(path, registry).unwrap() {
            Source::Helper(h) => h,
            Source::File(_) => panic!("credentials in the file"),
        }
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
        let found = in_file(&path, &with_port);
        let (user, password) = found.login.unwrap();
        assert_eq!((user.as_str(), password.expose()), ("u", "p-S3CRET"));
        let found = in_file(&path, &plain);
        assert_eq!(found.login.unwrap().0, "v");
        let other = Registry::parse("https://elsewhere.example/cache").unwrap();
        let e = read(&path, &other).unwrap_err();
        assert!(
            e.contains("has no credentials for elsewhere.example"),
            "{e}"
        );
    }

    #[test]
    fn identity_tokens_and_bad_files_are_said_without_values() {
        let r = Registry::parse("https://registry.corp.example/cache").unwrap();
        let (_d, path) =
            write(r#"{"auths":{"registry.corp.example":{"identitytoken":"tok-S3CRET"}}}"#);
        let found = in_file(&path, &r);
        assert!(found.login.is_none());
        assert_eq!(found.identity.unwrap().expose(), "tok-S3CRET");
        let (_d, path) = write(r#"{"auths":{"registry.corp.example":{"auth":"!!S3CRET"}}}"#);
        let e = read(&path, &r).unwrap_err();
        assert!(e.contains("not base64") && !e.contains("S3CRET"), "{e}");
        let (_d, path) = write("S3CRET not json");
        let e = read(&path, &r).unwrap_err();
        assert!(!e.contains("S3CRET not"), "{e}");
    }

    #[test]
    fn helpers_come_first_as_docker_has_it() {
        let r = Registry::parse("https://registry.corp.example:5000/cache").unwrap();
        let inline = r#""auths":{"registry.corp.example:5000":{"auth":"dTpwLVMzQ1JFVA=="}}"#;
        // The host's own helper, before `credsStore`, before `auths`.
        let (_d, path) = write(&format!(
            r#"{{{inline},"credsStore":"desktop","credHelpers":{{"https://registry.corp.example:5000":"ecr-login","other.example":"gcloud"}}}}"#
        ));
        let h = helper_of(&path, &r);
        assert_eq!(h.name, "ecr-login");
        assert_eq!(
            h.server, "registry.corp.example:5000",
            "host:port, as Docker asks"
        );
        assert_eq!(h.named_in, format!("credHelpers in {}", path.display()));
        // `credsStore` for every other host, even one with an `auths` entry.
        let (_d, path) = write(&format!(
            r#"{{{inline},"credsStore":"desktop","credHelpers":{{"other.example":"gcloud"}}}}"#
        ));
        let h = helper_of(&path, &r);
        assert_eq!(
            (h.name.as_str(), h.program()),
            ("desktop", "docker-credential-desktop".into())
        );
        let plain = Registry::parse("https://registry.corp.example/cache").unwrap();
        assert_eq!(helper_of(&path, &plain).server, "registry.corp.example");
        // An empty name for the host sends it to `auths`.
        let (_d, path) = write(&format!(
            r#"{{{inline},"credsStore":"desktop","credHelpers":{{"registry.corp.example:5000":""}}}}"#
        ));
        assert_eq!(in_file(&path, &r).login.unwrap().0, "u");
        // Without any helper: `auths`.
        let (_d, path) = write(&format!(r#"{{{inline},"credsStore":""}}"#));
        assert_eq!(in_file(&path, &r).login.unwrap().0, "u");
    }

    #[test]
    fn a_helper_name_that_is_not_a_plain_name_is_refused() {
        let r = Registry::parse("https://registry.corp.example/cache").unwrap();
        for bad in ["../../bin/sh", "a/b", "a\\b", "a b"] {
            let (_d, path) = write(&format!(r#"{{"credsStore":"{bad}"}}"#));
            let e = read(&path, &r).unwrap_err();
            assert!(
                e.contains("credsStore in") && e.contains("is not a plain name"),
                "{e}"
            );
        }
        let (_d, path) = write(r#"{"credHelpers":{"registry.corp.example":"/usr/bin/x"}}"#);
        let e = read(&path, &r).unwrap_err();
        assert!(e.contains("credHelpers in"), "{e}");
    }

    #[test]
    fn the_file_is_found_from_docker_config_then_home_then_userprofile() {
        let path = |vars: &[(&str, &str)]| {
            let vars: Vec<(String, OsString)> = vars
                .iter()
                .map(|(k, v)| (k.to_string(), v.into()))
                .collect();
            default_path(&|name: &str| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()))
        };
        let home = Path::new("h").join(".docker").join("config.json");
        let profile = Path::new("p").join(".docker").join("config.json");
        let all = [("DOCKER_CONFIG", "d"), ("HOME", "h"), ("USERPROFILE", "p")];
        assert_eq!(path(&all), Some(Path::new("d").join("config.json")));
        assert_eq!(path(&all[1..]), Some(home.clone()));
        assert_eq!(path(&all[2..]), Some(profile.clone()));
        // An empty variable counts as unset.
        assert_eq!(path(&[("DOCKER_CONFIG", ""), ("HOME", "h")]), Some(home));
        assert_eq!(path(&[("HOME", ""), ("USERPROFILE", "p")]), Some(profile));
        assert_eq!(path(&[]), None);
    }
}
