//! Which certificates the `[dev] extra_root_certs` setting makes trusted.

use crate::support::*;

async fn env_self_signed() -> Env {
    let origin = Origin::start_self_signed().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ca.pem"), origin.ca_pem()).unwrap();
    let env = Env { origin, dir };
    env.write_config("");
    env
}

#[tokio::test]
async fn a_self_signed_ca_certificate_given_as_extra_root_is_trusted_for_its_names() {
    let env = env_self_signed().await;
    let body = bytes(5000, 9);
    let url = env.serve("/a.bin", &body);
    let out = env.run(&["--json", "autofill", url.as_str()]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["sha256"], sha256_hex(&body));
}

#[tokio::test]
async fn an_untrusted_certificate_is_refused() {
    let env = Env::new().await;
    let url = env.serve("/a.bin", b"x");
    // Trust a different origin's CA: the handshake must fail.
    let stranger = Origin::start().await;
    std::fs::write(env.dir.path().join("ca.pem"), stranger.ca_pem()).unwrap();
    let out = env.run(&["autofill", url.as_str()]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("E_RESOURCE_NETWORK"),
        "{}",
        stderr(&out)
    );
    assert!(
        stderr(&out).contains("TLS: the server's certificate is not trusted: ")
            && stderr(&out).contains("`[dev] extra_root_certs`"),
        "{}",
        stderr(&out)
    );
    assert_eq!(env.origin.hits("/a.bin"), 0);
}

#[tokio::test]
async fn a_self_signed_certificate_in_no_trust_store_is_called_that() {
    // `CA:TRUE`, as `openssl req -x509` makes it, and a plain leaf.
    for origin in [
        Origin::start_self_signed().await,
        Origin::start_self_signed_leaf(|_| {}).await,
    ] {
        let dir = tempfile::tempdir().unwrap();
        // Another server's certificate is trusted, not this one.
        let stranger = Origin::start().await;
        std::fs::write(dir.path().join("ca.pem"), stranger.ca_pem()).unwrap();
        let env = Env { origin, dir };
        env.write_config("");
        let err = assert_handshake_refused(&env).await;
        assert!(
            err.contains("TLS: the server's certificate is not trusted: it is a self-signed certificate not in any trust store (for a test or development server, add that certificate to `[dev] extra_root_certs`)"),
            "{err}"
        );
        assert!(!err.contains("CA certificate used as"), "{err}");
    }
}

#[tokio::test]
async fn a_pinned_self_signed_certificate_is_refused_for_a_name_it_does_not_carry() {
    let env = env_self_signed().await;
    let url = env.serve("/a.bin", b"x");
    // unlisted.test resolves to the origin but is not in the certificate.
    let path = env.dir.path().join("config.toml");
    let text = std::fs::read_to_string(&path).unwrap().replace(
        "resolve = { ",
        "resolve = { \"unlisted.test\" = [\"127.0.0.1\"], ",
    );
    std::fs::write(&path, text).unwrap();
    let other = url.as_str().replace("origin.test", "unlisted.test");
    let out = env.run(&["autofill", &other]).await;
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(
        stderr(&out).contains(
            "TLS: the server's certificate is not trusted: it is not valid for unlisted.test"
        ),
        "{}",
        stderr(&out)
    );
}

/// A self-signed certificate for `origin.test` valid from `from` to
/// `until` (January 1st of those years), as PEM.
fn pem_valid(from: i32, until: i32) -> String {
    let mut params = rcgen::CertificateParams::new(vec!["origin.test".to_string()]).unwrap();
    params.not_before = rcgen::date_time_ymd(from, 1, 1);
    params.not_after = rcgen::date_time_ymd(until, 1, 1);
    let key = rcgen::KeyPair::generate().unwrap();
    params.self_signed(&key).unwrap().pem()
}

#[tokio::test]
async fn an_expired_or_not_yet_valid_pinned_certificate_is_refused_at_load() {
    let env = Env::new().await;
    let url = env.serve("/a.bin", b"x");
    let path = env.dir.path().join("config.toml");
    let text = std::fs::read_to_string(&path).unwrap().replace(
        "extra_root_certs = [\"ca.pem\"]",
        "extra_root_certs = [\"ca.pem\", \"pinned.pem\"]",
    );
    std::fs::write(&path, text).unwrap();
    let pinned = env.dir.path().join("pinned.pem");
    for (pem, said) in [
        (
            pem_valid(2001, 2002),
            "certificate 1 of 1 expired on 2002-01-01T00:00:00Z",
        ),
        (
            pem_valid(2200, 2300),
            "certificate 1 of 1 is not valid before 2200-01-01T00:00:00Z",
        ),
    ] {
        std::fs::write(&pinned, pem).unwrap();
        let out = env.run(&["autofill", url.as_str()]).await;
        assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
        let err = stderr(&out);
        assert!(err.starts_with("E_RESOURCE_CONFIG: "), "{err}");
        assert!(
            err.contains(&format!("{}: {said}", pinned.display())),
            "{err}"
        );
        assert_eq!(env.origin.hits("/a.bin"), 0);
    }
    std::fs::write(&pinned, pem_valid(2001, 2100)).unwrap();
    let out = env.run(&["autofill", url.as_str()]).await;
    assert!(out.status.success(), "{}", stderr(&out));
}

/// An env whose origin is `origin`, its certificate pinned through
/// `[dev] extra_root_certs`.
fn env_pinned(origin: Origin) -> Env {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ca.pem"), origin.ca_pem()).unwrap();
    let env = Env { origin, dir };
    env.write_config("");
    env
}

/// Autofills `/a.bin` from `env`'s origin, expects the handshake refused,
/// and returns stderr.
async fn assert_handshake_refused(env: &Env) -> String {
    let url = env.serve("/a.bin", b"x");
    let out = env.run(&["autofill", url.as_str()]).await;
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("E_RESOURCE_NETWORK"), "{err}");
    assert_eq!(env.origin.hits("/a.bin"), 0, "{err}");
    err
}

#[tokio::test]
async fn a_pinned_self_signed_leaf_is_trusted_for_its_name() {
    let env = env_pinned(Origin::start_self_signed_leaf(|_| {}).await);
    let url = env.serve("/a.bin", b"x");
    let out = env.run(&["autofill", url.as_str()]).await;
    assert!(out.status.success(), "{}", stderr(&out));
}

#[tokio::test]
async fn a_pinned_certificate_signed_with_sha1_is_refused() {
    let pem = include_str!("../support/certs/sha1-self-signed.pem");
    let env = env_pinned(Origin::start_with_pem(pem).await);
    let err = assert_handshake_refused(&env).await;
    assert!(
        err.contains("not trusted: it is signed with an algorithm this program does not accept (such as SHA-1 or MD5)"),
        "{err}"
    );
    assert!(!err.contains("Context"), "{err}");
}

#[tokio::test]
async fn a_pinned_certificate_for_client_authentication_only_is_refused() {
    let env = env_pinned(
        Origin::start_self_signed_leaf(|p| {
            p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        })
        .await,
    );
    let err = assert_handshake_refused(&env).await;
    assert!(err.contains("not meant for a server"), "{err}");
}

#[tokio::test]
async fn a_pinned_certificate_whose_key_usage_forbids_signing_is_refused() {
    let env = env_pinned(
        Origin::start_self_signed_leaf(|p| {
            p.key_usages = vec![rcgen::KeyUsagePurpose::KeyEncipherment];
        })
        .await,
    );
    let err = assert_handshake_refused(&env).await;
    assert!(err.contains("key usage"), "{err}");
}
