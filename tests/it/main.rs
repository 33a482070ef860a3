//! Integration tests: one binary, one module per concern, all talking HTTPS
//! to an in-process origin.

#[path = "../support/mod.rs"]
mod support;

mod address_guard;
#[cfg(unix)]
mod api_cancel;
#[cfg(unix)]
mod api_cancel_work;
#[cfg(unix)]
mod api_client_end;
#[cfg(unix)]
mod api_fairness;
#[cfg(unix)]
mod api_server;
#[cfg(unix)]
mod api_soak;
mod autofill;
mod autofill_manifest;
mod cache;
mod cache_registry;
#[cfg(unix)]
mod cli_bars;
mod cli_basics;
mod cli_gc;
#[cfg(unix)]
mod cli_gone_wrong;
mod cli_install;
mod cli_json;
mod cli_messages;
mod cli_newcomer;
mod cli_rate;
mod cli_serve_folders;
mod cli_serve_start;
mod cli_tables;
mod cli_terminal;
mod cli_waiting;
mod crash_order;
mod demo_example;
// App instances started as processes and killed with SIGKILL.
#[cfg(unix)]
mod election;
mod embed_config;
mod embed_controls;
mod embed_errors;
mod embed_event_fields;
mod embed_events;
mod embed_events_course;
mod embed_lifecycle;
mod embed_runtime;
mod embed_scoped;
mod fetch_rules;
mod fuzz_regressions;
mod hostile_input;
mod import;
#[cfg(unix)]
mod js_client;
mod live_policy;
mod manifest_cli;
mod no_proxy;
mod parts;
mod patience;
mod pooling;
mod process_signals;
mod prop_guard;
mod prop_iana;
mod prop_manifest;
mod prop_policy;
mod prop_time;
mod proxy;
mod readme;
mod resume;
mod resume_checks;
mod resume_parts;
mod scale;
mod serve_folder_example;
mod serve_ownership;
// Processes started and killed the Unix way (sh, sleep, SIGKILL).
#[cfg(unix)]
mod serve_parent;
mod serve_reload;
mod serve_scans;
mod service_cli;
mod service_concurrency;
mod service_crash;
mod service_lifecycle;
#[cfg(unix)]
mod service_limits;
#[cfg(unix)]
mod service_peer;
mod service_races;
mod service_retry;
mod smoke;
// The soak kills and signals processes the Unix way (kill -9, SIGHUP).
#[cfg(unix)]
mod soak;
mod squatting;
mod status_rows;
#[cfg(unix)]
mod store_trust;
mod tls_trust;
mod true_progress;
