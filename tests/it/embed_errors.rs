//! One error type for the app: `?` on every public call, typed codes, the
//! primary cause of a failure, and a service that is shut down saying so.

use std::path::PathBuf;

use gem_resources::policy::{Mode, Policy};
use gem_resources::{Config, Error, ErrorCode, Event, ResourceState, Resources};
use serde_json::json;

use crate::support::*;

/// What an app's own code looks like: every call of the crate with `?`
/// into the crate's one `Result`.
async fn app_lookup(service: &Resources, hosts: &[String]) -> gem_resources::Result<PathBuf> {
    let _config = Config::parse("[network]\nretries = 0")?;
    let policy = Policy::new(Mode::Blocklist, hosts)?;
    service.set_policy(policy)?;
    let path = service.path("g", "r").await?;
    Ok(path)
}

#[tokio::test]
async fn an_app_uses_question_mark_on_policy_config_and_path_errors_alike() {
    let env = Env::new().await;
    let body = bytes(10_000, 71);
    let url = env.serve("/r.bin", &body);
    let service = Resources::open(&env.config()).unwrap();
    service
        .install("g", &manifest(json!([entry("r", &url, &body)])))
        .await
        .unwrap();
    let path = app_lookup(&service, &[]).await.unwrap();
    assert_eq!(std::fs::read(path).unwrap(), body);
    let bad = app_lookup(&service, &["*".to_string()]).await.unwrap_err();
    assert_eq!(bad.code(), ErrorCode::Config, "{bad}");
    let parse: Error = Config::parse("[network]\nmode = 3").unwrap_err().into();
    assert_eq!(parse.code(), ErrorCode::Config);
}

#[tokio::test]
async fn a_failure_blocked_by_the_policy_names_the_policy_as_its_primary_cause() {
    let env = Env::new().await;
    let body = bytes(10_000, 72);
    env.origin.route("/gone.bin", Behaviour::Status(404));
    let url = env.url("origin.test", "/gone.bin");
    let mut e = entry("r", &url, &body);
    // The url answers 404; the mirror is on a host the policy blocks.
    e["mirrors"] = json!([env.url("blocked.test", "/r.bin").as_str()]);
    let service = Resources::open(&env.config()).unwrap();
    service
        .set_policy(Policy::new(Mode::Blocklist, &["blocked.test".to_string()]).unwrap())
        .unwrap();
    let mut events = service.subscribe();
    service.install("g", &manifest(json!([e]))).await.unwrap();
    let err = service.path("g", "r").await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::Unavailable, "{err}");
    assert_eq!(err.primary_cause(), ErrorCode::Policy, "{err}");
    let clone = err.clone();
    assert_eq!(clone.to_string(), err.to_string());
    let ResourceState::Failed { failure, .. } = service.status(Some("g")).unwrap()[0].resources[0]
        .state
        .clone()
    else {
        panic!("not failed");
    };
    assert_eq!(failure.code, ErrorCode::Unavailable);
    assert_eq!(failure.primary_cause, ErrorCode::Policy);
    let failed = std::iter::from_fn(|| events.try_recv().ok())
        .find_map(|e| match e {
            Event::Failed {
                primary_cause,
                code,
                ..
            } => Some((code, primary_cause)),
            _ => None,
        })
        .expect("a Failed event");
    assert_eq!(failed, (ErrorCode::Unavailable, ErrorCode::Policy));
}

#[tokio::test]
async fn an_invalid_gem_id_has_its_own_code_naming_the_rule() {
    let env = Env::new().await;
    let service = Resources::open(&env.config()).unwrap();
    for (id, rule) in [
        ("", "empty"),
        ("../x", "start with a letter or a digit"),
        ("a/b", "only letters"),
        ("a\u{7}b", "only letters"),
        ("a+b", "only letters"),
        ("@acme", "@scope/name"),
        ("@acme/", "@scope/name"),
        ("@/ocr", "@scope/name"),
        ("@acme/../x", "start with a letter or a digit"),
        ("@acme/ocr/v2", "only letters"),
        ("@.acme/ocr", "start with a letter or a digit"),
    ] {
        let err = service.install(id, &manifest(json!([]))).await.unwrap_err();
        assert_eq!(err.code(), ErrorCode::GemId, "{id:?}: {err}");
        assert!(err.to_string().contains(rule), "{id:?}: {err}");
        let err = service.path(id, "r").await.unwrap_err();
        assert_eq!(err.code(), ErrorCode::GemId, "{id:?}: {err}");
    }
}

#[tokio::test]
async fn a_scoped_gem_id_installs_serves_and_uninstalls() {
    let env = Env::new().await;
    let body = bytes(10_000, 74);
    let url = env.serve("/s.bin", &body);
    let service = Resources::open(&env.config()).unwrap();
    let m = manifest(json!([entry("model", &url, &body)]));
    service.install("@acme/ocr", &m).await.unwrap();
    // A plain id that looks like the stored file name is another gem.
    service.install("acme-ocr", &m).await.unwrap();
    let path = service.path("@acme/ocr", "model").await.unwrap();
    assert_eq!(std::fs::read(path).unwrap(), body);
    let mut installed = service.installed().unwrap();
    installed.sort();
    assert_eq!(installed, ["@acme/ocr", "acme-ocr"]);
    // Stored without a folder of its own: nothing outside gems/.
    let gems = store_root(&env).join("gems");
    assert!(gems.join("@acme+ocr.json").is_file());
    assert!(!gems.join("@acme").exists());
    let report = service.uninstall("@acme/ocr").await.unwrap();
    assert_eq!(report.gem, "@acme/ocr");
    assert!(
        report.kept.len() == 1,
        "the file is still declared by acme-ocr"
    );
    assert_eq!(service.installed().unwrap(), ["acme-ocr"]);
    service.shutdown().await;
}

#[tokio::test]
async fn after_shutdown_every_call_fails_with_the_shutdown_code() {
    let env = Env::new().await;
    let body = bytes(10_000, 73);
    let url = env.serve("/r.bin", &body);
    let service = Resources::open(&env.config()).unwrap();
    let m = manifest(json!([required_entry("r", &url, &body)]));
    assert!(!service.is_shut_down());
    service.shutdown().await;
    let clone = service.clone();
    assert!(clone.is_shut_down());
    let shut = |r: Result<(), Error>| {
        let err = r.unwrap_err();
        assert_eq!(err.code(), ErrorCode::Shutdown, "{err}");
        assert_eq!(err.code().as_str(), "E_RESOURCE_SHUTDOWN");
    };
    shut(clone.install("g", &m).await.map(drop));
    shut(clone.path("g", "r").await.map(drop));
    shut(clone.uninstall("g").await.map(drop));
    shut(clone.start().await.map(drop));
    shut(clone.status(None).map(drop));
    shut(clone.installed().map(drop));
    shut(clone.verify().await.map(drop));
    shut(clone.cancel("g", "r").await.map(drop));
    shut(clone.retry("g", "r").await.map(drop));
    shut(clone.download_now("g", "r").map(drop));
    shut(clone.subscribe_with_status(None).map(drop));
    shut(clone.set_policy(Policy::default()).map(drop));
    let user_file = env.dir.path().join("user-copy.bin");
    std::fs::write(&user_file, &body).unwrap();
    shut(clone.import(&user_file).await.map(drop));
    // The blocking calls, from a thread without a runtime.
    let blocking = clone.blocking();
    let (m, user) = (m.clone(), user_file.clone());
    let results = crate::embed_runtime::on_plain_thread("the blocking calls", move || {
        [
            blocking.install("g", &m).map(drop),
            blocking.path("g", "r").map(drop),
            blocking.uninstall("g").map(drop),
            blocking.start().map(drop),
            blocking.status(None).map(drop),
            blocking.verify().map(drop),
            blocking.cancel("g", "r").map(drop),
            blocking.retry("g", "r").map(drop),
            blocking.import(&user).map(drop),
        ]
    })
    .await;
    results.into_iter().for_each(shut);
    // Nothing was requested.
    assert_eq!(env.origin.hits("/r.bin"), 0);
    // Shutting down again is harmless.
    clone.shutdown().await;
}

/// The `Display` of a library error is a sentence for people: no code in
/// front, the code is `code()`. (The command line still prints
/// `CODE: message`: `cli_basics::fetch_of_an_unknown_id_fails_with_not_found`
/// and `cli_basics::a_failed_resource_exits_1_with_its_codes_and_the_others_still_download`
/// check those lines.)
#[tokio::test]
async fn a_library_error_reads_as_a_sentence_with_its_code_kept_apart() {
    let env = Env::new().await;
    let body = bytes(1000, 74);
    env.origin.route("/gone.bin", Behaviour::Status(404));
    let gone = env.url("origin.test", "/gone.bin");
    let mut huge = resource("huge", &env.serve("/huge.bin", &body), &[], &body);
    huge.size = 1 << 60;
    let service = Resources::open(&env.config()).unwrap();
    let errors = [
        (
            fetch_with(&env, &huge, no_retry()).await.unwrap_err(),
            ErrorCode::DiskSpace,
            "\"huge\"",
        ),
        (
            service.path("nobody", "r").await.unwrap_err(),
            ErrorCode::NotFound,
            "\"nobody\"",
        ),
        (
            service
                .install("../x", &manifest(json!([])))
                .await
                .unwrap_err(),
            ErrorCode::GemId,
            "\"../x\"",
        ),
        (
            fetch_with(&env, &resource("gone", &gone, &[], &body), no_retry())
                .await
                .unwrap_err(),
            ErrorCode::Unavailable,
            "\"gone\"",
        ),
    ];
    for (err, code, names) in errors {
        let text = err.to_string();
        assert_eq!(err.code(), code, "{text}");
        assert!(!text.starts_with("E_"), "{text}");
        assert!(!text.starts_with(code.as_str()), "{text}");
        assert!(text.contains(names), "{text}");
    }
}

#[tokio::test]
async fn a_failure_whose_record_cannot_be_written_still_reaches_the_caller_and_the_events() {
    // A failure log that cannot be written (here a folder where the file
    // goes, as a full disk would refuse it): the download's own error is
    // what the caller and the `Failed` event get, not the record's.
    let logs = Logs::capture();
    let env = Env::new().await;
    env.origin.route("/gone.bin", Behaviour::Status(404));
    let url = env.url("origin.test", "/gone.bin");
    let body = bytes(5000, 74);
    let service = Resources::open(&env.config()).unwrap();
    service
        .install("g", &manifest(json!([entry("r", &url, &body)])))
        .await
        .unwrap();
    let log = store_root(&env).join("failures").join("g.jsonl");
    std::fs::create_dir_all(log.join("in-the-way")).unwrap();
    let mut events = service.subscribe();
    let err = within("the lookup", service.path("g", "r"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::Unavailable, "{err}");
    assert_eq!(err.primary_cause(), ErrorCode::Http, "{err}");
    assert!(err.to_string().contains("404"), "{err}");
    let failed = within("the Failed event", async {
        loop {
            if let e @ Event::Failed { .. } = events.recv().await.unwrap() {
                return e;
            }
        }
    })
    .await;
    let Event::Failed {
        gem,
        code,
        primary_cause,
        message,
        ..
    } = failed
    else {
        unreachable!()
    };
    assert_eq!(
        (gem.as_str(), code, primary_cause),
        ("g", ErrorCode::Unavailable, ErrorCode::Http)
    );
    assert_eq!(message, err.to_string());
    assert!(log.is_dir(), "the record was not written in its place");
    assert!(
        logs.text()
            .lines()
            .any(|l| l.contains("WARN") && l.contains("g.jsonl")),
        "the record's own failure is logged:\n{}",
        logs.text()
    );
    service.shutdown().await;
}
