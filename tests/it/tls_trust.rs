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
    assert!(stderr(&out).contains("certificate"), "{}", stderr(&out));
    assert_eq!(env.origin.hits("/a.bin"), 0);
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
    assert!(stderr(&out).contains("NotValidForName"), "{}", stderr(&out));
}
