//! Bandwidth caps as people write them: `2000000`, `"500k"`, `"2M"`, the
//! way curl's `--limit-rate` takes them. `[network] max_bytes_per_sec`
//! and the command line's `--limit-rate` read them with the same parser.

use serde::{Deserialize, Deserializer};

/// A rate like curl's `--limit-rate`: bytes per second, or with a `k`, `M`
/// or `G` suffix (either case) for 1024, 1024² or 1024³ of them. The error
/// says what was wrong, for a person (`not a rate: "fast" (e.g. 500k or
/// 2M)`).
pub fn parse_rate(text: &str) -> Result<u64, String> {
    let (number, unit) = match text.char_indices().last() {
        Some((at, c)) if c.is_ascii_alphabetic() => (&text[..at], c.to_ascii_lowercase()),
        _ => (text, 'b'),
    };
    let factor = match unit {
        'b' => Some(1.0),
        'k' => Some(1024.0),
        'm' => Some(1024.0 * 1024.0),
        'g' => Some(1024.0 * 1024.0 * 1024.0),
        _ => None,
    };
    let value: f64 = number
        .trim()
        .parse()
        .map_err(|_| format!("not a rate: {text:?} (e.g. 500k or 2M)"))?;
    let factor = factor.ok_or_else(|| format!("unknown unit {unit:?} (use k, M or G)"))?;
    let bytes = value * factor;
    if !bytes.is_finite() || bytes < 1.0 || bytes > u64::MAX as f64 {
        return Err(format!("must be at least 1 byte per second, got {text:?}"));
    }
    Ok(bytes as u64)
}

/// `max_bytes_per_sec`: a whole number of bytes per second, or a rate
/// text for [`parse_rate`].
pub fn deserialize_opt<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Given {
        Bytes(u64),
        Text(String),
        Other(serde::de::IgnoredAny),
    }
    match Given::deserialize(d)? {
        Given::Bytes(bytes) => Ok(Some(bytes)),
        Given::Text(text) => parse_rate(&text)
            .map(Some)
            .map_err(serde::de::Error::custom),
        Given::Other(_) => Err(serde::de::Error::custom(
            "a rate is a whole number of bytes per second, or text such as \"500k\" or \"2M\"",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::parse_rate;
    use crate::Config;

    #[test]
    fn rates_take_curl_suffixes() {
        assert_eq!(parse_rate("1000"), Ok(1000));
        assert_eq!(parse_rate("500k"), Ok(512_000));
        assert_eq!(parse_rate("500K"), Ok(512_000));
        assert_eq!(parse_rate("1.5M"), Ok(1_572_864));
        assert_eq!(parse_rate("2m"), Ok(2_097_152));
        assert_eq!(parse_rate("1G"), Ok(1 << 30));
        for bad in ["", "k", "0", "-5k", "10x", "fast", "NaN", "1e30G"] {
            assert!(parse_rate(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_configured_cap_takes_a_number_or_a_rate_text() {
        let cap = |value: &str| {
            Config::parse(&format!("[network]\nmax_bytes_per_sec = {value}\n"))
                .map(|c| c.network.max_bytes_per_sec)
                .map_err(|e| e.to_string())
        };
        assert_eq!(cap("2000000"), Ok(Some(2_000_000)));
        assert_eq!(cap("\"2M\""), Ok(Some(2 << 20)));
        assert_eq!(cap("\"500k\""), Ok(Some(500 << 10)));
        let e = cap("\"fast\"").unwrap_err();
        assert!(
            e.contains("key network.max_bytes_per_sec: not a rate"),
            "{e}"
        );
        let e = cap("1.5").unwrap_err();
        assert!(e.contains("text such as \"500k\""), "{e}");
    }
}
