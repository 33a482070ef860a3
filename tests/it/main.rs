//! Integration tests: one binary, one module per concern, all talking HTTPS
//! to an in-process origin.

#[path = "../support/mod.rs"]
mod support;

mod smoke;
