//! The network wing: what may be connected to, and how.
//!
//! Owns the address rules ([`guard`]), the user's allowlist or blocklist
//! ([`policy`]), resolution that hands out only vetted addresses
//! ([`resolve`]), certificate trust (`tls`, reading DER with `der`), proxies and `CONNECT`
//! tunnels ([`proxy`], `tunnel`), one response type for both
//! (`response`), the parsers of headers a server controls ([`headers`]),
//! short failure reasons (`reason`), the bandwidth cap ([`throttle`]),
//! connections per host (`hosts`) and the HTTP client with the connections
//! it keeps (`pool`).
//!
//! Uses only [`crate::error`]; knows nothing of files, the store or the
//! service.

pub(crate) mod connecting;
mod der;
pub mod guard;
pub mod headers;
pub(crate) mod hosts;
mod pinned;
pub mod policy;
pub(crate) mod pool;
pub mod proxy;
pub(crate) mod reason;
pub mod resolve;
pub(crate) mod response;
mod settings;
pub mod throttle;
pub(crate) mod tls;
pub(crate) mod tunnel;

pub use settings::NetSettings;
