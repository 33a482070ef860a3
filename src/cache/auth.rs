//! Credentials as registries use them: none (anonymous), HTTP basic, and
//! the token flow (`401` with `WWW-Authenticate: Bearer realm=…,
//! service=…, scope=…`; a token fetched from the realm with the basic
//! credentials, if any, and kept until it expires).
//!
//! A password or token is a [`Secret`]: it has no `Display`, its `Debug`
//! is `***`, and it only ever becomes an `Authorization` header value
//! marked sensitive.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use base64::Engine;
use reqwest::header::HeaderValue;

/// A password or token: never shown.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("***")
    }
}

impl Secret {
    /// Wraps a password or token.
    pub(crate) fn new(text: &str) -> Secret {
        Secret(text.to_string())
    }

    /// The text itself, for a request that carries it.
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

/// Where the password comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PasswordSource {
    /// This environment variable (its name).
    Env(String),
    /// The first line of this file.
    File(PathBuf),
}

impl PasswordSource {
    /// Reads the password; the error names the variable or the file, never
    /// what it holds.
    pub(crate) fn read(&self) -> Result<Secret, String> {
        match self {
            PasswordSource::Env(var) => match std::env::var(var) {
                Ok(value) if !value.is_empty() => Ok(Secret(value)),
                _ => Err(format!(
                    "cache.password_env: the environment variable {var} is not set"
                )),
            },
            PasswordSource::File(path) => {
                let bytes = crate::manifest::read_regular_file(path, 64 << 10).map_err(|e| {
                    format!("cache.password_file: cannot read {}: {e}", path.display())
                })?;
                let text = String::from_utf8(bytes).map_err(|_| {
                    format!("cache.password_file: {} is not UTF-8 text", path.display())
                })?;
                let line = text.lines().next().unwrap_or_default().trim_end();
                if line.is_empty() {
                    return Err(format!("cache.password_file: {} is empty", path.display()));
                }
                Ok(Secret(line.to_string()))
            }
        }
    }
}

/// The user name and password, when configured.
#[derive(Debug, Clone, Default)]
pub(crate) struct Credentials {
    pub(crate) login: Option<(String, Secret)>,
    /// A refresh token for the token service (from a Docker
    /// `config.json`'s `identitytoken`).
    pub(crate) identity: Option<Secret>,
}

impl Credentials {
    /// `Authorization: Basic …`, when there are credentials.
    pub(crate) fn basic(&self) -> Option<HeaderValue> {
        let (user, Secret(password)) = self.login.as_ref()?;
        let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        sensitive(&format!("Basic {token}"))
    }
}

/// A header value marked sensitive (never in the HTTP client's logs).
pub(crate) fn sensitive(text: &str) -> Option<HeaderValue> {
    let mut value = HeaderValue::from_str(text).ok()?;
    value.set_sensitive(true);
    Some(value)
}

/// What a `401` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Challenge {
    /// HTTP basic.
    Basic,
    /// A token from `realm` for `service` and `scope`.
    Bearer {
        realm: String,
        service: Option<String>,
        scope: Option<String>,
    },
}

/// Reads `WWW-Authenticate` (`Bearer realm="…",service="…",scope="…"` or
/// `Basic realm="…"`); `None` for another scheme or a malformed header.
pub(crate) fn parse_challenge(value: &str) -> Option<Challenge> {
    let value = value.trim();
    let (scheme, rest) = value.split_once(' ').unwrap_or((value, ""));
    let params = parse_params(rest)?;
    if scheme.eq_ignore_ascii_case("basic") {
        return Some(Challenge::Basic);
    }
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let get = |key: &str| {
        params
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(key))
            .map(|(_, v)| v.clone())
    };
    Some(Challenge::Bearer {
        realm: get("realm")?,
        service: get("service"),
        scope: get("scope"),
    })
}

/// `key=value, key="quoted, value"` pairs.
fn parse_params(text: &str) -> Option<Vec<(String, String)>> {
    let mut out = Vec::new();
    let mut chars = text.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| *c == ',' || c.is_whitespace()) {
            chars.next();
        }
        if chars.peek().is_none() {
            return Some(out);
        }
        let key: String = std::iter::from_fn(|| chars.next_if(|c| *c != '=' && *c != ','))
            .collect::<String>()
            .trim()
            .to_string();
        if chars.next() != Some('=') || key.is_empty() {
            return None;
        }
        let mut value = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            loop {
                match chars.next()? {
                    '"' => break,
                    '\\' => value.push(chars.next()?),
                    c => value.push(c),
                }
            }
        } else {
            value = std::iter::from_fn(|| chars.next_if(|c| *c != ','))
                .collect::<String>()
                .trim()
                .to_string();
        }
        out.push((key, value));
    }
}

/// The token service's answer.
#[derive(serde::Deserialize)]
struct TokenAnswer {
    #[serde(default)]
    token: Option<String>,
    #[serde(default)]
    access_token: Option<String>,
    #[serde(default)]
    expires_in: Option<u64>,
}

/// The token in `body` and how long it lasts (60 s when the service does
/// not say, as the specification's default).
pub(crate) fn read_token(body: &[u8]) -> Result<(Secret, Duration), String> {
    let answer: TokenAnswer = serde_json::from_slice(body)
        .map_err(|_| "the token service's answer is not the expected JSON".to_string())?;
    let token = answer
        .token
        .or(answer.access_token)
        .filter(|t| !t.is_empty())
        .ok_or("the token service's answer holds no token")?;
    let lasts = Duration::from_secs(answer.expires_in.unwrap_or(60).clamp(1, 86_400));
    Ok((Secret(token), lasts))
}

/// Tokens by scope, until they expire (a tenth of their life, at most
/// 30 s, early).
#[derive(Debug, Default)]
pub(crate) struct Tokens {
    by_scope: Mutex<HashMap<String, (Secret, Instant)>>,
}

impl Tokens {
    /// The header of a live token for `scope`.
    pub(crate) fn header(&self, scope: &str) -> Option<HeaderValue> {
        let tokens = self.by_scope.lock().unwrap_or_else(|p| p.into_inner());
        let (Secret(token), until) = tokens.get(scope)?;
        (Instant::now() < *until)
            .then(|| sensitive(&format!("Bearer {token}")))
            .flatten()
    }

    /// Keeps `token` for `scope`.
    pub(crate) fn keep(&self, scope: &str, token: Secret, lasts: Duration) {
        let margin = (lasts / 10).min(Duration::from_secs(30));
        let until = Instant::now() + lasts - margin;
        let mut tokens = self.by_scope.lock().unwrap_or_else(|p| p.into_inner());
        tokens.insert(scope.to_string(), (token, until));
    }

    /// Forgets every token (the registry refused one).
    pub(crate) fn forget(&self, scope: &str) {
        let mut tokens = self.by_scope.lock().unwrap_or_else(|p| p.into_inner());
        tokens.remove(scope);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn challenges_are_read_as_registries_send_them() {
        assert_eq!(
            parse_challenge(
                r#"Bearer realm="https://auth.example/token",service="registry.example",scope="repository:a/b:pull,push""#
            ),
            Some(Challenge::Bearer {
                realm: "https://auth.example/token".into(),
                service: Some("registry.example".into()),
                scope: Some("repository:a/b:pull,push".into()),
            })
        );
        assert_eq!(
            parse_challenge(r#"Basic realm="Registry Realm""#),
            Some(Challenge::Basic)
        );
        assert_eq!(
            parse_challenge("bearer realm=https://a.example/t"),
            Some(Challenge::Bearer {
                realm: "https://a.example/t".into(),
                service: None,
                scope: None
            })
        );
        assert_eq!(parse_challenge("Negotiate abc"), None);
        assert_eq!(parse_challenge(r#"Bearer realm="unterminated"#), None);
        assert_eq!(parse_challenge("Bearer service=x"), None);
    }

    #[test]
    fn secrets_never_show() {
        let s = Secret("hunter2".into());
        assert_eq!(format!("{s:?}"), "***");
        let c = Credentials {
            login: Some(("u".into(), s)),
            identity: None,
        };
        assert!(!format!("{c:?}").contains("hunter2"));
        assert!(c.basic().unwrap().is_sensitive());
        let (token, lasts) = read_token(br#"{"token":"t0k","expires_in":300}"#).unwrap();
        assert_eq!(lasts, Duration::from_secs(300));
        let tokens = Tokens::default();
        tokens.keep("s", token, lasts);
        assert_eq!(tokens.header("s").unwrap(), "Bearer t0k");
        assert!(tokens.header("other").is_none());
        assert!(read_token(b"{}").is_err());
    }
}
