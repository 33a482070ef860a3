//! The methods: each request's params, its call to the service and its
//! answer.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use serde_json::{json, Value};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use super::connection::{line, Connection};
use super::order::Turn;
use super::request::{ok, params, required, valid_id};
use super::subscriptions::subscribe;
use super::Shared;
use crate::api::discovery;
use crate::api::protocol::{
    self, notification, AutofillParams, Changed, GemParams, Hello, InstallParams, PathResult,
    PolicyBody, Request, ResourceParams, RpcError, ServiceInfo, StatusResult, UninstallResult,
    UnsubscribeParams,
};
use crate::error::{Error, Result};
use crate::net::policy::Policy;
use crate::service::autofill::{AutofillObserver, AutofillProgress};
use crate::service::Resources;

/// The answer to an `autofill` cancelled before its end.
fn cancelled_autofill() -> RpcError {
    let message = "the call was cancelled; nothing was kept";
    RpcError {
        code: protocol::REQUEST_CANCELLED,
        message: message.into(),
        data: Some(crate::api::protocol::ErrorData {
            code: crate::ErrorCode::Cancelled,
            primary_cause: crate::ErrorCode::Cancelled,
            message: message.into(),
            details: serde_json::Map::new(),
        }),
    }
}

/// Methods that wait for a transfer: `$/cancelRequest` cancels them.
pub(super) const CANCELLABLE: [&str; 2] = ["path", "autofill"];

/// [`dispatch`], with a call that waits for a transfer registered under its
/// id, so that `$/cancelRequest` (or the connection's end) cancels it.
pub(super) async fn dispatch_call(
    request: Request,
    mut turn: Option<Turn>,
    conn: &Arc<Connection>,
    shared: &Arc<Shared>,
) -> Option<std::result::Result<Value, RpcError>> {
    // A call that changes the store starts once the one before it (on this
    // connection) has been applied; its turn ends when it has been.
    if let Some(turn) = turn.as_mut() {
        turn.wait().await;
    }
    let key = request
        .id
        .as_ref()
        .filter(|_| CANCELLABLE.contains(&request.method.as_str()))
        .map(Value::to_string);
    let Some(key) = key else {
        return dispatch(request, conn, shared, &CancellationToken::new()).await;
    };
    let token = conn.closed.child_token();
    let serial = conn.next_call.fetch_add(1, Ordering::Relaxed);
    // Two calls under one id: the id names the later one.
    conn.calls
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(key.clone(), (serial, token.clone()));
    let outcome = dispatch(request, conn, shared, &token).await;
    let mut calls = conn.calls.lock().unwrap_or_else(|p| p.into_inner());
    if calls.get(&key).is_some_and(|(s, _)| *s == serial) {
        calls.remove(&key);
    }
    outcome
}

/// Sends the events of `gem`'s resource `id` to the connection as
/// `$/progress` notifications under `token` (LSP's work-done progress),
/// until the returned token is cancelled (the call ended), then those
/// already published; the task ends once they are queued. Best effort: a
/// client that does not read them loses them, never the answer.
pub(super) fn report_progress(
    service: &Resources,
    conn: &Arc<Connection>,
    token: Value,
    gem: &str,
    id: &str,
) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let done = conn.closed.child_token();
    let mut events = service.subscribe();
    let (conn, gem, id, stop) = (conn.clone(), gem.to_string(), id.to_string(), done.clone());
    let send = move |event: crate::Event| {
        let Ok(value) = serde_json::to_value(&event) else {
            return;
        };
        let mine = value.get("gem").and_then(Value::as_str) == Some(gem.as_str())
            && value.get("resource").and_then(Value::as_str) == Some(id.as_str());
        if mine {
            let params = json!({ "token": token, "value": value });
            conn.try_send_line(line(&notification("$/progress", params)));
        }
    };
    let sent = tokio::spawn(async move {
        loop {
            let event = tokio::select! {
                event = events.recv() => event,
                () = stop.cancelled() => break,
            };
            match event {
                Ok(event) => send(event),
                Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
        // The call ended: what was published before goes out.
        while let Ok(event) = events.try_recv() {
            send(event);
        }
    });
    (done, sent)
}

/// `$/cancelRequest {"id": …}`: cancels that call of this connection
/// when it is still waiting; whether there was one.
pub(super) fn cancel_request(
    conn: &Connection,
    params: Option<Value>,
) -> std::result::Result<Value, RpcError> {
    let Some(id) = params
        .as_ref()
        .and_then(|p| p.get("id"))
        .filter(|id| valid_id(id))
    else {
        return Err(RpcError::usage(
            protocol::INVALID_PARAMS,
            "$/cancelRequest takes {\"id\": the id of a call of this connection}",
        ));
    };
    let token = conn
        .calls
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&id.to_string())
        .map(|(_, token)| token.clone());
    let found = token.is_some();
    if let Some(token) = token {
        token.cancel();
    }
    Ok(json!({ "cancelled": found }))
}

/// Runs one request; `None` when it answered by itself (`subscribe`).
pub(super) async fn dispatch(
    request: Request,
    conn: &Arc<Connection>,
    shared: &Arc<Shared>,
    cancel: &CancellationToken,
) -> Option<std::result::Result<Value, RpcError>> {
    let service = &shared.service;
    let p = request.params;
    let outcome = match request.method.as_str() {
        "hello" => match params::<HelloParams>(p) {
            Ok(HelloParams { nonce }) => hello(shared, nonce),
            Err(e) => Err(e),
        },
        "status" => match params::<GemParams>(p) {
            Ok(GemParams { gem }) => ok(status(shared, gem).await),
            Err(e) => Err(e),
        },
        "path" => match required::<ResourceParams>(p) {
            Ok(r) if !valid_token(r.progress.as_ref()) => Err(invalid_token()),
            Ok(r) => {
                // The call's own events, from before it starts until it ends.
                let reporting = r
                    .progress
                    .clone()
                    .map(|token| report_progress(service, conn, token, &r.gem, &r.id));
                let outcome = service.path_until(&r.gem, &r.id, Some(cancel)).await;
                if let Some((stop, sent)) = reporting {
                    // Its last events (`verified`, `failed`) go out first.
                    stop.cancel();
                    let _ = sent.await;
                }
                ok(outcome.map(|path| PathResult {
                    gem: r.gem,
                    resource: r.id,
                    path,
                }))
            }
            Err(e) => Err(e),
        },
        "$/cancelRequest" => cancel_request(conn, p),
        "install" => match required::<InstallParams>(p) {
            Ok(InstallParams {
                gem,
                manifest,
                installed_by,
                take_over,
            }) => ok(install(service, &gem, &manifest, installed_by.as_deref(), take_over).await),
            Err(e) => Err(e),
        },
        "uninstall" => match required::<ResourceGem>(p) {
            Ok(ResourceGem { gem }) => ok(uninstall(service, &gem).await),
            Err(e) => Err(e),
        },
        "download_now" | "cancel" | "retry" => match required::<ResourceParams>(p) {
            Ok(r) => {
                let changed = match request.method.as_str() {
                    "download_now" => service.download_now(&r.gem, &r.id),
                    "cancel" => service.cancel(&r.gem, &r.id).await,
                    _ => service.retry(&r.gem, &r.id).await,
                };
                ok(changed.map(|changed| Changed { changed }))
            }
            Err(e) => Err(e),
        },
        "autofill" => match params::<AutofillParams>(p) {
            Ok(a) if !valid_token(a.progress.as_ref()) => Err(invalid_token()),
            Ok(a) => tokio::select! {
                biased;
                () = cancel.cancelled() => Err(cancelled_autofill()),
                outcome = autofill(service, conn, a) => outcome,
            },
            Err(e) => Err(e),
        },
        "policy" => ok(Ok(PolicyBody::from(&service.policy()))),
        "set_policy" => match required::<PolicyBody>(p) {
            Ok(body) => ok(Policy::new(body.mode, &body.hosts)
                .map_err(Error::from)
                .and_then(|policy| service.set_policy_counted(policy))),
            Err(e) => Err(e),
        },
        "subscribe" => match params::<GemParams>(p) {
            Ok(GemParams { gem }) => return subscribe(request.id, gem, conn, shared).await,
            Err(e) => Err(e),
        },
        "unsubscribe" => match params::<UnsubscribeParams>(p) {
            Ok(u) => {
                let mut subs = conn.subscriptions.lock().unwrap_or_else(|p| p.into_inner());
                let ended: Vec<u64> = match u.subscription {
                    Some(n) => vec![n],
                    None => subs.keys().copied().collect(),
                };
                for n in ended {
                    if let Some(token) = subs.remove(&n) {
                        token.cancel();
                    }
                }
                Ok(json!({}))
            }
            Err(e) => Err(e),
        },
        other => Err(RpcError::usage(
            protocol::METHOD_NOT_FOUND,
            format!("no method {other:?} (see PROTOCOL.md)"),
        )),
    };
    Some(outcome)
}

/// `hello`'s answer; with a `nonce`, the proof that this service holds the
/// store's secret.
pub(super) fn hello(
    shared: &Shared,
    nonce: Option<String>,
) -> std::result::Result<Value, RpcError> {
    if nonce
        .as_ref()
        .is_some_and(|n| n.chars().count() > discovery::MAX_NONCE_CHARS)
    {
        return Err(RpcError::usage(
            protocol::INVALID_PARAMS,
            format!(
                "params.nonce: longer than {} characters",
                discovery::MAX_NONCE_CHARS
            ),
        ));
    }
    ok(Ok(Hello {
        protocol: protocol::PROTOCOL,
        version: env!("CARGO_PKG_VERSION").to_string(),
        store: shared.store_dir.clone(),
        pid: std::process::id(),
        proof: nonce.map(|n| discovery::proof(&shared.secret, &n)),
    }))
}

#[derive(serde::Deserialize, Default)]
pub(super) struct HelloParams {
    #[serde(default)]
    nonce: Option<String>,
}

#[derive(serde::Deserialize)]
pub(super) struct ResourceGem {
    gem: String,
}

pub(super) async fn status(shared: &Shared, gem: Option<String>) -> Result<StatusResult> {
    let service = shared.service.clone();
    let info = ServiceInfo {
        socket: shared.socket.clone(),
        pid: std::process::id(),
    };
    let work = move || {
        let mut result = crate::api::status_of(&service, gem.as_deref())?;
        result.service = Some(info);
        Ok(result)
    };
    match tokio::task::spawn_blocking(work).await {
        Ok(result) => result,
        Err(e) => Err(Error::Invalid(format!("status stopped: {e}"))),
    }
}

pub(super) async fn install(
    service: &Resources,
    gem: &str,
    manifest: &Value,
    by: Option<&str>,
    take_over: bool,
) -> Result<crate::InstallReport> {
    let by = match by {
        None | Some("api") => crate::InstalledBy::Api,
        Some("cli") => crate::InstalledBy::Cli,
        Some(other) => {
            return Err(Error::Invalid(format!(
                "params.installed_by: {:?} is not one of \"api\" or \"cli\"",
                other.chars().take(64).collect::<String>()
            )))
        }
    };
    let bytes = serde_json::to_vec(manifest)
        .map_err(|e| Error::Invalid(format!("the manifest cannot be read: {e}")))?;
    let manifest = crate::manifest::parse_manifest(&bytes)?;
    if take_over {
        service.install_taking_over(gem, &manifest, by).await
    } else {
        service.install_by(gem, &manifest, by).await
    }
}

pub(super) async fn uninstall(service: &Resources, gem: &str) -> Result<UninstallResult> {
    Ok(match service.uninstall_if_installed(gem).await? {
        Some(report) => UninstallResult {
            gem: report.gem,
            installed: true,
            deleted: report.deleted,
            kept: report.kept,
        },
        None => UninstallResult {
            gem: gem.to_string(),
            installed: false,
            ..UninstallResult::default()
        },
    })
}

/// Whether a call's `progress` token, if any, is one (a string of at
/// most [`protocol::MAX_ID_CHARS`] characters or a number).
fn valid_token(token: Option<&Value>) -> bool {
    token.is_none_or(|t| valid_id(t) && !t.is_null())
}

/// The answer to a call whose `progress` is not a token.
fn invalid_token() -> RpcError {
    RpcError::usage(
        protocol::INVALID_PARAMS,
        format!(
            "params.progress: a token is a string of at most {} characters or a number",
            protocol::MAX_ID_CHARS
        ),
    )
}

/// An `autofill` call's progress as `$/progress` notifications under its
/// token, best effort, as `path`'s events.
fn autofill_observer(conn: &Arc<Connection>, token: Value) -> AutofillObserver {
    let conn = conn.clone();
    Arc::new(move |progress: AutofillProgress| {
        if let Ok(value) = serde_json::to_value(&progress) {
            let params = json!({ "token": token, "value": value });
            conn.try_send_line(line(&notification("$/progress", params)));
        }
    })
}

pub(super) async fn autofill(
    service: &Resources,
    conn: &Arc<Connection>,
    params: AutofillParams,
) -> std::result::Result<Value, RpcError> {
    let observer = params.progress.map(|token| autofill_observer(conn, token));
    match (params.url, params.manifest) {
        (Some(url), None) => {
            let url = url::Url::parse(&url)
                .map_err(|e| Error::Usage(format!("not a valid URL: {url:?}: {e}")));
            match url {
                Ok(url) => ok(service.autofill_observed(&url, observer).await),
                Err(e) => Err(RpcError::of(&e)),
            }
        }
        (None, Some(manifest)) => {
            let bytes = serde_json::to_vec_pretty(&manifest).unwrap_or_default();
            ok(service
                .autofill_manifest_observed(&bytes, params.all, params.url_only, observer)
                .await)
        }
        _ => Err(RpcError::usage(
            protocol::INVALID_PARAMS,
            "autofill takes {\"url\": …} or {\"manifest\": {…}, \"all\"?: bool, \"url_only\"?: bool}",
        )),
    }
}
