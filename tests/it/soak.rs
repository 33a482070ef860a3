//! The 60-second chaos soak of `serve` (the long one is `scripts/soak.sh`):
//! faults at random from a printed seed (`SOAK_SEED` replays one), with
//! every invariant of `tests/support/soak` checked throughout and at the end.

use crate::support::origin;

#[path = "../support/soak/mod.rs"]
mod harness;

#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn sixty_seconds_of_faults_break_no_invariant() {
    let dir = tempfile::tempdir().unwrap();
    let seed = harness::world::seed_from("SOAK_SEED");
    println!("soak seed {seed} (SOAK_SEED={seed} replays it)");
    let summary = harness::run(harness::Settings {
        bin: env!("CARGO_BIN_EXE_gem-resources").into(),
        dir: dir.path().to_path_buf(),
        seed,
        chaos_secs: 60.0,
        settle_secs: 90.0,
        resources: 36,
        max_size: 512 << 10,
        restart_mean_secs: 12.0,
        disk: None,
        verbose: false,
    })
    .await;
    println!("{}", summary.text);
    assert!(
        summary.violations.is_empty(),
        "soak seed {seed}: {} violation(s)\n{}",
        summary.violations.len(),
        summary.text
    );
}
