//! Batches (JSON-RPC 2.0, section 6) and the reading of one request.

use std::sync::Arc;

use serde_json::Value;

use super::connection::{Connection, Held};
use super::dispatch::dispatch_call;
use super::order::Turn;
use super::request::request_of;
use super::Shared;
use crate::api::protocol::{self, answer, RpcError};

/// Requests one batch may hold.
pub(super) const MAX_BATCH: usize = protocol::MAX_IN_FLIGHT;

/// A batch (JSON-RPC 2.0, section 6): its requests run at once and their
/// answers go out together, as one array, once all are done; notifications
/// get none, and a batch of notifications gets nothing. An empty batch, or
/// one of more than [`MAX_BATCH`], gets one `-32600`.
pub(super) async fn answer_batch(
    batch: Vec<Value>,
    turns: Vec<Option<Turn>>,
    held: Held,
    conn: &Arc<Connection>,
    shared: &Arc<Shared>,
) {
    if batch.is_empty() || batch.len() > MAX_BATCH {
        let error = RpcError::usage(
            protocol::INVALID_REQUEST,
            format!("a batch holds 1 to {MAX_BATCH} requests"),
        );
        conn.send_answer(&answer(Value::Null, Err(error)), held)
            .await;
        return;
    }
    // Its calls that change the store wait for their turns, in its order.
    let answers = batch.into_iter().zip(turns).map(|(item, turn)| async move {
        match request_of(item) {
            Ok(request) if request.method == "subscribe" => request.id.map(|id| {
                let error = RpcError::usage(
                    protocol::INVALID_REQUEST,
                    "subscribe cannot be part of a batch: send it alone",
                );
                answer(id, Err(error))
            }),
            Ok(request) => {
                let id = request.id.clone();
                let outcome = dispatch_call(request, turn, conn, shared).await;
                id.zip(outcome).map(|(id, outcome)| answer(id, outcome))
            }
            Err((id, error)) => Some(answer(id, Err(error))),
        }
    });
    let answers: Vec<Value> = futures_util::future::join_all(answers)
        .await
        .into_iter()
        .flatten()
        .collect();
    if !answers.is_empty() {
        conn.send_answer(&Value::Array(answers), held).await;
    }
}
