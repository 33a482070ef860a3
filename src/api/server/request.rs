//! A request read from a line: whether it is one, and its params; and an
//! answer's result.

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use crate::api::protocol::{self, Request, RpcError};
use crate::error::{Error, Result};

pub(super) fn params<T: DeserializeOwned + Default>(
    params: Option<Value>,
) -> std::result::Result<T, RpcError> {
    match params {
        None | Some(Value::Null) => Ok(T::default()),
        Some(v) => serde_json::from_value(v).map_err(bad_params),
    }
}

pub(super) fn required<T: DeserializeOwned>(
    params: Option<Value>,
) -> std::result::Result<T, RpcError> {
    serde_json::from_value(params.unwrap_or(Value::Null)).map_err(bad_params)
}

pub(super) fn bad_params(e: serde_json::Error) -> RpcError {
    RpcError::usage(protocol::INVALID_PARAMS, format!("invalid params: {e}"))
}

pub(super) fn ok<T: Serialize>(result: Result<T>) -> std::result::Result<Value, RpcError> {
    match result {
        Ok(value) => serde_json::to_value(value)
            .map_err(|e| RpcError::of(&Error::Invalid(format!("cannot write the answer: {e}")))),
        Err(e) => Err(RpcError::of(&e)),
    }
}

/// The request in `value`, or the id and error to answer it with.
pub(super) fn request_of(value: Value) -> std::result::Result<Request, (Value, RpcError)> {
    let id = value.get("id").cloned();
    if let Some(bad) = id.as_ref().filter(|id| !valid_id(id)) {
        let what = match bad {
            Value::String(_) => format!("longer than {} characters", protocol::MAX_ID_CHARS),
            _ => "neither a string nor a number".to_string(),
        };
        let error = RpcError::usage(
            protocol::INVALID_REQUEST,
            format!(
                "the request's id is {what}: an id is a string of at most {} characters, a number or null",
                protocol::MAX_ID_CHARS
            ),
        );
        return Err((Value::Null, error));
    }
    match serde_json::from_value::<Request>(value) {
        Ok(r) if r.jsonrpc == "2.0" => Ok(r),
        _ => Err((
            id.unwrap_or(Value::Null),
            RpcError::usage(
                protocol::INVALID_REQUEST,
                "not a JSON-RPC 2.0 request (jsonrpc, method, id, params)",
            ),
        )),
    }
}

/// Whether `id` is one a request may carry: a string of at most
/// [`protocol::MAX_ID_CHARS`] characters, a number, or `null`.
pub(super) fn valid_id(id: &Value) -> bool {
    match id {
        Value::Null | Value::Number(_) => true,
        Value::String(s) => s.chars().count() <= protocol::MAX_ID_CHARS,
        _ => false,
    }
}
