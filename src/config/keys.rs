//! The keys each table of the configuration file takes, and the hint for
//! an unknown one: the key it was probably meant to be (`retires` →
//! `retries`), or the table a known key belongs in (`store` under
//! `[dev]` is a top-level key).

/// The tables and their keys; `None` is the top level. A unit test holds
/// these to what the types accept.
pub const TABLES: &[(Option<&str>, &[&str])] = &[
    (None, &["store", "network", "service", "cache", "dev"]),
    (
        Some("network"),
        &[
            "mode",
            "hosts",
            "connect_timeout_secs",
            "stall_timeout_secs",
            "retries",
            "retry_backoff_secs",
            "retry_after_max_secs",
            "min_bytes_per_min",
            "max_bytes_per_sec",
            "partial_max_age_days",
            "autofill_max_bytes",
            "proxy",
            "proxy_resolves",
            "connections_per_file",
            "spread_over_mirrors",
            "wait_for_others_secs",
        ],
    ),
    (
        Some("service"),
        &[
            "max_concurrent_downloads",
            "max_per_host",
            "retry_failed_after",
        ],
    ),
    (
        Some("cache"),
        &[
            "oci",
            "push",
            "username",
            "password_env",
            "password_file",
            "mount_from",
            "docker_config",
            "allow_internal",
            "timeout_secs",
            "breaker_secs",
            "push_max_bytes_per_sec",
        ],
    ),
    (
        Some("dev"),
        &[
            "extra_root_certs",
            "extra_root_pems",
            "resolve",
            "allow_addresses",
            "allow_public_addresses",
        ],
    ),
];

/// The message for serde's `unknown field `KEY`, …` in `table` (`None`:
/// the top level), when there is a better one to give; `first_table` is
/// the first `[table]` header of the file, above which a top-level key
/// must go.
pub fn unknown_key(
    message: &str,
    table: Option<&str>,
    first_table: Option<&str>,
) -> Option<String> {
    let key = message.strip_prefix("unknown field `")?.split_once('`')?.0;
    let here = keys_of(table)?;
    // A known key of another table: say where it goes.
    if let Some((home, _)) = TABLES
        .iter()
        .find(|(t, keys)| *t != table && keys.contains(&key))
    {
        let fix = match home {
            None => format!(
                "it is a top-level key; move it above `[{}]`",
                first_table.or(table).unwrap_or_default()
            ),
            Some(home) => format!("it belongs in `[{home}]`; move it there"),
        };
        return Some(format!("unknown key `{key}` here ({fix})"));
    }
    let shown =
        |t: Option<&str>| t.map_or("at the top level".to_string(), |t| format!("in `[{t}]`"));
    if let Some(known) = closest(key, here) {
        return Some(format!(
            "unknown key `{key}` {} (did you mean `{known}`?)",
            shown(table)
        ));
    }
    // A misspelling of another table's key.
    TABLES
        .iter()
        .filter(|(t, _)| *t != table)
        .find_map(|(t, keys)| closest(key, keys).map(|known| (*t, known)))
        .map(|(t, known)| {
            format!(
                "unknown key `{key}` {} (did you mean `{known}`, {}?)",
                shown(table),
                t.map_or("a top-level key".to_string(), |t| format!(
                    "a key of `[{t}]`"
                ))
            )
        })
}

fn keys_of(table: Option<&str>) -> Option<&'static [&'static str]> {
    TABLES
        .iter()
        .find(|(t, _)| *t == table)
        .map(|(_, keys)| *keys)
}

/// The known key closest to `key`: at most one edit away for a short key,
/// two for a longer one, as the manifest's suggestions go.
fn closest(key: &str, known: &[&'static str]) -> Option<&'static str> {
    if key.chars().count() > 64 {
        return None;
    }
    let lower = key.to_lowercase();
    known
        .iter()
        .map(|k| (strsim::damerau_levenshtein(&lower, k), *k))
        .filter(|(distance, k)| *distance <= if k.len() <= 4 { 1 } else { 2 })
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, k)| k)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Config;

    #[test]
    fn docs_configuration_lists_every_key() {
        let docs = include_str!("../../docs/configuration.md");
        let table = &docs[docs.find("## Every key").expect("the table of keys")..];
        for (name, keys) in TABLES {
            let Some(name) = name else { continue };
            for key in keys.iter() {
                let row = format!("| `[{name}]` | `{key}` |");
                assert!(table.contains(&row), "docs/configuration.md lacks {row}");
            }
        }
        assert!(table.contains("| `store` |"));
    }

    #[test]
    fn the_tables_list_every_key_the_types_take() {
        for (table, keys) in TABLES {
            let header = table.map(|t| format!("[{t}]\n")).unwrap_or_default();
            let e = Config::parse(&format!("{header}zzzz_not_a_key = 1\n"))
                .unwrap_err()
                .to_string();
            // No hint for a word far from every key: serde's own list.
            let listed: Vec<&str> = e
                .split("expected one of ")
                .nth(1)
                .unwrap_or_else(|| panic!("{e}"))
                .split(", ")
                .map(|k| k.trim_matches('`'))
                .collect();
            assert_eq!(&listed, keys, "{table:?}");
        }
    }

    #[test]
    fn a_misspelt_key_gets_the_one_it_was_meant_to_be() {
        let e = |text: &str| Config::parse(text).unwrap_err().to_string();
        assert_eq!(
            e("[network]\nretires = 3\n"),
            "line 2, key network.retires: unknown key `retires` in `[network]` (did you mean `retries`?)"
        );
        assert_eq!(
            e("stroe = \"s\"\n"),
            "line 1, key stroe: unknown key `stroe` at the top level (did you mean `store`?)"
        );
        assert_eq!(
            e("[service]\nretries = 3\n"),
            "line 2, key service.retries: unknown key `retries` here (it belongs in `[network]`; move it there)"
        );
        assert_eq!(
            e("[network]\nretries = 1\n[dev]\nstore = \"s\"\n"),
            "line 4, key dev.store: unknown key `store` here (it is a top-level key; move it above `[network]`)"
        );
        assert_eq!(
            e("[dev]\nmax_per_hots = 2\n"),
            "line 2, key dev.max_per_hots: unknown key `max_per_hots` in `[dev]` (did you mean `max_per_host`, a key of `[service]`?)"
        );
        assert_eq!(
            e("[netwrok]\nretries = 1\n"),
            "line 1: unknown key `netwrok` at the top level (did you mean `network`?)"
        );
    }
}
