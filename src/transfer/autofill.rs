//! Auto-fill with the download rules: the size and SHA-256 of a file read
//! from its addresses in order (the url, then the mirrors), each address
//! retried on a transient failure after the same backoff as a download
//! ([`RetryPolicy::decide`]), the next address tried after a permanent one.
//! Nothing is kept.

use tokio_util::sync::CancellationToken;
use url::Url;

use crate::error::{Attempt, Error, Result};
use crate::transfer::fetch::{Control, Fetcher, Output, Reporter, Transfer, TransferError};
use crate::transfer::retry::{Decision, RetryPolicy};

/// The outcome of [`autofill_addresses`]: what was read, and from where.
#[derive(Debug, Clone)]
pub struct Filled {
    /// Size, SHA-256 and final address of the bytes read.
    pub transfer: Transfer,
    /// The address (of those given) that served them.
    pub address: Url,
}

/// Reads the first of `addresses` that answers, by the download rules, and
/// returns its size and SHA-256; at most `max_bytes` are read from each.
/// `resource` names the file in errors. A single address that fails gives
/// that attempt's error; several give [`Error::Unavailable`] listing every
/// address's last reason. `cancel` stops it with [`Error::Cancelled`].
pub async fn autofill_addresses(
    fetcher: &Fetcher,
    resource: &str,
    addresses: &[Url],
    max_bytes: u64,
    retry: RetryPolicy,
    progress: &mut dyn Reporter,
    cancel: Option<&CancellationToken>,
) -> Result<Filled> {
    let mut attempts = Vec::new();
    for (index, address) in addresses.iter().enumerate() {
        progress.trying(address);
        match one_address(fetcher, address, max_bytes, retry, progress, cancel).await {
            Ok(transfer) => {
                return Ok(Filled {
                    transfer,
                    address: address.clone(),
                })
            }
            Err(TransferError::Attempt(a)) => {
                // The reporter says it (a warning, an event), as for a
                // download; the log keeps it for debugging.
                if let Some(next) = addresses.get(index + 1) {
                    tracing::info!(resource, "{a}; trying the next address");
                    progress.fell_back(&a, next);
                }
                attempts.push(a);
            }
            Err(TransferError::Local(e)) => return Err(e),
            Err(TransferError::Cancelled) => {
                return Err(Error::Cancelled {
                    resource: resource.to_string(),
                    reason: "stopped before it finished".into(),
                })
            }
        }
    }
    match <[Attempt; 1]>::try_from(attempts) {
        Ok([single]) => Err(single.into()),
        Err(attempts) => Err(Error::Unavailable {
            resource: resource.to_string(),
            attempts,
        }),
    }
}

/// The query parameter that makes `url` a signed or expiring address (a
/// CDN's `X-Amz-Signature`, `X-Goog-Expires`, `Expires`, `Signature`,
/// an Azure `sig`, a `token`…), if it has one: such an address works for
/// minutes or hours, so a manifest should not declare it.
pub fn expiring_parameter(url: &Url) -> Option<String> {
    const NAMES: &[&str] = &[
        "x-amz-signature",
        "x-amz-expires",
        "x-amz-security-token",
        "x-goog-signature",
        "x-goog-expires",
        "signature",
        "expires",
        "key-pair-id",
        "policy",
        "sig",
        "se",
        "token",
        "auth_key",
    ];
    url.query_pairs()
        .map(|(name, _)| name.into_owned())
        .find(|name| NAMES.contains(&name.to_ascii_lowercase().as_str()))
}

/// Tries one address until it succeeds or the retry rules move on.
async fn one_address(
    fetcher: &Fetcher,
    address: &Url,
    max_bytes: u64,
    retry: RetryPolicy,
    progress: &mut dyn Reporter,
    cancel: Option<&CancellationToken>,
) -> Result<Transfer, TransferError> {
    let mut retries = 0;
    loop {
        let control = Control {
            cancel,
            reporter: &mut *progress,
        };
        let attempt = match fetcher
            .transfer(address, None, max_bytes, Output::Discard, control)
            .await
        {
            Ok(transfer) => return Ok(transfer),
            Err(TransferError::Attempt(a)) => a,
            Err(other) => return Err(other),
        };
        match retry.decide(&attempt.error, retries) {
            Decision::NextAddress => return Err(TransferError::Attempt(attempt)),
            Decision::Retry(wait) => {
                retries += 1;
                let reason = attempt.error.to_string();
                progress.retrying(wait, retries + 1, retry.retries + 1, &reason);
                tracing::info!("{attempt}; retrying in {:.1}s", wait.as_secs_f64());
                let sleep = tokio::time::sleep(wait);
                match cancel {
                    Some(token) => tokio::select! {
                        () = sleep => {}
                        () = token.cancelled() => return Err(TransferError::Cancelled),
                    },
                    None => sleep.await,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::expiring_parameter;

    #[test]
    fn signed_and_expiring_addresses_are_told_apart_from_lasting_ones() {
        let param = |text: &str| expiring_parameter(&url::Url::parse(text).unwrap());
        assert_eq!(
            param("https://b.s3.amazonaws.com/m.onnx?X-Amz-Algorithm=AWS4&X-Amz-Expires=300&X-Amz-Signature=ab"),
            Some("X-Amz-Expires".to_string())
        );
        assert_eq!(
            param("https://d1.cloudfront.net/m.onnx?Expires=1&Signature=x&Key-Pair-Id=K"),
            Some("Expires".to_string())
        );
        assert_eq!(
            param("https://a.blob.core.windows.net/c/m.onnx?sv=2020&se=2026-12-01&sig=abc"),
            Some("se".to_string())
        );
        for lasting in [
            "https://cdn.example.com/m.onnx",
            "https://cdn.example.com/m.onnx?download=true",
            "https://huggingface.co/o/r/resolve/main/m.onnx?revision=v1",
        ] {
            assert_eq!(param(lasting), None, "{lasting}");
        }
    }
}
