//! One service per store, elected among the instances of an app: the
//! instance that takes the store's service lock runs the service, the
//! others are its clients, and when it goes one of them takes over.
//!
//! [`Resources::open_or_follow`] (or [`Member::join`]) is the whole of it
//! for an app that runs in several windows or processes:
//!
//! - **The election.** An instance looks for the store's live service
//!   ([`discovery::live`]); with none it opens [`Resources`] and
//!   [`Resources::listen`] takes the store's lock
//!   (`store-v1/run/service.lock`, [`discovery::hold`]) before it listens
//!   and [`Resources::start`]s. The lock makes the race safe: it is an OS
//!   lock, held by one process at a time and released by the system the
//!   moment that process ends, however it ends (quit, crash, `kill -9`).
//!   Of instances that try together, one takes it; the others are told
//!   `E_RESOURCE_BUSY` and follow the winner once its `service.json` is
//!   written.
//! - **Following.** A follower is a [`Client`] of the service, checked as
//!   [`Client::for_store`] checks it. When its connection closes (the
//!   service stopped, or its process ended) or the service answers that it
//!   is shutting down, the follower waits a random pause of up to
//!   [`TAKE_OVER_JITTER`], looks again, and, finding no service, takes
//!   the lock itself: of the followers that lost the service, one starts
//!   the next and the others find it.
//! - **What is sent again.** A call of [`Member`] that changes nothing
//!   ([`SAFE_AGAIN`]: `path`, `status`, `policy`, `hello`, `autofill`)
//!   cut off by the service going away is sent again to the next service:
//!   a waiting `path` resolves with the file, its download resumed from
//!   the bytes the last service kept. A call that changes the store
//!   (`install`, `uninstall`, `set_policy`, `cancel`, `retry`,
//!   `download_now`) is not: it fails with [`Error::CutOff`]
//!   (`E_RESOURCE_SERVICE`), since it may or may not have been applied.
//!   A call made while no service runs waits for the next, at most
//!   [`RECONNECT`].
//!
//! A service that stops cleanly cancels the calls of its connections and
//! may answer them before it closes them: the answer of a call this
//! instance did not cancel (JSON-RPC `-32800`), or `E_RESOURCE_SHUTDOWN`,
//! is taken as the service going away, like the connection's end, and
//! never given to the caller. The JavaScript client's
//! `connect({store, takeOver})` does the same with the same rules.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde_json::{json, Value};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::api::client::Reply;
use crate::api::discovery::{self, ServiceFile};
use crate::api::protocol::{self, Hello, PathResult, PolicyBody, RpcError, StatusResult};
use crate::api::{ApiServer, Client};
use crate::config::Config;
use crate::error::{Error, ErrorCode, Result};
use crate::net::policy::Policy;
use crate::service::{PolicyChange, Resources};
use crate::store::Store;

/// Calls that change nothing on the service: cut off by the service going
/// away, they are sent again to the next one. Any other call may or may
/// not have been applied, and fails with [`Error::CutOff`].
pub const SAFE_AGAIN: [&str; 5] = ["hello", "status", "path", "policy", "autofill"];

/// The longest random pause of a follower that lost its service before it
/// looks again and, finding none, takes over: each draws its own, so that
/// one starts the next service and the others find it.
pub const TAKE_OVER_JITTER: Duration = Duration::from_millis(150);

/// How long [`Member::join`] tries to run or reach a service.
pub const JOIN_WAIT: Duration = Duration::from_secs(10);

/// How long a call waits for the next service when none runs (the
/// election keeps trying after; the next call waits again).
pub const RECONNECT: Duration = Duration::from_secs(30);

/// The first pause between two looks for a service; it doubles up to
/// [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_millis(50);
const RETRY_MAX: Duration = Duration::from_secs(1);

/// How long a service that closed a follower's connection but still holds
/// the store is given to finish stopping before it is asked again.
const STILL_RUNS: Duration = Duration::from_millis(200);

/// What an instance is in its store's election.
#[derive(Debug, Clone)]
pub enum Role {
    /// It runs the store's service and its local API: the app's own
    /// code may call the service directly.
    Service(Resources),
    /// It is a client of the service another process runs.
    Client(Arc<Client>),
    /// The service went away; the next is being elected.
    Electing,
    /// It left ([`Member::leave`]).
    Left,
}

impl Role {
    /// Whether this instance runs the service.
    pub fn serves(&self) -> bool {
        matches!(self, Role::Service(_))
    }
}

/// What the keeper of an instance's role publishes to its calls.
#[derive(Clone)]
struct State {
    role: Role,
    /// Which service: one more at each election.
    term: u64,
    /// The connection calls go through (to this process's own service
    /// when it serves); none while electing.
    client: Option<Arc<Client>>,
    /// Cancelled by a call that found the service going away.
    going: CancellationToken,
    /// Why the last election failed, while none has succeeded since.
    failure: Option<Error>,
}

/// An instance of an app in the election of its store's service
/// ([module documentation](self)). Its calls go to whichever instance
/// runs the service; dropping it leaves as [`Member::leave`] does, without
/// waiting.
#[derive(Debug)]
pub struct Member {
    state: watch::Receiver<State>,
    stop: CancellationToken,
    keeper: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State")
            .field("role", &self.role)
            .field("term", &self.term)
            .finish_non_exhaustive()
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Resources {
    /// Runs the store's service in this process, or follows the one
    /// another instance runs, and takes over when that one goes: see
    /// [`Member`] and [`crate::api::election`]. Call inside a Tokio
    /// runtime.
    pub async fn open_or_follow(config: &Config) -> Result<Member> {
        Member::join(config).await
    }
}

/// The role an instance holds, with what keeps it.
enum Held {
    Serving {
        service: Resources,
        api: ApiServer,
        client: Arc<Client>,
    },
    Following {
        client: Arc<Client>,
        file: ServiceFile,
    },
}

impl Held {
    fn state(&self, term: u64) -> State {
        let (role, client) = match self {
            Held::Serving {
                service, client, ..
            } => (Role::Service(service.clone()), client.clone()),
            Held::Following { client, .. } => (Role::Client(client.clone()), client.clone()),
        };
        State {
            role,
            term,
            client: Some(client),
            going: CancellationToken::new(),
            failure: None,
        }
    }
}

impl Member {
    /// Joins the election of `config`'s store: runs the service when none
    /// runs (until [`Member::leave`]), else follows the one that runs, and
    /// takes over when it goes. Fails when neither was possible within
    /// [`JOIN_WAIT`], or at once on an error of opening the service (a
    /// store that cannot be opened, say). Call inside a Tokio runtime.
    pub async fn join(config: &Config) -> Result<Member> {
        let store = Store::open(&config.store_dir())?;
        let stop = CancellationToken::new();
        let held = elect(config, &store, None, Instant::now() + JOIN_WAIT, &stop).await?;
        let (tx, rx) = watch::channel(held.state(1));
        let keeper = tokio::spawn(keep(config.clone(), store, held, tx, stop.clone()));
        Ok(Member {
            state: rx,
            stop,
            keeper: std::sync::Mutex::new(Some(keeper)),
        })
    }

    /// What this instance is now.
    pub fn role(&self) -> Role {
        self.state.borrow().role.clone()
    }

    /// The role as it changes: `changed().await`, then `borrow()`.
    pub fn roles(&self) -> watch::Receiver<Role> {
        let mut states = self.state.clone();
        let (tx, rx) = watch::channel(states.borrow_and_update().role.clone());
        tokio::spawn(async move {
            while states.changed().await.is_ok() {
                let role = states.borrow_and_update().role.clone();
                if tx.send(role).is_err() {
                    return;
                }
            }
        });
        rx
    }

    /// The local path of `gem`'s resource `id`, downloaded first when
    /// missing by whichever instance runs the service; sent again to the
    /// next service when this one goes, its download resumed from the
    /// bytes kept.
    pub async fn path(&self, gem: &str, id: &str) -> Result<std::path::PathBuf> {
        let result: PathResult = self.call("path", json!({ "gem": gem, "id": id })).await?;
        Ok(result.path)
    }

    /// Every installed gem's status (or `gem`'s), as `status --json`.
    pub async fn status(&self, gem: Option<&str>) -> Result<StatusResult> {
        self.call("status", json!({ "gem": gem })).await
    }

    /// `hello`: the protocol, version, store and process of the service
    /// now running.
    pub async fn hello(&self) -> Result<Hello> {
        self.call("hello", json!({})).await
    }

    /// The service's network policy.
    pub async fn policy(&self) -> Result<Policy> {
        let body: PolicyBody = self.call("policy", json!({})).await?;
        Ok(Policy::new(body.mode, &body.hosts)?)
    }

    /// Sets the network policy of every process on the store; not sent
    /// again ([`Error::CutOff`] when the service went away first).
    pub async fn set_policy(&self, policy: &Policy) -> Result<PolicyChange> {
        self.call("set_policy", json!(PolicyBody::from(policy)))
            .await
    }

    /// Calls `method` with `params` (see `PROTOCOL.md`) on the service,
    /// whichever instance runs it, and reads its result as `T`. Cut off by
    /// the service going away, a call in [`SAFE_AGAIN`] is sent again to
    /// the next service; any other fails with [`Error::CutOff`]. The
    /// service's own errors come back as [`Error::Remote`].
    pub async fn call<T: DeserializeOwned>(&self, method: &str, params: Value) -> Result<T> {
        let mut after = 0;
        let mut lost: Option<(String, String)> = None;
        loop {
            let state = self.next_service(after, lost.as_ref()).await?;
            let Some(client) = state.client.clone() else {
                return Err(Error::Shutdown);
            };
            let reason = match client.request(method, params.clone()).await? {
                Reply::Answered(Ok(value)) => {
                    return serde_json::from_value(value).map_err(|e| Error::Service {
                        socket: client.socket().to_string(),
                        reason: format!("cannot read the answer to {method}: {e}"),
                    })
                }
                Reply::Answered(Err(error)) => match going_away(&error) {
                    Some(reason) => reason,
                    None => return Err(error.into_error()),
                },
                Reply::Lost(reason) => reason,
            };
            // The keeper elects the next service at once.
            state.going.cancel();
            if !SAFE_AGAIN.contains(&method) {
                return Err(Error::CutOff {
                    socket: client.socket().to_string(),
                    method: method.to_string(),
                    reason,
                });
            }
            tracing::info!(
                "`{method}` was cut off by the service going away ({reason}): sent again to the next"
            );
            after = state.term;
            lost = Some((client.socket().to_string(), reason));
        }
    }

    /// The state of a service after term `after`, waiting for it at most
    /// [`RECONNECT`] when there is none (`lost`: the socket of the one
    /// lost and how).
    async fn next_service(&self, after: u64, lost: Option<&(String, String)>) -> Result<State> {
        let mut states = self.state.clone();
        let found = tokio::time::timeout(
            RECONNECT,
            states.wait_for(|s| {
                matches!(s.role, Role::Left) || (s.term > after && s.client.is_some())
            }),
        )
        .await;
        let found = found.map(|seen| seen.map(|state| state.clone()));
        match found {
            Ok(Ok(state)) if matches!(state.role, Role::Left) => Err(Error::Shutdown),
            Ok(Ok(state)) => Ok(state),
            Ok(Err(_)) => Err(Error::Shutdown),
            Err(_) => {
                let last = self
                    .state
                    .borrow()
                    .failure
                    .as_ref()
                    .map_or_else(|| "none answered".to_string(), ToString::to_string);
                let (socket, how) = lost.cloned().unwrap_or_default();
                Err(Error::Service {
                    socket,
                    reason: format!(
                        "it went away ({how}) and no service came back within {} s (last try: {last})",
                        RECONNECT.as_secs()
                    ),
                })
            }
        }
    }

    /// Leaves the election: a service run here stops (its downloads keep
    /// their bytes, as [`Resources::shutdown`]), and another instance
    /// takes over; calls still waiting here fail with
    /// `E_RESOURCE_SHUTDOWN`.
    pub async fn leave(&self) {
        self.stop.cancel();
        let keeper = self.keeper.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(keeper) = keeper {
            let _ = keeper.await;
        }
    }
}

/// Why an answer says the service is going away: a call this instance
/// never cancels answered as cancelled (the service cancels the calls of
/// the connections it closes as it stops), or `E_RESOURCE_SHUTDOWN`.
fn going_away(error: &RpcError) -> Option<String> {
    let shutdown = error
        .data
        .as_ref()
        .is_some_and(|d| d.code == ErrorCode::Shutdown);
    (error.code == protocol::REQUEST_CANCELLED || shutdown)
        .then(|| format!("it is shutting down: {}", error.message))
}

/// A random pause of up to `most`.
fn jitter(most: Duration) -> Duration {
    let mut bytes = [0u8; 2];
    let _ = getrandom::fill(&mut bytes);
    most.mul_f64(f64::from(u16::from_le_bytes(bytes)) / f64::from(u16::MAX))
}

/// Sleeps `pause`; false when `stop` came first.
async fn pause_unless(stop: &CancellationToken, pause: Duration) -> bool {
    tokio::select! {
        () = stop.cancelled() => false,
        () = tokio::time::sleep(pause) => true,
    }
}

/// One election, until `deadline`: a client of the store's live service,
/// or the service itself when none runs and this instance takes the lock.
/// `lost` is the service whose connection was lost: while `service.json`
/// still names it, it is stopping and is given [`STILL_RUNS`]; a first
/// look that finds no service waits [`jitter`] first.
async fn elect(
    config: &Config,
    store: &Store,
    lost: Option<&ServiceFile>,
    deadline: Instant,
    stop: &CancellationToken,
) -> Result<Held> {
    let mut jittered = lost.is_none();
    let mut pause = RETRY_FIRST;
    loop {
        if stop.is_cancelled() {
            return Err(Error::Shutdown);
        }
        let failed = match discovery::live(store) {
            Some(file) => {
                let stopping = lost.is_some_and(|l| l.pid == file.pid && l.secret == file.secret);
                if stopping && !pause_unless(stop, STILL_RUNS).await {
                    continue;
                }
                match Client::connect_to(&file).await {
                    Ok(client) => {
                        return Ok(Held::Following {
                            client: Arc::new(client),
                            file,
                        })
                    }
                    // Starting, or stopping: look again.
                    Err(e) => e,
                }
            }
            None if !jittered => {
                jittered = true;
                pause_unless(stop, jitter(TAKE_OVER_JITTER)).await;
                continue;
            }
            None => match serve(config, store).await {
                Ok(held) => return Ok(held),
                // Another instance took the store: follow it once it
                // listens.
                Err(e) if e.code() == ErrorCode::Busy => e,
                Err(e) => return Err(e),
            },
        };
        if Instant::now() >= deadline {
            return Err(failed);
        }
        tracing::debug!("no service to follow yet ({failed}); looking again");
        pause_unless(stop, pause).await;
        pause = (pause * 2).min(RETRY_MAX);
    }
}

/// Runs the store's service here: opens it, takes the store and listens,
/// starts it, and connects to it as the instance's calls will.
/// `E_RESOURCE_BUSY` when another process holds the store.
async fn serve(config: &Config, store: &Store) -> Result<Held> {
    let service = Resources::open(config)?;
    // `listen` waits for the lock a moment (a client may be looking):
    // not on a worker of the runtime.
    let listening = {
        let service = service.clone();
        tokio::task::spawn_blocking(move || service.listen()).await
    };
    let api = match listening {
        Ok(Ok(api)) => api,
        Ok(Err(e)) => {
            service.shutdown().await;
            return Err(e);
        }
        Err(e) => {
            service.shutdown().await;
            return Err(Error::Invalid(format!("listening stopped: {e}")));
        }
    };
    let connected = async {
        service.start().await?;
        let file = discovery::live(store).ok_or_else(|| Error::Service {
            socket: api.socket().to_string(),
            reason: "its service.json is missing once it listens".into(),
        })?;
        Client::connect_to(&file).await
    };
    match connected.await {
        Ok(client) => {
            tracing::info!(socket = api.socket(), "running the store's service");
            Ok(Held::Serving {
                service,
                api,
                client: Arc::new(client),
            })
        }
        Err(e) => {
            api.stop().await;
            service.shutdown().await;
            Err(e)
        }
    }
}

/// Keeps an instance's role: serves until it leaves; follows until the
/// service goes, then elects the next (for as long as it takes).
async fn keep(
    config: Config,
    store: Store,
    mut held: Held,
    tx: watch::Sender<State>,
    stop: CancellationToken,
) {
    let left = |tx: &watch::Sender<State>| {
        tx.send_modify(|s| {
            s.role = Role::Left;
            s.client = None;
        });
    };
    let mut term = 1;
    loop {
        match held {
            Held::Serving {
                service,
                api,
                client,
            } => {
                stop.cancelled().await;
                left(&tx);
                drop(client);
                api.stop().await;
                service.shutdown().await;
                return;
            }
            Held::Following { client, file } => {
                let going = tx.borrow().going.clone();
                tokio::select! {
                    () = stop.cancelled() => {
                        left(&tx);
                        return;
                    }
                    () = client.closed() => {}
                    () = going.cancelled() => {}
                }
                drop(client);
                tx.send_modify(|s| {
                    s.role = Role::Electing;
                    s.client = None;
                });
                tracing::info!(
                    pid = file.pid,
                    "the store's service went away: electing the next"
                );
                held = loop {
                    let until = Instant::now() + RETRY_MAX * 2;
                    match elect(&config, &store, Some(&file), until, &stop).await {
                        Ok(next) => break next,
                        Err(_) if stop.is_cancelled() => {
                            left(&tx);
                            return;
                        }
                        Err(e) => {
                            tracing::warn!("no service for the store yet: {e}");
                            tx.send_modify(|s| s.failure = Some(e));
                        }
                    }
                };
                term += 1;
                tx.send_replace(held.state(term));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rpc(code: i64, data: Option<ErrorCode>) -> RpcError {
        RpcError {
            code,
            message: "m".into(),
            data: data.map(|code| crate::api::protocol::ErrorData {
                code,
                primary_cause: code,
                message: "m".into(),
                details: serde_json::Map::new(),
            }),
        }
    }

    #[test]
    fn what_changes_nothing_is_sent_again_and_nothing_else() {
        for method in ["path", "status", "policy", "hello", "autofill"] {
            assert!(SAFE_AGAIN.contains(&method), "{method}");
        }
        for method in [
            "install",
            "uninstall",
            "set_policy",
            "cancel",
            "retry",
            "download_now",
            "subscribe",
        ] {
            assert!(!SAFE_AGAIN.contains(&method), "{method}");
        }
    }

    #[test]
    fn a_service_stopping_is_told_from_its_errors() {
        assert!(going_away(&rpc(
            protocol::REQUEST_CANCELLED,
            Some(ErrorCode::Cancelled)
        ))
        .is_some());
        assert!(going_away(&rpc(protocol::SERVICE_ERROR, Some(ErrorCode::Shutdown))).is_some());
        // A download cancelled by another client (`cancel`) is the
        // caller's answer, not a service going away.
        assert!(going_away(&rpc(protocol::SERVICE_ERROR, Some(ErrorCode::Cancelled))).is_none());
        assert!(going_away(&rpc(protocol::SERVICE_ERROR, Some(ErrorCode::Unavailable))).is_none());
    }

    #[test]
    fn the_jitter_stays_within_its_bound() {
        for _ in 0..100 {
            assert!(jitter(TAKE_OVER_JITTER) <= TAKE_OVER_JITTER);
        }
    }
}
