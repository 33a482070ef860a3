use super::failures::LOG_SLACK;
use super::*;
use std::time::{Duration, Instant};

fn registration(gem: &str, shas: &[String]) -> Registration {
    let resources: Vec<serde_json::Value> = shas
        .iter()
        .enumerate()
        .map(|(i, sha)| {
            serde_json::json!({
                "id": format!("r{i}"),
                "url": format!("https://cdn.example.com/{i}.bin"),
                "sha256": sha,
                "size": 1,
            })
        })
        .collect();
    let doc = serde_json::json!({ "resources": resources });
    let manifest = crate::manifest::parse_manifest(doc.to_string().as_bytes()).unwrap();
    Registration {
        gem: gem.to_string(),
        name: None,
        resources: manifest.resources,
        installed_by: Some(InstalledBy::Library),
    }
}

fn shas(n: usize, seed: u8) -> Vec<String> {
    (0..n)
        .map(|i| hex::encode(sha2::Sha256::digest([seed, i as u8, (i >> 8) as u8])))
        .collect()
}

fn open() -> (tempfile::TempDir, Registry) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    (dir, Registry::new(&store))
}

use sha2::Digest;

#[test]
fn a_record_of_what_served_a_file_goes_with_the_file() {
    let (dir, registry) = open();
    let sha = shas(3, 9);
    for s in &sha {
        registry.record_served_by(s, "https://cdn.example.com/x.bin");
    }
    registry.forget_served_by(&sha[0]);
    assert_eq!(registry.served_by(&sha[0]), None);
    assert!(registry.served_by(&sha[1]).is_some());
    // Forgetting twice, or a name that is not a SHA-256, does nothing.
    registry.forget_served_by(&sha[0]);
    registry.forget_served_by("../gems/x");
    // Records an earlier version left in `served/`: orphans go; the
    // record of a file still stored stays.
    let old = shas(2, 10);
    let served = dir.path().join("store-v1/served");
    std::fs::create_dir_all(&served).unwrap();
    let record = r#"{"served_by":"https://cdn.example.com/x.bin","at":"2026-01-01T00:00:00Z"}"#;
    for s in &old {
        std::fs::write(served.join(format!("{s}.json")), record).unwrap();
    }
    std::fs::write(served.join("notes.txt"), "keep").unwrap();
    assert_eq!(registry.prune_served(|s| s == old[0]), 1);
    assert!(registry.served_by(&old[0]).is_some());
    assert_eq!(registry.served_by(&old[1]), None);
    assert!(served.join("notes.txt").exists());
    assert_eq!(registry.prune_served(|s| s == old[0]), 0);
    // Forgetting removes an earlier version's record too.
    registry.forget_served_by(&old[0]);
    assert_eq!(registry.served_by(&old[0]), None);
}

#[test]
fn what_served_a_file_reads_back_and_a_store_without_the_record_says_none() {
    let (dir, registry) = open();
    let sha = &shas(2, 9);
    // A store of an earlier version has no `served/` at all.
    assert_eq!(registry.served_by(&sha[0]), None);
    registry.record_served_by(&sha[0], "https://mirror.example.com/m.bin");
    assert_eq!(
        registry.served_by(&sha[0]).as_deref(),
        Some("https://mirror.example.com/m.bin")
    );
    registry.record_served_by(&sha[0], SERVED_BY_IMPORT);
    assert_eq!(registry.served_by(&sha[0]).as_deref(), Some("import"));
    assert_eq!(registry.served_by(&sha[1]), None);
    // Not a SHA-256: nothing written, nothing read outside the folder.
    registry.record_served_by("../gems/x", "https://a.example.com/");
    assert_eq!(registry.served_by("../gems/x"), None);
    // A record of a later version, with more fields, still reads; a
    // broken one is no answer.
    let served = dir.path().join("store-v1/served");
    std::fs::create_dir_all(&served).unwrap();
    let later = r#"{"served_by":"https://a.example.com/","at":"2026-01-01T00:00:00Z","more":1}"#;
    std::fs::write(served.join(format!("{}.json", sha[1])), later).unwrap();
    assert_eq!(
        registry.served_by(&sha[1]).as_deref(),
        Some("https://a.example.com/")
    );
    std::fs::write(served.join(format!("{}.json", sha[1])), "{").unwrap();
    assert_eq!(registry.served_by(&sha[1]), None);
}

#[test]
fn asking_about_every_resource_parses_an_unchanged_registration_once() {
    let (_dir, registry) = open();
    let all = shas(300, 1);
    registry.put(&registration("g", &all)).unwrap();
    for sha in &all {
        assert!(registry.declares(sha).unwrap());
    }
    assert!(!registry.declares(&shas(1, 2)[0]).unwrap());
    assert_eq!(registry.get("g").unwrap().unwrap().resources.len(), 300);
    assert_eq!(registry.list().unwrap().len(), 1);
    assert_eq!(registry.parses(), 1, "one parse for 300 lookups");
}

#[test]
fn the_resources_declaring_a_file_come_from_every_gem_and_follow_upgrades() {
    let (_dir, registry) = open();
    let (a, b) = (shas(300, 15), shas(2, 16));
    // `b` declares one of `a`'s files twice, under two ids.
    let both = vec![b[0].clone(), a[7].clone(), a[7].clone()];
    registry.put(&registration("a", &a)).unwrap();
    registry.put(&registration("b", &both)).unwrap();
    let found = |sha: &str| -> Vec<(String, String)> {
        let declaring = registry.declaring(sha).unwrap();
        assert!(declaring.iter().all(|(_, r)| r.sha256 == sha));
        declaring.into_iter().map(|(g, r)| (g, r.id)).collect()
    };
    let pair = |g: &str, id: &str| (g.to_string(), id.to_string());
    assert_eq!(
        found(&a[7]),
        [pair("a", "r7"), pair("b", "r1"), pair("b", "r2")]
    );
    assert_eq!(found(&b[0]), [pair("b", "r0")]);
    assert_eq!(found(&b[1]), []);
    // An upgrade of `b` that drops the file is seen at once.
    registry.put(&registration("b", &b)).unwrap();
    assert_eq!(found(&a[7]), [pair("a", "r7")]);
    assert_eq!(found(&b[1]), [pair("b", "r1")]);
    // Each registration is read once per change of the registry, not
    // once per look.
    assert_eq!(registry.parses(), 4);
}

#[test]
fn clearing_failures_never_reparses_an_unchanged_registration() {
    let (_dir, registry) = open();
    let all = shas(50, 3);
    registry.put(&registration("g", &all)).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    for i in 0..50 {
        rt.block_on(registry.set_failure("g", &format!("r{i}"), None))
            .unwrap();
    }
    assert!(registry.parses() <= 1, "{} parses", registry.parses());
}

#[test]
fn the_gems_that_asked_are_looked_at_first_and_the_others_after() {
    let (dir, registry) = open();
    let (a, b) = (shas(3, 11), shas(3, 12));
    registry.put(&registration("a", &a)).unwrap();
    registry.put(&registration("b", &b)).unwrap();
    // Another process's registry: nothing read yet. A file of `b`,
    // asked for by `b`: only `b` is read (`a` comes first in `gems/`).
    let fresh = Registry::new(&Store::open(dir.path()).unwrap());
    assert!(fresh.declares_looking_first_at(&b[1], ["b"]).unwrap());
    assert_eq!(fresh.parses(), 1);
    // Asked for by a gem that does not declare it (an upgrade dropped
    // it), or one not installed: the others still count.
    assert!(fresh.declares_looking_first_at(&a[2], ["b"]).unwrap());
    assert!(fresh.declares_looking_first_at(&b[0], ["gone"]).unwrap());
    assert!(!fresh
        .declares_looking_first_at(&shas(1, 13)[0], ["a", "b"])
        .unwrap());
}

#[test]
fn a_clear_with_nothing_to_clear_takes_no_lock_and_sees_other_processes_records() {
    let (dir, here) = open();
    let elsewhere = Registry::new(&Store::open(dir.path()).unwrap());
    let reg = registration("g", &shas(4, 14));
    here.put(&reg).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let clear = |registry: &Registry, i: usize| {
        let resource = format!("r{i}");
        let clear = registry.set_failure("g", &resource, None);
        rt.block_on(async { tokio::time::timeout(Duration::from_secs(5), clear).await })
    };
    // No failure log: nothing to clear, and no wait for the registry
    // lock another process holds.
    let held = rt.block_on(elsewhere.lock()).unwrap();
    let started = Instant::now();
    clear(&here, 0).expect("no wait for the lock").unwrap();
    assert!(started.elapsed() < Duration::from_secs(2));
    drop(held);
    // A record another process wrote since: cleared here, seen gone
    // there.
    rt.block_on(elsewhere.set_failure("g", "r1", Some(failure(&reg, 1, "one"))))
        .unwrap();
    clear(&here, 1).unwrap().unwrap();
    assert!(elsewhere.failures("g").unwrap().is_empty());
    // Known here without `r3`; another process then adds `r3`: the
    // changed log is read again, not trusted from memory.
    rt.block_on(here.set_failure("g", "r2", Some(failure(&reg, 2, "two"))))
        .unwrap();
    assert_eq!(here.failures("g").unwrap().len(), 1);
    rt.block_on(elsewhere.set_failure("g", "r3", Some(failure(&reg, 3, "three"))))
        .unwrap();
    clear(&here, 3).unwrap().unwrap();
    let left: Vec<String> = elsewhere.failures("g").unwrap().into_keys().collect();
    assert_eq!(left, ["r2"]);
}

#[test]
fn a_change_by_another_process_is_seen_at_once() {
    // Two registries on one store stand for two processes.
    let (dir, here) = open();
    let elsewhere = Registry::new(&Store::open(dir.path()).unwrap());
    let (old, new) = (shas(20, 4), shas(20, 5));
    here.put(&registration("g", &old)).unwrap();
    assert!(here.declares(&old[7]).unwrap());
    // Same gem, same number of resources, same file size.
    elsewhere.put(&registration("g", &new)).unwrap();
    assert!(!here.declares(&old[7]).unwrap());
    assert!(here.declares(&new[7]).unwrap());
    assert_eq!(here.get("g").unwrap().unwrap().resources[7].sha256, new[7]);
    elsewhere.remove("g").unwrap();
    assert!(!here.declares(&new[7]).unwrap());
    assert!(here.get("g").unwrap().is_none());
}

fn failure(reg: &Registration, i: usize, message: &str) -> FailureRecord {
    let error = Error::failed_elsewhere(ErrorCode::Http, message.to_string());
    FailureRecord::new(&reg.resources[i], &error)
}

fn log_lines(dir: &tempfile::TempDir) -> usize {
    let path = dir.path().join("store-v1/failures/g.jsonl");
    std::fs::read(path).map_or(0, |b| b.iter().filter(|c| **c == b'\n').count())
}

#[test]
fn each_failure_appends_one_line_and_the_log_stays_compact() {
    let (dir, registry) = open();
    let reg = registration("g", &shas(300, 7));
    registry.put(&reg).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    for i in 0..300 {
        let record = failure(&reg, i, &format!("attempt {i}"));
        rt.block_on(registry.set_failure("g", &format!("r{i}"), Some(record)))
            .unwrap();
        assert_eq!(log_lines(&dir), i + 1, "one appended line per failure");
    }
    assert_eq!(registry.failures("g").unwrap().len(), 300);
    // Fail and clear the same resources over and over: the log is
    // compacted instead of growing without end.
    for round in 0..5 {
        for i in 0..300 {
            let record = (i % 2 == 0).then(|| failure(&reg, i, &format!("round {round}")));
            rt.block_on(registry.set_failure("g", &format!("r{i}"), record))
                .unwrap();
            assert!(log_lines(&dir) <= 2 * 300 + LOG_SLACK + 1);
        }
    }
    let all = registry.failures("g").unwrap();
    assert_eq!(all.len(), 150);
    assert_eq!(all["r298"].message, "round 4");
    assert!(!all.contains_key("r299"));
    // Another process reads the same records from the file.
    let elsewhere = Registry::new(&Store::open(dir.path()).unwrap());
    assert_eq!(elsewhere.failures("g").unwrap(), all);
    // Clearing every record removes the log.
    for i in (0..300).step_by(2) {
        rt.block_on(registry.set_failure("g", &format!("r{i}"), None))
            .unwrap();
    }
    assert!(registry.failures("g").unwrap().is_empty());
    assert!(log_lines(&dir) <= LOG_SLACK + 150);
}

#[test]
fn a_line_cut_short_by_a_crash_loses_only_itself() {
    let (dir, registry) = open();
    let reg = registration("g", &shas(3, 8));
    registry.put(&reg).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(registry.set_failure("g", "r0", Some(failure(&reg, 0, "first"))))
        .unwrap();
    // A crash in the middle of the next append.
    let path = dir.path().join("store-v1/failures/g.jsonl");
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    file.write_all(br#"{"resource":"r1","record":{"at":"#)
        .unwrap();
    drop(file);
    // Another process (a fresh registry) reads what is whole, and its
    // next record stays whole too.
    let next = Registry::new(&Store::open(dir.path()).unwrap());
    assert_eq!(next.failures("g").unwrap().len(), 1);
    rt.block_on(next.set_failure("g", "r2", Some(failure(&reg, 2, "third"))))
        .unwrap();
    let all = Registry::new(&Store::open(dir.path()).unwrap())
        .failures("g")
        .unwrap();
    assert_eq!(all.keys().collect::<Vec<_>>(), ["r0", "r2"]);
    assert_eq!(all["r2"].message, "third");
    // A change by another process is seen by the first registry too.
    assert_eq!(registry.failures("g").unwrap(), all);
}

#[test]
fn a_failure_that_cannot_be_written_is_still_reported_by_this_process() {
    let (dir, registry) = open();
    let reg = registration("g", &shas(2, 9));
    registry.put(&reg).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(registry.set_failure("g", "r0", Some(failure(&reg, 0, "first"))))
        .unwrap();
    registry.cache.full_disk.store(true, Ordering::Relaxed);
    let err = rt
        .block_on(registry.set_failure("g", "r1", Some(failure(&reg, 1, "disk full"))))
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::DiskSpace, "{err}");
    let err = rt
        .block_on(registry.set_failure("g", "r0", None))
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::DiskSpace, "{err}");
    // The file still holds only the first record; this process reports
    // what it could not write, even after another process changed the
    // file (which makes it read the file again).
    let elsewhere = Registry::new(&Store::open(dir.path()).unwrap());
    assert_eq!(
        elsewhere.failures("g").unwrap().keys().collect::<Vec<_>>(),
        ["r0"]
    );
    rt.block_on(elsewhere.set_failure("g", "r0", Some(failure(&reg, 0, "again"))))
        .unwrap();
    let here = registry.failures("g").unwrap();
    assert_eq!(here.keys().collect::<Vec<_>>(), ["r1"], "{here:?}");
    assert_eq!(here["r1"].message, "disk full");
    // Once the disk has room again, the next change of each record is
    // written, and every process reads the same.
    registry.cache.full_disk.store(false, Ordering::Relaxed);
    rt.block_on(registry.set_failure("g", "r1", Some(failure(&reg, 1, "later"))))
        .unwrap();
    rt.block_on(registry.set_failure("g", "r0", None)).unwrap();
    assert!(registry.unsaved().get("g").is_none_or(|u| u.is_empty()));
    let all = registry.failures("g").unwrap();
    assert_eq!(all.keys().collect::<Vec<_>>(), ["r1"]);
    assert_eq!(all["r1"].message, "later");
    assert_eq!(elsewhere.failures("g").unwrap(), all);
}

#[test]
fn failure_records_are_written_off_the_runtime_thread() {
    let (_dir, registry) = open();
    let reg = registration("g", &shas(1, 10));
    registry.put(&reg).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    // On a current-thread runtime, the task runs on this thread: the
    // file work must not.
    rt.block_on(registry.set_failure("g", "r0", Some(failure(&reg, 0, "x"))))
        .unwrap();
    let worked_on = registry.cache.worked_on.lock().unwrap().unwrap();
    assert_ne!(worked_on, std::thread::current().id());
}

#[test]
fn failures_recorded_at_once_are_written_together_each_line_kept() {
    let (dir, registry) = open();
    let reg = registration("g", &shas(200, 11));
    registry.put(&reg).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    rt.block_on(async {
        let all = (0..200).map(|i| {
            let (registry, record) = (registry.clone(), failure(&reg, i, "refused"));
            tokio::spawn(async move {
                registry
                    .set_failure("g", &format!("r{i}"), Some(record))
                    .await
            })
        });
        for written in futures_util::future::join_all(all).await {
            written.unwrap().unwrap();
        }
    });
    // Those that came in while one write ran went in the next, under one
    // lock and in one append.
    let writes = registry.cache.failure_writes.load(Ordering::Relaxed);
    assert!(writes < 100, "{writes} writes for 200 records");
    assert_eq!(log_lines(&dir), 200);
    let read = Registry::new(&Store::open(dir.path()).unwrap());
    assert_eq!(read.failures("g").unwrap().len(), 200);
}

#[test]
fn scoped_gem_ids_are_lower_case_and_plain_ids_keep_their_rules() {
    for good in ["@acme/ocr", "@acme-2/ocr.v3", "ocr", "Ocr-Tools", "a_b.c"] {
        assert!(check_gem_id(good).is_ok(), "{good}");
    }
    for bad in ["@ACME/ocr", "@acme/OCR", "@Acme/Ocr"] {
        let err = check_gem_id(bad).unwrap_err();
        assert_eq!(err.code(), ErrorCode::GemId, "{bad}");
        assert!(err.to_string().contains("lower case"), "{bad}: {err}");
    }
    // Records written before the rule are still read.
    assert_eq!(gem_of_stem("@Acme+ocr").as_deref(), Some("@Acme/ocr"));
}

#[test]
fn every_change_increases_the_generation() {
    let (_dir, registry) = open();
    assert_eq!(registry.generation(), 0);
    registry.put(&registration("g", &shas(1, 6))).unwrap();
    assert_eq!(registry.generation(), 1);
    registry.remove("g").unwrap();
    assert_eq!(registry.generation(), 2);
    assert_eq!(registry.clean(), 0, "no temporary file is left behind");
}
