//! What the examples share to run offline: a configuration built in code
//! that trusts the embedded local origin through `[dev]` only.

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;

use gem_resources::{Config, Result};

use crate::origin::Origin;

/// A configuration whose store is in `dir` and which trusts `origin`
/// through `[dev]` only: its CA as PEM text, `cdn.test` answered with
/// loopback.
pub fn dev_config(dir: &Path, origin: &Origin) -> Result<Config> {
    let mut config = Config::default();
    config.store = Some(dir.join("store"));
    config.network.retries = 0;
    config.dev.trust_pem(origin.ca_pem());
    let loopback = IpAddr::V4(Ipv4Addr::LOCALHOST);
    config.dev.resolve.insert("cdn.test".into(), vec![loopback]);
    config.dev.allow_address("127.0.0.1")?;
    config.validate()?;
    Ok(config)
}
