//! Credentials kept by a Docker credential helper (`credHelpers` or
//! `credsStore` in `config.json`, see `docker`), got as Docker gets them:
//! the program `docker-credential-<name>` (found on `PATH`) runs with the
//! argument `get`, reads the registry's server (`host`, or `host:port`
//! when the address names a port) on stdin and answers
//! `{"ServerURL": …, "Username": …, "Secret": …}` on stdout. A `Username`
//! of `<token>` makes the secret an identity token: a refresh token for
//! the registry's token service. A helper that fails prints why on stdout
//! (`credentials not found in native keychain`) and exits non-zero.
//!
//! The helper runs when the registry first asks for credentials (an
//! anonymous registry never runs it), off the async threads, at most
//! [`HELPER_TIMEOUT`] (then it is killed). Its answer is kept for the
//! cache's life; a failure is kept for the breaker's while, then the
//! helper runs again when the registry next asks. Its stderr is
//! discarded, and no message says its secret: an error names the helper,
//! how it ended, and the first line it printed on failure.

use std::ffi::{OsStr, OsString};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::cache::auth::{Credentials, Secret};
use crate::platform::program;

/// Longest a helper may take to answer.
pub(crate) const HELPER_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest answer read from a helper.
const MAX_ANSWER: u64 = 64 << 10;

/// The name of a helper's program is this and the helper's name.
const PREFIX: &str = "docker-credential-";

/// `Username` of an identity token.
const TOKEN_USER: &str = "<token>";

/// Whether `name` may name a helper: 1 to 64 of ASCII letters, digits,
/// `.`, `_` and `-` (no path separator: the program is looked for on
/// `PATH`, never by a path the file names).
pub(crate) fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// A credential helper to ask for one registry's credentials.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Helper {
    /// Its name, after `docker-credential-` (checked by [`valid_name`]).
    pub(crate) name: String,
    /// What it is asked for: `host`, or `host:port`.
    pub(crate) server: String,
    /// Where it is named, for messages (`credsStore in /home/me/.docker/config.json`).
    pub(crate) named_in: String,
}

impl Helper {
    /// `docker-credential-<name>`.
    pub(crate) fn program(&self) -> String {
        format!("{PREFIX}{}", self.name)
    }

    /// Runs the helper found on `search` (a `PATH` value) for its
    /// credentials, at most `timeout`. Blocks.
    pub(crate) fn get(
        &self,
        search: Option<&OsStr>,
        timeout: Duration,
    ) -> Result<Credentials, String> {
        let program = self.program();
        let server = &self.server;
        let path = search
            .and_then(|s| program::find_on_path(s, &program))
            .ok_or_else(|| {
                format!(
                    "the credential helper {program} ({}) is not on PATH",
                    self.named_in
                )
            })?;
        let ran = program::run(&path, &["get"], server.as_bytes(), timeout, MAX_ANSWER)
            .map_err(|e| format!("the credential helper {program} cannot be started: {e}"))?;
        let Some(status) = ran.status else {
            return Err(format!(
                "the credential helper {program} did not answer for {server} within {}s and was stopped",
                timeout.as_secs_f64()
            ));
        };
        if !status.success() {
            let ended = match status.code() {
                Some(code) => format!("exit status {code}"),
                None => status.to_string(),
            };
            let said = ran.stdout.as_deref().map(first_line).unwrap_or_default();
            let said = if said.is_empty() {
                String::new()
            } else {
                format!(": {said}")
            };
            return Err(format!(
                "the credential helper {program} failed for {server} ({ended}){said}"
            ));
        }
        let answer = ran.stdout.ok_or_else(|| {
            format!("the credential helper {program}'s answer for {server} is longer than 64 KiB")
        })?;
        read_answer(&answer)
            .map_err(|why| format!("the credential helper {program}'s answer for {server} {why}"))
    }
}

/// The first line of what a failed helper printed, as text, cut short;
/// control characters left out.
fn first_line(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let line = text.lines().map(str::trim).find(|l| !l.is_empty());
    let line: String = line
        .unwrap_or_default()
        .chars()
        .filter(|c| !c.is_control())
        .collect();
    crate::error::shorten_to(&line, 200)
}

#[derive(serde::Deserialize)]
struct Answer {
    #[serde(default, rename = "Username")]
    username: String,
    #[serde(default, rename = "Secret")]
    secret: String,
}

/// Reads a helper's answer; the reason (completing "the answer …") names
/// no value from it.
fn read_answer(bytes: &[u8]) -> Result<Credentials, &'static str> {
    let answer: Answer =
        serde_json::from_slice(bytes).map_err(|_| "is not JSON with Username and Secret")?;
    if answer.secret.is_empty() {
        return Err("holds no secret");
    }
    let mut credentials = Credentials::default();
    if answer.username == TOKEN_USER {
        credentials.identity = Some(Secret::new(&answer.secret));
    } else if answer.username.is_empty() {
        return Err("holds no user name");
    } else {
        credentials.login = Some((answer.username, Secret::new(&answer.secret)));
    }
    Ok(credentials)
}

/// A helper's credentials, got the first time they are needed.
#[derive(Debug)]
pub(crate) struct Lazy {
    helper: Helper,
    /// Where the helper is looked for (the `PATH` the cache was set up
    /// with).
    search: Option<OsString>,
    timeout: Duration,
    /// How long a failure is kept before the helper runs again.
    retry_after: Duration,
    got: OnceLock<Credentials>,
    /// One run at a time; the last failure and when it came.
    failed: tokio::sync::Mutex<Option<(String, Instant)>>,
}

impl Lazy {
    /// `helper`, looked for on `search`, each run at most `timeout`, a
    /// failure kept for `retry_after`.
    pub(crate) fn new(
        helper: Helper,
        search: Option<OsString>,
        timeout: Duration,
        retry_after: Duration,
    ) -> Lazy {
        Lazy {
            helper,
            search,
            timeout,
            retry_after,
            got: OnceLock::new(),
            failed: tokio::sync::Mutex::new(None),
        }
    }

    /// The credentials, when the helper has given them.
    pub(crate) fn ready(&self) -> Option<&Credentials> {
        self.got.get()
    }

    /// The credentials: the ones the helper gave, else it is run (unless
    /// it failed within `retry_after`: that failure again).
    pub(crate) async fn get(&self) -> Result<&Credentials, String> {
        if let Some(got) = self.got.get() {
            return Ok(got);
        }
        let mut failed = self.failed.lock().await;
        if let Some(got) = self.got.get() {
            return Ok(got);
        }
        if let Some((why, at)) = failed.as_ref() {
            if at.elapsed() < self.retry_after {
                return Err(why.clone());
            }
        }
        let (helper, search, timeout) = (self.helper.clone(), self.search.clone(), self.timeout);
        let got = tokio::task::spawn_blocking(move || helper.get(search.as_deref(), timeout))
            .await
            .unwrap_or_else(|_| {
                Err(format!(
                    "the credential helper {} could not be run",
                    self.helper.program()
                ))
            });
        match got {
            Ok(credentials) => {
                *failed = None;
                Ok(self.got.get_or_init(|| credentials))
            }
            Err(why) => {
                *failed = Some((why.clone(), Instant::now()));
                Err(why)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helper_names_are_plain_names() {
        for good in ["desktop", "osxkeychain", "ecr-login", "gcloud", "a.b_c-1"] {
            assert!(valid_name(good), "{good}");
        }
        let long = "a".repeat(65);
        for bad in [
            "",
            "../desktop",
            "a/b",
            "a\\b",
            "a b",
            "C:x",
            "a\0b",
            long.as_str(),
        ] {
            assert!(!valid_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn answers_give_a_login_or_an_identity_token_and_never_show_a_value() {
        let login =
            read_answer(br#"{"ServerURL":"r","Username":"u","Secret":"p-S3CRET"}"#).unwrap();
        let (user, secret) = login.login.unwrap();
        assert_eq!((user.as_str(), secret.expose()), ("u", "p-S3CRET"));
        let token = read_answer(br#"{"Username":"<token>","Secret":"id-S3CRET"}"#).unwrap();
        assert!(token.login.is_none());
        assert_eq!(token.identity.unwrap().expose(), "id-S3CRET");
        for bad in [
            &br#"{"Username":"u","Secret":""}"#[..],
            br#"{"Username":"","Secret":"S3CRET"}"#,
            b"S3CRET",
        ] {
            let e = read_answer(bad).unwrap_err();
            assert!(!e.contains("S3CRET"), "{e}");
        }
    }

    #[test]
    fn what_a_failed_helper_printed_is_one_clean_line() {
        assert_eq!(
            first_line(b"\n  credentials not found in native keychain\nmore\n"),
            "credentials not found in native keychain"
        );
        assert_eq!(first_line(b"a\x1b[31mb"), "a[31mb");
        assert!(first_line(&[b'x'; 1000]).ends_with("x… (1000 characters)"));
    }

    /// A helper script `docker-credential-<name>` in a folder of its own,
    /// and that folder as a search path.
    #[cfg(unix)]
    fn fake(name: &str, body: &str) -> (tempfile::TempDir, OsString, Helper) {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(format!("{PREFIX}{name}"));
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        let search = dir.path().as_os_str().to_owned();
        let helper = Helper {
            name: name.to_string(),
            server: "registry.test:5000".into(),
            named_in: "credsStore in config.json".into(),
        };
        (dir, search, helper)
    }

    #[cfg(unix)]
    #[test]
    fn a_helper_is_asked_for_the_server_on_stdin_and_its_answer_read() {
        // It answers only for the server it is asked about, as `get`.
        let (_d, search, helper) = fake(
            "fake",
            r#"[ "$1" = get ] || exit 2
server=$(cat)
echo "noise-S3CRET" >&2
if [ "$server" = "registry.test:5000" ]; then
  printf '{"ServerURL":"%s","Username":"reader","Secret":"pw-S3CRET"}' "$server"
else
  echo "credentials not found in native keychain"; exit 1
fi"#,
        );
        let got = helper.get(Some(&search), HELPER_TIMEOUT).unwrap();
        let (user, secret) = got.login.unwrap();
        assert_eq!((user.as_str(), secret.expose()), ("reader", "pw-S3CRET"));
        let other = Helper {
            server: "elsewhere.test".into(),
            ..helper.clone()
        };
        let e = other.get(Some(&search), HELPER_TIMEOUT).unwrap_err();
        assert_eq!(
            e,
            "the credential helper docker-credential-fake failed for elsewhere.test (exit status 1): credentials not found in native keychain"
        );
        // Not on the search path given (whatever the process's PATH).
        let elsewhere = tempfile::tempdir().unwrap();
        let e = helper
            .get(Some(elsewhere.path().as_os_str()), HELPER_TIMEOUT)
            .unwrap_err();
        assert!(
            e.contains("docker-credential-fake (credsStore in config.json) is not on PATH"),
            "{e}"
        );
        assert!(helper.get(None, HELPER_TIMEOUT).is_err());
    }

    #[cfg(unix)]
    #[test]
    fn a_helper_that_fails_is_named_without_its_stderr_or_a_secret() {
        let (_d, search, helper) = fake(
            "leaky",
            "echo 'secret pw-S3CRET' >&2\necho '{\"Username\":\"u\",\"Secret\":\"\"}'",
        );
        let e = helper.get(Some(&search), HELPER_TIMEOUT).unwrap_err();
        assert!(
            e.contains("docker-credential-leaky") && e.contains("holds no secret"),
            "{e}"
        );
        let (_d, search, helper) = fake("quiet", "echo 'key S3CRET' >&2\nexit 4");
        let e = helper.get(Some(&search), HELPER_TIMEOUT).unwrap_err();
        assert_eq!(e, "the credential helper docker-credential-quiet failed for registry.test:5000 (exit status 4)");
    }

    #[cfg(unix)]
    #[test]
    fn a_helper_that_hangs_is_stopped_at_the_timeout() {
        let (_d, search, helper) = fake("hangs", "exec sleep 30");
        let started = Instant::now();
        let e = helper
            .get(Some(&search), Duration::from_millis(300))
            .unwrap_err();
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        assert!(
            e.contains("docker-credential-hangs did not answer for registry.test:5000 within 0.3s"),
            "{e}"
        );
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn a_helper_runs_once_and_a_failure_waits_before_it_runs_again() {
        // Each run leaves a line in `runs`; the first fails.
        let (dir, search, helper) = fake("counted", "");
        let runs = dir.path().join("runs");
        let script = format!(
            "#!/bin/sh\necho run >> '{0}'\n[ $(wc -l < '{0}') -gt 1 ] || {{ echo 'not yet'; exit 1; }}\nprintf '{{\"Username\":\"u\",\"Secret\":\"s\"}}'\n",
            runs.display()
        );
        std::fs::write(dir.path().join("docker-credential-counted"), script).unwrap();
        let count = || {
            std::fs::read_to_string(&runs)
                .unwrap_or_default()
                .lines()
                .count()
        };
        let lazy = Lazy::new(
            helper,
            Some(search),
            HELPER_TIMEOUT,
            Duration::from_millis(300),
        );
        assert!(lazy.ready().is_none(), "nothing runs before it is needed");
        assert_eq!(count(), 0);
        let e = lazy.get().await.unwrap_err();
        assert!(e.contains("not yet"), "{e}");
        // Within the wait, the failure is said again without a run.
        assert!(lazy.get().await.is_err());
        assert_eq!(count(), 1);
        tokio::time::sleep(Duration::from_millis(350)).await;
        assert_eq!(lazy.get().await.unwrap().login.as_ref().unwrap().0, "u");
        assert_eq!(lazy.get().await.unwrap().login.as_ref().unwrap().0, "u");
        assert!(lazy.ready().is_some());
        assert_eq!(count(), 2, "its answer is kept");
    }
}
