//! The transfer wing: one file from its sources.
//!
//! Owns the HTTPS transfer of one address with its redirects, checks and
//! live policy ([`fetch`]), the order of addresses and the resume rules
//! ([`download`](mod@download)), which failures are retried and how long
//! to wait ([`retry`]), and the writer thread that hashes and writes the
//! bytes (`sink`).
//!
//! Uses [`crate::net`] to connect and [`crate::store`]'s partial files to
//! keep bytes; never the service.

pub mod autofill;
pub mod download;
pub mod fetch;
pub mod retry;
pub(crate) mod sink;
