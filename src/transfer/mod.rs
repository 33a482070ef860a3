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
mod body;
mod cached;
mod carry;
pub mod download;
mod exchange;
pub mod fetch;
pub mod meter;
pub mod parts;
mod patience;
pub mod retry;
mod scatter;
pub(crate) mod sink;
pub mod slots;
mod stream;
mod write_back;
